"""What the shard_map paths share: the mesh they run on, batch padding, the global loss.

The sharded implementations run under `jax.shard_map` on the ambient mesh
(`jax.set_mesh`, read while tracing with `jax.sharding.get_abstract_mesh`),
whose axes are named `"data"` and `"model"`. Each device sees a slice of the
batch (and, for `sharded_fused`, a slice of the vocabulary) and computes its
per-token quantities with `objective`'s blocks. What makes it the loss of
docs/spec.md rather than a mean of per-device losses is the normaliser: every
device weights its tokens with the *global* one,

    token_mean:          m / max(psum(sum m), 1)          (all devices' valid tokens)
    seq_mean_token_mean: m / (B * max(sum_t m, 1))         (B = the real batch size)
    sum_over_constant, seq_mean_token_mean_over_constant: as objective's (no count across rows)

(token_mean's global weights also weigh the entropy under docs/spec.md v2's
entropy_aggregation "token_mean"; a row is never split, so the sequence
ratio levels need nothing global)

and the devices' weighted sums are added with a psum over the batch axes.

Padding. B need not divide by the number of batch shards: the batch is
padded with rows of mask 0 (tokens 0, advantages 0, old/ref log-probs 0,
zero float inputs), whose weights are exactly 0 (their loss_t is finite:
`objective.neutralise_masked`), so they change neither the loss nor any
gradient; `seq_mean_token_mean` divides by the real B, never the padded one.
Their rows are sliced off the outputs (jnp.pad's transpose slices the
gradients).

Mesh. No ambient mesh: a 1 x 1 mesh of jax.devices()[0]. An ambient mesh
that lacks one of the axis names: the kernels use the named axes it has and
replicate over the rest (a shard_map inside jit must run on the context
mesh; it cannot move to another one). Gradients come from JAX's autodiff
through shard_map with its replication checks on (`check_vma`), which
transposes each psum and each implicit broadcast correctly: nothing is
counted twice.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from grpo_kernels import objective
from grpo_kernels.fused.common import loss_and_aux, token_side

F32 = jnp.float32
DATA_AXIS = "data"
MODEL_AXIS = "model"


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where a sharded kernel runs and how it splits its inputs."""

    mesh: object  # jax.sharding.Mesh or AbstractMesh
    batch_axes: tuple  # mesh axes the batch is split over (possibly none)
    vocab_axes: tuple  # mesh axes the vocabulary is split over (none or one)

    def shards(self, axes):
        return math.prod(self.mesh.shape[axis] for axis in axes)

    @property
    def batch_shards(self):
        return self.shards(self.batch_axes)

    @property
    def vocab_shards(self):
        return self.shards(self.vocab_axes)

    @property
    def batch_entry(self):
        """The PartitionSpec entry of a batch-sharded dimension."""
        return self.batch_axes or None

    @property
    def vocab_entry(self):
        return self.vocab_axes or None


def layout(batch_axes, vocab_axes=()):
    """The Layout on the ambient mesh (module docstring): the wanted axes it has.

    Must be called while tracing the implementation (inside jit): that is
    where the ambient mesh is visible as an abstract mesh.
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        one_device = np.asarray(jax.devices()[:1]).reshape(1, 1)
        mesh = jax.sharding.Mesh(one_device, (DATA_AXIS, MODEL_AXIS))
    present = lambda axes: tuple(axis for axis in axes if axis in mesh.axis_names)
    return Layout(mesh, present(batch_axes), present(vocab_axes))


def psum(value, axes):
    """jax.lax.psum over `axes`; the value itself when there are none."""
    return jax.lax.psum(value, axes) if axes else value


def pmax(value, axes):
    """jax.lax.pmax over `axes`; the value itself when there are none (pmax refuses ())."""
    return jax.lax.pmax(value, axes) if axes else value


def padded_size(size, shards):
    """The smallest multiple of `shards` that is >= size."""
    return -(-size // shards) * shards


def pad_axis(array, size, axis=0):
    """array with zeros appended along `axis` up to `size`."""
    widths = [(0, 0)] * array.ndim
    widths[axis] = (0, size - array.shape[axis])
    return jnp.pad(array, widths)


def token_inputs(tokens, mask, advantages, old_logp, ref_logp, is_weights, rows):
    """The per-token inputs as a dict (absent ones omitted), padded to `rows` rows."""
    inputs = {"tokens": tokens, "mask": mask, "advantages": advantages}
    for name, array in (("old_logp", old_logp), ("ref_logp", ref_logp), ("is_weights", is_weights)):
        if array is not None:
            inputs[name] = array
    return {name: pad_axis(array, rows) for name, array in inputs.items()}


def token_input_specs(inputs, layout):
    """PartitionSpecs of `token_inputs`: every one split over the batch axes."""
    return {name: PartitionSpec(layout.batch_entry) for name in inputs}


def hparams_f32(hparams):
    """The hyperparameters as f32 arrays (shard_map arguments, replicated)."""
    return {name: jnp.asarray(value, F32) for name, value in hparams.items()}


def global_weights(mask, aggregation, normalizer, batch, batch_axes):
    """Weights w [b, T] of this device's rows with loss = psum(sum(w * loss_t)) (module docstring).

    objective.aggregation_weights with the counts of the whole batch: the
    valid-token count psum'd over batch_axes, the real batch size `batch`.
    A fully masked batch gets w = 0: loss 0 and exactly-zero gradients.
    """
    if aggregation == "token_mean":
        return mask / jnp.maximum(psum(jnp.sum(mask), batch_axes), 1.0)
    if aggregation == "seq_mean_token_mean":
        return mask / (batch * jnp.maximum(jnp.sum(mask, axis=1, keepdims=True), 1.0))
    return objective.aggregation_weights(mask, aggregation, normalizer)


def device_loss(logp, entropy, inputs, hparams, config, *, vocab, batch, batch_axes):
    """(loss, aux) of docs/spec.md from this device's logp and entropy [b, T].

    The per-token loss is `objective`'s (via fused.common.loss_and_aux: bad
    ids poisoned, masked positions neutralised); `loss` is the psum over
    batch_axes of the globally weighted sums, the same on every device.
    """
    mask = inputs["mask"]
    side = token_side(
        inputs["tokens"], mask, inputs["advantages"], inputs.get("old_logp"),
        inputs.get("ref_logp"), inputs.get("is_weights"), hparams, config,
        weights_of=lambda aggregation: global_weights(
            mask, aggregation, hparams["normalizer"], batch, batch_axes
        ),
    )
    loss, aux = loss_and_aux(logp, entropy, side, vocab, hparams, config)
    return psum(loss, batch_axes), aux
