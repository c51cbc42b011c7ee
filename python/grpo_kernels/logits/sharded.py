"""GRPO on logits [B, T, V] under `jax.shard_map`, the batch split over every device (logits kind).

Batch axes: ("data", "model"). The logits kind has nothing to split over
the vocabulary that would not be a fused kernel's job, so the batch is split
over both mesh axes and all d * m devices work; a row is never split. Each
device holds a micro-batch of ceil(B / (d m)) rows (the batch padded with
fully masked rows, sharding), computes logp and the entropy of its
rows with `objective`'s blocks in f32 (rows summed in two levels,
`objective.blocked_row_sum`: inside shard_map XLA:CPU sums each row
sequentially), weights its tokens with the global
normaliser and sums; the sums are combined with a psum (sharding).
No ambient mesh: a 1 x 1 mesh of jax.devices()[0].

Gradients are JAX's autodiff through the shard_map; bf16 logits are upcast
on the device, so their gradient comes back in bf16 as jax.grad returns it.
"""

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from grpo_kernels import objective, sharding

BATCH_AXES = (sharding.DATA_AXIS, sharding.MODEL_AXIS)


def _device_loss(logits, inputs, hparams, *, config, vocab, batch, batch_axes):
    """(loss, aux) from this device's rows: logits [b, T, V], inputs [b, T] / [b]."""
    logp, entropy = objective.token_logp_and_entropy(
        objective.transform_logits(logits.astype(jnp.float32), hparams, config),
        objective.safe_token_ids(inputs["mask"], inputs["tokens"]),
        hparams["temperature"],
        config["temperature_mode"],
        # Inside shard_map XLA:CPU sums each row sequentially; two levels keep the f32 error small.
        row_sum=objective.blocked_row_sum,
    )
    return sharding.device_loss(
        logp, entropy, inputs, hparams, config, vocab=vocab, batch=batch, batch_axes=batch_axes
    )


def grpo_loss(*, logits, tokens, mask, advantages, old_logp, ref_logp, hparams, config,
              is_weights=None, seq_mean_over_padded_batch=False):
    """GRPO loss of docs/spec.md: (loss, {"logp", "per_token_loss", "entropy"}).

    logits [B, T, V] bf16|f32; tokens [B, T] i32; mask [B, T] f32 in {0, 1};
    advantages [B] f32; old_logp, ref_logp [B, T] f32 or None; is_weights
    [B, T] or [B, 1] f32 or None. Every switch of docs/spec.md v2 (rows are never split).
    seq_mean_over_padded_batch: a deliberate bug for the suite's fixture
    (seq_mean_token_mean divides by the padded batch size); False is correct.
    """
    objective.check_policy_inputs(old_logp, ref_logp, config)
    if logits.ndim != 3:
        raise ValueError(f"logits has shape {list(logits.shape)}; expected [B, T, V]")
    batch, _, vocab = logits.shape
    layout = sharding.layout(BATCH_AXES)
    rows = sharding.padded_size(batch, layout.batch_shards)
    inputs = sharding.token_inputs(tokens, mask, advantages, old_logp, ref_logp, is_weights, rows)
    rows_spec = PartitionSpec(layout.batch_entry)
    sharded = jax.shard_map(
        functools.partial(
            _device_loss,
            config=dict(config),
            vocab=vocab,
            batch=rows if seq_mean_over_padded_batch else batch,
            batch_axes=layout.batch_axes,
        ),
        mesh=layout.mesh,
        in_specs=(
            PartitionSpec(layout.batch_entry, None, None),
            sharding.token_input_specs(inputs, layout),
            PartitionSpec(),
        ),
        out_specs=(PartitionSpec(), rows_spec),
    )
    loss, aux = sharded(
        sharding.pad_axis(logits, rows), inputs, sharding.hparams_f32(hparams)
    )
    return loss, {key: value[:batch] for key, value in aux.items()}


grpo_loss.spec_version = 2
