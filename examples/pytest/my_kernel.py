"""A user's own GRPO loss kernel, as a kernel author would write it (JAX).

It implements docs/spec.md version 1 with the temperature on the logits (TRL,
verl and Liger's convention) and refuses the other temperature mode with
NotImplementedError, which the suite reports as unsupported, not failed.
`grpo_loss_clip_inverted` is the same kernel with one realistic bug: the
clipped branch taken with `max` instead of `min`.
"""

import jax
import jax.numpy as jnp


def _loss(*, logits, tokens, mask, advantages, old_logp, ref_logp, hparams, config, pick):
    if config["temperature_mode"] != "logits":
        raise NotImplementedError("this kernel divides the logits by the temperature only")
    valid = mask > 0
    logprobs = jax.nn.log_softmax(logits.astype(jnp.float32) / hparams["temperature"], axis=-1)
    ids = jnp.where(valid, tokens, 0)  # padding may hold any id (-100)
    logp = jnp.take_along_axis(logprobs, ids[..., None], axis=-1)[..., 0]
    entropy = -jnp.sum(jnp.exp(logprobs) * logprobs, axis=-1)

    # Padding may hold any old / ref log-prob: keep it out of exp.
    on_policy = jax.lax.stop_gradient(logp)
    old = on_policy if old_logp is None else jnp.where(valid, old_logp, on_policy)
    ratio = jnp.exp(logp - old)
    a = advantages[:, None]
    unclipped = (jnp.minimum(ratio, hparams["delta"]) if config["two_sided"] else ratio) * a
    clipped = jnp.clip(ratio, 1.0 - hparams["eps_low"], 1.0 + hparams["eps_high"]) * a
    loss_t = -pick(unclipped, clipped)
    if config["kl"]:
        d = jnp.where(valid, ref_logp, logp) - logp
        loss_t = loss_t + hparams["beta"] * (jnp.exp(d) - d - 1.0)
    if config["entropy_bonus"]:
        loss_t = loss_t - hparams["entropy_coef"] * entropy

    m = mask.astype(jnp.float32)
    masked = jnp.where(valid, loss_t, 0.0)
    if config["aggregation"] == "token_mean":
        loss = jnp.sum(masked) / jnp.maximum(jnp.sum(m), 1.0)
    elif config["aggregation"] == "seq_mean_token_mean":
        loss = jnp.mean(jnp.sum(masked, axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1.0))
    elif config["aggregation"] == "sum_over_constant":
        loss = jnp.sum(masked) / hparams["normalizer"]
    else:
        raise NotImplementedError(f"aggregation {config['aggregation']!r}")
    return loss, {"logp": logp, "per_token_loss": loss_t, "entropy": entropy}


def grpo_loss(*, logits, tokens, mask, advantages, old_logp, ref_logp, hparams, config):
    return _loss(logits=logits, tokens=tokens, mask=mask, advantages=advantages, old_logp=old_logp,
                 ref_logp=ref_logp, hparams=hparams, config=config, pick=jnp.minimum)


def grpo_loss_clip_inverted(*, logits, tokens, mask, advantages, old_logp, ref_logp, hparams, config):
    return _loss(logits=logits, tokens=tokens, mask=mask, advantages=advantages, old_logp=old_logp,
                 ref_logp=ref_logp, hparams=hparams, config=config, pick=jnp.maximum)
