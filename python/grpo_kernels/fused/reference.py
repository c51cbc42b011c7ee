"""The plain-JAX fused baseline (docs/spec.md, fused kind): logits = hidden @ lm_head, then `logits.reference`.

The whole [B, T, V] f32 logits tensor is materialised (and its cotangent in
the backward): the memory the chunked paths exist to avoid. It is the
baseline of the tolerance rule for every fused implementation.
"""

import jax.numpy as jnp

from grpo_kernels.fused import common
from grpo_kernels.logits import reference as logits_reference


def grpo_loss(*, hidden, lm_head, tokens, mask, advantages, old_logp, ref_logp, hparams, config,
              is_weights=None):
    """GRPO loss of docs/spec.md (v1 and v2), fused kind: (loss, {"logp", "per_token_loss", "entropy"}).

    hidden [B, T, H] bf16|f32; lm_head [H, V] bf16|f32 (Flax layout);
    the rest as in logits.reference.grpo_loss.
    """
    common.check_fused_inputs(
        hidden=hidden, lm_head=lm_head, tokens=tokens, mask=mask, advantages=advantages,
        old_logp=old_logp, ref_logp=ref_logp, config=config,
    )
    logits = jnp.einsum("bth,hv->btv", hidden, lm_head, preferred_element_type=jnp.float32)
    return logits_reference.grpo_loss(
        logits=logits, tokens=tokens, mask=mask, advantages=advantages,
        old_logp=old_logp, ref_logp=ref_logp, hparams=hparams, config=config,
        is_weights=is_weights,
    )


grpo_loss.spec_version = 2
