"""Liger-Kernel 0.8.5's Triton cross-entropy behind docs/spec.md's head-loss adapter (logits kind, torch).

Check it (torch worker; the absolute path of this file):

    grpo-verify check --objective cross_entropy --impl /abs/path/examples/liger/head_ce_adapter.py:head_loss
    grpo-verify check --objective cross_entropy --impl /abs/path/examples/liger/head_ce_adapter.py:fused_head_loss

What runs is Liger's own `LigerCrossEntropyFunction` (liger_kernel/ops/cross_entropy.py:510-600), the
function `LigerCrossEntropyLoss` calls, and for the fused kind (`fused_head_loss`)
`LigerFusedLinearCrossEntropyFunction` (ops/fused_linear_cross_entropy.py:472), which runs the same
kernel on row chunks of hidden @ lm_head.T: the Triton kernel `liger_cross_entropy_kernel` computes the
loss and writes d logits into the logits' storage in the forward pass; the backward scales them by
the cotangent (`cross_entropy_backward`). On a machine without a GPU it runs in Triton's
interpreter (TRITON_INTERPRET=1, set before Liger's kernels are decorated, as triton_adapter.py
does), with two fixes to the interpreter, not to Liger (grpo_verify_worker/triton_interpreter.py):
its bf16 cast rounds to nearest, a float argument (softcap, the weight sums) reaches the kernel as
an fp32 scalar, and libdevice's tanh (a stub in the interpreter) is NumPy's, as compiled Triton
has all three.

The mapping (docs/spec.md -> Liger):
  logits [N, V], labels [N]  -> _input (a copy: Liger overwrites it with d logits), target (int64)
  class_weights              -> weight
  ignore_index, label_smoothing, softcap (None when inf) -> the same
  z_loss (lambda)            -> lse_square_scale; `return_z_loss=True`, aux "z_loss"
  reduction none | sum | mean -> the same
Declared unsupported (`supports`) and refused: over_count and batchmean (Liger has neither), a
temperature other than 1 (Liger's cross-entropy has none), distillation. Refused too: a mean with
class weights and a z-loss, whose z-loss Liger divides by the row count where SPEC divides by the
class-weight sum (FINDINGS.md, LC3: a convention SPEC does not express).
"""

import os
import pathlib

import torch
from grpo_verify_worker import triton_interpreter
from grpo_verify_worker.loader import import_file

if not torch.cuda.is_available():
    # Must precede the decoration of Liger's kernels: @triton.jit reads it when the kernel is defined.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from liger_kernel.ops import cross_entropy as liger_ce  # noqa: E402
from liger_kernel.ops import fused_linear_cross_entropy as liger_flce  # noqa: E402

triton_interpreter.require(liger_ce.liger_cross_entropy_kernel, "Liger's cross-entropy")
if not torch.cuda.is_available():
    triton_interpreter.round_bf16_casts_to_nearest()
    triton_interpreter.bf16_arithmetic_as_floats()  # bf16 + - * / on values, not on their uint16 storage
    triton_interpreter.pass_float_args_as_f32()
    triton_interpreter.libdevice_tanh_for(liger_ce)  # the softcap's tanh (ops/cross_entropy.py:19, :144)


# The adapters' one refusal (docs/spec.md, "Refusing a configuration"): `switch` names a switch of
# schema.json ("reduction" for the head losses), None a hyperparameter no switch relaxes.
Refused = import_file(pathlib.Path(__file__).parents[1] / "spec_mapping.py").Refusal


def _refusals(objective, config, hparams, weights):
    """The refusals both entry points share (see the module docstring)."""
    if objective != "cross_entropy":
        raise Refused("LigerCrossEntropyFunction is a cross-entropy", switch=None)
    reduction = config["reduction"]
    if reduction not in ("none", "sum", "mean"):
        raise Refused("Liger's cross-entropy reduces by none, sum or mean", switch="reduction", value=reduction)
    if hparams["temperature"] != 1.0:
        raise Refused("Liger's cross-entropy has no temperature", switch=None)
    if reduction == "mean" and weights is not None and hparams["z_loss"] != 0:
        # Liger reduces the z-loss over the count of unignored rows (ops/cross_entropy.py:326, :244,
        # :279) and the cross-entropy over their weights (:322); SPEC reduces both over the weights.
        raise Refused("Liger's mean divides the z-loss by the row count, not the class-weight sum", switch=None)


def _softcap(hparams):
    return None if hparams["softcap"] == float("inf") else hparams["softcap"]


def head_loss(inputs, objective, config, hparams):
    """`LigerCrossEntropyFunction` on the logits."""
    weights = inputs.get("class_weights")
    _refusals(objective, config, hparams, weights)
    loss, z_loss, _, _ = liger_ce.LigerCrossEntropyFunction.apply(
        inputs["logits"].clone(), inputs["labels"], weights, int(hparams["ignore_index"]), hparams["z_loss"],
        hparams["label_smoothing"], config["reduction"], _softcap(hparams), True,
    )
    return loss, {"z_loss": z_loss}


def fused_head_loss(inputs, objective, config, hparams):
    """`LigerFusedLinearCrossEntropyFunction` on hidden, lm_head and bias (Liger's default
    `accum_dtype=None`): row chunks whose logits are `_input_chunk @ weight.t()`
    (ops/fused_linear_cross_entropy.py:168), then the cross-entropy kernel above."""
    weights = inputs.get("class_weights")
    _refusals(objective, config, hparams, weights)
    out = liger_flce.LigerFusedLinearCrossEntropyFunction.apply(
        inputs["hidden"], inputs["lm_head"].t(), inputs["labels"], inputs.get("bias"), weights,
        int(hparams["ignore_index"]), hparams["z_loss"], hparams["label_smoothing"], config["reduction"],
        _softcap(hparams), True,
    )
    return out[0], {"z_loss": out[1]}


fused_head_loss.kind = "fused"
fused_head_loss.framework = "torch"

head_loss.kind = "logits"
head_loss.framework = "torch"
# What the draws keep to (docs/spec.md, "The head-loss adapter"); the refusals above stay as the guard.
head_loss.supports = {"reductions": ["none", "sum", "mean"], "temperature": False}
fused_head_loss.supports = head_loss.supports
