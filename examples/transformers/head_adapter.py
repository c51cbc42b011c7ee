"""transformers 5.10.2's causal-LM loss behind docs/spec.md's head-loss adapter (logits kind, torch).

Check it (torch worker; the absolute path of this file):

    grpo-verify check --objective cross_entropy --impl /abs/path/examples/transformers/head_adapter.py:head_loss

What runs is `transformers.loss.loss_utils.ForCausalLMLoss` (loss_utils.py:48-70), the loss every
`*ForCausalLM` model's `loss_function` is: the logits upcast to f32 (:58), then
`fixed_cross_entropy` (:31-45), torch's `cross_entropy` with `reduction="mean"`, or `"sum"` divided
by `num_items_in_batch` when one is given (the gradient-accumulation fix).

The mapping (docs/spec.md -> transformers):
  logits [N, V], labels [N]    -> logits [B, T, V] and `shift_labels` [B, T]: our labels are already
                                  the targets of their rows, so transformers' own shift (:60-63) is
                                  skipped by passing them as shift_labels
  ignore_index                 -> ignore_index
  reduction mean               -> num_items_in_batch=None: torch's mean over the unignored rows
  reduction over_count (n)     -> num_items_in_batch = n: sum / n
Declared unsupported (`supports`) and refused: the other reductions, label smoothing, a z-loss, class
weights, a softcap and a temperature other than 1 (fixed_cross_entropy passes none of them to
cross_entropy), distillation.
"""

import os
import pathlib

import torch
from grpo_verify_worker.loader import import_file

if not torch.cuda.is_available():
    # Before the library's import, which may import liger_kernel and so decorate Triton kernels: on a
    # machine without a GPU they must be the interpreter's, for a Triton adapter in the same worker
    # (examples/liger/head_ce_adapter.py). None runs here.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from transformers.loss.loss_utils import ForCausalLMLoss  # noqa: E402


# The adapters' one refusal (docs/spec.md, "Refusing a configuration"): `switch` names a switch of
# schema.json ("reduction" for the head losses), None a hyperparameter no switch relaxes.
Refused = import_file(pathlib.Path(__file__).parents[1] / "spec_mapping.py").Refusal


def head_loss(inputs, objective, config, hparams):
    if objective != "cross_entropy":
        raise Refused("ForCausalLMLoss is a cross-entropy", switch=None)
    reduction = config["reduction"]
    if reduction not in ("mean", "over_count"):
        raise Refused("ForCausalLMLoss has a mean and a sum over num_items_in_batch", switch="reduction", value=reduction)
    for name, off in (("label_smoothing", 0.0), ("z_loss", 0.0), ("softcap", float("inf")), ("temperature", 1.0)):
        if hparams[name] != off:
            raise Refused(f"ForCausalLMLoss takes no {name}", switch=None)
    if inputs.get("class_weights") is not None:
        raise Refused("ForCausalLMLoss takes no class weights", switch=None)
    logits, labels = inputs["logits"], inputs["labels"]
    n, v = logits.shape
    b = int(hparams["batch"])
    shift = labels.reshape(b, n // b)
    items = torch.tensor(hparams["num_items"]) if reduction == "over_count" else None
    loss = ForCausalLMLoss(logits.reshape(b, n // b, v), shift, v, num_items_in_batch=items,
                           ignore_index=int(hparams["ignore_index"]), shift_labels=shift)
    return loss, {}


head_loss.kind = "logits"
head_loss.framework = "torch"
# What the draws keep to (docs/spec.md, "The head-loss adapter"); the refusals above stay as the guard.
head_loss.supports = {"reductions": ["mean", "over_count"], "softcap": False, "temperature": False,
                      "label_smoothing": False, "z_loss": False, "class_weights": False}


def head_loss_over_count(inputs, objective, config, hparams):
    """`head_loss` on the over_count reduction only: transformers' gradient-accumulation path
    (`num_items_in_batch`, what its Trainer passes), without FINDINGS.md's TF1 (the mean's 0/0)."""
    return head_loss(inputs, objective, config, hparams)


head_loss_over_count.kind = "logits"
head_loss_over_count.framework = "torch"
head_loss_over_count.supports = dict(head_loss.supports, reductions=["over_count"])
