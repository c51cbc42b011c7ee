"""Worked example: an external per-token GRPO kernel behind docs/spec.md's adapter contract.

Check it (from the repository root):

    cargo run --release -- check --impl examples/external_adapter/adapter.py:grpo_loss

The kernel (their_kernel.py) takes Python-float hyperparameters, divides the
log-prob by the temperature, and knows nothing of masks. This adapter
  - refuses, while tracing, what the kernel cannot do (NotImplementedError:
    the suite reports that configuration as unsupported, not failed);
  - sanitises masked positions, which may hold any id (-100) and any old
    log-prob (+-1e9), so no inf or NaN forms there, forward or backward;
  - makes an out-of-vocabulary id at an unmasked position loud (NaN);
  - masks and aggregates the per-token loss.
"""

import pathlib
import runpy

import jax.numpy as jnp

# In your code: `from your_package import per_token_grpo`.
per_token_grpo = runpy.run_path(str(pathlib.Path(__file__).with_name("their_kernel.py")))[
    "per_token_grpo"
]


def adapt(kernel):
    """A grpo_loss (docs/spec.md, "Implementation adapter") around a kernel with per_token_grpo's signature."""

    def grpo_loss(*, logits, tokens, mask, advantages, old_logp, ref_logp, hparams, config):
        # The kernel has one temperature convention and only the clipped PPO term.
        if config["temperature_mode"] != "logp":
            raise NotImplementedError("the kernel divides the log-prob by tau (logp mode), not the logits")
        if config["kl"]:
            raise NotImplementedError("the kernel has no KL penalty")
        if config["entropy_bonus"]:
            raise NotImplementedError("the kernel computes no entropy")
        if config["two_sided"]:
            raise NotImplementedError("the kernel has no upper bound delta on the ratio")

        # Masked positions: id 0 is a valid id, and old = 0 gives r = exp(logp) <= 1.
        valid = mask > 0
        safe_tokens = jnp.where(valid, tokens, 0)
        if old_logp is not None:
            old_logp = jnp.where(valid, old_logp, 0.0)

        loss_t, logp = kernel(
            logits,
            safe_tokens,
            old_logp,
            advantages,
            epsilon_low=hparams["eps_low"],
            epsilon_high=hparams["eps_high"],
            temperature=hparams["temperature"],
        )

        # An unmasked id outside [0, V) is bad input: NaN, not a silent clamp.
        out_of_vocab = valid & ((tokens < 0) | (tokens >= logits.shape[-1]))
        logp = jnp.where(out_of_vocab, jnp.nan, logp)
        loss_t = jnp.where(out_of_vocab, jnp.nan, loss_t)

        # docs/spec.md, "Aggregation": loss = sum(w * loss_t); w = 0 where masked.
        aggregation = config["aggregation"]
        if aggregation == "token_mean":
            weights = mask / jnp.maximum(jnp.sum(mask), 1.0)
        elif aggregation == "seq_mean_token_mean":
            tokens_per_row = jnp.maximum(jnp.sum(mask, axis=1, keepdims=True), 1.0)
            weights = mask / (mask.shape[0] * tokens_per_row)
        elif aggregation == "sum_over_constant":
            weights = mask / hparams["normalizer"]
        else:
            raise ValueError(f"aggregation = {aggregation!r} is not one of docs/spec.md's three")
        loss = jnp.sum(weights * loss_t)
        return loss, {"logp": logp, "per_token_loss": loss_t}

    grpo_loss.static_hparams = True  # the kernel takes Python floats
    return grpo_loss


grpo_loss = adapt(per_token_grpo)
