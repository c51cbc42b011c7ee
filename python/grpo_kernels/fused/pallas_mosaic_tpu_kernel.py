"""Pallas TPU kernels of the fused LM-head path (the wiring is in pallas_mosaic_tpu.py).

Three kernels over a grid of (token block, vocabulary block) tiles, each
tile computing its logits = hidden_tile @ lm_head_tile on the MXU (f32
accumulation) and never storing them:

    row_stats       grid (token blocks, vocab blocks), vocab innermost:
                    common's online row statistics, accumulated in the
                    [tn, 1] output blocks while they stay resident.
    hidden_grad     grid (token blocks, vocab blocks): dz of the tile, then
                    d hidden_tile += dz @ lm_head_tile.T in a VMEM f32 scratch.
    lm_head_grad    grid (vocab blocks, token blocks): dz of the tile, then
                    d lm_head_tile += hidden_tile.T @ dz in a VMEM f32 scratch.

The per-element math is common's (the same functions the XLA paths
run), with one_reduction=False. The vocabulary need not be a multiple of
the block: the last block overhangs lm_head, its extra columns hold
unspecified values and are masked (logits to -inf and dz to 0 in every
tile; the lm_head tile's overhang to 0 in the last block, since 0 x garbage
could be NaN). Likewise rows past B*T in the last token block are zeroed
before the d lm_head reduction over tokens. Interpret mode fills overhangs
with NaN, so the CPU checks exercise every mask.

Block shapes follow the TPU tiling rule (last two block dims multiples of
(8, 128) or the full dims): hidden (tn, H), lm_head (H, tv), per-token
vectors (tn, 1); 1/tau travels in SMEM.

The gradient matmuls follow what the plain path's f32-cotangent dots do on
the same platform, so each backend is at parity with its own baseline:
`exact_grad_matmuls` False (TPU) feeds the MXU operands in the gradient's
dtype (a bf16 gradient rounds dz to bf16, as XLA's default precision does for
the plain path's f32 x bf16 dot); True (interpret mode, CPU) keeps dz and
the tiles in f32, as XLA:CPU computes that dot.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from grpo_kernels.fused import common

F32 = jnp.float32


def _column_valid(shape, block_index, block, vocab):
    """[*, tv] bool: which columns of this vocab block are inside the vocabulary (None: all)."""
    if vocab % block == 0:
        return None
    columns = block_index * block + jax.lax.broadcasted_iota(jnp.int32, shape, 1)
    return columns < vocab


def _row_valid(shape, block_index, block, rows):
    if rows % block == 0:
        return None
    return block_index * block + jax.lax.broadcasted_iota(jnp.int32, shape, 0) < rows


def _zero_overhang(tile, is_last, valid):
    """tile with the positions `valid` (a function of the tile's shape) rejects zeroed.

    Only the last block overhangs the array, so the select runs there alone
    (lax.cond: an [H, tile] select every step would cost VPU time per MXU step).
    """
    zero = jnp.zeros((), tile.dtype)
    return jax.lax.cond(
        is_last, lambda t: jnp.where(valid(t.shape), t, zero), lambda t: t, tile
    )


def _tile_logits(hidden_ref, lm_head_ref):
    return jnp.dot(hidden_ref[...], lm_head_ref[...], preferred_element_type=F32)


def _summary(row_max_ref, log_sum_ref, mean_centred_ref):
    return common.SoftmaxSummary(row_max_ref[...], log_sum_ref[...], mean_centred_ref[...])


def _stats_kernel(inv_tau_ref, hidden_ref, lm_head_ref, tokens_ref,
                  row_max_ref, sum_exp_ref, sum_exp_centred_ref, chosen_ref,
                  *, temperature_mode, vocab, vocab_block):
    j = pl.program_id(1)
    outputs = (row_max_ref, sum_exp_ref, sum_exp_centred_ref, chosen_ref)

    @pl.when(j == 0)
    def _():
        row_max_ref[...] = jnp.full(row_max_ref.shape, -jnp.inf, F32)
        for ref in outputs[1:]:
            ref[...] = jnp.zeros(ref.shape, F32)

    logits = _tile_logits(hidden_ref, lm_head_ref)
    stats = common.accumulate_row_stats(
        common.RowStats(*(ref[...] for ref in outputs)),
        logits,
        j * vocab_block,
        tokens_ref[...],
        inv_tau_ref[0, 0],
        temperature_mode,
        column_valid=_column_valid(logits.shape, j, vocab_block, vocab),
        one_reduction=False,
    )
    for ref, value in zip(outputs, stats):
        ref[...] = value


def _tile_cotangent(j_vocab, inv_tau_ref, hidden_ref, lm_head_ref, tokens_ref,
                    row_max_ref, log_sum_ref, mean_centred_ref, gy_ref, ge_ref,
                    *, temperature_mode, vocab, vocab_block):
    """dz [tn, tv] f32 of the tile (0 in columns past the vocabulary)."""
    logits = _tile_logits(hidden_ref, lm_head_ref)
    return common.logits_cotangent(
        logits, j_vocab * vocab_block, _summary(row_max_ref, log_sum_ref, mean_centred_ref),
        tokens_ref[...], gy_ref[...], ge_ref[...], inv_tau_ref[0, 0], temperature_mode,
        column_valid=_column_valid(logits.shape, j_vocab, vocab_block, vocab),
    )


def _matmul_dtype(output_dtype, exact):
    return F32 if exact else output_dtype


def _hidden_grad_kernel(inv_tau_ref, hidden_ref, lm_head_ref, tokens_ref, row_max_ref,
                        log_sum_ref, mean_centred_ref, gy_ref, ge_ref, d_hidden_ref, acc_ref,
                        *, exact_grad_matmuls, **static):
    j = pl.program_id(1)

    @pl.when(j == 0)
    def _():
        acc_ref[...] = jnp.zeros(acc_ref.shape, F32)

    dz = _tile_cotangent(
        j, inv_tau_ref, hidden_ref, lm_head_ref, tokens_ref, row_max_ref, log_sum_ref,
        mean_centred_ref, gy_ref, ge_ref, **static,
    )
    lm_head_tile = lm_head_ref[...]
    vocab, vocab_block = static["vocab"], static["vocab_block"]
    if vocab % vocab_block:  # overhanging columns: unspecified values, 0 x garbage could be NaN
        lm_head_tile = _zero_overhang(
            lm_head_tile, j == pl.num_programs(1) - 1,
            lambda shape: _column_valid(shape, j, vocab_block, vocab),
        )
    dtype = _matmul_dtype(d_hidden_ref.dtype, exact_grad_matmuls)
    acc_ref[...] += jax.lax.dot_general(
        dz.astype(dtype), lm_head_tile.astype(dtype), (((1,), (1,)), ((), ())),
        preferred_element_type=F32,
    )

    @pl.when(j == pl.num_programs(1) - 1)
    def _():
        d_hidden_ref[...] = acc_ref[...].astype(d_hidden_ref.dtype)


def _lm_head_grad_kernel(inv_tau_ref, hidden_ref, lm_head_ref, tokens_ref, row_max_ref,
                         log_sum_ref, mean_centred_ref, gy_ref, ge_ref, d_lm_head_ref, acc_ref,
                         *, rows, token_block, exact_grad_matmuls, **static):
    j, i = pl.program_id(0), pl.program_id(1)

    @pl.when(i == 0)
    def _():
        acc_ref[...] = jnp.zeros(acc_ref.shape, F32)

    dz = _tile_cotangent(
        j, inv_tau_ref, hidden_ref, lm_head_ref, tokens_ref, row_max_ref, log_sum_ref,
        mean_centred_ref, gy_ref, ge_ref, **static,
    )
    dtype = _matmul_dtype(d_lm_head_ref.dtype, exact_grad_matmuls)
    hidden_tile = hidden_ref[...].astype(dtype)
    if rows % token_block:  # rows past B*T: unspecified values, 0 x garbage could be NaN
        is_last = i == pl.num_programs(1) - 1
        valid = lambda shape: _row_valid(shape, i, token_block, rows)
        dz = _zero_overhang(dz, is_last, valid)
        hidden_tile = _zero_overhang(hidden_tile, is_last, valid)
    acc_ref[...] += jax.lax.dot_general(
        hidden_tile, dz.astype(dtype), (((0,), (0,)), ((), ())), preferred_element_type=F32
    )

    @pl.when(i == pl.num_programs(1) - 1)
    def _():
        d_lm_head_ref[...] = acc_ref[...].astype(d_lm_head_ref.dtype)


def _blocks(rows, vocab, blocks):
    """(tn, tv): the configured blocks, or the full dims when those are smaller."""
    return min(blocks.token_block, rows), min(blocks.vocab_block, vocab)


def _compiler_params(blocks, semantics):
    return pltpu.CompilerParams(
        dimension_semantics=semantics, vmem_limit_bytes=blocks.vmem_limit_bytes
    )


_SMEM = pl.BlockSpec(memory_space=pltpu.SMEM)


def row_stats(hidden_rows, lm_head, safe_tokens, inv_tau, *, temperature_mode, blocks, interpret):
    """RowStats [n, 1] of hidden_rows [n, H] @ lm_head [H, V] (no [n, V] array)."""
    rows, width = hidden_rows.shape
    vocab = lm_head.shape[1]
    tn, tv = _blocks(rows, vocab, blocks)
    column = lambda i, j: (i, 0)
    kernel = functools.partial(
        _stats_kernel, temperature_mode=temperature_mode, vocab=vocab, vocab_block=tv
    )
    outputs = pl.pallas_call(
        kernel,
        grid=(pl.cdiv(rows, tn), pl.cdiv(vocab, tv)),
        in_specs=[
            _SMEM,
            pl.BlockSpec((tn, width), lambda i, j: (i, 0)),
            pl.BlockSpec((width, tv), lambda i, j: (0, j)),
            pl.BlockSpec((tn, 1), column),
        ],
        out_specs=[pl.BlockSpec((tn, 1), column)] * 4,
        out_shape=[jax.ShapeDtypeStruct((rows, 1), F32)] * 4,
        compiler_params=_compiler_params(blocks, ("parallel", "arbitrary")),
        interpret=interpret,
        name="fused_grpo_row_stats",
    )(inv_tau.reshape(1, 1), hidden_rows, lm_head, safe_tokens)
    return common.RowStats(*outputs)


def _grad_inputs(inv_tau, hidden_rows, lm_head, safe_tokens, summary, gy, ge):
    return (inv_tau.reshape(1, 1), hidden_rows, lm_head, safe_tokens, *summary, gy, ge)


def hidden_grad(hidden_rows, lm_head, safe_tokens, inv_tau, summary, gy, ge, *,
                temperature_mode, blocks, interpret, exact_grad_matmuls):
    """d hidden [n, H] (hidden's dtype) for the logit cotangents of logits_cotangent."""
    rows, width = hidden_rows.shape
    vocab = lm_head.shape[1]
    tn, tv = _blocks(rows, vocab, blocks)
    column = pl.BlockSpec((tn, 1), lambda i, j: (i, 0))
    kernel = functools.partial(
        _hidden_grad_kernel, temperature_mode=temperature_mode, vocab=vocab, vocab_block=tv,
        exact_grad_matmuls=exact_grad_matmuls,
    )
    return pl.pallas_call(
        kernel,
        grid=(pl.cdiv(rows, tn), pl.cdiv(vocab, tv)),
        in_specs=[
            _SMEM,
            pl.BlockSpec((tn, width), lambda i, j: (i, 0)),
            pl.BlockSpec((width, tv), lambda i, j: (0, j)),
        ] + [column] * 6,
        out_specs=pl.BlockSpec((tn, width), lambda i, j: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((rows, width), hidden_rows.dtype),
        scratch_shapes=[pltpu.VMEM((tn, width), F32)],
        compiler_params=_compiler_params(blocks, ("parallel", "arbitrary")),
        interpret=interpret,
        name="fused_grpo_hidden_grad",
    )(*_grad_inputs(inv_tau, hidden_rows, lm_head, safe_tokens, summary, gy, ge))


def lm_head_grad(hidden_rows, lm_head, safe_tokens, inv_tau, summary, gy, ge, *,
                 temperature_mode, blocks, interpret, exact_grad_matmuls):
    """d lm_head [H, V] (lm_head's dtype), each vocab block reduced over all token blocks."""
    rows, width = hidden_rows.shape
    vocab = lm_head.shape[1]
    tn, tv = _blocks(rows, vocab, blocks)
    column = pl.BlockSpec((tn, 1), lambda j, i: (i, 0))
    kernel = functools.partial(
        _lm_head_grad_kernel, temperature_mode=temperature_mode, vocab=vocab, vocab_block=tv,
        rows=rows, token_block=tn, exact_grad_matmuls=exact_grad_matmuls,
    )
    return pl.pallas_call(
        kernel,
        grid=(pl.cdiv(vocab, tv), pl.cdiv(rows, tn)),
        in_specs=[
            _SMEM,
            pl.BlockSpec((tn, width), lambda j, i: (i, 0)),
            pl.BlockSpec((width, tv), lambda j, i: (0, j)),
        ] + [column] * 6,
        out_specs=pl.BlockSpec((width, tv), lambda j, i: (0, j)),
        out_shape=jax.ShapeDtypeStruct((width, vocab), lm_head.dtype),
        scratch_shapes=[pltpu.VMEM((width, tv), F32)],
        compiler_params=_compiler_params(blocks, ("parallel", "arbitrary")),
        interpret=interpret,
        name="fused_grpo_lm_head_grad",
    )(*_grad_inputs(inv_tau, hidden_rows, lm_head, safe_tokens, summary, gy, ge))
