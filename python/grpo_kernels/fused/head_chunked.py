"""Cross-entropy and distillation on the fused LM head, token-chunked (XLA, any backend).

The [N, V] logits never exist: the rows are walked in chunks of `chunk` tokens,
each chunk's logits [chunk, V] formed as hidden_c @ lm_head (+ bias) in f32,
its row losses taken by head_losses' row formulas (the same contract, docs/spec.md
"The other losses on the head"), and its gradients taken right there:

- scalar reductions (sum, mean, over_count, batchmean): the forward pass
  accumulates d lm_head and d bias and writes d hidden's chunk rows, each row
  weighted by its share of the reduction (1 / D for mean, with D counted over
  the whole batch first); the backward pass scales them by the cotangent.
  Three matmuls a chunk, as the plain path has.
- reduction "none": the forward pass keeps the per-row losses only; the
  backward pass walks the chunks again with the cotangent's rows as weights
  (the upstream's per-token weights reach every row: never one scalar).

A distillation's teacher is its own hidden [N, H_t] and head [H_t, V], its
chunk's logits formed beside the student's and never differentiated. N need
not be a multiple of `chunk`: the tail is padded with ignored rows, which
take no part and whose gradient rows are cut off.
"""

import functools

import jax
import jax.numpy as jnp

from grpo_kernels import head_losses

F32 = jnp.float32


def _weights(labels, class_weights, objective, config, hparams):
    """Each row's weight in the reduced loss, [N] (ignored rows 0); None for "none"."""
    reduction = config["reduction"]
    live = labels != int(hparams["ignore_index"])
    if reduction == "none":
        return None
    if reduction == "mean":
        if objective == "cross_entropy" and class_weights is not None:
            w_y = jnp.asarray(class_weights, F32)[jnp.where(live, labels, 0)]
            counted = jnp.where(live, w_y, 0.0)
        else:
            counted = live.astype(F32)
        d = jnp.sum(counted)
        share = jnp.where(d > 0, 1.0 / jnp.where(d > 0, d, 1.0), 0.0)
    elif reduction == "sum":
        share = jnp.float32(1.0)
    elif reduction == "over_count":
        share = jnp.float32(1.0 / hparams["num_items"])
    else:  # batchmean
        share = jnp.float32(1.0 / int(hparams["batch"]))
    return jnp.where(live, share, 0.0).astype(F32)


def _chunked(x, chunk, fill):
    """x [N, ...] padded to a multiple of `chunk` rows with `fill` and cut into [n, chunk, ...]."""
    n = x.shape[0]
    pad = -n % chunk
    if pad:
        x = jnp.concatenate([x, jnp.full((pad,) + x.shape[1:], fill, x.dtype)])
    return x.reshape((-1, chunk) + x.shape[1:])


def _row_losses(z, t, labels, inputs, objective, config, hparams):
    """Per-row losses [C] (and z-loss rows) of one chunk's logits, by head_losses' formulas."""
    kwargs = head_losses.loss_kwargs(objective, dict(config, reduction="none"), hparams, inputs)
    kwargs.update(num_items=None, batch=None)
    if objective == "cross_entropy":
        rows, aux = head_losses.cross_entropy(z, labels, **kwargs)
        return rows, aux["z_loss"]
    rows, _ = head_losses.distillation(z, t, labels, **kwargs)
    return rows, jnp.zeros_like(rows)


def _sweep(hidden, lm_head, bias, inputs, weights, objective, config, hparams, chunk, grads):
    """One walk over the row chunks: per-row losses and z-loss rows [N], and with `grads` the
    gradients of sum_i weights_i l_i in (hidden, lm_head, bias)."""
    n = hidden.shape[0]
    ignore = int(hparams["ignore_index"])
    labels = _chunked(inputs["labels"], chunk, ignore)
    h = _chunked(hidden, chunk, 0)
    w = _chunked(jnp.zeros((n,), F32) if weights is None else weights, chunk, 0)
    distill = objective == "distillation"
    th = _chunked(inputs["teacher_hidden"], chunk, 0) if distill else jnp.zeros((h.shape[0], 0), F32)
    t_head = inputs.get("teacher_lm_head")
    has_bias = bias is not None
    b = bias if has_bias else jnp.zeros((lm_head.shape[1],), lm_head.dtype)

    def chunk_rows(z, th_c, labels_c, w_c):
        t = jax.lax.stop_gradient(head_losses.head_logits(th_c, t_head)) if distill else None
        rows, z_rows = _row_losses(z, t, labels_c, inputs, objective, config, hparams)
        return jnp.sum(w_c * rows), (rows, z_rows)

    def step(carry, xs):
        h_c, th_c, labels_c, w_c = xs
        z = head_losses.head_logits(h_c, lm_head, b if has_bias else None)  # [chunk, V] f32
        if not grads:
            _, (rows, z_rows) = chunk_rows(z, th_c, labels_c, w_c)
            return carry, (rows, z_rows, jnp.zeros((0,), F32))
        d_head, d_b = carry
        # d z of the chunk's weighted rows, then the product's three gradients by hand, each an
        # f32-accumulated matmul of the inputs as they are (no f32 copy of lm_head).
        (_, (rows, z_rows)), dz = jax.value_and_grad(chunk_rows, has_aux=True)(z, th_c, labels_c, w_c)
        g_h = jnp.dot(dz, lm_head.T, preferred_element_type=F32)
        d_head = d_head + jnp.dot(h_c.T, dz, preferred_element_type=F32)
        return (d_head, d_b + jnp.sum(dz, axis=0)), (rows, z_rows, g_h)

    init = (jnp.zeros(lm_head.shape, F32), jnp.zeros(b.shape, F32)) if grads else ()
    carry, (rows, z_rows, d_h) = jax.lax.scan(step, init, (h, th, labels, w))
    rows, z_rows = rows.reshape(-1)[:n], z_rows.reshape(-1)[:n]
    if not grads:
        return rows, z_rows, None
    d_hidden = d_h.reshape(-1, hidden.shape[1])[:n]
    return rows, z_rows, (d_hidden, carry[0], carry[1] if has_bias else None)


def _cast(grads, dtypes, scale):
    """The gradients times `scale`, each in its input's dtype (None for an absent bias)."""
    return tuple(None if g is None else (g * scale).astype(dtype) for g, dtype in zip(grads, dtypes))


def head_loss_chunked(inputs, objective, config, hparams, *, chunk=256):
    """The head-loss adapter (docs/spec.md) of the fused kind, in row chunks of `chunk` tokens."""
    if chunk < 1:
        raise ValueError(f"chunk = {chunk}; must be >= 1")
    head_losses.loss_kwargs(objective, config, hparams, inputs)  # names a bad objective early
    hidden, lm_head, bias = inputs["hidden"], inputs["lm_head"], inputs.get("bias")
    chunk = min(chunk, hidden.shape[0])  # never pad past N
    rest = {k: v for k, v in inputs.items() if k not in ("hidden", "lm_head", "bias")}
    weights = _weights(rest["labels"], rest.get("class_weights"), objective, config, hparams)
    dtypes = (hidden.dtype, lm_head.dtype, None if bias is None else bias.dtype)

    @jax.custom_vjp
    def loss_of(hidden, lm_head, bias):
        return forward(hidden, lm_head, bias)[0]

    def forward(hidden, lm_head, bias):
        if weights is None:
            rows, z_rows, _ = _sweep(hidden, lm_head, bias, rest, None, objective, config, hparams, chunk, False)
            return (rows, z_rows), (hidden, lm_head, bias)
        rows, z_rows, grads = _sweep(hidden, lm_head, bias, rest, weights, objective, config, hparams, chunk, True)
        return (jnp.sum(weights * rows), jnp.sum(weights * z_rows)), grads

    def backward(saved, cotangent):
        g = cotangent[0]
        if weights is None:
            h, head, b = saved
            _, _, grads = _sweep(h, head, b, rest, g.astype(F32), objective, config, hparams, chunk, True)
            return _cast(grads, dtypes, 1.0)
        return _cast(saved, dtypes, g.astype(F32))

    loss_of.defvjp(forward, backward)
    loss, z = loss_of(hidden, lm_head, bias)
    return loss, ({"z_loss": jax.lax.stop_gradient(z)} if objective == "cross_entropy" else {})


head_loss_chunked.kind = "fused"


def head_loss(inputs, objective, config, hparams):
    """The built-in `head_fused_chunked`: chunks of 256 tokens (at T = 8192, V = 151936, H = 1536,
    bf16: 2.70 GiB of XLA temporaries for cross-entropy, against 2.99 at 512 and 4.68 at 1024;
    docs/figures.md, "The head losses' fused path")."""
    return head_loss_chunked(inputs, objective, config, hparams, chunk=256)


head_loss.kind = "fused"


def small_chunks(chunk):
    """The adapter in chunks of `chunk` tokens (tests: several chunks and a ragged tail on small N)."""
    adapter = functools.partial(head_loss_chunked, chunk=chunk)
    adapter.kind = "fused"
    return adapter
