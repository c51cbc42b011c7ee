"""Fused LM-head GRPO at the memory frontier: vocabulary-outer, two passes (XLA, any backend).

Pass 1 (forward) walks the vocabulary in chunks of `vocab_chunk` columns:
logits_c = hidden @ lm_head[:, c] (matmul 1) feeds the online row
statistics of fused_common (max, LSE, E_p[t], z_y); the [B*T, V] logits
never exist. Pass 2 (backward) walks the chunks again: it recomputes
logits_c (matmul 2), forms dz_c from the saved per-token statistics, adds
dz_c @ lm_head[:, c].T into d hidden (matmul 3) and writes
d lm_head[:, c] = hidden.T @ dz_c (matmul 4) straight into the output,
each chunk's columns exactly once. Residuals are the inputs and four
[B*T] vectors. V need not be a multiple of the chunk: the remainder is one
more, smaller chunk (fused_common.chunk_loop); lm_head is never padded.

The custom_vjp covers only (hidden, lm_head) -> (logp, entropy) per token;
the PPO/KL/entropy terms and the aggregation are `objective`'s blocks,
differentiated by JAX, so their cotangents arrive here as g_logp, g_ent.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp

from grpo_kernels import fused_common as common
from grpo_kernels import objective


@dataclasses.dataclass(frozen=True)
class ChunkedConfig:
    """vocab_chunk: lm_head columns per chunk; 151936 = 74 x 2048 + 384."""

    vocab_chunk: int = 2048


DEFAULT_CONFIG = ChunkedConfig()


def _forward_stats(hidden_rows, lm_head, safe_tokens, inv_tau, temperature_mode, vocab_chunk):
    def see_chunk(start, size, stats):
        logits = common.chunk_logits(hidden_rows, common.lm_head_columns(lm_head, start, size))
        return common.accumulate_row_stats(stats, logits, start, safe_tokens, inv_tau, temperature_mode)

    stats = common.chunk_loop(
        lm_head.shape[1], vocab_chunk, see_chunk, common.empty_row_stats(hidden_rows.shape[0])
    )
    return common.finish_row_stats(stats, inv_tau, temperature_mode)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def token_logp_and_entropy(hidden_rows, lm_head, safe_tokens, inv_tau, temperature_mode, vocab_chunk):
    """(logp, entropy) [n, 1] of hidden_rows [n, H] @ lm_head [H, V] (SPEC.md, per token).

    safe_tokens [n, 1] i32 in [0, V); inv_tau f32 scalar (not differentiated).
    """
    logp, entropy, _ = _forward_stats(
        hidden_rows, lm_head, safe_tokens, inv_tau, temperature_mode, vocab_chunk
    )
    return logp, entropy


def _stats_fwd(hidden_rows, lm_head, safe_tokens, inv_tau, temperature_mode, vocab_chunk):
    logp, entropy, summary = _forward_stats(
        hidden_rows, lm_head, safe_tokens, inv_tau, temperature_mode, vocab_chunk
    )
    return (logp, entropy), (hidden_rows, lm_head, safe_tokens, inv_tau, summary)


def _stats_bwd(temperature_mode, vocab_chunk, residuals, cotangents):
    hidden_rows, lm_head, safe_tokens, inv_tau, summary = residuals
    gy, ge = common.logit_coefficients(*cotangents, inv_tau, temperature_mode)
    hidden_t = hidden_rows.T.astype(common.F32)  # [H, n], transposed once for matmul 4

    def chunk_grads(start, size, carry):
        d_hidden, d_lm_head = carry
        columns = common.lm_head_columns(lm_head, start, size)
        logits = common.chunk_logits(hidden_rows, columns)
        dz = common.logits_cotangent(
            logits, start, summary, safe_tokens, gy, ge, inv_tau, temperature_mode
        )
        d_hidden = d_hidden + common.hidden_cotangent(dz, columns)
        d_columns = common.lm_head_cotangent(hidden_t, dz).astype(lm_head.dtype)
        return d_hidden, jax.lax.dynamic_update_slice_in_dim(d_lm_head, d_columns, start, axis=1)

    d_hidden, d_lm_head = common.chunk_loop(
        lm_head.shape[1],
        vocab_chunk,
        chunk_grads,
        (jnp.zeros(hidden_rows.shape, common.F32), jnp.zeros(lm_head.shape, lm_head.dtype)),
    )
    return d_hidden.astype(hidden_rows.dtype), d_lm_head, None, None


token_logp_and_entropy.defvjp(_stats_fwd, _stats_bwd)


def grpo_loss(*, hidden, lm_head, tokens, mask, advantages, old_logp, ref_logp, hparams, config,
              block_config=DEFAULT_CONFIG):
    """GRPO loss of SPEC.md, fused kind, without materialising [B*T, V] logits.

    hidden [B, T, H] bf16|f32; lm_head [H, V] bf16|f32; the rest as in
    reference.grpo_loss. Returns (loss, {"logp", "per_token_loss", "entropy"}).
    """
    batch, time, width, vocab = common.check_fused_inputs(
        hidden=hidden, lm_head=lm_head, tokens=tokens, mask=mask, advantages=advantages,
        old_logp=old_logp, ref_logp=ref_logp, config=config,
    )
    inv_tau = 1.0 / jax.lax.stop_gradient(jnp.asarray(hparams["temperature"], common.F32))
    logp, entropy = token_logp_and_entropy(
        hidden.reshape(batch * time, width),
        lm_head,
        objective.safe_token_ids(mask, tokens).reshape(-1, 1),
        inv_tau,
        config["temperature_mode"],
        block_config.vocab_chunk,
    )
    side = common.token_side(tokens, mask, advantages, old_logp, ref_logp, hparams, config)
    return common.loss_and_aux(
        logp.reshape(batch, time), entropy.reshape(batch, time), side, vocab, hparams, config
    )
