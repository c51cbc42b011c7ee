"""GRPO loss of docs/spec.md (logits kind) on the Pallas TPU kernels of `pallas_mosaic_tpu_kernel`.

The kernels compute what touches [B, T, V]: per-token logp and entropy
(forward) and d logits (backward). Everything per token or per sequence --
the PPO clip, KL, entropy bonus, masking and aggregation -- is the plain-JAX
objective of `objective.py`, exactly as the reference composes it. The
custom_vjp below joins the two: JAX differentiates the plain-JAX part, which
hands the kernel's backward the cotangents of logp and entropy per token,

    a = d loss / d logp / tau,   c = -(d loss / d entropy) / k   (k = tau or 1),

so d logits = a (onehot - p) + c p (log p + entropy), written tile by tile.
That cotangent already holds the loss's cotangent, the aggregation weight,
the advantage and the clip/KL derivatives (autodiff of `min` at a kink: any
split is admissible, docs/spec.md "Kinks").
"""

import functools

import jax
import jax.numpy as jnp

from grpo_kernels import objective
from grpo_kernels.logits.pallas_mosaic_tpu_kernel import BlockSizes, logits_gradient, token_statistics

DEFAULT_BLOCK_SIZES = BlockSizes()


def _score_divisor(temperature, temperature_mode):
    """k with scores x = z / k: tau in logits mode, 1 in logp mode."""
    if temperature_mode == "logits":
        return temperature
    if temperature_mode == "logp":
        return jnp.ones_like(temperature)
    raise ValueError(
        f"temperature_mode = {temperature_mode!r}; expected one of {objective.TEMPERATURE_MODES}"
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def token_logp_and_entropy(logits, safe_tokens, temperature, temperature_mode, block_sizes):
    """(logp, entropy), each [B, T] f32: `objective.token_logp_and_entropy` on the kernels."""
    (logp, entropy), _ = _forward(logits, safe_tokens, temperature, temperature_mode, block_sizes)
    return logp, entropy


def _forward(logits, safe_tokens, temperature, temperature_mode, block_sizes):
    divisor = _score_divisor(temperature, temperature_mode)
    chosen, entropy, row_max, log_sum = token_statistics(logits, safe_tokens, divisor, block_sizes)
    # logits mode: logp = log_softmax(z / tau)[y]; logp mode: log_softmax(z)[y] / tau.
    logp = chosen if temperature_mode == "logits" else chosen * (1.0 / temperature)
    residuals = (logits, safe_tokens, temperature, row_max, log_sum, entropy)
    return (logp, entropy), residuals


def _backward(temperature_mode, block_sizes, residuals, cotangents):
    logits, safe_tokens, temperature, row_max, log_sum, entropy = residuals
    d_logp, d_entropy = cotangents
    divisor = _score_divisor(temperature, temperature_mode)
    d_logits = logits_gradient(
        logits,
        safe_tokens,
        row_max,
        log_sum,
        entropy,
        d_logp / temperature,
        -d_entropy / divisor,
        divisor,
        block_sizes,
    )
    # No gradient for the token ids or the temperature (docs/spec.md: gradients of the float inputs).
    return d_logits, None, None


token_logp_and_entropy.defvjp(_forward, _backward)


def grpo_loss(*, logits, tokens, mask, advantages, old_logp, ref_logp, hparams, config,
              is_weights=None, block_sizes=DEFAULT_BLOCK_SIZES):
    """GRPO loss of docs/spec.md: (loss, {"logp", "per_token_loss", "entropy"}).

    logits [B, T, V] bf16|f32 (math in f32; the gradient comes back in the
    logits' dtype); tokens [B, T] i32; mask [B, T] f32 in {0, 1};
    advantages [B] f32; old_logp, ref_logp [B, T] f32 or None.
    is_weights [B, T] or [B, 1] f32 or None (docs/spec.md v2). block_sizes: the kernels' tiles (static).

    Every v2 switch is supported. The logit transform is an elementwise XLA
    pass before the kernels (exact; it costs an f32 [B, T, V] copy and its
    cotangent, which JAX's autodiff chains onto the kernels' d logits).
    """
    if config["on_policy"] != (old_logp is None):
        raise ValueError(
            f"config['on_policy'] = {config['on_policy']} but old_logp is "
            f"{'absent' if old_logp is None else 'given'}"
        )
    if objective.setting(config, "logit_transform"):
        logits = objective.transform_logits(logits.astype(jnp.float32), hparams, config)
    logp, entropy = token_logp_and_entropy(
        logits,
        objective.safe_token_ids(mask, tokens),
        jnp.asarray(hparams["temperature"], jnp.float32),
        config["temperature_mode"],
        block_sizes,
    )
    return objective.loss_and_aux(
        logp, entropy, tokens=tokens, mask=mask, advantages=advantages, old_logp=old_logp,
        ref_logp=ref_logp, is_weights=is_weights, vocab=logits.shape[-1], hparams=hparams,
        config=config,
    )


grpo_loss.spec_version = 2


@functools.wraps(grpo_loss, assigned=())  # the signature, for the adapter
def grpo_loss_small_blocks(**inputs):
    """`grpo_loss` with 16 x 256 tiles: many time and vocabulary tiles at the suite's small shapes."""
    return grpo_loss(**inputs, block_sizes=BlockSizes(vocab_block=256, time_block=16))


grpo_loss_small_blocks.spec_version = 2
