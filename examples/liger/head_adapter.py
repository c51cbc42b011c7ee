"""Liger-Kernel 0.8.5's fused-linear JSD behind docs/spec.md's head-loss adapter (fused kind, torch).

Check it (torch worker; the absolute path of this file):

    grpo-verify check --objective distillation --impl /abs/path/examples/liger/head_adapter.py:head_loss

What runs is Liger's own `LigerFusedLinearJSDLoss` (liger_kernel/chunked_loss/jsd_loss.py, on
`LigerFusedLinearDistillationBase` in fused_linear_distillation.py) with `compiled=False`, plain
torch on CPU: row chunks of `chunk_size` tokens, the student's and teacher's logits formed per chunk
(input @ weight.t() + bias), both divided by the temperature (fused_linear_distillation.py:120-121),
the soft loss summed over the chunk's unmasked rows and divided by the batch's count of them
(:138-146). Only the soft loss: weight_hard_loss = 0, weight_soft_loss = 1.

The mapping (docs/spec.md -> Liger):
  hidden [N, H], lm_head [H, V], bias [V]   -> student_input, student_weight = lm_head.T, student_bias
  teacher_hidden, teacher_lm_head            -> teacher_input, teacher_weight = teacher_lm_head.T
  labels [N], ignore_index                   -> true_labels (int64), ignore_index
  divergence forward_kl | reverse_kl | jsd(beta) -> beta 0 | 1 | beta (jsd_loss.py:33-46: the same
                                                    endpoints and mixture as TRL's)
  reduction mean                             -> Liger's only normalisation (over the unmasked rows)
Refused (NotImplementedError naming it): reductions other than mean; a softcap; cross-entropy.
"""

import os
import pathlib

import torch
from grpo_verify_worker.loader import import_file

if not torch.cuda.is_available():
    # Importing liger_kernel decorates its Triton kernels; on a machine without a GPU they must be
    # the interpreter's, for head_ce_adapter.py's cross-entropy in the same worker (none runs here).
    os.environ.setdefault("TRITON_INTERPRET", "1")

from liger_kernel.chunked_loss.jsd_loss import LigerFusedLinearJSDLoss  # noqa: E402


# The adapters' one refusal (docs/spec.md, "Refusing a configuration"): `switch` names a switch of
# schema.json ("reduction" for the head losses), None a hyperparameter no switch relaxes.
Refused = import_file(pathlib.Path(__file__).parents[1] / "spec_mapping.py").Refusal


def head_loss(inputs, objective, config, hparams, *, chunk_size=1024):
    if objective != "distillation":
        raise Refused("LigerFusedLinearJSDLoss is a distillation loss", switch=None)
    if config["reduction"] != "mean":
        raise Refused("Liger's distillation divides by the unmasked rows only", switch="reduction", value=config["reduction"])
    if hparams["softcap"] != float("inf"):
        raise Refused("Liger's distillation has no softcap", switch=None)
    beta = {"forward_kl": 0.0, "reverse_kl": 1.0, "jsd": hparams["beta"]}[config["divergence"]]
    loss = LigerFusedLinearJSDLoss(
        weight_hard_loss=0.0, weight_soft_loss=1.0, beta=beta, ignore_index=int(hparams["ignore_index"]),
        temperature=hparams["temperature"], compiled=False, chunk_size=chunk_size,
    )
    value = loss(inputs["hidden"], inputs["lm_head"].t(), inputs["teacher_hidden"], inputs["teacher_lm_head"].t(),
                 inputs["labels"], inputs.get("bias"))
    return value, {}


head_loss.kind = "fused"
head_loss.framework = "torch"
# What the draws keep to (docs/spec.md, "The head-loss adapter"); the refusals above stay as the guard.
head_loss.supports = {"reductions": ["mean"], "softcap": False}
