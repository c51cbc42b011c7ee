"""TRL 1.15.0's GKD loss behind docs/spec.md's head-loss adapter (logits kind, torch).

Check it (torch worker; the absolute path of this file):

    grpo-verify check --objective distillation --impl /abs/path/examples/trl/head_adapter.py:head_loss

What runs is TRL's own `GKDTrainer.generalized_jsd_loss` (trl/experimental/gkd/gkd_trainer.py:238-321
in trl 1.15.0), plain torch: temperature on both logits (:271-272), log-softmax, KL(p || q) at beta = 0,
KL(q || p) at beta = 1, between them the mixture beta p + (1 - beta) q (:278-297).

The mapping (docs/spec.md -> TRL):
  logits, teacher_logits [N, V]  -> student_logits, teacher_logits [B, T, V]
  labels [N]                     -> labels [B, T] (TRL masks label -100, :300-302)
  divergence forward_kl | reverse_kl | jsd(beta) -> beta 0 | 1 | beta
  reduction mean                 -> reduction="batchmean" with labels: TRL divides by the count of
                                    unmasked tokens (:311-316, clamped to 1), our per-token mean
  reduction sum                  -> reduction="sum"
  reduction over_count (n)       -> num_items_in_batch = n (:305-310)
  reduction none                 -> reduction="none" without labels (TRL's [B, T, V] elements),
                                    summed over V and masked by the adapter (TRL's own "none"
                                    with labels returns the unmasked elements, not rows)
Refused (NotImplementedError naming it): reduction batchmean (TRL's "batchmean" with labels is the
per-token mean above; over B it has no form with labels); ignore_index other than -100 (TRL's
mask is fixed, :301); a softcap (TRL has none); cross-entropy (not this loss).
"""

import os
import pathlib

import torch
from grpo_verify_worker.loader import import_file

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
if not torch.cuda.is_available():
    # Before the library's import, which may import liger_kernel and so decorate Triton kernels: on a
    # machine without a GPU they must be the interpreter's, for a Triton adapter in the same worker
    # (examples/liger/head_ce_adapter.py). None runs here.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from trl.experimental.gkd.gkd_trainer import GKDTrainer  # noqa: E402


# The adapters' one refusal (docs/spec.md, "Refusing a configuration"): `switch` names a switch of
# schema.json ("reduction" for the head losses), None a hyperparameter no switch relaxes.
Refused = import_file(pathlib.Path(__file__).parents[1] / "spec_mapping.py").Refusal


def head_loss(inputs, objective, config, hparams):
    if objective != "distillation":
        raise Refused("TRL's GKD loss is a distillation loss", switch=None)
    if hparams["softcap"] != float("inf"):
        raise Refused("TRL's GKD loss has no softcap", switch=None)
    if int(hparams["ignore_index"]) != -100:
        raise Refused("TRL's GKD loss masks label -100 only", switch=None)
    reduction = config["reduction"]
    if reduction == "batchmean":
        raise Refused("TRL's batchmean with labels is the per-token mean; over B it has no form", switch="reduction", value=reduction)
    beta = {"forward_kl": 0.0, "reverse_kl": 1.0, "jsd": hparams["beta"]}[config["divergence"]]
    labels = inputs["labels"]
    n = labels.shape[0]
    b = int(hparams["batch"])
    shape = (b, n // b, -1)
    student, teacher = inputs["logits"].reshape(shape), inputs["teacher_logits"].reshape(shape)
    tau = hparams["temperature"]
    jsd = GKDTrainer.generalized_jsd_loss
    if reduction == "none":
        elements = jsd(student, teacher, labels=None, beta=beta, temperature=tau, reduction="none")
        rows = elements.sum(-1).reshape(n)
        return torch.where(labels != -100, rows, torch.zeros_like(rows)), {}
    y = labels.reshape(b, n // b)
    if reduction == "over_count":
        return jsd(student, teacher, labels=y, beta=beta, temperature=tau, num_items_in_batch=hparams["num_items"]), {}
    return jsd(student, teacher, labels=y, beta=beta, temperature=tau, reduction={"mean": "batchmean", "sum": "sum"}[reduction]), {}


head_loss.kind = "logits"
head_loss.framework = "torch"
# What the draws keep to (docs/spec.md, "The head-loss adapter"); the refusals above stay as the guard.
head_loss.supports = {"reductions": ["none", "sum", "mean", "over_count"], "softcap": False, "ignore_index": [-100]}
