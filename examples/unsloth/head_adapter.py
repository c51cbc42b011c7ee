"""Unsloth 2026.10.9's Triton cross-entropy behind docs/spec.md's head-loss adapter (logits kind, torch).

Check it (torch worker; the absolute path of this file):

    grpo-verify check --objective cross_entropy --impl /abs/path/examples/unsloth/head_adapter.py:head_loss
    grpo-verify check --objective cross_entropy --impl /abs/path/examples/unsloth/head_adapter.py:head_loss_untempered

`head_loss_untempered` is the same function declaring no temperature, so that the softcap cases
(the odd-V softcap edge among them) are drawn at temperature 1 and none is refused.
`head_loss_scale_before_softcap` exists to show UC1 (FINDINGS.md): it passes 1 / tau as
`logit_scaling` with a softcap too, where `head_loss` refuses, and fails there by the order.

What runs is `unsloth.kernels.cross_entropy_loss` (Apache-2.0, as its header says; this file only
calls it): `fast_cross_entropy_loss` (:537-569), the loss Unsloth's `*ForCausalLM` forwards call
(models/llama.py:2172) and the one `patch_loss_functions` (:578) installs as transformers'
`ForCausalLMLoss` for ignore_index -100 (unsloth_zoo/loss_utils.py:180-186), and under `none`
its autograd Function `Fast_CrossEntropyLoss` (:390-534), whose per-row losses
`fast_cross_entropy_loss` sums. The Triton kernels `_cross_entropy_forward` (:56, V <= 65536;
`_chunked_cross_entropy_forward`, :185, above) store per-row losses and log-sum-exps in f32; the
backward (`_cross_entropy_backward`, :297) recomputes the transformed logits and writes d logits
times each row's own cotangent (`dloss_ptr + row * dlosses.stride(0)`, :336, :378) into a new
tensor of the logits' dtype (:497).

Importing on a machine without a GPU: `import unsloth` (which `import unsloth.kernels...` runs)
selects Unsloth's CPU backend (unsloth/__init__.py:1652-1663, unsloth/_cpu_init.py: it patches
transformers' / TRL's trainers, never this kernel) and `unsloth.kernels` imports as on a GPU
(kernels/utils.py with DEVICE_TYPE "cpu", DEVICE_COUNT 0: `torch_gpu_device` is a null context,
`is_cdna()` False). This module sets, with `os.environ.setdefault` before the import:
  TRITON_INTERPRET=1          (no CUDA only) Triton's interpreter: @triton.jit reads it at decoration
  UNSLOTH_COMPILE_LOCATION    a temporary directory: the import otherwise creates
                              ./unsloth_compiled_cache in the current directory
Nothing is stubbed and the kernel module is not loaded by path. In the interpreter three things
of Triton 3.8.0's interpreter are fixed, none of Unsloth's code
(grpo_verify_worker/triton_interpreter.py): the bf16 store of d logits rounds to nearest; the kernel
module's `triton_tanh` (libdevice.tanh, kernels/utils.py:75, a stub returning None in the
interpreter) is NumPy's, through `libdevice_tanh_for`; and its `triton_cast` (= `tl.cast`,
kernels/utils.py:76, used at :90, :230, :334-335) calls `tl.cast` as the interpreter patches it:
the interpreter patches builtins on `triton.language` only, so the alias raises "Did you forget to
add @triton.jit ?" (`builtin_aliases_for`). On CUDA none of them applies.

The mapping (docs/spec.md -> Unsloth):
  logits [N, V], labels [N] -> logits [B, T, V], labels [B, T] (B = hparams batch; labels int64)
  softcap s (inf: none)     -> logit_softcapping = s (0: off)
  temperature tau, no softcap -> logit_scaling = 1 / tau (0: off at tau = 1): Unsloth folds a
                               logit divisor into this one factor itself (models/llama.py:1907-1913,
                               `resolve_logit_scaling`: logit_scaling = 1 / logit_scale_divide)
  reduction mean            -> n_items=None: the sum over the count of labels != -100, 0 -> 1 (:561-569)
  reduction over_count (n)  -> n_items = tensor(n) (as the trainer's num_items_in_batch)
  reduction batchmean (B)   -> n_items = B: the same `loss.sum() / n_items`
  reduction sum             -> n_items = 1
  reduction none            -> Fast_CrossEntropyLoss.apply: the per-row losses (ignored rows 0)
Declared unsupported (`supports`) and refused: an ignore_index other than -100 (the kernels test
`label_idx != -100`, :116, :275, :341, :481; there is no parameter), label smoothing, a z-loss and
class weights (none exists), distillation. Refused too: a temperature with a softcap, since Unsloth
scales before the softcap (:102-106) where SPEC divides after it (s tanh(z / s) / tau).
"""

import os
import pathlib
import tempfile

import torch
from grpo_verify_worker import triton_interpreter
from grpo_verify_worker.loader import import_file

if not torch.cuda.is_available():
    # Must precede the decoration of Unsloth's kernels: @triton.jit reads it when the kernel is defined.
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("UNSLOTH_COMPILE_LOCATION", os.path.join(tempfile.gettempdir(), "unsloth_compiled_cache"))

from unsloth.kernels import cross_entropy_loss as unsloth_ce  # noqa: E402

triton_interpreter.require(unsloth_ce._cross_entropy_forward, "Unsloth's cross-entropy")


if not torch.cuda.is_available():
    # Each rebinds a module global the kernels read, never their code (the module docstring).
    triton_interpreter.round_bf16_casts_to_nearest()  # d logits stored into a bf16 tensor (:378, :497)
    triton_interpreter.bf16_arithmetic_as_floats()  # bf16 + - * / on values, not on their uint16 storage
    triton_interpreter.libdevice_tanh_for(unsloth_ce, "triton_tanh")  # libdevice.tanh (kernels/utils.py:75)
    triton_interpreter.builtin_aliases_for(unsloth_ce, "triton_cast")  # tl.cast (kernels/utils.py:76)


# The adapters' one refusal (docs/spec.md, "Refusing a configuration"): `switch` names a switch of
# schema.json ("reduction" for the head losses), None a hyperparameter no switch relaxes.
Refused = import_file(pathlib.Path(__file__).parents[1] / "spec_mapping.py").Refusal

IGNORE_INDEX = -100  # fixed in the kernels (:116, :275, :341) and in fast_cross_entropy_loss (:562)


def _transforms(hparams, scale_before_softcap=False):
    """(logit_softcapping, logit_scaling) of the case, 0 meaning off, as Unsloth's callers pass them."""
    softcap, tau = hparams["softcap"], hparams["temperature"]
    capped = softcap != float("inf")
    if capped and tau != 1.0 and not scale_before_softcap:
        raise Refused("Unsloth's logit scaling precedes its softcap (s tanh(z / (tau s))); SPEC divides "
                      "the softcapped logits by the temperature (s tanh(z / s) / tau)", switch=None)
    return (float(softcap) if capped else 0), (1.0 / float(tau) if tau != 1.0 else 0)


def head_loss(inputs, objective, config, hparams, scale_before_softcap=False):
    """`fast_cross_entropy_loss` (scalar reductions) or `Fast_CrossEntropyLoss` (none) on the logits."""
    if objective != "cross_entropy":
        raise Refused("Unsloth's fast_cross_entropy_loss is a cross-entropy", switch=None)
    reduction = config["reduction"]
    if reduction not in ("none", "sum", "mean", "over_count", "batchmean"):
        raise Refused(f"Unsloth's cross-entropy has no reduction {reduction!r}", switch="reduction", value=reduction)
    if int(hparams["ignore_index"]) != IGNORE_INDEX:
        raise Refused("Unsloth's cross-entropy ignores label -100 only", switch=None)
    for name in ("label_smoothing", "z_loss"):
        if hparams[name] != 0.0:
            raise Refused(f"Unsloth's cross-entropy has no {name}", switch=None)
    if inputs.get("class_weights") is not None:
        raise Refused("Unsloth's cross-entropy takes no class weights", switch=None)
    softcapping, scaling = _transforms(hparams, scale_before_softcap)
    logits, labels = inputs["logits"], inputs["labels"]
    if reduction == "none":
        return unsloth_ce.Fast_CrossEntropyLoss.apply(logits, labels, softcapping, scaling), {}
    n, v = logits.shape
    b = int(hparams["batch"])
    n_items = {
        "mean": None,
        "sum": 1,
        "over_count": torch.tensor(hparams["num_items"], dtype=torch.float32) if reduction == "over_count" else None,
        "batchmean": b,
    }[reduction]
    loss = unsloth_ce.fast_cross_entropy_loss(
        logits.reshape(b, n // b, v), labels.reshape(b, n // b),
        logit_softcapping=softcapping, logit_scaling=scaling, n_items=n_items,
    )
    return loss, {}


head_loss.kind = "logits"
head_loss.framework = "torch"
# What the draws keep to (docs/spec.md, "The head-loss adapter"); the refusals above stay as the guard.
head_loss.supports = {
    "reductions": ["none", "sum", "mean", "over_count", "batchmean"],
    "ignore_index": [IGNORE_INDEX],
    "label_smoothing": False,
    "z_loss": False,
    "class_weights": False,
}


def head_loss_untempered(inputs, objective, config, hparams):
    """`head_loss` with the temperature declared unsupported: every softcap draw is checked."""
    return head_loss(inputs, objective, config, hparams)


head_loss_untempered.kind = "logits"
head_loss_untempered.framework = "torch"
head_loss_untempered.supports = dict(head_loss.supports, temperature=False)


def head_loss_scale_before_softcap(inputs, objective, config, hparams):
    """UC1's demonstration, not a mapping: 1 / tau as `logit_scaling` with a softcap as well, which
    Unsloth applies before the softcap, s tanh(z / (tau s)), where SPEC has s tanh(z / s) / tau."""
    return head_loss(inputs, objective, config, hparams, scale_before_softcap=True)


head_loss_scale_before_softcap.kind = "logits"
head_loss_scale_before_softcap.framework = "torch"
head_loss_scale_before_softcap.supports = head_loss.supports
