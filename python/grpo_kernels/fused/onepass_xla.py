"""Fused LM-head GRPO at the time frontier: token-outer, one pass (XLA, any backend).

Each chunk of `token_chunk` tokens sees the whole vocabulary at once, so its
log-sum-exp, the loss coefficients and the gradient come in one pass, with
the three matmuls of the plain path and no recomputation:

    logits_c = hidden_c @ lm_head                [n_c, V] f32     (matmul 1)
    online row statistics over its blocks of `vocab_block` columns, then
    logp, entropy; d loss / d (logp, entropy) from the vjp of `objective`'s
    per-token blocks (common.loss_coefficients); then for each block b:
        dz_cb       = common.logits_cotangent(logits_c[:, b])
        d hidden_c += dz_cb @ lm_head[:, b].T                           (matmul 2)
        G[:, b]    += hidden_c.T @ dz_cb          G: [H, V] f32        (matmul 3)

All of it runs in the forward pass, for a unit cotangent. d lm_head needs
every token chunk, so it accumulates in the f32 buffer G across the token
loop; G and the f32 d hidden are the residuals, and the backward only
scales them by the loss cotangent (one fused multiply-and-round, no second
[H, V] copy). The column blocks keep the backward dots' f32 operands (an
[H, vocab_block] slice of lm_head) and the G update small; V and B*T need
not be multiples of the blocks (common.chunk_loop). On XLA:CPU the
blocks of a bf16 lm_head are sliced from its uint16 bit patterns
(common.lm_head_columns): one 0.47 GB copy at V = 151936, in place of
an f32 one twice that size.

Because the gradient is formed for the loss alone, only the loss is
differentiable: a non-zero cotangent on aux (logp, per_token_loss,
entropy) raises NotImplementedError instead of being dropped.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import custom_derivatives

from grpo_kernels.fused import common
from grpo_kernels import objective


@dataclasses.dataclass(frozen=True)
class OnePassConfig:
    """Block sizes of the one-pass path (defaults sized for V = 151936, H = 1536).

    token_chunk: tokens per pass over the vocabulary; its [token_chunk, V] f32
        logits are the largest temporary besides G (0.31 GB at the default).
    vocab_block: columns per block of the row statistics and the gradient dots.
    """

    token_chunk: int = 512
    vocab_block: int = 2048


DEFAULT_CONFIG = OnePassConfig()


def _rows(array, start, size):
    return jax.lax.dynamic_slice_in_dim(array, start, size, axis=0)


def _one_pass(hidden_rows, lm_head, per_token, hparams, config, blocks, with_grads):
    """(logp, entropy) [N, 1] and, when with_grads, (d hidden f32 [N, H], G f32 [H, V]).

    per_token: (safe_tokens [N, 1], TokenSide of [N, 1] columns).
    """
    rows_total, width = hidden_rows.shape
    vocab = lm_head.shape[1]
    mode = config["temperature_mode"]
    inv_tau = 1.0 / jnp.asarray(hparams["temperature"], common.F32)

    def token_chunk(start, size, carry):
        safe_tokens, side = jax.tree.map(lambda a: _rows(a, start, size), per_token)
        rows = _rows(hidden_rows, start, size)
        logits = common.chunk_logits(rows, lm_head)

        def see_block(column, columns, stats):
            # Block by block (an f32 slice of logits, fused into the reduction):
            # shorter row sums, as accurate as the chunked path's.
            logits_block = jax.lax.dynamic_slice_in_dim(logits, column, columns, axis=1)
            return common.accumulate_row_stats(
                stats, logits_block, column, safe_tokens, inv_tau, mode
            )

        stats = common.chunk_loop(
            vocab, blocks.vocab_block, see_block, common.empty_row_stats(size)
        )
        logp, entropy, summary = common.finish_row_stats(stats, inv_tau, mode)
        carry = dict(carry)
        carry["logp"] = jax.lax.dynamic_update_slice_in_dim(carry["logp"], logp, start, axis=0)
        carry["entropy"] = jax.lax.dynamic_update_slice_in_dim(
            carry["entropy"], entropy, start, axis=0
        )
        if not with_grads:
            return carry
        g_logp, g_entropy = common.loss_coefficients(logp, entropy, side, vocab, hparams, config)
        gy, ge = common.logit_coefficients(g_logp, g_entropy, inv_tau, mode)
        rows_t = rows.T.astype(common.F32)

        def vocab_block(column, columns, inner):
            d_rows, d_lm_head = inner
            weights = common.lm_head_columns(lm_head, column, columns)
            dz = common.logits_cotangent(
                jax.lax.dynamic_slice_in_dim(logits, column, columns, axis=1),
                column, summary, safe_tokens, gy, ge, inv_tau, mode,
            )
            d_rows = d_rows + common.hidden_cotangent(dz, weights)
            block_sum = jax.lax.dynamic_slice_in_dim(d_lm_head, column, columns, axis=1)
            block_sum = block_sum + common.lm_head_cotangent(rows_t, dz)
            return d_rows, jax.lax.dynamic_update_slice_in_dim(d_lm_head, block_sum, column, axis=1)

        d_rows, carry["d_lm_head"] = common.chunk_loop(
            vocab, blocks.vocab_block, vocab_block,
            (jnp.zeros((size, width), common.F32), carry["d_lm_head"]),
        )
        carry["d_hidden"] = jax.lax.dynamic_update_slice_in_dim(
            carry["d_hidden"], d_rows, start, axis=0
        )
        return carry

    carry = {
        "logp": jnp.zeros((rows_total, 1), common.F32),
        "entropy": jnp.zeros((rows_total, 1), common.F32),
    }
    if with_grads:
        carry["d_hidden"] = jnp.zeros((rows_total, width), common.F32)
        carry["d_lm_head"] = jnp.zeros((width, vocab), common.F32)
    return common.chunk_loop(rows_total, min(blocks.token_chunk, rows_total), token_chunk, carry)


def _loss_and_aux(hidden, lm_head, inputs, config, blocks, with_grads):
    batch, time, width = hidden.shape
    tokens, side, hparams = inputs
    flat = lambda a: a.reshape(batch * time, 1)
    per_token = (flat(objective.safe_token_ids(side.mask, tokens)), jax.tree.map(flat, side))
    result = _one_pass(
        hidden.reshape(batch * time, width), lm_head, per_token, hparams, config, blocks, with_grads
    )
    loss, aux = common.loss_and_aux(
        result["logp"].reshape(batch, time), result["entropy"].reshape(batch, time),
        side, lm_head.shape[1], hparams, config,
    )
    return loss, aux, result


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _fused_loss(hidden, lm_head, inputs, config_items, blocks):
    loss, aux, _ = _loss_and_aux(hidden, lm_head, inputs, dict(config_items), blocks, False)
    return loss, aux


def _fused_loss_fwd(hidden, lm_head, inputs, config_items, blocks):
    hidden, lm_head, inputs = jax.tree.map(
        lambda p: p.value, (hidden, lm_head, inputs),
        is_leaf=lambda x: isinstance(x, custom_derivatives.CustomVJPPrimal),
    )
    loss, aux, result = _loss_and_aux(hidden, lm_head, inputs, dict(config_items), blocks, True)
    # 0-d arrays carry the primal dtypes (residuals must be arrays).
    dtypes = (jnp.zeros((), hidden.dtype), jnp.zeros((), lm_head.dtype))
    residuals = (result["d_hidden"].reshape(hidden.shape), result["d_lm_head"], dtypes)
    return (loss, aux), residuals


def _fused_loss_bwd(config_items, blocks, residuals, cotangents):
    d_hidden, d_lm_head, (hidden_like, lm_head_like) = residuals
    g_loss, g_aux = cotangents
    live = [k for k, g in g_aux.items() if not isinstance(g, custom_derivatives.SymbolicZero)]
    if live:
        raise NotImplementedError(
            f"fused_onepass differentiates only the loss (its gradient is formed in the forward "
            f"pass); got a cotangent for aux {live}"
        )
    if isinstance(g_loss, custom_derivatives.SymbolicZero):
        g_loss = jnp.zeros((), common.F32)
    g_loss = g_loss.astype(common.F32)
    # One fused multiply-and-round per output: g_loss stays f32, the product is never stored in f32.
    return (
        (g_loss * d_hidden).astype(hidden_like.dtype),
        (g_loss * d_lm_head).astype(lm_head_like.dtype),
        None,
    )


_fused_loss.defvjp(_fused_loss_fwd, _fused_loss_bwd, symbolic_zeros=True)


def grpo_loss(*, hidden, lm_head, tokens, mask, advantages, old_logp, ref_logp, hparams, config,
              is_weights=None, block_config=DEFAULT_CONFIG):
    """GRPO loss of docs/spec.md, fused kind, in one pass over the vocabulary per token chunk.

    hidden [B, T, H] bf16|f32; lm_head [H, V] bf16|f32; the rest as in
    logits.reference.grpo_loss. Returns (loss, {"logp", "per_token_loss", "entropy"});
    only the loss is differentiable. Hyperparameters, advantages and old/ref
    log-probs are not differentiated (stop_gradient).

    docs/spec.md v2: every per-token switch (policy losses, KL estimators, clamps,
    rollout correction, entropy and aggregation weights, which are computed
    over the whole batch before the token loop). Refused: ratio_level
    "sequence" / "sequence_token" (d loss / d logp of a token then depends on
    the logp of every token of its row, which other token chunks hold) and
    logit_transform (the row statistics see raw hidden @ lm_head).
    """
    common.check_fused_inputs(
        hidden=hidden, lm_head=lm_head, tokens=tokens, mask=mask, advantages=advantages,
        old_logp=old_logp, ref_logp=ref_logp, config=config,
    )
    common.refuse_logit_transform("fused_onepass", config)
    objective.refuse_unless(
        "fused_onepass", config, "ratio_level", ("token",),
        "couples every token of a row, but the loss coefficients are formed per token chunk",
    )
    side = common.token_side(
        tokens, mask, advantages, old_logp, ref_logp, is_weights, hparams, config
    )
    hparams = {name: jnp.asarray(value, common.F32) for name, value in hparams.items()}
    inputs = jax.lax.stop_gradient((tokens, side, hparams))
    return _fused_loss(hidden, lm_head, inputs, tuple(sorted(config.items())), block_config)


grpo_loss.spec_version = 2
