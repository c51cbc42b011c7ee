"""The plain-JAX reference of the other losses on the head: cross-entropy and distillation.

docs/spec.md, "The other losses on the head: cross-entropy and distillation", is the
contract; this is its direct transcription over [N, V] logits in f32, the baseline the
fused paths of these losses will be judged against, as logits.reference is GRPO's. The
suite's f64 oracle of the same contract is `grpo_oracle::losses`.

Rows whose label is `ignore_index` take no part: their logits may hold anything (NaN
included) and their gradient rows are exactly zero. When every row is ignored the loss is
0 under every reduction, never 0/0 (torch's mean gives NaN there).
"""

import jax
import jax.numpy as jnp

from grpo_kernels import schema

F32 = jnp.float32
REDUCTIONS = schema.HEAD_SWITCHES["reduction"]
DIVERGENCES = schema.HEAD_SWITCHES["divergence"]


def _log_q(logits, softcap, temperature, live):
    """log_softmax(softcap * tanh(z / softcap) / tau) of the live rows (0 elsewhere: no NaN leaks)."""
    z = jnp.where(live[:, None], logits.astype(F32), 0.0)
    if softcap is not None:
        z = softcap * jnp.tanh(z / softcap)
    x = z / temperature
    return jax.nn.log_softmax(x, axis=-1), jax.nn.logsumexp(x, axis=-1)


def _reduce(rows, live, reduction, denominator, upstream, num_items, batch):
    """The reduction of docs/spec.md's table over the row losses `rows` (ignored rows 0)."""
    rows = jnp.where(live, rows, 0.0)
    if reduction == "none":
        if upstream is None:
            return rows
        return jnp.sum(rows * upstream)
    total = jnp.sum(rows)
    if reduction == "sum":
        return total
    if reduction == "mean":
        return jnp.where(denominator > 0, total / jnp.where(denominator > 0, denominator, 1.0), 0.0)
    if reduction == "over_count":
        if not num_items or num_items <= 0:
            raise ValueError(f"reduction 'over_count' needs num_items > 0, got {num_items!r}")
        return total / num_items
    if reduction == "batchmean":
        if not batch or batch <= 0:
            raise ValueError(f"reduction 'batchmean' needs the batch size B > 0, got {batch!r}")
        return total / batch
    raise ValueError(f"reduction {reduction!r}; expected one of {REDUCTIONS}")


def _check(temperature, softcap):
    if not temperature > 0:
        raise ValueError(f"temperature {temperature}: must be > 0")
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap {softcap}: must be > 0 (None: no softcap)")


def cross_entropy(logits, labels, *, ignore_index=-100, label_smoothing=0.0, z_loss=0.0,
                  class_weights=None, softcap=None, temperature=1.0, reduction="mean",
                  upstream=None, num_items=None, batch=None):
    """Cross-entropy of docs/spec.md over logits [N, V] and labels [N].

    Returns (loss, {"per_token": [N], "z_loss": the z-loss reduced as the loss}). With
    reduction "none" the loss is the per-token vector, or sum_i upstream_i * l_i when
    `upstream` [N] is given (what a caller's backward weights it by).
    """
    _check(temperature, softcap)
    vocab = logits.shape[-1]
    live = labels != ignore_index
    safe = jnp.where(live, labels, 0)
    log_q, lse = _log_q(logits, softcap, temperature, live)
    weights = jnp.ones((vocab,), F32) if class_weights is None else jnp.asarray(class_weights, F32)
    w_y = weights[safe]
    nll = -jnp.take_along_axis(log_q, safe[:, None], axis=-1)[:, 0]
    smooth = -jnp.sum(log_q * weights, axis=-1)
    z_rows = z_loss * lse * lse
    rows = (1.0 - label_smoothing) * w_y * nll + (label_smoothing / vocab) * smooth + z_rows
    denominator = jnp.sum(jnp.where(live, w_y, 0.0))
    reduced = _reduce(rows, live, reduction, denominator, upstream, num_items, batch)
    reduced_z = _reduce(z_rows, live, reduction, denominator, upstream, num_items, batch)
    return reduced, {"per_token": jnp.where(live, rows, 0.0), "z_loss": reduced_z}


def distillation(student_logits, teacher_logits, labels, *, divergence="forward_kl", beta=0.5,
                 ignore_index=-100, softcap=None, temperature=1.0, reduction="mean",
                 upstream=None, num_items=None, batch=None):
    """Forward KL, reverse KL or JSD(beta) of docs/spec.md between the teacher's softmax and the
    student's, over logits [N, V] (the teacher's not differentiated) and labels [N] (only
    which rows are ignored). Returns (loss, {"per_token": [N]})."""
    _check(temperature, softcap)
    if divergence not in DIVERGENCES:
        raise ValueError(f"divergence {divergence!r}; expected one of {DIVERGENCES}")
    if divergence == "jsd" and not 0.0 <= beta <= 1.0:
        raise ValueError(f"JSD beta {beta}: must be in [0, 1]")
    live = labels != ignore_index
    log_q, _ = _log_q(student_logits, softcap, temperature, live)
    log_p, _ = _log_q(jax.lax.stop_gradient(teacher_logits), softcap, temperature, live)

    def kl(log_a, log_b):  # sum_c a_c (log a_c - log b_c), 0 where a_c is 0
        a = jnp.exp(log_a)
        return jnp.sum(jnp.where(a > 0, a * (log_a - log_b), 0.0), axis=-1)

    if divergence == "forward_kl" or (divergence == "jsd" and beta == 0.0):
        rows = kl(log_p, log_q)
    elif divergence == "reverse_kl" or (divergence == "jsd" and beta == 1.0):
        rows = kl(log_q, log_p)
    else:
        # log m from the logs: two probabilities that both underflow stay finite.
        log_m = jnp.logaddexp(jnp.log(beta) + log_p, jnp.log1p(-beta) + log_q)
        rows = beta * kl(log_p, log_m) + (1.0 - beta) * kl(log_q, log_m)
    denominator = jnp.sum(live.astype(F32))
    reduced = _reduce(rows, live, reduction, denominator, upstream, num_items, batch)
    return reduced, {"per_token": jnp.where(live, rows, 0.0)}


# The head-loss adapter (docs/spec.md, "The head-loss adapter"): what the worker calls.
OBJECTIVES = schema.HEAD_OBJECTIVES


def loss_kwargs(objective, config, hparams, inputs):
    """The keyword arguments of `cross_entropy` / `distillation` for an adapter call."""
    softcap = hparams["softcap"]
    kwargs = dict(
        ignore_index=int(hparams["ignore_index"]),
        softcap=None if softcap == float("inf") else softcap,
        temperature=hparams["temperature"],
        reduction=config["reduction"],
        num_items=hparams["num_items"],
        batch=int(hparams["batch"]),
    )
    if objective == "cross_entropy":
        kwargs.update(label_smoothing=hparams["label_smoothing"], z_loss=hparams["z_loss"],
                      class_weights=inputs.get("class_weights"))
    elif objective == "distillation":
        kwargs.update(divergence=config["divergence"], beta=hparams["beta"])
    else:
        raise ValueError(f"objective {objective!r}; expected one of {OBJECTIVES}")
    return kwargs


def _call(objective, logits, inputs, kwargs):
    if objective == "cross_entropy":
        return cross_entropy(logits, inputs["labels"], **kwargs)
    return distillation(logits, inputs["teacher_logits"], inputs["labels"], **kwargs)


def head_loss(inputs, objective, config, hparams):
    """The plain-JAX reference on the logits kind: inputs["logits"] [N, V]."""
    loss, aux = _call(objective, inputs["logits"], inputs, loss_kwargs(objective, config, hparams, inputs))
    return loss, {"z_loss": aux["z_loss"]} if "z_loss" in aux else {}


head_loss.kind = "logits"


def head_logits(hidden, lm_head, bias=None):
    """hidden [N, H] @ lm_head [H, V] (+ bias [V]), accumulated and returned in f32."""
    z = jnp.dot(hidden, lm_head, preferred_element_type=F32)
    return z if bias is None else z + bias.astype(F32)


def fused_head_loss(inputs, objective, config, hparams):
    """The fused kind, plainly: the [N, V] logits formed whole, then `head_loss`. The teacher of a
    distillation is its own hidden [N, H_t] and head [H_t, V]."""
    given = dict(inputs, logits=head_logits(inputs["hidden"], inputs["lm_head"], inputs.get("bias")))
    if objective == "distillation":
        given["teacher_logits"] = head_logits(inputs["teacher_hidden"], inputs["teacher_lm_head"])
    return head_loss(given, objective, config, hparams)


fused_head_loss.kind = "fused"
