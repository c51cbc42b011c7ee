"""An implementation with a known relative error in one output (`grpo-verify sensitivity`), or
declaring other conventions than its own (`grpo-verify necessity`).

`grpo_verify_worker.perturb:w_<hex>` names the implementation whose
parameters are the hex-encoded JSON {"impl", "quantity", "scope", "e"}: the
implementation `impl` (any name the loader takes) with one output moved by
a relative error e, the rest exactly as it computes them:

- quantity: "loss", "logp", "entropy", "per_token_loss" (the forward values;
  their gradients unchanged) or "grad" (d logits), "grad_hidden",
  "grad_lm_head" (the gradient alone; the forward unchanged, through
  x + (x - stop_gradient(x)) * s, whose value is x exactly and whose
  gradient is (1 + s) times x's);
- scope: "tensor" (every element), "row" (the first valid position: its row
  of d logits or d hidden, its log-prob, entropy and per-token loss; d
  lm_head's column of its token), "element" (one value of that row: the
  token's d logit, d hidden's first entry, d lm_head's (0, token) entry).

With {"impl", "conventions"} instead, it is `impl` exactly as it computes,
declaring `conventions` in place of its own (`grpo-verify necessity`).

The wrapper keeps the wrapped implementation's kind, SPEC version, framework
and (unless given) declared precision conventions, so a run is judged as the
implementation is. Each spec is its own name: the loader loads it once, no
worker restarts. The harness builds the names (`grpo_verify::sensitivity::perturb_name`).
"""

import functools
import json

from grpo_verify_worker import loader
from grpo_verify_worker.protocol import split_result

QUANTITIES = ("loss", "logp", "entropy", "per_token_loss", "grad", "grad_hidden", "grad_lm_head")
SCOPES = ("tensor", "row", "element")
INPUT_OF = {"grad": "logits", "grad_hidden": "hidden", "grad_lm_head": "lm_head"}


class _Ops:
    """The few array operations the wrapper needs, in the implementation's
    framework; traceable (no host values: the JAX runner traces the step)."""

    def __init__(self, framework):
        self.torch = framework == "torch"
        if self.torch:
            import torch

            self.lib = torch
        else:
            import jax
            import jax.numpy as jnp

            self.lib, self.jax = jnp, jax

    def stop(self, x):
        return x.detach() if self.torch else self.jax.lax.stop_gradient(x)

    def f32(self, x):
        return x.to(self.lib.float32) if self.torch else x.astype(self.lib.float32)

    def like(self, s, x):
        return s.to(x.dtype) if self.torch else s.astype(x.dtype)

    def first_valid(self, mask):
        """[B, T]: 1 at the first valid position in row-major order, else 0."""
        valid = self.f32(mask != 0)
        flat = valid.reshape(-1)
        seen = self.lib.cumsum(flat, dim=0) if self.torch else self.lib.cumsum(flat)
        return (flat * self.f32(seen == 1)).reshape(mask.shape)

    def indicator(self, n, index):
        """[n]: 1 at `index` (a traced scalar), else 0."""
        return self.f32(self.lib.arange(n) == index)


def _weights(ops, like, quantity, scope, first, token):
    """Per-element factors (0 or 1) of the scope, shaped as `like`; `first`
    is the first valid position's one-hot [B, T], `token` its token id."""
    if scope == "tensor":
        return ops.f32(like == like) + 0  # ones, NaN aside
    if quantity == "grad_lm_head":  # [H, V]: the token's column, or its first entry
        column = ops.indicator(like.shape[1], token)[None, :]
        return column * (1 if scope == "row" else ops.indicator(like.shape[0], 0)[:, None])
    if quantity in ("grad", "grad_hidden"):  # [B, T, W]
        row = first[..., None]
        if scope == "row":
            return row
        return row * ops.indicator(like.shape[-1], token if quantity == "grad" else 0)[None, None, :]
    return first  # [B, T] aux: one position either way


def _wrap(spec):
    inner = loader.Loader().load(spec["impl"])
    if "conventions" in spec:
        return _redeclared(inner, tuple(spec["conventions"]))
    quantity, scope, e = spec["quantity"], spec["scope"], float(spec["e"])
    if quantity not in QUANTITIES or scope not in SCOPES:
        raise ValueError(f"quantity must be one of {QUANTITIES} and scope one of {SCOPES}: {spec}")
    if quantity in INPUT_OF and INPUT_OF[quantity] not in inner.float_params:
        raise ValueError(f"{spec['impl']} is of the {inner.kind} kind: it has no {quantity}")
    ops = _Ops(inner.framework)

    @functools.wraps(inner.function)
    def perturbed(**inputs):
        first = ops.first_valid(inputs["mask"])
        token = (first * ops.f32(inputs["tokens"])).sum()
        if quantity in INPUT_OF:
            x = inputs[INPUT_OF[quantity]]
            s = ops.like(_weights(ops, x, quantity, scope, first, token) * e, x)
            inputs = {**inputs, INPUT_OF[quantity]: x + (x - ops.stop(x)) * s}
        loss, aux = split_result(inner.name, inner.function(**inputs))
        if quantity == "loss":
            loss = loss + ops.stop(loss) * e
        elif quantity in ("logp", "entropy", "per_token_loss"):
            if quantity not in aux:
                raise ValueError(f"{spec['impl']} returns no {quantity}")
            value = aux[quantity]
            s = ops.like(_weights(ops, value, quantity, scope, first, token) * e, value)
            aux = {**aux, quantity: value + ops.stop(value) * s}
        return loss, aux

    perturbed.kind = inner.kind
    perturbed.spec_version = inner.spec_version
    perturbed.framework = inner.framework
    perturbed.precision_conventions = inner.precision_conventions
    perturbed.static_hparams = inner.static_hparams
    return perturbed


def _redeclared(inner, conventions):
    """`inner` unchanged but for its declaration: `grpo-verify necessity` drops one declared
    stage at a time and asks whether some case then fails."""

    @functools.wraps(inner.function)
    def same(**inputs):
        return inner.function(**inputs)

    same.kind = inner.kind
    same.spec_version = inner.spec_version
    same.framework = inner.framework
    same.precision_conventions = conventions
    same.static_hparams = inner.static_hparams
    return same


def __getattr__(attribute):
    if not attribute.startswith("w_"):
        raise AttributeError(attribute)
    return _wrap(json.loads(bytes.fromhex(attribute[2:]).decode()))
