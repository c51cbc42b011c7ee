"""A smoke test of adapter.py against the JAX reference, without the harness.

    PYTHONPATH=python .venv/bin/python examples/trl/selfcheck.py [--cases N]

Random f32 inputs for each TRL preset's switches (and a few free ones), the same
inputs to `grpo_kernels.logits.reference.grpo_loss` (jax.vjp) and to the adapter
(torch.autograd.grad); prints the relative error of the loss and the gradient. It
is no verdict (that is `grpo-verify check`'s tolerance rule); it says whether the
mapping of switches onto TRL is the right one, which would show as errors of order
1, not 1e-6. The presets and what each fixes come from the binary
(`grpo-verify presets --json`, found as `grpo_verify.binary()` finds it: a checkout's
`target/release/grpo-verify` once built), so they are the ones `check --objective` draws.
"""

import argparse
import json
import pathlib
import runpy
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import torch

import grpo_verify
from grpo_kernels import schema
from grpo_kernels.logits import reference

adapter = runpy.run_path(str(pathlib.Path(__file__).with_name("adapter.py")))

BASE_HPARAMS = {
    "eps_low": 0.2, "eps_high": 0.28, "temperature": 0.7, "beta": 0.0, "entropy_coef": 0.0,
    "delta": float("inf"), "normalizer": 1.0, "logit_scale": 1.0, "logit_softcap": float("inf"),
    "log_ratio_min": float("-inf"), "log_ratio_max": float("inf"), "sapo_tau_pos": 1.0,
    "sapo_tau_neg": 1.05, "kl_log_ratio_clamp": float("inf"), "kl_max": float("inf"),
}
# Every switch at its default (schema.json), under a preset's.
DEFAULT_CONFIG = {name: values[0] for name, values in schema.CONFIG_CHOICES[2].items()}
# A few free combinations on top of trl:grpo: (name, config changes, hparam changes).
FREE = [
    ("kl + bias-corrected + entropy + delta", {"kl": True, "kl_times_ratio": True, "entropy_bonus": True,
                                               "two_sided": True},
     {"beta": 0.05, "entropy_coef": 0.01, "delta": 1.5}),
    ("on-policy, is_weights", {"on_policy": True, "rollout_correction": True}, {}),
    ("logit transform", {"logit_transform": True}, {"logit_scale": 0.5, "logit_softcap": 3.0}),
    ("gspo + kl x ratio + is_weights", {"ratio_level": "sequence", "kl": True, "kl_times_ratio": True,
                                        "rollout_correction": True}, {"beta": 0.1}),
]


def trl_presets():
    """TRL's presets as the binary defines them: name, fixed switches, fixed hyperparameters, normalizer."""
    listed = subprocess.run([grpo_verify.binary(), "presets", "--json"], check=True, capture_output=True, text=True)
    presets = [json.loads(line) for line in listed.stdout.splitlines()]
    return [p for p in presets if p["name"].startswith("trl:")]


def configurations():
    """(name, config, hparams, normalizer) of each TRL preset, then of the free combinations."""
    presets = trl_presets()
    out = []
    for p in presets:
        fixed = {k: schema.INFINITIES.get(v, v) for k, v in p["hparams"].items()}
        out.append((p["name"], {**DEFAULT_CONFIG, **p["switches"]}, {**BASE_HPARAMS, **fixed}, p["normalizer"]))
    grpo = next(p for p in presets if p["name"] == "trl:grpo")
    for name, c, h in FREE:
        out.append((name, {**DEFAULT_CONFIG, **grpo["switches"], **c}, {**BASE_HPARAMS, **h}, None))
    return out


def draw(rng, batch, time, vocab, hidden_size=None):
    mask = (rng.random((batch, time)) < 0.8).astype(np.float32)
    mask[0, :] = 1.0
    tokens = rng.integers(0, vocab, (batch, time))
    tokens[mask == 0] = -100
    logits = (rng.standard_normal((batch, time, vocab)) * 2).astype(np.float32)
    old = np.zeros((batch, time), np.float32)  # filled after logp is known
    return {
        "logits": logits, "tokens": tokens, "mask": mask,
        "advantages": rng.standard_normal(batch).astype(np.float32),
        "old_noise": (rng.standard_normal((batch, time)) * 0.3).astype(np.float32),
        "ref_noise": (rng.standard_normal((batch, time)) * 0.5).astype(np.float32),
        "is_weights": rng.uniform(0, 3, (batch, time)).astype(np.float32),
        "cotangent": 1.7, "old": old,
    }


def run(name, config, hparams, d):
    cot = d["cotangent"]
    logits, mask, tokens = d["logits"], d["mask"], d["tokens"]
    # logp of the chosen tokens at tau (logits mode), to place old / ref near it
    z = logits / hparams["temperature"]
    lse = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1)
    logp = np.take_along_axis(z, np.where(mask > 0, tokens, 0)[..., None], -1)[..., 0] - lse
    old = np.where(mask > 0, logp + d["old_noise"], 1e9).astype(np.float32)
    ref = np.where(mask > 0, logp + d["ref_noise"], -1e9).astype(np.float32)
    old = None if config["on_policy"] else old
    ref = ref if config["kl"] else None
    isw = d["is_weights"] if config["rollout_correction"] else None

    def jax_loss(lg):
        loss, _ = reference.grpo_loss(
            logits=lg, tokens=jnp.asarray(tokens, jnp.int32), mask=jnp.asarray(mask),
            advantages=jnp.asarray(d["advantages"]), old_logp=None if old is None else jnp.asarray(old),
            ref_logp=None if ref is None else jnp.asarray(ref),
            hparams={k: jnp.float32(v) for k, v in hparams.items()}, config=config,
            is_weights=None if isw is None else jnp.asarray(isw))
        return loss

    j_loss, vjp = jax.vjp(jax_loss, jnp.asarray(logits))
    (j_grad,) = vjp(jnp.float32(cot))

    t_logits = torch.tensor(logits, requires_grad=True)
    t = lambda a: None if a is None else torch.tensor(a)  # noqa: E731
    t_loss, aux = adapter["grpo_loss"](
        logits=t_logits, tokens=torch.tensor(tokens), mask=t(mask), advantages=t(d["advantages"]),
        old_logp=t(old), ref_logp=t(ref), hparams=dict(hparams), config=dict(config), is_weights=t(isw))
    (t_grad,) = torch.autograd.grad(t_loss, t_logits, grad_outputs=torch.tensor(cot))
    loss_err = abs(float(t_loss) - float(j_loss)) / max(abs(float(j_loss)), 1e-6)
    grad_err = float(np.abs(t_grad.numpy() - np.asarray(j_grad)).max() / max(np.abs(j_grad).max(), 1e-12))
    lp_err = float(np.abs(np.where(mask > 0, aux["logp"].detach().numpy() - logp, 0)).max())
    print(f"{name:40s} loss {float(t_loss):+.6e} vs {float(j_loss):+.6e}  rel {loss_err:.1e}  "
          f"grad rel {grad_err:.1e}  logp abs {lp_err:.1e}")
    return max(loss_err, grad_err)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=2)
    args = parser.parse_args()
    configs = configurations()
    rng = np.random.default_rng(0)
    worst = 0.0
    for case in range(args.cases):
        batch, time, vocab = int(rng.integers(1, 4)), int(rng.integers(1, 9)), int(rng.integers(2, 1500))
        d = draw(rng, batch, time, vocab)
        valid = float(d["mask"].sum())
        print(f"case {case}: B={batch} T={time} V={vocab} valid={valid:.0f}")
        for name, config, hparams, normalizer in configs:
            hparams = dict(hparams)
            if normalizer == "batch_times_time":
                hparams["normalizer"] = float(batch * time)
            elif normalizer == "valid_count":
                hparams["normalizer"] = max(valid, 1.0)
            elif normalizer is not None:
                raise ValueError(f"{name}: normalizer {normalizer!r} is not one this smoke test forms")
            worst = max(worst, run(name, config, hparams, d))
    print(f"worst relative error {worst:.2e}")


if __name__ == "__main__":
    main()
