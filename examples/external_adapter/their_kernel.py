"""Stands in for an external GRPO kernel (TRL / Liger style) that knows nothing of grpo-verify.

Its conventions, which the adapter beside it translates to docs/spec.md's:
hyperparameters are Python floats; the temperature divides the log-prob
(docs/spec.md's "logp" temperature mode); old log-probs of None mean on-policy;
one-sided clipping only; no KL, no entropy, no mask and no aggregation:
every position must hold a valid token id and a finite old log-prob.
"""

import jax
import jax.numpy as jnp


def per_token_grpo(
    logits, chosen_ids, old_per_token_logps, advantages, *, epsilon_low, epsilon_high, temperature
):
    """(per_token_loss, per_token_logps), each [B, T] f32.

    logits [B, T, V] bf16|f32; chosen_ids [B, T] int in [0, V);
    old_per_token_logps [B, T] f32 or None (on-policy); advantages [B] f32.

        logp = (z[y] - LSE(z)) / temperature
        r    = exp(logp - old),   old = stop_gradient(logp) when on-policy
        loss = -min(r * A, clip(r, 1 - epsilon_low, 1 + epsilon_high) * A)
    """
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    chosen = jnp.take_along_axis(log_probs, chosen_ids[..., None], axis=-1)[..., 0]
    per_token_logps = chosen / temperature
    if old_per_token_logps is None:
        old_per_token_logps = jax.lax.stop_gradient(per_token_logps)
    ratio = jnp.exp(per_token_logps - old_per_token_logps)
    clipped_ratio = jnp.clip(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)
    per_sequence = advantages[:, None]
    per_token_loss = -jnp.minimum(ratio * per_sequence, clipped_ratio * per_sequence)
    return per_token_loss, per_token_logps
