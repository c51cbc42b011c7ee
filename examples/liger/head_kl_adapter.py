"""Liger-Kernel 0.8.5's Triton KL divergence behind docs/spec.md's head-loss adapter (torch).

Check it (torch worker; the absolute path of this file):

    grpo-verify check --objective distillation --impl /abs/path/examples/liger/head_kl_adapter.py:head_loss
    grpo-verify check --objective distillation --impl /abs/path/examples/liger/head_kl_adapter.py:head_loss_log_target
    grpo-verify check --objective distillation --impl /abs/path/examples/liger/head_kl_adapter.py:fused_head_loss

What runs of Liger's:
- `head_loss`, `head_loss_log_target` (logits kind): `LigerKLDIVLoss` (liger_kernel/transformers/
  kl_div.py:6-12, a `torch.nn.KLDivLoss` whose forward is `LigerKLDivLossFunction`,
  ops/kl_div.py:195-267). Its Triton kernel `_kldiv_kernel_forward` (ops/kl_div.py:46-95) takes the
  student's log-probs `y_pred` and the target (probabilities, or log-probabilities with
  `log_target=True`) and computes torch's pointwise `target * (log(max(target, eps)) - y_pred)` (or
  `exp(target) * (target - y_pred)`), summed per row unless `none`; `kldiv_forward_triton` reduces
  (:159-166); `_kldiv_kernel_backward` (:98-127) writes d y_pred = -target (or -exp(target)) and the
  backward scales it (:188-192, :254-259). The student is never differentiated through the
  target, so the direction is torch's KLDivLoss(input = log q, target = p) = KL(p || q): SPEC's
  forward KL (the teacher's p first). The log-softmax is not Liger's: this adapter forms both
  distributions itself, in torch, in f32 (see "Ours" below).
- `fused_head_loss` (fused kind): `LigerFusedLinearKLDivLoss` (transformers/fused_linear_kl_div.py:8-81,
  exported from liger_kernel.transformers), i.e. `LigerFusedLinearKLDivFunction`
  (ops/fused_linear_kl_div.py:302-388): row chunks of `student_input @ student_weight.t()` in the
  inputs' dtype (:185), the Triton kernel `_kl_div_kernel` (:42-116, through the dispatcher's
  `kl_loss_and_grad`, ops/backends/_triton/kl_div.py:87-148) dividing them by the temperature,
  taking their log-softmax and KL(target || q) in f32 and writing d logits over the chunk in place
  (:108-116), then d hidden and d weight as products with them (:205, :207-256). The target is
  given as probabilities; Liger's temperature applies to the student only (its docstring, :339).

On a machine without a GPU it runs in Triton's interpreter (TRITON_INTERPRET=1, set before Liger's
kernels are decorated, as head_ce_adapter.py does), with two fixes to the interpreter, not to Liger
(grpo_verify_worker/triton_interpreter.py): a float argument reaches the kernel as an fp32 scalar
(`eps.to(tl.float32)`, ops/kl_div.py:73, raises AttributeError without it) and the bf16 cast
rounds to nearest.

Ours (not Liger's; exact maps of docs/spec.md's definitions, in torch, f32):
- logits kind: x = s tanh(z / s) / tau (the softcap and temperature) on the student's and the
  teacher's logits, upcast to f32 first (exact from bf16), then `torch.log_softmax` of both; the
  teacher's is detached. `head_loss` passes the teacher as probabilities (exp of its log-softmax;
  Liger's and torch's default `log_target=False`), `head_loss_log_target` as log-probabilities.
  Liger's kernel thus always reads f32 log-probs: a bf16 case differs from an f32 one only in its
  inputs, and d logits is rounded to bf16 once, by the f32 -> bf16 cast's backward.
- fused kind: the teacher's p = softmax(teacher_hidden @ teacher_lm_head / tau) in f32, detached.
- under `none`, the sum over V of Liger's pointwise [N, V] terms (torch's `none` is pointwise).

The mapping (docs/spec.md -> Liger):
  divergence forward_kl            -> KLDivLoss(log q, p): KL(p || q)
  logits kind:
  reduction sum                    -> reduction="sum" on [N, V]
  reduction mean (no ignored rows) -> reduction="batchmean" on [N, V]: sum / N, the rows' mean
  reduction batchmean (B)          -> reduction="batchmean" on the [B, T * V] view of the same
                                      tensors: sum / B, torch's batchmean over the first dimension
                                      (Liger takes 2-D inputs only, ops/kl_div.py:131)
  reduction none                   -> reduction="none" [N, V], summed over V (ours)
  fused kind:
  hidden [N, H], lm_head [H, V]    -> student_input, student_weight = lm_head.T (contiguous)
  labels, ignore_index             -> shift_labels (int64), ignore_index (:157-171, :65-71)
  temperature                      -> temperature (the student's) and ours on the teacher
  reduction mean                   -> reduction="batchmean": sum / the unignored rows (:165-166)
  reduction sum                    -> reduction="sum"
Refused (Refusal naming it): reverse KL and JSD (a KLDivLoss differentiates its input only; the
student would be the target); over_count (neither has it); Liger's own `mean`, sum / (N * V)
(torch's elementwise mean, ops/kl_div.py:164, fused :167-168) is not SPEC's mean and no SPEC
reduction is it (FINDINGS.md, LK1); logits kind: any ignored row (`LigerKLDIVLoss` has no
ignore_index; `supports` declares `ignored_rows: False`, so none is drawn); fused kind: `none` (Liger raises,
:346-351), SPEC's batchmean over B (Liger's batchmean is over the unignored rows), a softcap and a
bias (Liger's fused KL has neither).

`fused_head_loss` passes the weight contiguous, as nn.Linear holds it; `fused_head_loss_transposed_weight`
passes the view lm_head.T, on which Liger's backward scales the wrong elements of d weight under a
cotangent other than 1 (FINDINGS.md, LK2). In bf16 the fused kind fails on Liger's bf16 logits and bf16
d logits (LK3, LK4). `python head_kl_adapter.py` (with python/ on PYTHONPATH) runs LK5's probe: the
logits kind's d input in the target's dtype.
"""

import os
import pathlib

import torch
from grpo_verify_worker import triton_interpreter
from grpo_verify_worker.loader import import_file

if not torch.cuda.is_available():
    # Must precede the decoration of Liger's kernels: @triton.jit reads it when the kernel is defined.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from liger_kernel.ops import fused_linear_kl_div as liger_flkl  # noqa: E402
from liger_kernel.ops import kl_div as liger_kl  # noqa: E402
from liger_kernel.transformers.fused_linear_kl_div import LigerFusedLinearKLDivLoss  # noqa: E402
from liger_kernel.transformers.kl_div import LigerKLDIVLoss  # noqa: E402

triton_interpreter.require(liger_kl._kldiv_kernel_forward, "Liger's KL divergence")
triton_interpreter.require(liger_flkl._kl_div_kernel, "Liger's fused-linear KL divergence")
if not torch.cuda.is_available():
    triton_interpreter.round_bf16_casts_to_nearest()
    triton_interpreter.bf16_arithmetic_as_floats()  # bf16 + - * / on values, not on their uint16 storage
    triton_interpreter.pass_float_args_as_f32()  # eps.to(tl.float32), ops/kl_div.py:73


# The adapters' one refusal (docs/spec.md, "Refusing a configuration"): `switch` names a switch of
# schema.json ("reduction" or "divergence" for the head losses), None a hyperparameter or an input
# no switch relaxes.
Refused = import_file(pathlib.Path(__file__).parents[1] / "spec_mapping.py").Refusal


def _refusals(objective, config, reductions):
    """The refusals all entry points share (see the module docstring)."""
    if objective != "distillation":
        raise Refused("Liger's KL divergence is a distillation loss", switch=None)
    if config["divergence"] != "forward_kl":
        raise Refused("Liger's KLDivLoss is KL(target || input) with only the input differentiated: forward KL only",
                      switch="divergence", value=config["divergence"])
    if config["reduction"] not in reductions:
        raise Refused(f"this Liger KL entry point maps SPEC's reductions {', '.join(reductions)} only",
                      switch="reduction", value=config["reduction"])


def _transform(z, hparams):
    """docs/spec.md's x = s tanh(z / s) / tau in f32 (ours, not Liger's)."""
    x = z.float()
    s = hparams["softcap"]
    if s != float("inf"):
        x = s * torch.tanh(x / s)
    return x / hparams["temperature"]


def _logits_kind(inputs, objective, config, hparams, log_target):
    _refusals(objective, config, ("none", "sum", "mean", "batchmean"))
    labels = inputs["labels"]
    if bool((labels == int(hparams["ignore_index"])).any()):
        raise Refused("LigerKLDIVLoss has no ignore_index: a case with ignored rows", switch=None)
    log_q = torch.log_softmax(_transform(inputs["logits"], hparams), dim=-1)
    with torch.no_grad():
        log_p = torch.log_softmax(_transform(inputs["teacher_logits"].detach(), hparams), dim=-1)
    target = log_p if log_target else log_p.exp()
    reduction = config["reduction"]
    if reduction == "batchmean":
        b = int(hparams["batch"])
        return LigerKLDIVLoss(reduction="batchmean", log_target=log_target)(log_q.reshape(b, -1), target.reshape(b, -1)), {}
    if reduction == "none":
        return LigerKLDIVLoss(reduction="none", log_target=log_target)(log_q, target).sum(-1), {}
    liger_reduction = {"sum": "sum", "mean": "batchmean"}[reduction]
    return LigerKLDIVLoss(reduction=liger_reduction, log_target=log_target)(log_q, target), {}


def head_loss(inputs, objective, config, hparams):
    """`LigerKLDIVLoss(reduction, log_target=False)` on our f32 log q and p (logits kind)."""
    return _logits_kind(inputs, objective, config, hparams, log_target=False)


def head_loss_log_target(inputs, objective, config, hparams):
    """`LigerKLDIVLoss(reduction, log_target=True)` on our f32 log q and log p (logits kind)."""
    return _logits_kind(inputs, objective, config, hparams, log_target=True)


def _fused(inputs, objective, config, hparams, weight_of):
    _refusals(objective, config, ("sum", "mean"))
    if hparams["softcap"] != float("inf"):
        raise Refused("Liger's fused-linear KL has no softcap", switch=None)
    if inputs.get("bias") is not None:
        raise Refused("Liger's fused-linear KL has no bias", switch=None)
    tau = hparams["temperature"]
    with torch.no_grad():
        teacher = inputs["teacher_hidden"].detach().float() @ inputs["teacher_lm_head"].detach().float()
        p = torch.softmax(teacher / tau, dim=-1)
    loss = LigerFusedLinearKLDivLoss(
        reduction={"sum": "sum", "mean": "batchmean"}[config["reduction"]],
        ignore_index=int(hparams["ignore_index"]), temperature=tau,
    )
    return loss(inputs["hidden"], weight_of(inputs["lm_head"]), p, inputs["labels"].long()), {}


def fused_head_loss(inputs, objective, config, hparams):
    """`LigerFusedLinearKLDivLoss` on hidden, a contiguous lm_head.T (nn.Linear's [V, H] weight) and our
    f32 teacher probabilities (fused kind), Liger's defaults otherwise (`eps=1e-10`, `accum_dtype=None`)."""
    return _fused(inputs, objective, config, hparams, lambda lm_head: lm_head.t().contiguous())


def fused_head_loss_transposed_weight(inputs, objective, config, hparams):
    """`fused_head_loss` with the weight passed as the view lm_head.t() (strides (1, V)), as
    head_ce_adapter.py passes it to Liger's fused-linear cross-entropy: FINDINGS.md, LK2."""
    return _fused(inputs, objective, config, hparams, lambda lm_head: lm_head.t())


head_loss.kind = "logits"
head_loss.framework = "torch"
# What the draws keep to (docs/spec.md, "The head-loss adapter"); the refusals above stay as the guard.
head_loss.supports = {"reductions": ["none", "sum", "mean", "batchmean"], "divergences": ["forward_kl"], "ignored_rows": False}
head_loss_log_target.kind = "logits"
head_loss_log_target.framework = "torch"
head_loss_log_target.supports = head_loss.supports
fused_head_loss.kind = "fused"
fused_head_loss.framework = "torch"
fused_head_loss.supports = {"reductions": ["sum", "mean"], "divergences": ["forward_kl"], "softcap": False, "bias": False}
fused_head_loss_transposed_weight.kind = "fused"
fused_head_loss_transposed_weight.framework = "torch"
fused_head_loss_transposed_weight.supports = fused_head_loss.supports


def _mixed_dtype_probe():
    """FINDINGS.md, LK5: an f32 student's d log q from a bf16 teacher target, against torch's kl_div.

        PYTHONPATH=python .venv/bin/python examples/liger/head_kl_adapter.py
    """
    torch.manual_seed(0)
    log_q = torch.log_softmax(torch.randn(3, 11), dim=-1).requires_grad_()
    p = torch.softmax(torch.randn(3, 11), dim=-1).bfloat16()  # exact in f32: torch's gradient is -p exactly
    cotangent = torch.tensor(0.7)
    for reduction in ("sum", "batchmean"):
        got, = torch.autograd.grad(LigerKLDIVLoss(reduction=reduction)(log_q, p), [log_q], grad_outputs=cotangent)
        want, = torch.autograd.grad(torch.nn.functional.kl_div(log_q, p.float(), reduction=reduction), [log_q],
                                    grad_outputs=cotangent)
        rel = ((got - want).abs() / want.abs()).max().item()
        print(f"reduction={reduction}: d log q {got.dtype}, max relative error {rel:.3e} (bf16's unit roundoff 2^-8 = {2**-8:.3e})")


if __name__ == "__main__":
    _mixed_dtype_probe()
