"""Fused LM-head GRPO at the memory frontier: vocabulary-outer, two passes (XLA, any backend).

Pass 1 (forward) walks the vocabulary in chunks of `vocab_chunk` columns:
logits_c = hidden @ lm_head[:, c] (matmul 1) feeds the online row
statistics of fused.common (max, LSE, E_p[t], z_y); the [B*T, V] logits
never exist. Pass 2 (backward) walks the chunks again, in tiles of
`token_block` tokens: it recomputes the tile's logits (matmul 2), forms dz
from the saved per-token statistics, adds dz @ lm_head[:, c].T into d hidden
(matmul 3) and accumulates d lm_head[:, c] = hidden.T @ dz (matmul 4) over
the tiles; each chunk's columns of d lm_head are then final and written
once. Residuals are the inputs and three [B*T] vectors. V need not be a
multiple of any block: remainders are smaller blocks (common.
chunk_loop, static_blocks); lm_head is never padded or copied whole.

The custom_vjp covers only (hidden, lm_head) -> (logp, entropy) per token;
the PPO/KL/entropy terms and the aggregation are `objective`'s blocks,
differentiated by JAX, so their cotangents arrive here as g_logp, g_ent.

XLA:CPU shapes the data movement (see common on slicing lm_head):
chunks are sliced from static blocks of `lm_head_block` columns, and a bf16
d lm_head is built in each block's integer buffer, written to the output
once per block.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp

from grpo_kernels.fused import common


@dataclasses.dataclass(frozen=True)
class ChunkedConfig:
    """Block sizes of the chunked path (defaults sized for V = 151936, H = 1536).

    vocab_chunk: lm_head columns per chunk, the unit of both passes.
    token_block: tokens per backward tile; bounds the [token_block, vocab_chunk]
        f32 tiles whatever B*T is.
    lm_head_block: columns per static block of lm_head (a multiple of
        vocab_chunk): the [H, lm_head_block] slice the chunks are cut from;
        for bf16, also V / lm_head_block whole-output writes of d lm_head.
    """

    vocab_chunk: int = 2048
    token_block: int = 2048
    lm_head_block: int = 32768

    def __post_init__(self):
        for name in ("vocab_chunk", "token_block", "lm_head_block"):
            if getattr(self, name) < 1:
                raise ValueError(f"ChunkedConfig.{name} = {getattr(self, name)}; must be >= 1")
        if self.lm_head_block % self.vocab_chunk:
            raise ValueError(
                f"ChunkedConfig.lm_head_block = {self.lm_head_block} must be a multiple of "
                f"vocab_chunk = {self.vocab_chunk}"
            )


DEFAULT_CONFIG = ChunkedConfig()


def _rows(array, start, size):
    return jax.lax.dynamic_slice_in_dim(array, start, size, axis=0)


def _after(column, witness):
    """column, but data-dependent on witness (an f32 scalar some loop produced).

    witness < -inf never holds (NaN included), so the value is unchanged;
    XLA does not fold it (it does fold witness**2 < 0), so whatever is sliced at the result
    waits for that loop. XLA:CPU's scheduler otherwise materialises every
    block's slice of lm_head at the start of the program (all of lm_head
    again), and folds a loop-carried column away as a known trip count.
    """
    return column + (witness < -jnp.inf).astype(column.dtype)


def _walk_blocks(lm_head_view, blocks, column, chunk_step, block_done, witness, carry):
    """(carry, end column) after every chunk of the vocabulary, block by block.

    Each static block of `lm_head_block` columns is sliced from lm_head_view
    (common.lm_head_bits) at the traced `column`, made dependent on
    the previous block's loop through witness(carry) (see _after): one
    block's slice exists at a time.

    chunk_step(block, start, offset, size, carry) -> (carry, block) handles the
    chunk of columns [start, start + size) = block[:, offset:offset + size],
    and may rewrite the block; block_done(block, block_start, carry) -> carry.
    """
    vocab = lm_head_view.shape[1]
    for block_start, block_size in common.static_blocks(vocab, blocks.lm_head_block):
        block = jax.lax.dynamic_slice_in_dim(lm_head_view, column, block_size, axis=1)

        def step(offset, size, state, block_start=block_start):
            carry, block = state
            return chunk_step(block, block_start + offset, offset, size, carry)

        carry, block = common.chunk_loop(block_size, blocks.vocab_chunk, step, (carry, block))
        carry = block_done(block, block_start, carry)
        column = _after(column + block_size, witness(carry))
    return carry, column


def _forward_stats(hidden_rows, lm_head, safe_tokens, inv_tau, temperature_mode, blocks):
    """(logp, entropy, SoftmaxSummary, end column) of every row: pass 1."""

    def see_chunk(block, start, offset, size, stats):
        columns = common.block_columns(block, offset, size, lm_head.dtype)
        logits = common.chunk_logits(hidden_rows, columns)
        stats = common.accumulate_row_stats(
            stats, logits, start, safe_tokens, inv_tau, temperature_mode
        )
        return stats, block

    stats, column = _walk_blocks(
        common.lm_head_bits(lm_head, jnp.uint16), blocks, jnp.int32(0), see_chunk,
        lambda block, block_start, stats: stats, lambda stats: stats.sum_exp[0, 0],
        common.empty_row_stats(hidden_rows.shape[0]),
    )
    return (*common.finish_row_stats(stats, inv_tau, temperature_mode), column)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def token_logp_and_entropy(hidden_rows, lm_head, safe_tokens, inv_tau, temperature_mode, blocks):
    """(logp, entropy) [n, 1] of hidden_rows [n, H] @ lm_head [H, V] (docs/spec.md, per token).

    safe_tokens [n, 1] i32 in [0, V); inv_tau f32 scalar (not differentiated);
    blocks a ChunkedConfig.
    """
    logp, entropy, _, _ = _forward_stats(
        hidden_rows, lm_head, safe_tokens, inv_tau, temperature_mode, blocks
    )
    return logp, entropy


def _stats_fwd(hidden_rows, lm_head, safe_tokens, inv_tau, temperature_mode, blocks):
    logp, entropy, summary, column = _forward_stats(
        hidden_rows, lm_head, safe_tokens, inv_tau, temperature_mode, blocks
    )
    return (logp, entropy), (hidden_rows, lm_head, safe_tokens, inv_tau, summary, column)


def _stats_bwd(temperature_mode, blocks, residuals, cotangents):
    """Pass 2: per chunk, recompute logits; d hidden += dz @ W_c.T; d W_c = hidden.T @ dz."""
    hidden_rows, lm_head, safe_tokens, inv_tau, summary, forward_end = residuals
    rows_total, width = hidden_rows.shape
    gy, ge = common.logit_coefficients(*cotangents, inv_tau, temperature_mode)
    hidden_t = hidden_rows.T.astype(common.F32)  # [H, n], transposed once for matmul 4
    token_block = min(blocks.token_block, rows_total)

    def chunk_step(block, start, offset, size, d_hidden):
        columns = common.block_columns(block, offset, size, lm_head.dtype)

        def tile(row, rows, carry):
            d_hidden, d_columns = carry
            take = lambda a: _rows(a, row, rows)
            logits = common.chunk_logits(take(hidden_rows), columns)
            dz = common.logits_cotangent(
                logits, start, jax.tree.map(take, summary), take(safe_tokens), take(gy), take(ge),
                inv_tau, temperature_mode,
            )
            d_rows = take(d_hidden) + common.hidden_cotangent(dz, columns)
            d_columns = d_columns + common.lm_head_cotangent(
                jax.lax.dynamic_slice_in_dim(hidden_t, row, rows, axis=1), dz
            )
            return jax.lax.dynamic_update_slice_in_dim(d_hidden, d_rows, row, axis=0), d_columns

        d_hidden, d_columns = common.chunk_loop(
            rows_total, token_block, tile, (d_hidden, jnp.zeros((width, size), common.F32))
        )
        # The chunk's gradient replaces its (already read) lm_head columns in
        # the block, as bits: an integer dynamic-update-slice stays in place,
        # where XLA:CPU rewrites the whole buffer for a bf16 one.
        d_columns = d_columns.astype(lm_head.dtype)
        if block.dtype != lm_head.dtype:
            d_columns = jax.lax.bitcast_convert_type(d_columns, block.dtype)
        return d_hidden, jax.lax.dynamic_update_slice_in_dim(block, d_columns, offset, axis=1)

    def write_block(block, block_start, carry):
        d_hidden, d_lm_head = carry
        block_grad = common.block_columns(block, 0, block.shape[1], lm_head.dtype)
        d_lm_head = jax.lax.dynamic_update_slice_in_dim(d_lm_head, block_grad, block_start, axis=1)
        return d_hidden, d_lm_head

    def chunk_step_carrying_output(block, start, offset, size, carry):
        d_hidden, d_lm_head = carry
        d_hidden, block = chunk_step(block, start, offset, size, d_hidden)
        return (d_hidden, d_lm_head), block

    # int16 bits (the forward sliced uint16): distinct values, never merged.
    # The start, forward_end - V = 0, is traced: the first block waits for pass 1.
    (d_hidden, d_lm_head), _ = _walk_blocks(
        common.lm_head_bits(lm_head, jnp.int16), blocks, forward_end - lm_head.shape[1],
        chunk_step_carrying_output, write_block, lambda carry: carry[1][0, 0].astype(common.F32),
        (jnp.zeros(hidden_rows.shape, common.F32), jnp.zeros(lm_head.shape, lm_head.dtype)),
    )
    return d_hidden.astype(hidden_rows.dtype), d_lm_head, None, None


token_logp_and_entropy.defvjp(_stats_fwd, _stats_bwd)


def grpo_loss(*, hidden, lm_head, tokens, mask, advantages, old_logp, ref_logp, hparams, config,
              is_weights=None, block_config=DEFAULT_CONFIG):
    """GRPO loss of docs/spec.md, fused kind, without materialising [B*T, V] logits.

    hidden [B, T, H] bf16|f32; lm_head [H, V] bf16|f32; the rest as in
    logits.reference.grpo_loss (keyword arguments of the adapter). Returns
    (loss, {"logp", "per_token_loss", "entropy"}). docs/spec.md v2: every switch but
    logit_transform (refused: the tiles hold raw hidden @ lm_head).
    """
    return common.grpo_loss_from_statistics(
        token_logp_and_entropy, implementation="fused_chunked", hidden=hidden, lm_head=lm_head, tokens=tokens, mask=mask,
        advantages=advantages, old_logp=old_logp, ref_logp=ref_logp, is_weights=is_weights,
        hparams=hparams, config=config, block_config=block_config,
    )


grpo_loss.spec_version = 2
