"""What Liger's in-place backward (`triton_grpo_loss(..., inplace=True)`, its default) overwrites.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python examples/liger/repros/triton_inplace_backward.py

Liger-Kernel 0.8.5, liger_kernel/ops/grpo_loss.py:932: `dlogits = logits.data if inplace else
torch.empty_like(logits)`; the backward kernel stores d logits there (:552) and :1003 zeroes the last
row. `.data` bypasses autograd's version counter, so nothing notices.

1. Through examples/liger/triton_adapter.py, as the harness runs it (leaf tensors, torch.autograd.grad
   with a cotangent, aux and loss read after the backward): the leaf, the loss, aux["logp"] and
   aux["per_token_loss"] are bit-identical before and after the backward, and the gradient equals
   the inplace=False one. The adapter's torch.cat([logits, zeros]) (Liger wants B x (T + 1) x V) is
   the buffer that gets overwritten.
2. Called directly on a (B, T + 1, V) logits tensor, as Liger's docstring shows: after the backward
   the logits hold d logits (the tensor aliases its own gradient).
3. The same logits feeding a second differentiable term whose backward reads them (here
   0.5 * sum(z^2), a stand-in for any op that saves its input): that term's gradient is computed
   from the overwritten logits, silently, because the GRPO loss's backward runs first.
"""

import importlib.util
import os
import pathlib
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")
import torch  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "python"))  # the adapter imports grpo_verify_worker, as the worker has it
from grpo_kernels import schema  # noqa: E402

spec = importlib.util.spec_from_file_location("liger_triton_adapter", HERE.parent / "triton_adapter.py")
adapter = importlib.util.module_from_spec(spec)
spec.loader.exec_module(adapter)
from liger_kernel.transformers.grpo_loss import triton_grpo_loss  # noqa: E402

torch.manual_seed(0)
B, T, V = 2, 3, 40
# Every v2 key at its default (schema.json), as the harness sends them, then the case's own values.
config = {name: values[0] for name, values in schema.CONFIG_CHOICES[2].items()}
config.update({"temperature_mode": "logits", "aggregation": "token_mean", "on_policy": False, "kl": True,
               "entropy_bonus": False, "two_sided": False})
hparams = {name: schema.INFINITIES.get(h["default"], h["default"]) for name, h in schema.HPARAMS.items()}
hparams.update({"eps_low": 0.2, "eps_high": 0.28, "temperature": 0.7, "beta": 0.04, "entropy_coef": 0.0,
                "delta": float("inf"), "normalizer": 1.0})
tokens = torch.randint(0, V, (B, T))
mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
advantages = torch.tensor([0.7, -1.3])
old_logp = torch.randn(B, T) * 0.1 - 3.5
ref_logp = torch.randn(B, T) * 0.1 - 3.5
base = torch.randn(B, T, V)


def harness_like(inplace):
    adapter.INPLACE = inplace
    leaf = base.clone().requires_grad_(True)
    before = leaf.detach().clone()
    loss, aux = adapter.grpo_loss(logits=leaf, tokens=tokens, mask=mask, advantages=advantages,
                                  old_logp=old_logp, ref_logp=ref_logp, hparams=hparams, config=config)
    snapshot = (loss.detach().clone(), {k: v.detach().clone() for k, v in aux.items()})
    (grad,) = torch.autograd.grad(loss, [leaf], grad_outputs=torch.tensor(0.375))
    same = lambda a, b: bool(torch.equal(a, b))  # noqa: E731
    print(f"  inplace={inplace}: leaf unchanged {same(leaf.detach(), before)}, loss unchanged "
          f"{same(loss.detach(), snapshot[0])}, aux unchanged "
          f"{all(same(aux[k].detach(), snapshot[1][k]) for k in aux)}")
    return grad


print("1. through the adapter, as the harness runs it")
g_inplace, g_copy = harness_like(True), harness_like(False)
print(f"  gradients equal (inplace True vs False): {bool(torch.equal(g_inplace, g_copy))}")

print("2. direct call on a (B, T + 1, V) leaf")
logits = torch.cat([base, torch.zeros(B, 1, V)], dim=1).requires_grad_(True)
before = logits.detach().clone()
per_token, _, _ = triton_grpo_loss(logits, old_logp, ref_logp, tokens, advantages, mask, temperature=0.7,
                                   beta=0.04, eps_low=0.2, eps_high=0.28, loss_type="bnpo")
loss = (per_token * mask).sum() / mask.sum()
(grad,) = torch.autograd.grad(loss, [logits])
print(f"  logits changed: {not torch.equal(logits.detach(), before)}; logits now equal their gradient: "
      f"{bool(torch.equal(logits.detach(), grad))}")

print("3. the same logits in a second differentiable term (0.5 * sum(z^2): its gradient is z)")
for inplace in (False, True):
    logits = torch.cat([base, torch.zeros(B, 1, V)], dim=1).requires_grad_(True)
    extra = 0.5 * (logits * logits).sum()  # MulBackward saves `logits` itself
    per_token, _, _ = triton_grpo_loss(logits, old_logp, ref_logp, tokens, advantages, mask, temperature=0.7,
                                       beta=0.04, eps_low=0.2, eps_high=0.28, loss_type="bnpo",
                                       inplace=inplace)
    loss = (per_token * mask).sum() / mask.sum() + 1e-3 * extra
    (grad,) = torch.autograd.grad(loss, [logits])
    if not inplace:
        reference = grad
    else:
        err = (grad - reference).abs().max().item()
        print(f"  inplace=True: max |grad - grad(inplace=False)| = {err:.3e} (no error raised)")
