"""Pallas TPU kernels of the logits kind: per-token log-softmax statistics and their gradient.

Two kernels over the grid (batch, time blocks, vocabulary blocks), vocabulary
innermost:

- `token_statistics` streams each row of logits once, block by block, keeping
  an online log-sum-exp in VMEM scratch (running max, running sum of
  exp(u) and of exp(u) * u, where u are the centred scores) and picking the
  chosen logit in the block that owns it. At the last vocabulary block it
  writes, per token, log_softmax(x)[y], the entropy, the row max and log S.
- `logits_gradient` recomputes p block by block from the row max and log S
  and writes d logits = a (onehot(y) - p) + c p (log p + entropy), with the
  per-token coefficients a and c computed outside (in plain JAX).

Scores are x = z / k with k = tau in logits mode and k = 1 in logp mode
(docs/spec.md, "Per-token quantities"). The kernels take 1 / k as a runtime scalar
in SMEM (scalar prefetch), so a new temperature never recompiles, and
multiply by it (one multiply per element, not a divide). Like the reference,
they work on centred scores u = (z - max z) / k: z - max is exact for the
large common offsets (logits near -3e4) where z / k would round.

Layout. Logits are read in (time_block, vocab_block) tiles straight from the
unpadded [B, T, V] array: the last tile of each axis is partial (Pallas pads
it on input and drops the padding on output), so nothing the size of the
logits is ever copied. Masking is explicit: `vocab_tail_mask` removes the
padded columns of the last vocabulary tile with `where` (never -inf times 0),
and padded time rows are row-local garbage that only reaches padded output
rows, which `time_rows` cuts off. Per-token values travel as [B, T_pad, 128]
lane-replicated rows, as in JAX's TPU flash attention: a block whose last dim
is 1 would be lane-sparse. Every block's last two dims are multiples of
(8, 128) (the TPU tiling rule), and per-sequence rows are selected by
`program_id(0)` through the index map, never by a rank-1 block.

Off TPU the same kernels run in Pallas interpret mode; the choice is made
when lowering (`jax.lax.platform_dependent`), so exporting for TPU from a
CPU host lowers the real Mosaic kernels.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

LANES = 128  # TPU vector lanes: the last block dim is a multiple of this
ROW_ALIGN = 16  # sublane multiple of time blocks: 8 rows of f32, 16 of packed bf16
FILL = float(jnp.finfo(jnp.float32).min)  # finite stand-in for padded columns


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Tile sizes (static: changing them recompiles).

    vocab_block: columns per tile, a multiple of 128. 2048 is what the seed
      team measured on TPU v6e; 151936 = 74 x 2048 + 384 leaves a partial tail.
    time_block: rows per tile, a multiple of 16; capped to T rounded up to 16.
    """

    vocab_block: int = 2048
    time_block: int = 256

    def __post_init__(self):
        if self.vocab_block <= 0 or self.vocab_block % LANES:
            raise ValueError(f"vocab_block = {self.vocab_block}; expected a positive multiple of {LANES}")
        if self.time_block <= 0 or self.time_block % ROW_ALIGN:
            raise ValueError(f"time_block = {self.time_block}; expected a positive multiple of {ROW_ALIGN}")

    def tiles(self, time, vocab):
        """(time tile, vocabulary tile) for a [*, time, vocab] problem."""
        return (
            min(self.time_block, _round_up(time, ROW_ALIGN)),
            min(self.vocab_block, _round_up(vocab, LANES)),
        )


def _round_up(n, multiple):
    return -(-n // multiple) * multiple


# ---- Small named pieces: each is one decision, and the suite's broken ----
# ---- mutants (suites/fixtures/mutants/pallas_*.py) patch exactly one of them. ----


def vocab_tail_mask(columns, vocab_size):
    """True where a tile column is a real vocabulary id (< V), False in the padded tail."""
    return columns < vocab_size


def per_token_block(b, t, v, *scalar_refs):
    """Block index of a per-token [B, T_pad, 128] array: sequence b, time tile t."""
    return b, t, 0


def logits_block(b, t, v, *scalar_refs):
    """Block index of a [B, T, V] array: sequence b, time tile t, vocabulary tile v."""
    return b, t, v


def to_rows(values, padded_time, fill):
    """Per-token values [B, T] -> [B, T_pad, 128]: time padded with `fill`, lanes replicated."""
    batch, time = values.shape
    padded = jnp.pad(values, ((0, 0), (0, padded_time - time)), constant_values=fill)
    return jnp.broadcast_to(padded[:, :, None], (batch, padded_time, LANES))


def time_rows(rows, time):
    """The real tokens of a kernel's per-token output [B, T_pad, 128] -> [B, T]."""
    return rows[:, :time, 0]


# ---- Kernels ----


def _columns(vocab_tile_index, shape):
    """Vocabulary id of every element of a (time tile, vocab tile) block."""
    return vocab_tile_index * shape[1] + jax.lax.broadcasted_iota(jnp.int32, shape, 1)


def _lanes_to(tile, width):
    """A lane-replicated (rows, 128) tile as (rows, width), width a multiple of 128."""
    return jnp.tile(tile, (1, width // LANES))


def _statistics_kernel(
    scalars_ref, tokens_ref, logits_ref,  # inputs
    chosen_out, entropy_out, max_out, log_sum_out,  # outputs, written at the last vocab tile
    run_max, run_sum, run_weighted, run_chosen,  # VMEM accumulators across vocab tiles
    *, vocab_size,
):
    v = pl.program_id(2)
    inv_divisor = scalars_ref[0]  # 1 / k: 1 / tau in logits mode, 1 in logp mode
    z = logits_ref[...].astype(jnp.float32)
    columns = _columns(v, z.shape)
    real = vocab_tail_mask(columns, vocab_size)
    z = jnp.where(real, z, FILL)
    tile_max = jnp.max(z, axis=1, keepdims=True)

    @pl.when(v == 0)
    def _start_row():
        run_max[...] = jnp.broadcast_to(tile_max, run_max.shape)
        run_sum[...] = jnp.zeros_like(run_sum)
        run_weighted[...] = jnp.zeros_like(run_weighted)
        run_chosen[...] = jnp.zeros_like(run_chosen)

    # Online log-sum-exp in the centred frame u = (z - m) / k. When the max
    # moves from m to m' (shift s = (m' - m) / k >= 0), the old terms become
    # exp(u - s) = exp(u) e^-s and exp(u - s) (u - s) = e^-s (exp(u) u - s exp(u)).
    old_max, old_sum = run_max[...], run_sum[...]
    new_max = jnp.maximum(old_max, tile_max)
    shift = (new_max - old_max) * inv_divisor
    rescale = jnp.exp(-shift)
    u = (z - _lanes_to(new_max, z.shape[1])) * inv_divisor
    e = jnp.where(real, jnp.exp(u), 0.0)
    eu = jnp.where(real, e * u, 0.0)
    run_sum[...] = rescale * old_sum + jnp.sum(e, axis=1, keepdims=True)
    run_weighted[...] = rescale * (run_weighted[...] - shift * old_sum) + jnp.sum(
        eu, axis=1, keepdims=True
    )
    run_max[...] = new_max
    onehot = columns == _lanes_to(tokens_ref[...], z.shape[1])
    run_chosen[...] += jnp.sum(jnp.where(onehot, z, 0.0), axis=1, keepdims=True)

    @pl.when(v == pl.num_programs(2) - 1)
    def _finish_row():
        log_sum = jnp.log(run_sum[...])
        # log p_y = u_y - log S;  entropy = -sum p log p = log S - sum(e u) / S.
        chosen_out[...] = (run_chosen[...] - run_max[...]) * inv_divisor - log_sum
        entropy_out[...] = log_sum - run_weighted[...] / run_sum[...]
        max_out[...] = run_max[...]
        log_sum_out[...] = log_sum


def _gradient_kernel(
    scalars_ref, tokens_ref, max_ref, log_sum_ref, entropy_ref, coef_logp_ref, coef_entropy_ref,
    logits_ref,  # inputs
    grad_out,  # output
    *, vocab_size,
):
    v = pl.program_id(2)
    inv_divisor = scalars_ref[0]
    z = logits_ref[...].astype(jnp.float32)
    width = z.shape[1]
    columns = _columns(v, z.shape)
    real = vocab_tail_mask(columns, vocab_size)
    z = jnp.where(real, z, FILL)
    log_p = (z - _lanes_to(max_ref[...], width)) * inv_divisor - _lanes_to(log_sum_ref[...], width)
    p = jnp.where(real, jnp.exp(log_p), 0.0)
    onehot = (columns == _lanes_to(tokens_ref[...], width)).astype(jnp.float32)
    # d logp / dz = (onehot - p) / tau and d entropy / dz = -p (log p + H) / k
    # (docs/spec.md, "Gradient conventions"); the 1/tau, 1/k and the loss's
    # cotangents are folded into a and c outside the kernel.
    a = _lanes_to(coef_logp_ref[...], width)
    c = _lanes_to(coef_entropy_ref[...], width)
    h = _lanes_to(entropy_ref[...], width)
    grad = a * (onehot - p) + c * jnp.where(real, p * (log_p + h), 0.0)
    grad_out[...] = jnp.where(real, grad, 0.0).astype(grad_out.dtype)


# ---- pallas_call wiring ----


def _on_tpu_or_interpreted(call, *args):
    """call(*args, interpret=...) with the Mosaic kernel on TPU and interpret mode elsewhere.

    Decided when lowering, not from jax.default_backend(): a TPU export from a
    CPU host gets the real kernel, a CPU run the interpreter.
    """
    return jax.lax.platform_dependent(
        *args,
        tpu=functools.partial(call, interpret=False),
        default=functools.partial(call, interpret=True),
    )


def _scalars(divisor):
    """The kernels' SMEM scalars: [1 / k]."""
    return jnp.reshape(1.0 / jnp.asarray(divisor, jnp.float32), (1,))


def token_statistics(logits, safe_tokens, divisor, block_sizes):
    """Per-token (log_softmax(x)[y], entropy, row max of z, log S), each [B, T] f32.

    logits [B, T, V] f32|bf16; safe_tokens [B, T] i32 in [0, V); divisor k
    (f32 scalar): x = z / k. log S = LSE((z - max z) / k).
    """
    batch, time, vocab = logits.shape
    time_tile, vocab_tile = block_sizes.tiles(time, vocab)
    padded_time = _round_up(time, time_tile)
    grid = (batch, padded_time // time_tile, pl.cdiv(vocab, vocab_tile))
    row_spec = pl.BlockSpec((None, time_tile, LANES), per_token_block)
    row_shape = jax.ShapeDtypeStruct((batch, padded_time, LANES), jnp.float32)

    def call(scalars, tokens, logits, *, interpret):
        return pl.pallas_call(
            functools.partial(_statistics_kernel, vocab_size=vocab),
            out_shape=(row_shape,) * 4,
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1,
                grid=grid,
                in_specs=[row_spec, pl.BlockSpec((None, time_tile, vocab_tile), logits_block)],
                out_specs=(row_spec,) * 4,
                scratch_shapes=[pltpu.VMEM((time_tile, LANES), jnp.float32)] * 4,
            ),
            compiler_params=pltpu.CompilerParams(
                dimension_semantics=("parallel", "parallel", "arbitrary")
            ),
            interpret=interpret,
            name="grpo_token_statistics",
        )(scalars, tokens, logits)

    rows = _on_tpu_or_interpreted(
        call, _scalars(divisor), to_rows(safe_tokens, padded_time, 0), logits
    )
    return tuple(time_rows(r, time) for r in rows)


def logits_gradient(logits, safe_tokens, row_max, log_sum, entropy, coef_logp, coef_entropy,
                    divisor, block_sizes):
    """d loss / d logits [B, T, V] in the logits' dtype.

    grad[b, t, v] = a (onehot(y)_v - p_v) + c p_v (log p_v + entropy), with
    a = coef_logp, c = coef_entropy ([B, T] f32) and p from the row max and
    log S of `token_statistics`.
    """
    batch, time, vocab = logits.shape
    time_tile, vocab_tile = block_sizes.tiles(time, vocab)
    padded_time = _round_up(time, time_tile)
    grid = (batch, padded_time // time_tile, pl.cdiv(vocab, vocab_tile))
    row_spec = pl.BlockSpec((None, time_tile, LANES), per_token_block)
    tile_spec = pl.BlockSpec((None, time_tile, vocab_tile), logits_block)

    def call(scalars, *inputs, interpret):
        return pl.pallas_call(
            functools.partial(_gradient_kernel, vocab_size=vocab),
            out_shape=jax.ShapeDtypeStruct(logits.shape, logits.dtype),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1,
                grid=grid,
                in_specs=[row_spec] * 6 + [tile_spec],
                out_specs=tile_spec,
            ),
            compiler_params=pltpu.CompilerParams(
                dimension_semantics=("parallel", "parallel", "parallel")
            ),
            interpret=interpret,
            name="grpo_logits_gradient",
        )(scalars, *inputs)

    # Padded rows get a = c = 0 and harmless statistics; their output rows are dropped.
    rows = [to_rows(safe_tokens, padded_time, 0)] + [
        to_rows(x, padded_time, 0.0) for x in (row_max, log_sum, entropy, coef_logp, coef_entropy)
    ]
    return _on_tpu_or_interpreted(call, _scalars(divisor), *rows, logits)
