"""Cross-check of the torch port (adapter.py) against the JAX reference it ports, without the harness.

From the repository root:

    PYTHONPATH=python .venv/bin/python examples/torch_reference/crosscheck_jax.py --configs 400

Draws random SPEC configs (v1 dicts and v2 dicts with every switch free),
hyperparameters (infinities included) and inputs (garbage token ids and
+-1e9 log-probs at masked positions, fully masked rows), runs both kinds
with a random cotangent, and compares loss, gradients (torch.autograd.grad
vs jax.vjp) and aux. Error of an array: max |torch - jax| / max |jax|
(normwise; elementwise ratios are noise wherever a value cancels to ~0).
f32 inputs must agree to --tol; bf16 inputs are reported separately (their
gradients come back rounded to bf16, so one rounding flip is 2^-8).

A case above the tolerance is run once more with the port's math in float64
(adapter.MATH_DTYPE): when torch and JAX are both about as far from that
value as from each other, the gap is rounding in both (a cancellation) and
is reported as explained; a port bug leaves the port near its own f64 value
and far from JAX, and fails the run.
"""

import argparse
import collections
import math
import pathlib
import runpy
import sys

import jax
import jax.numpy as jnp
import numpy as np
import torch

from grpo_kernels import schema
from grpo_kernels.fused import reference as jax_fused
from grpo_kernels.logits import reference as jax_logits

jax.config.update("jax_platforms", "cpu")
port = runpy.run_path(str(pathlib.Path(__file__).with_name("adapter.py")))

def pick(rng, choices):
    return choices[rng.integers(len(choices))]


def draw_config(rng, v2):
    """Every switch of the SPEC version drawn freely, from the schema's values."""
    return {name: pick(rng, choices) for name, choices in schema.CONFIG_CHOICES[2 if v2 else 1].items()}


def draw_hparams(rng, config, v2, batch, time):
    maybe_inf = lambda value, sign=1.0: sign * math.inf if rng.random() < 0.4 else value  # noqa: E731
    # eps = 0 (a clip edge at r = 1, where on-policy ratios sit) one time in ten.
    eps_high = rng.uniform(0.0, 0.4) if rng.random() > 0.1 else 0.0
    hparams = {
        "eps_low": rng.uniform(0.0, 0.4) if rng.random() > 0.1 else 0.0,
        "eps_high": eps_high,
        "temperature": rng.uniform(0.4, 2.0),
        "beta": rng.uniform(0.0, 0.5) if config["kl"] else 0.0,
        "entropy_coef": rng.uniform(0.0, 0.2) if config["entropy_bonus"] else 0.0,
        "delta": 1.0 + eps_high + rng.uniform(0.05, 2.0) if config["two_sided"] else math.inf,
        "normalizer": float(rng.integers(1, batch * time + 1)),
    }
    if v2:
        hparams.update({
            "logit_scale": rng.uniform(0.5, 2.0),
            "logit_softcap": maybe_inf(rng.uniform(2.0, 20.0)),
            "log_ratio_min": maybe_inf(rng.uniform(-1.0, -0.02), -1.0),
            "log_ratio_max": maybe_inf(rng.uniform(0.02, 1.0)),
            "sapo_tau_pos": rng.uniform(0.3, 3.0),
            "sapo_tau_neg": rng.uniform(0.3, 3.0),
            "kl_log_ratio_clamp": maybe_inf(rng.uniform(0.05, 2.0)),
            "kl_max": maybe_inf(rng.uniform(0.01, 1.0)),
        })
    return {k: float(np.float32(v)) for k, v in hparams.items()}


def draw_inputs(rng, config, fused, bf16):
    batch, time, vocab = rng.integers(1, 5), rng.integers(1, 9), rng.integers(2, 300)
    mask = (rng.random((batch, time)) < 0.7).astype(np.float32)
    if rng.random() < 0.1:
        mask[:] = 0.0
    if batch > 1 and rng.random() < 0.3:
        mask[0] = 0.0  # a fully masked row
    scale = pick(rng, (0.5, 2.0, 8.0))
    if fused:
        width = rng.integers(1, 40)
        floats = {"hidden": rng.normal(0, scale, (batch, time, width)).astype(np.float32),
                  "lm_head": rng.normal(0, 1 / math.sqrt(width), (width, vocab)).astype(np.float32)}
        logits = floats["hidden"] @ floats["lm_head"]
    else:
        floats = {"logits": (rng.normal(0, scale, (batch, time, vocab))
                             + pick(rng, (0.0, -1e3))).astype(np.float32)}
        logits = floats["logits"]
    if bf16:
        floats = {k: np.asarray(jnp.asarray(v, jnp.bfloat16)) for k, v in floats.items()}
    tokens = rng.integers(0, vocab, (batch, time))
    tokens = np.where(mask > 0, tokens, pick(rng, (-100, vocab, vocab + 7, 0)))
    # Behaviour / reference log-probs near the policy's own, so ratios straddle the clip band.
    shifted = logits - logits.max(-1, keepdims=True)
    own = np.take_along_axis(shifted - np.log(np.exp(shifted).sum(-1, keepdims=True)),
                             np.where(mask > 0, tokens, 0)[..., None], -1)[..., 0]
    garbage = lambda: rng.choice([1e9, -1e9, 0.0], (batch, time))  # noqa: E731
    near = lambda: np.where(mask > 0, own + rng.normal(0, 0.3, own.shape), garbage())  # noqa: E731
    others = {
        "tokens": tokens,
        "mask": mask,
        "advantages": np.where(rng.random(batch) < 0.1, 0.0, rng.normal(0, 1, batch)).astype(np.float32),
        "old_logp": None if config["on_policy"] else near().astype(np.float32),
        "ref_logp": near().astype(np.float32) if config["kl"] else None,
        "is_weights": None,
    }
    if config.get("rollout_correction"):
        shape = pick(rng, ((batch, time), (batch, 1)))
        others["is_weights"] = rng.uniform(0.0, 2.0, shape).astype(np.float32)
    return floats, others


def run_jax(function, floats, others, hparams, config, cotangent):
    names = list(floats)
    kwargs = {k: (None if v is None else jnp.asarray(v, jnp.int32 if k == "tokens" else None))
              for k, v in others.items()}
    if "rollout_correction" not in config:
        kwargs.pop("is_weights")
    hp = {k: jnp.float32(v) for k, v in hparams.items()}

    def step(xs, kwargs, hp, cotangent):
        def objective(*xs):
            return function(**dict(zip(names, xs)), **kwargs, hparams=hp, config=dict(config))

        loss, vjp, aux = jax.vjp(objective, *xs, has_aux=True)
        return loss, vjp(cotangent.astype(loss.dtype)), aux

    # One compile per case (-O0, as the worker does for small steps): eager JAX compiles every op.
    args = ([jnp.asarray(floats[n]) for n in names], kwargs, hp, jnp.float32(cotangent))
    compiled = jax.jit(step).lower(*args).compile({"xla_backend_optimization_level": 0})
    loss, grads, aux = compiled(*args)
    return loss, dict(zip(names, grads)), aux


def run_torch(function, floats, others, hparams, config, cotangent):
    names = list(floats)
    xs = [torch.tensor(np.asarray(floats[n], np.float32)).to(
        torch.bfloat16 if floats[n].dtype.name == "bfloat16" else torch.float32).requires_grad_()
        for n in names]
    kwargs = {k: None if v is None else torch.tensor(v) for k, v in others.items()}
    hp = {k: torch.tensor(v, dtype=torch.float32) for k, v in hparams.items()}
    loss, aux = function(**dict(zip(names, xs)), **kwargs, hparams=hp, config=dict(config))
    grads = torch.autograd.grad(loss, xs, grad_outputs=torch.tensor(cotangent, dtype=loss.dtype))
    for name, x, g in zip(names, xs, grads):
        assert g.dtype == x.dtype, (name, g.dtype, x.dtype)
    return loss, dict(zip(names, grads)), aux


def run_torch_f64(function, *args):
    """run_torch with the port's math in float64 (its MATH_DTYPE): an f64 opinion on a case."""
    namespace = function.__globals__
    namespace["MATH_DTYPE"] = torch.float64
    try:
        return run_torch(function, *args)
    finally:
        namespace["MATH_DTYPE"] = torch.float32


def as_f64(x):
    if isinstance(x, torch.Tensor):
        return x.detach().to(torch.float64).numpy()
    return np.asarray(jnp.asarray(x, jnp.float32), np.float64)


def error(mine, theirs, mask=None):
    """max |mine - theirs| / max |theirs| (unmasked positions only when mask is given); NaN must match."""
    a, b = as_f64(mine), as_f64(theirs)
    if mask is not None:
        a, b = a[mask > 0], b[mask > 0]
    if a.size == 0:
        return 0.0
    if not np.array_equal(np.isnan(a), np.isnan(b)) or not np.all(np.isfinite(a[~np.isnan(a)])):
        return math.inf
    a, b = np.nan_to_num(a), np.nan_to_num(b)
    scale = np.max(np.abs(b))
    diff = np.max(np.abs(a - b))
    return 0.0 if diff == 0 else diff / max(scale, 1e-30)


def quantities(floats, outputs):
    return ["loss"] + [f"grad.{n}" for n in floats] + [f"aux.{k}" for k in outputs[2]]


def distance(mine, theirs, quantity, mask):
    """`error` of one quantity ("loss", "grad.NAME", "aux.KEY") of two (loss, grads, aux) triples."""
    if quantity == "loss":
        return error(mine[0], theirs[0])
    group, name = quantity.split(".")
    if group == "grad":
        return error(mine[1][name], theirs[1][name])
    return error(mine[2][name], theirs[2][name], mask)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tol", type=float, default=1e-5)
    parser.add_argument("--only", type=int, help="run only this case index (same draws)")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    worst = {}  # (kind, dtype, quantity) -> (error, case index)
    failures = []
    counts = collections.Counter()
    for index in range(args.configs):
        v2 = rng.random() < 0.8
        fused = bool(rng.integers(2))
        bf16 = rng.random() < 0.25
        config = draw_config(rng, v2)
        floats, others = draw_inputs(rng, config, fused, bf16)
        batch, time = others["mask"].shape
        hparams = draw_hparams(rng, config, v2, batch, time)
        cotangent = float(np.float32(pick(rng, (1.0, -1.0, 0.5, 3.0)) * rng.uniform(0.5, 2.0)))
        if args.only is not None and index != args.only:
            continue
        jax_fn = jax_fused.grpo_loss if fused else jax_logits.grpo_loss
        torch_fn = port["grpo_loss_fused"] if fused else port["grpo_loss"]
        theirs = run_jax(jax_fn, floats, others, hparams, config, cotangent)
        mine = run_torch(torch_fn, floats, others, hparams, config, cotangent)
        kind, dtype = ("fused" if fused else "logits"), ("bf16" if bf16 else "f32")
        counts[(kind, dtype, "v2" if v2 else "v1")] += 1
        errors = {q: distance(mine, theirs, q, others["mask"]) for q in quantities(floats, theirs)}
        tol = args.tol if not bf16 else 1e-2
        above = []
        for quantity, value in errors.items():
            key = (kind, dtype, quantity)
            if value >= worst.get(key, (-1.0,))[0]:
                worst[key] = (value, index)
            if not value <= tol:
                above.append((quantity, value))
        if above:
            # Both off the f64 value by about as much as from each other: rounding (say a
            # cancellation), not a port bug (which would leave the port near its own f64 value).
            exact = run_torch_f64(torch_fn, floats, others, hparams, config, cotangent)
            for quantity, value in above:
                e_torch, e_jax = (distance(which, exact, quantity, others["mask"])
                                  for which in (mine, theirs))
                rounding = min(e_torch, e_jax) >= value / 4
                failures.append((index, quantity, value, config, hparams, (e_torch, e_jax, rounding)))
    print(f"{args.configs} random configs (seed {args.seed}); counts by kind, dtype, SPEC version:")
    for key, count in sorted(counts.items()):
        print(f"  {' '.join(key)}: {count}")
    print("worst normwise relative error per quantity (case index):")
    for (kind, dtype, quantity), (value, index) in sorted(worst.items()):
        print(f"  {kind:6} {dtype:4} {quantity:18} {value:.3e}  (#{index})")
    unexplained = 0
    for index, quantity, value, config, hparams, (e_torch, e_jax, rounding) in failures:
        unexplained += not rounding
        print(f"ABOVE #{index} {quantity}: {value:.3e}; off the port's f64 value: torch {e_torch:.3e}, "
              f"jax {e_jax:.3e}: {'rounding in both' if rounding else 'UNEXPLAINED'}"
              f"\n  config {config}\n  hparams {hparams}")
    print(f"{len(failures)} above tolerance ({args.tol:g} f32, 1e-2 bf16), {unexplained} unexplained")
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
