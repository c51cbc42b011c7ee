"""What the fused LM-head paths share: input checks, per-chunk softmax math, the loss.

The fused kind (docs/spec.md) takes hidden [B, T, H] and lm_head [H, V] with
logits = hidden @ lm_head (f32 accumulation). The chunked paths never hold a
row of logits at once; they see it a vocabulary chunk at a time, so the
per-token statistics of docs/spec.md are built online:

    t_v  = (z_v - m) * a          m = row max of z, a = 1/tau (logits mode) or 1 (logp mode)
    S0   = sum_v exp(t_v)          log_sum = log S0 = LSE(t)
    S1   = sum_v exp(t_v) t_v      mean_centred = S1 / S0 = E_p[t]
    logp = (t_y - log_sum) * c     c = 1 (logits mode) or 1/tau (logp mode)
    ent  = log_sum - mean_centred  (both terms >= 0: no cancellation)

Centring on the row max before scaling by 1/tau is what `objective` does
too: z - m is exact where z / tau would round a large common offset.

The backward of (logp, ent) with cotangents (g_logp, g_ent) is, per logit,

    dz_v = gy * onehot(y)_v - p_v * (gy + ge * (t_v - mean_centred)),
    gy = g_logp / tau,   ge = g_ent * a,   p_v = exp(t_v - log_sum),

the chain rule through docs/spec.md's d logp / d z and d ent / d z. Everything
after (logp, ent) -- PPO, KL, entropy bonus, aggregation -- is `objective`'s
building blocks, so the coefficients g_logp, g_ent come from JAX's autodiff
of those blocks (or `loss_coefficients`, which is that vjp), never from a
second hand-written copy of docs/spec.md.

Per-token vectors are [n, 1] columns: the same functions run on whole XLA
chunks and inside Pallas TPU kernels, where rank-1 vectors do not tile.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from grpo_kernels import objective

F32 = jnp.float32


def check_fused_inputs(*, hidden, lm_head, tokens, mask, advantages, old_logp, ref_logp, config):
    """(B, T, H, V) of valid fused-kind inputs, or a ValueError naming the input."""
    if hidden.ndim != 3:
        raise ValueError(f"hidden has shape {list(hidden.shape)}; expected [B, T, H]")
    batch, time, width = hidden.shape
    if lm_head.ndim != 2:
        raise ValueError(f"lm_head has shape {list(lm_head.shape)}; expected [H, V] = [{width}, V]")
    if lm_head.shape[0] != width:
        hint = (
            " (it looks like the [V, H] layout: pass lm_head.T, since logits = hidden @ lm_head)"
            if lm_head.shape[1] == width
            else ""
        )
        raise ValueError(
            f"lm_head has shape {list(lm_head.shape)} but hidden {list(hidden.shape)} has "
            f"H = {width}; expected lm_head [H, V] = [{width}, V]{hint}"
        )
    vocab = lm_head.shape[1]
    for name, array, want in (
        ("tokens", tokens, (batch, time)),
        ("mask", mask, (batch, time)),
        ("advantages", advantages, (batch,)),
        ("old_logp", old_logp, (batch, time)),
        ("ref_logp", ref_logp, (batch, time)),
    ):
        if array is not None and tuple(array.shape) != want:
            raise ValueError(
                f"{name} has shape {list(array.shape)}; expected {list(want)} "
                f"for hidden {list(hidden.shape)}"
            )
    for name, array in (("hidden", hidden), ("lm_head", lm_head)):
        if array.dtype not in (jnp.float32, jnp.bfloat16):
            raise ValueError(f"{name} has dtype {array.dtype}; expected float32 or bfloat16")
    objective.check_policy_inputs(old_logp, ref_logp, config)
    if config["temperature_mode"] not in objective.TEMPERATURE_MODES:
        raise ValueError(
            f"temperature_mode = {config['temperature_mode']!r}; "
            f"expected one of {objective.TEMPERATURE_MODES}"
        )
    return batch, time, width, vocab


# Slicing lm_head on XLA:CPU. XLA:CPU has no bf16 data movement: a bf16
# dynamic-slice becomes convert-to-f32, slice, convert back, and the convert of
# the loop-invariant lm_head is then hoisted out of the chunk loop, an [H, V]
# f32 temporary (0.93 GB at H = 1536, V = 151936). Slicing the 16-bit
# integer patterns instead is exact and stays in place, but the bitcast of a
# whole loop-invariant lm_head is hoisted as well: an integer copy of it
# (0.47 GB). The chunked path therefore slices a block of columns (outside any
# loop) as bits, and its chunk loop slices that block (`block_columns`).


def lm_head_bits(lm_head, bits=jnp.uint16):
    """lm_head as 16-bit integer patterns (bf16), or itself (f32): what blocks are sliced from.

    Views with different `bits` are different values to XLA, so common-
    subexpression elimination cannot merge the forward's blocks with the
    backward's (and keep them alive in between).
    """
    if lm_head.dtype == jnp.bfloat16:
        return jax.lax.bitcast_convert_type(lm_head, bits)
    return lm_head


def block_columns(view, offset, size, dtype):
    """Columns [offset, offset + size) of a bits view, in dtype (offset may be traced)."""
    columns = jax.lax.dynamic_slice_in_dim(view, offset, size, axis=1)
    if view.dtype != dtype:
        return jax.lax.bitcast_convert_type(columns, dtype)
    return columns


def lm_head_columns(lm_head, start, size):
    """lm_head[:, start:start + size] (start traced, size static), via a whole-lm_head view."""
    return block_columns(lm_head_bits(lm_head), start, size, lm_head.dtype)


def static_blocks(total, block):
    """[(start, size)] covering [0, total): full blocks, then the remainder."""
    starts = range(0, total, block)
    return [(start, min(block, total - start)) for start in starts]


def chunk_logits(hidden_rows, lm_head_chunk):
    """logits [n, C] f32 = hidden_rows [n, H] @ lm_head_chunk [H, C], f32 accumulation."""
    return jnp.dot(hidden_rows, lm_head_chunk, preferred_element_type=F32)


def hidden_cotangent(logits_cotangent, lm_head_chunk):
    """d hidden [n, H] f32 = dz [n, C] @ lm_head_chunk.T; dz stays f32, as in the baseline."""
    return jax.lax.dot_general(
        logits_cotangent, lm_head_chunk.astype(F32), (((1,), (1,)), ((), ())),
        preferred_element_type=F32,
    )


def lm_head_cotangent(hidden_rows_t, logits_cotangent):
    """d lm_head chunk [H, C] f32 = hidden_rows.T [H, n] (f32) @ dz [n, C] f32."""
    return jnp.dot(hidden_rows_t, logits_cotangent, preferred_element_type=F32)


def chunk_loop(total, chunk, body, carry):
    """carry after body(start, size, carry) over [0, total) in chunks of `chunk`.

    A remainder chunk (total % chunk != 0) runs first, once, with its own
    static size, over [0, remainder); the full chunks follow in a fori_loop
    (start traced, size static). No operand is ever padded. Remainder first
    so that the loop is the last writer of the carry: XLA then builds a
    loop-carried output in place instead of copying it after a tail step.
    """
    full, remainder = divmod(total, chunk)
    if remainder:
        carry = body(0, remainder, carry)
    if full == 1:
        carry = body(remainder, chunk, carry)
    elif full > 1:
        carry = jax.lax.fori_loop(
            0, full, lambda i, c: body(remainder + i * chunk, chunk, c), carry
        )
    return carry


def _scaled(centred_logits, inv_tau, temperature_mode):
    """t = (z - m) / tau in logits mode, z - m in logp mode."""
    return centred_logits * inv_tau if temperature_mode == "logits" else centred_logits


class RowStats(NamedTuple):
    """Online softmax statistics of each token's logit row, [n, 1] f32 columns."""

    row_max: jax.Array  # m: max of the raw logits seen so far
    sum_exp: jax.Array  # S0 relative to m
    sum_exp_centred: jax.Array  # S1 relative to m
    chosen_logit: jax.Array  # z_y (0 until y's chunk is seen)


def empty_row_stats(rows):
    column = jnp.zeros((rows, 1), F32)
    return RowStats(jnp.full((rows, 1), -jnp.inf, F32), column, column, column)


def _onehot(shape, column_start, safe_tokens):
    columns = column_start + jax.lax.broadcasted_iota(jnp.int32, shape, 1)
    return columns == safe_tokens


def _row_sums(terms, one_reduction):
    """[n, 1] row sums of each [n, C] term.

    one_reduction: a single variadic reduce, so XLA fuses the terms into it
    and never stores them (separate sums would each materialise an [n, C]
    f32 intermediate on XLA:CPU). XLA:CPU runs a variadic reduce as one
    sequential sum per row, ~20x less accurate than its vectorised jnp.sum at
    C = 2048; so each row is summed as `lanes` interleaved partial sums (the
    columns viewed as [C / lanes, lanes], reduced over the first), then those
    are summed: as accurate as jnp.sum, no slower. Pallas kernels pass False:
    Mosaic lowers plain sums, and its intermediates live in VMEM anyway.
    """
    if not one_reduction:
        return [jnp.sum(term, axis=1, keepdims=True) for term in terms]
    rows, width = terms[0].shape
    lanes = next(k for k in (128, 64, 32, 16, 8, 4, 2, 1) if width % k == 0)
    zeros = tuple(jnp.zeros((), F32) for _ in terms)
    partial_sums = jax.lax.reduce(
        tuple(term.reshape(rows, width // lanes, lanes) for term in terms),
        zeros,
        lambda a, b: tuple(x + y for x, y in zip(a, b)),
        (1,),
    )
    return [jnp.sum(partial, axis=1, keepdims=True) for partial in partial_sums]


def accumulate_row_stats(stats, logits, column_start, safe_tokens, inv_tau, temperature_mode,
                         column_valid=None, one_reduction=True):
    """RowStats after also seeing logits [n, C] (f32) of columns column_start + [0, C).

    safe_tokens [n, 1] i32. column_valid [n or 1, C] bool marks real columns
    where a block overhangs the vocabulary (Pallas); None = all real.
    """
    if column_valid is not None:
        logits = jnp.where(column_valid, logits, -jnp.inf)
    new_max = jnp.maximum(stats.row_max, jnp.max(logits, axis=1, keepdims=True))
    shift = _scaled(stats.row_max - new_max, inv_tau, temperature_mode)  # <= 0; -inf at first
    rescale = jnp.exp(shift)
    # S1 relative to the new max: rescale * (S1 + shift * S0); shift * S0 is 0 * -inf at first.
    shifted_sum = jnp.where(rescale > 0, rescale * shift, 0.0) * stats.sum_exp
    centred = _scaled(logits - new_max, inv_tau, temperature_mode)
    weights = jnp.exp(centred)
    weighted = weights * centred
    if column_valid is not None:
        weights = jnp.where(column_valid, weights, 0.0)
        weighted = jnp.where(column_valid, weighted, 0.0)
    chosen = jnp.where(_onehot(logits.shape, column_start, safe_tokens), logits, 0.0)
    sum_exp, sum_exp_centred, chosen_logit = _row_sums((weights, weighted, chosen), one_reduction)
    return RowStats(
        row_max=new_max,
        sum_exp=rescale * stats.sum_exp + sum_exp,
        sum_exp_centred=rescale * stats.sum_exp_centred + shifted_sum + sum_exp_centred,
        chosen_logit=stats.chosen_logit + chosen_logit,
    )


class SoftmaxSummary(NamedTuple):
    """What the backward needs of each row, [n, 1] f32: p_v = exp(t_v - log_sum)."""

    row_max: jax.Array
    log_sum: jax.Array
    mean_centred: jax.Array


def finish_row_stats(stats, inv_tau, temperature_mode):
    """(logp, entropy, SoftmaxSummary) from complete RowStats; logp and entropy [n, 1]."""
    log_sum = jnp.log(stats.sum_exp)
    mean_centred = stats.sum_exp_centred / stats.sum_exp
    chosen_centred = stats.chosen_logit - stats.row_max
    if temperature_mode == "logits":
        logp = chosen_centred * inv_tau - log_sum
    else:
        logp = (chosen_centred - log_sum) * inv_tau
    entropy = log_sum - mean_centred
    return logp, entropy, SoftmaxSummary(stats.row_max, log_sum, mean_centred)


def logit_coefficients(g_logp, g_entropy, inv_tau, temperature_mode):
    """(gy, ge) [n, 1] of the module docstring from the cotangents of logp and entropy."""
    return g_logp * inv_tau, _scaled(g_entropy, inv_tau, temperature_mode)


def logits_cotangent(logits, column_start, summary, safe_tokens, gy, ge, inv_tau,
                     temperature_mode, column_valid=None):
    """dz [n, C] f32 for logits [n, C] of columns column_start + [0, C) (module docstring)."""
    centred = _scaled(logits - summary.row_max, inv_tau, temperature_mode)
    probs = jnp.exp(centred - summary.log_sum)
    onehot = _onehot(logits.shape, column_start, safe_tokens)
    grad = jnp.where(onehot, gy, 0.0) - probs * (gy + ge * (centred - summary.mean_centred))
    if column_valid is not None:
        grad = jnp.where(column_valid, grad, 0.0)
    return grad


class TokenSide(NamedTuple):
    """The per-token inputs of the loss besides logp and entropy, [B, T] (or [n, 1] slices).

    Every field is per token (advantages and is_weights broadcast), so that a
    path may cut it into [n, 1] columns of tokens (fused_onepass); the rows of
    a TokenSide are then tokens, else sequences.
    """

    tokens: jax.Array  # raw ids (for the out-of-vocabulary poison)
    mask: jax.Array
    advantages: jax.Array  # per token (broadcast from per sequence)
    weights: jax.Array  # aggregation weights: loss = sum(weights * loss_t)
    token_mean_weights: jax.Array | None  # the entropy's, when entropy_aggregation = "token_mean"
    is_weights: jax.Array | None  # rollout correction (broadcast), when given
    old_logp: jax.Array | None
    ref_logp: jax.Array | None


def token_side(tokens, mask, advantages, old_logp, ref_logp, is_weights, hparams, config,
               weights_of=None):
    """TokenSide [B, T] of the adapter inputs.

    weights_of(aggregation) -> weights [B, T]; default objective.aggregation_weights
    (the sharded paths pass their global ones).
    """
    if weights_of is None:
        weights_of = lambda aggregation: objective.aggregation_weights(
            mask, aggregation, hparams["normalizer"]
        )
    entropy_mean = config["entropy_bonus"] and (
        objective.setting(config, "entropy_aggregation") == "token_mean"
    )
    return TokenSide(
        tokens=tokens,
        mask=mask,
        advantages=jnp.broadcast_to(advantages[:, None], mask.shape),
        weights=weights_of(config["aggregation"]),
        token_mean_weights=weights_of("token_mean") if entropy_mean else None,
        is_weights=None if is_weights is None else jnp.broadcast_to(is_weights, mask.shape),
        old_logp=old_logp,
        ref_logp=ref_logp,
    )


def loss_and_aux(logp, entropy, side, vocab, hparams, config):
    """(loss, aux) of the adapter from logp and entropy (shaped like side.mask), via `objective`.

    Each row's advantage is side.advantages[:, 0] (constant along a sequence;
    a token's own in [n, 1] columns).
    """
    return objective.loss_and_aux(
        logp, entropy, tokens=side.tokens, mask=side.mask, advantages=side.advantages[:, 0],
        old_logp=side.old_logp, ref_logp=side.ref_logp, is_weights=side.is_weights, vocab=vocab,
        hparams=hparams, config=config, weights=side.weights,
        token_mean_weights=side.token_mean_weights,
    )


def loss_coefficients(logp, entropy, side, vocab, hparams, config):
    """(d loss / d logp, d loss / d entropy) per token, for the loss of `loss_and_aux`.

    The jax.vjp of `objective`'s blocks: on-policy `old` is stop_gradient(logp)
    there, and kinks split the way autodiff of the baseline splits them.
    """
    _, pull_back = jax.vjp(
        lambda logp, entropy: loss_and_aux(logp, entropy, side, vocab, hparams, config)[0],
        logp, entropy,
    )
    return pull_back(jnp.ones((), F32))


def refuse_logit_transform(implementation, config):
    """The vocabulary-tiled paths see raw hidden @ lm_head tiles: no logit transform."""
    objective.refuse_unless(
        implementation, config, "logit_transform", (False,),
        "(softcap / scale) is not applied inside the vocabulary tiles",
    )


def grpo_loss_from_statistics(token_logp_and_entropy, *, hidden, lm_head, tokens,
                              mask, advantages, old_logp, ref_logp, hparams, config,
                              block_config, is_weights=None, implementation="this fused path"):
    """The fused adapter around a (logp, entropy) custom_vjp over (hidden, lm_head).

    `token_logp_and_entropy(hidden_rows [N, H], lm_head, safe_tokens [N, 1],
    inv_tau, temperature_mode, block_config)` is the path's own kernel; the
    rest (checks, per-token loss, aggregation, aux) is shared. Returns
    (loss, {"logp", "per_token_loss", "entropy"}). Hyperparameters are not
    differentiated. Every v2 switch but the logit transform is supported
    (`implementation` names the path in the refusal). A v1 caller (one
    that passes no `is_weights`, say a kernel of the suite's own fixtures)
    keeps working.
    """
    batch, time, width, vocab = check_fused_inputs(
        hidden=hidden, lm_head=lm_head, tokens=tokens, mask=mask, advantages=advantages,
        old_logp=old_logp, ref_logp=ref_logp, config=config,
    )
    refuse_logit_transform(implementation, config)
    inv_tau = 1.0 / jax.lax.stop_gradient(jnp.asarray(hparams["temperature"], F32))
    logp, entropy = token_logp_and_entropy(
        hidden.reshape(batch * time, width),
        lm_head,
        objective.safe_token_ids(mask, tokens).reshape(-1, 1),
        inv_tau,
        config["temperature_mode"],
        block_config,
    )
    side = token_side(tokens, mask, advantages, old_logp, ref_logp, is_weights, hparams, config)
    return loss_and_aux(
        logp.reshape(batch, time), entropy.reshape(batch, time), side, vocab, hparams, config
    )
