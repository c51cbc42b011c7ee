"""Fused LM-head GRPO with Pallas TPU kernels (interpret mode off TPU).

Vocabulary-tiled like fused_chunked, as three kernels (pallas_mosaic_tpu_kernel):
the forward kernel gives each token's online row statistics (one matmul per
tile); the backward recomputes each tile's logits twice, once in the kernel
that reduces d hidden over vocabulary blocks and once in the kernel that
reduces d lm_head over token blocks (five matmuls in all: each output block
is owned by one grid row, so no cross-block accumulation in HBM is needed).
No [B*T, V] array exists in HBM; V and B*T need not be multiples of the
blocks.

The custom_vjp covers (hidden, lm_head) -> (logp, entropy) per token, as in
fused_chunked; the loss is `objective`'s blocks (common.loss_and_aux).
On TPU the kernels are compiled by Mosaic; elsewhere they run in Pallas
interpret mode (lax.platform_dependent picks per lowering platform, so
exporting for "tpu" from a CPU host lowers the real kernels).
"""

import dataclasses
import functools

import jax

from grpo_kernels.fused import common
from grpo_kernels.fused import pallas_mosaic_tpu_kernel as kernel


@dataclasses.dataclass(frozen=True)
class PallasConfig:
    """Tile sizes (TPU tiling: token_block % 8 == 0, vocab_block % 128 == 0, unless a
    block covers the whole dimension). The defaults keep each kernel's VMEM use
    under ~32 MiB at H = 4096 (double-buffered hidden and lm_head tiles plus an
    f32 accumulator); vmem_limit_bytes raises Mosaic's scoped-VMEM default."""

    token_block: int = 256
    vocab_block: int = 512
    vmem_limit_bytes: int = 64 * 1024 * 1024

    def __post_init__(self):
        if self.token_block < 8 or self.token_block % 8:
            raise ValueError(f"PallasConfig.token_block = {self.token_block}; need a multiple of 8")
        if self.vocab_block < 128 or self.vocab_block % 128:
            raise ValueError(
                f"PallasConfig.vocab_block = {self.vocab_block}; need a multiple of 128"
            )


DEFAULT_CONFIG = PallasConfig()


def _per_platform(kernel_function, *args, **static):
    """kernel_function compiled by Mosaic on TPU, in Pallas interpret mode elsewhere.

    Gradient kernels also take `exact_grad_matmuls` per platform (see
    pallas_mosaic_tpu_kernel): the precision of the plain path's gradient dots there.
    """
    tpu, default = dict(interpret=False), dict(interpret=True)
    if kernel_function is not kernel.row_stats:
        tpu["exact_grad_matmuls"], default["exact_grad_matmuls"] = False, True
    return jax.lax.platform_dependent(
        *args,
        tpu=functools.partial(kernel_function, **static, **tpu),
        default=functools.partial(kernel_function, **static, **default),
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def token_logp_and_entropy(hidden_rows, lm_head, safe_tokens, inv_tau, temperature_mode, blocks):
    """(logp, entropy) [n, 1] of hidden_rows [n, H] @ lm_head [H, V] (docs/spec.md, per token)."""
    return _stats_fwd(hidden_rows, lm_head, safe_tokens, inv_tau, temperature_mode, blocks)[0]


def _stats_fwd(hidden_rows, lm_head, safe_tokens, inv_tau, temperature_mode, blocks):
    stats = _per_platform(
        kernel.row_stats, hidden_rows, lm_head, safe_tokens, inv_tau,
        temperature_mode=temperature_mode, blocks=blocks,
    )
    logp, entropy, summary = common.finish_row_stats(stats, inv_tau, temperature_mode)
    return (logp, entropy), (hidden_rows, lm_head, safe_tokens, inv_tau, summary)


def _stats_bwd(temperature_mode, blocks, residuals, cotangents):
    hidden_rows, lm_head, safe_tokens, inv_tau, summary = residuals
    gy, ge = common.logit_coefficients(*cotangents, inv_tau, temperature_mode)
    args = (hidden_rows, lm_head, safe_tokens, inv_tau, summary, gy, ge)
    static = dict(temperature_mode=temperature_mode, blocks=blocks)
    d_hidden = _per_platform(kernel.hidden_grad, *args, **static)
    d_lm_head = _per_platform(kernel.lm_head_grad, *args, **static)
    return d_hidden, d_lm_head, None, None


token_logp_and_entropy.defvjp(_stats_fwd, _stats_bwd)


def grpo_loss(*, hidden, lm_head, tokens, mask, advantages, old_logp, ref_logp, hparams, config,
              is_weights=None, block_config=DEFAULT_CONFIG):
    """GRPO loss of docs/spec.md, fused kind, with the LM-head tiles in Pallas kernels.

    hidden [B, T, H] bf16|f32; lm_head [H, V] bf16|f32; the rest as in
    logits.reference.grpo_loss (keyword arguments of the adapter). Returns
    (loss, {"logp", "per_token_loss", "entropy"}). docs/spec.md v2: every switch but
    logit_transform (refused: the tiles hold raw hidden @ lm_head).
    """
    return common.grpo_loss_from_statistics(
        token_logp_and_entropy, implementation="fused_pallas", hidden=hidden, lm_head=lm_head, tokens=tokens, mask=mask,
        advantages=advantages, old_logp=old_logp, ref_logp=ref_logp, is_weights=is_weights,
        hparams=hparams, config=config, block_config=block_config,
    )


grpo_loss.spec_version = 2
