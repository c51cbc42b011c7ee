"""Fused LM-head GRPO under `jax.shard_map`: vocabulary over "model", batch over "data".

lm_head [H, V] is split by columns over the "model" axis (V padded with zero
columns to a multiple of its size m), hidden / tokens / mask by rows over
"data" (B padded with fully masked rows, sharding). Each device forms
its block of logits z [b, T, V/m] = hidden @ lm_head (in f32) and
the row statistics of fused.common over the whole vocabulary from blocks:

    M    = pmax of the block maxima (real columns only; stop_gradient: LSE is shift-invariant)
    t_v  = (z_v - M) * a            a = 1/tau (logits mode) or 1 (logp mode)
    S0   = psum of sum_v exp(t_v)       S1 = psum of sum_v exp(t_v) t_v
    z_y  = psum of the block's z_v at v = y (only y's owner holds it)

then logp and the entropy (common.finish_row_stats) and the loss with
the global normaliser (sharding). Padding columns are excluded from the
max and from S0, S1 and z_y; they hold t = 0 rather than -inf so that no
0 * inf forms in the backward.

Gradients are JAX's autodiff through the shard_map: d hidden comes back
split over "data" (summed over the vocabulary blocks), d lm_head split over
"model" (summed over the batch shards), both in their input dtypes; the
padding rows and columns are sliced off.
"""

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from grpo_kernels import objective, sharding
from grpo_kernels.fused import common

F32 = jnp.float32
BATCH_AXES = (sharding.DATA_AXIS,)
VOCAB_AXES = (sharding.MODEL_AXIS,)


def _row_stats(logits, columns, safe_tokens, vocab, inv_tau, temperature_mode, vocab_axes,
               rescale_shard_sums):
    """common.RowStats [b, T] of whole rows from this device's block logits [b, T, Vb].

    columns [Vb]: the global vocabulary index of each block column (>= vocab
    for padding). rescale_shard_sums=False is the deliberate bug of the
    suite's fixture: each block's S0 and S1 are taken relative to its own
    maximum and added as they are, never rescaled to the global M.
    """
    real = columns < vocab
    block_max = jax.lax.stop_gradient(jnp.max(jnp.where(real, logits, -jnp.inf), axis=-1))
    row_max = jax.lax.stop_gradient(sharding.pmax(block_max, vocab_axes))  # finite: V >= 1
    if rescale_shard_sums:
        shift_to = row_max
    else:  # bug: each block's own maximum (a block of padding only: any finite value)
        shift_to = jnp.where(jnp.isfinite(block_max), block_max, row_max)
    centred = common._scaled(logits - shift_to[..., None], inv_tau, temperature_mode)
    centred = jnp.where(real, centred, 0.0)
    weights = jnp.where(real, jnp.exp(centred), 0.0)
    chosen = (columns == safe_tokens[..., None]) & real
    sums = (
        jnp.sum(weights, axis=-1),
        jnp.sum(weights * centred, axis=-1),
        jnp.sum(jnp.where(chosen, logits, 0.0), axis=-1),
    )
    sum_exp, sum_exp_centred, chosen_logit = sharding.psum(sums, vocab_axes)
    return common.RowStats(row_max, sum_exp, sum_exp_centred, chosen_logit)


def _device_loss(hidden, lm_head, inputs, hparams, *, config, vocab, batch, layout,
                 rescale_shard_sums):
    """(loss, aux) from this device's rows hidden [b, T, H] and columns lm_head [H, Vb].

    Both are upcast here, on the device: the products of bf16 values are exact
    in f32 either way, and the backward's partial sums (d hidden over the
    vocabulary blocks, d lm_head over the batch shards) are then psum'd in f32
    and rounded to the input dtype once, as jax.grad of the baseline does; a
    bf16 operand would round each device's partial sum first.
    """
    logits = jnp.einsum("bth,hv->btv", hidden.astype(F32), lm_head.astype(F32),
                        preferred_element_type=F32)
    # docs/spec.md v2's transform, elementwise on the block (padding columns: f(0) = 0, excluded anyway).
    logits = objective.transform_logits(logits, hparams, config)
    block = lm_head.shape[1]
    first_column = block * jax.lax.axis_index(layout.vocab_axes) if layout.vocab_axes else 0
    columns = first_column + jnp.arange(block, dtype=jnp.int32)
    inv_tau = 1.0 / jax.lax.stop_gradient(hparams["temperature"])
    stats = _row_stats(
        logits,
        columns,
        objective.safe_token_ids(inputs["mask"], inputs["tokens"]),
        vocab,
        inv_tau,
        config["temperature_mode"],
        layout.vocab_axes,
        rescale_shard_sums,
    )
    logp, entropy, _ = common.finish_row_stats(stats, inv_tau, config["temperature_mode"])
    return sharding.device_loss(
        logp, entropy, inputs, hparams, config,
        vocab=vocab, batch=batch, batch_axes=layout.batch_axes,
    )


def grpo_loss(*, hidden, lm_head, tokens, mask, advantages, old_logp, ref_logp, hparams, config,
              is_weights=None, rescale_shard_sums=True):
    """GRPO loss of docs/spec.md, fused kind: (loss, {"logp", "per_token_loss", "entropy"}).

    hidden [B, T, H] bf16|f32; lm_head [H, V] bf16|f32 (Flax layout);
    the rest as in logits.reference.grpo_loss; every switch of docs/spec.md v2. rescale_shard_sums=False is a
    deliberate bug for the suite's fixture (see _row_stats); True is correct.
    """
    batch, _, _, vocab = common.check_fused_inputs(
        hidden=hidden, lm_head=lm_head, tokens=tokens, mask=mask, advantages=advantages,
        old_logp=old_logp, ref_logp=ref_logp, config=config,
    )
    layout = sharding.layout(BATCH_AXES, VOCAB_AXES)
    rows = sharding.padded_size(batch, layout.batch_shards)
    columns = sharding.padded_size(vocab, layout.vocab_shards)
    inputs = sharding.token_inputs(tokens, mask, advantages, old_logp, ref_logp, is_weights, rows)
    sharded = jax.shard_map(
        functools.partial(
            _device_loss,
            config=dict(config),
            vocab=vocab,
            batch=batch,
            layout=layout,
            rescale_shard_sums=rescale_shard_sums,
        ),
        mesh=layout.mesh,
        in_specs=(
            PartitionSpec(layout.batch_entry, None, None),
            PartitionSpec(None, layout.vocab_entry),
            sharding.token_input_specs(inputs, layout),
            PartitionSpec(),
        ),
        out_specs=(PartitionSpec(), PartitionSpec(layout.batch_entry)),
    )
    loss, aux = sharded(
        sharding.pad_axis(hidden, rows),
        sharding.pad_axis(lm_head, columns, axis=1),
        inputs,
        sharding.hparams_f32(hparams),
    )
    return loss, {key: value[:batch] for key, value in aux.items()}


grpo_loss.spec_version = 2
