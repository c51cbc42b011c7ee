"""The plain-JAX reference implementation of docs/spec.md (logits kind).

This is the baseline of the tolerance rule: every other implementation is
judged against the f64 oracle relative to this function's own error at the
same dtypes. All math runs in f32; bf16 logits are upcast first (jax.grad
then returns their gradient in bf16 by itself).
"""

import jax.numpy as jnp

from grpo_kernels import objective


def grpo_loss(*, logits, tokens, mask, advantages, old_logp, ref_logp, hparams, config,
              is_weights=None):
    """GRPO loss of docs/spec.md (v1 and v2): (loss, {"logp", "per_token_loss", "entropy"}).

    logits [B, T, V] bf16|f32; tokens [B, T] i32; mask [B, T] f32 in {0, 1};
    advantages [B] f32; old_logp, ref_logp [B, T] f32 or None;
    is_weights [B, T] or [B, 1] f32, or None (v2 rollout correction).
    """
    if config["on_policy"] != (old_logp is None):
        raise ValueError(
            f"config['on_policy'] = {config['on_policy']} but old_logp is "
            f"{'absent' if old_logp is None else 'given'}"
        )
    logits_f32 = objective.transform_logits(logits.astype(jnp.float32), hparams, config)
    logp, entropy = objective.token_logp_and_entropy(
        logits_f32,
        objective.safe_token_ids(mask, tokens),
        hparams["temperature"],
        config["temperature_mode"],
    )
    return objective.loss_and_aux(
        logp, entropy, tokens=tokens, mask=mask, advantages=advantages, old_logp=old_logp,
        ref_logp=ref_logp, is_weights=is_weights, vocab=logits.shape[-1], hparams=hparams,
        config=config,
    )


grpo_loss.spec_version = 2
