"""torchtune 0.6.1's chunked-output losses behind docs/spec.md's head-loss adapter (logits kind, torch).

Check them (torch worker; the absolute path of this file):

    grpo-verify check --objective cross_entropy --impl /abs/path/examples/torchtune/head_adapter.py:head_loss
    grpo-verify check --objective distillation  --impl /abs/path/examples/torchtune/head_adapter.py:head_loss
    grpo-verify check --objective distillation  --impl /abs/path/examples/torchtune/head_adapter.py:head_loss_symmetric
    grpo-verify check --objective distillation  --impl /abs/path/examples/torchtune/head_adapter.py:head_loss_plain

`head_loss_valid_rows` and `head_loss_symmetric_valid_rows` are the same, refusing a batch whose
every label is ignored (FINDINGS.md TT1, TT3: torchtune's 0/0 there), so that a run surveys the
rest; `head_loss_unmapped` is TT2's repro. TORCHTUNE_NUM_OUTPUT_CHUNKS (default 8) sets the count
of output chunks (3 splits T <= 6 unevenly).

What runs is torchtune's own code, as installed (torchtune/modules/loss/):
  - cross-entropy: `CEWithChunkedOutputLoss` (ce_chunked_output_loss.py:13-83): each chunk upcast to
    f32 and `F.cross_entropy(reduction="sum")` (:41-43), the chunks' sum divided by the count of
    non-ignored labels (:66, :83);
  - distillation: `ForwardKLWithChunkedOutputLoss` (kd_losses.py:172-254) and
    `ReverseKLWithChunkedOutputLoss` (:257-335), on the per-chunk `ForwardKLLoss` (:13-61) and
    `ReverseKLLoss` (:64-116) with `normalize=False`, the sum divided by the count of non-ignored
    labels; `head_loss_symmetric` runs `SymmetricKLWithChunkedOutputLoss` (:338-427) and
    `head_loss_plain` the unchunked `ForwardKLLoss` / `ReverseKLLoss` themselves.
Every one takes the logits in the model's dtype and upcasts them to f32 before its softmax
(ce :42; kd :49, :51, :100-103): no rounding beyond the returned gradient's cast back to bf16.

The mapping (docs/spec.md -> torchtune):
  logits, teacher_logits [N, V] -> [B, T, V] (B = hparams["batch"]) split as torchtune's models split
                                   their output, `hidden.chunk(num_output_chunks, dim=1)`
                                   (modules/transformer.py:498-501, `chunked_output`): a list of
                                   [B, T / 8, V] chunks, NUM_OUTPUT_CHUNKS = 8 (the losses' default)
  labels [N]                    -> labels [B, T]
  ignore_index                  -> ignore_index (the constructor's; any value)
  reduction mean                -> the chunked losses' only reduction: the sum over the non-ignored
                                   rows divided by their count
  reduction sum (head_loss_plain only) -> `normalize=False`
  divergence reverse_kl, jsd at beta = 1 -> ReverseKL...: sum_c q_c (log q_c - log p_c) exactly
  divergence forward_kl, jsd at beta = 0 -> ForwardKL..., less the teacher's entropy (below)
torchtune's "forward KL" is DistiLLM's `forward_kl` (the source its docstring cites, kd_losses.py:16):
-sum_c p_c log q_c (:49-53, :56, :61), the cross-entropy of the student against the teacher,
KL(p || q) + H(p). The adapter maps it onto SPEC's KL exactly by subtracting the mean (or sum, as
the loss reduces) over the non-ignored rows of the teacher's entropy H(p) = -sum_c p_c log p_c,
computed here in f64 from the teacher's logits (not differentiated, as SPEC's teacher is not),
from torchtune's f32 loss: a quantity of the teacher alone, so every gradient returned is
torchtune's own, untouched, and any error in torchtune's value still shows (FINDINGS.md, TT2).

Declared unsupported (`supports`) and refused: every reduction but mean (and sum in
`head_loss_plain`), a temperature other than 1 and a softcap (none of these losses has either; the
KD recipe applies none), and for cross-entropy label smoothing, a z-loss and class weights (:41-43
pass none of them). Refused too: JSD(beta) for 0 < beta < 1 (torchtune has no mixture divergence;
`SymmetricKL...`'s r * FKL + (1 - r) * RKL is another loss, FINDINGS.md TT4), and in
`head_loss_symmetric` every divergence but the endpoints r = 1 (forward) and r = 0 (reverse).
"""

import os
import pathlib

import torch
from grpo_verify_worker.loader import import_file
from torchtune.modules.loss import (
    CEWithChunkedOutputLoss,
    ForwardKLLoss,
    ForwardKLWithChunkedOutputLoss,
    ReverseKLLoss,
    ReverseKLWithChunkedOutputLoss,
    SymmetricKLWithChunkedOutputLoss,
)

# The adapters' one refusal (docs/spec.md, "Refusing a configuration"): `switch` names a switch of
# schema.json ("reduction" for the head losses), None a hyperparameter no switch relaxes.
Refused = import_file(pathlib.Path(__file__).parents[1] / "spec_mapping.py").Refusal

# torchtune's default (ce_chunked_output_loss.py:30, kd_losses.py:191, :276, :362), which the
# recipes' configs keep; the model splits its output with the same count (the KD recipe asserts the
# two agree, recipes/knowledge_distillation_single_device.py:282-285).
NUM_OUTPUT_CHUNKS = int(os.environ.get("TORCHTUNE_NUM_OUTPUT_CHUNKS", "8"))  # another count, to split T <= 8 unevenly


def _common_refusals(hparams, reduction, reductions):
    if reduction not in reductions:
        raise Refused(f"torchtune's loss reduces by {' or '.join(reductions)} only", switch="reduction", value=reduction)
    if hparams["temperature"] != 1.0:
        raise Refused("torchtune's chunked losses take no temperature", switch=None)
    if hparams["softcap"] != float("inf"):
        raise Refused("torchtune's chunked losses take no softcap", switch=None)


def _chunks(x, batch):
    """[N, V] -> torchtune's list of [B, T / chunks, V] output chunks (transformer.py:498-501)."""
    n, v = x.shape
    return list(x.reshape(batch, n // batch, v).chunk(NUM_OUTPUT_CHUNKS, dim=1))


def _side(objective, config, hparams):
    """Which endpoint a distillation case asks for: "forward" or "reverse" (JSD refused between)."""
    if objective != "distillation":
        raise Refused("torchtune's KD losses are distillation losses", switch=None)
    divergence = config["divergence"]
    if divergence == "jsd":
        beta = hparams["beta"]
        if beta == 0.0:
            return "forward"
        if beta == 1.0:
            return "reverse"
        raise Refused("torchtune has no JSD(beta): its SymmetricKL is r * forward + (1 - r) * reverse KL",
                      switch="divergence", value="jsd")
    return {"forward_kl": "forward", "reverse_kl": "reverse"}[divergence]


def _teacher_entropy(teacher_logits, labels, ignore_index, reduction):
    """The teacher's entropy over the non-ignored rows, reduced as the loss (mean: over their count,
    0 when there is none, as torchtune's guard :58-60, :250-252 returns). f64, not differentiated."""
    log_p = torch.log_softmax(teacher_logits.detach().double(), dim=-1)
    rows = -(log_p.exp() * log_p).sum(-1)
    live = labels != ignore_index
    total = torch.where(live, rows, torch.zeros_like(rows)).sum()
    if reduction == "mean":
        count = int(live.sum())
        total = total / count if count else total * 0.0
    return total


def _less_entropy(loss, inputs, hparams, reduction):
    """SPEC's forward KL from torchtune's -sum p log q (the module docstring; FINDINGS.md TT2)."""
    h = _teacher_entropy(inputs["teacher_logits"], inputs["labels"], int(hparams["ignore_index"]), reduction)
    return loss - h.to(loss.dtype)


def head_loss(inputs, objective, config, hparams):
    """`CEWithChunkedOutputLoss` (cross_entropy); `ForwardKLWithChunkedOutputLoss` /
    `ReverseKLWithChunkedOutputLoss` (distillation), on torchtune's output chunks."""
    _common_refusals(hparams, config["reduction"], ("mean",))
    ignore_index = int(hparams["ignore_index"])
    b = int(hparams["batch"])
    labels = inputs["labels"].reshape(b, -1)
    if objective == "cross_entropy":
        for name, off in (("label_smoothing", 0.0), ("z_loss", 0.0)):
            if hparams[name] != off:
                raise Refused(f"CEWithChunkedOutputLoss takes no {name}", switch=None)
        if inputs.get("class_weights") is not None:
            raise Refused("CEWithChunkedOutputLoss takes no class weights", switch=None)
        loss_fn = CEWithChunkedOutputLoss(num_output_chunks=NUM_OUTPUT_CHUNKS, ignore_index=ignore_index)
        return loss_fn(_chunks(inputs["logits"], b), labels), {}
    side = _side(objective, config, hparams)
    cls = ForwardKLWithChunkedOutputLoss if side == "forward" else ReverseKLWithChunkedOutputLoss
    loss_fn = cls(num_output_chunks=NUM_OUTPUT_CHUNKS, ignore_index=ignore_index)
    loss = loss_fn(_chunks(inputs["logits"], b), _chunks(inputs["teacher_logits"], b), labels)
    if side == "forward":
        loss = _less_entropy(loss, inputs, hparams, "mean")
    return loss, {}


def head_loss_symmetric(inputs, objective, config, hparams):
    """`SymmetricKLWithChunkedOutputLoss` at its endpoints: sym_kd_ratio 1 (forward KL, less the
    teacher's entropy as in `head_loss`) and 0 (reverse KL), which its docstring names (:352-353).
    Between them it is r * FKL + (1 - r) * RKL, which SPEC's JSD(beta) is not: refused (TT4)."""
    _common_refusals(hparams, config["reduction"], ("mean",))
    side = _side(objective, config, hparams)
    b = int(hparams["batch"])
    loss_fn = SymmetricKLWithChunkedOutputLoss(num_output_chunks=NUM_OUTPUT_CHUNKS,
                                               sym_kd_ratio=1.0 if side == "forward" else 0.0,
                                               ignore_index=int(hparams["ignore_index"]))
    loss = loss_fn(_chunks(inputs["logits"], b), _chunks(inputs["teacher_logits"], b), inputs["labels"].reshape(b, -1))
    if side == "forward":
        loss = _less_entropy(loss, inputs, hparams, "mean")
    return loss, {}


def head_loss_plain(inputs, objective, config, hparams):
    """The unchunked `ForwardKLLoss` / `ReverseKLLoss` on [N, V]: mean is `normalize=True` (guarded,
    :58-60, :114-115), sum is `normalize=False` (:55-56, :112-113)."""
    reduction = config["reduction"]
    _common_refusals(hparams, reduction, ("mean", "sum"))
    side = _side(objective, config, hparams)
    cls = ForwardKLLoss if side == "forward" else ReverseKLLoss
    loss_fn = cls(ignore_index=int(hparams["ignore_index"]))
    loss = loss_fn(inputs["logits"], inputs["teacher_logits"], inputs["labels"], normalize=reduction == "mean")
    if side == "forward":
        loss = _less_entropy(loss, inputs, hparams, reduction)
    return loss, {}


head_loss.kind = "logits"
head_loss.framework = "torch"
# What the draws keep to (docs/spec.md, "The head-loss adapter"); the refusals above stay as the guard.
head_loss.supports = {"reductions": ["mean"], "softcap": False, "temperature": False,
                      "label_smoothing": False, "z_loss": False, "class_weights": False}

head_loss_symmetric.kind = "logits"
head_loss_symmetric.framework = "torch"
head_loss_symmetric.supports = dict(head_loss.supports)

head_loss_plain.kind = "logits"
head_loss_plain.framework = "torch"
head_loss_plain.supports = dict(head_loss.supports, reductions=["mean", "sum"])


def _with_valid_rows(function, name):
    """`function` refusing a batch whose every label is ignored (FINDINGS.md TT1, TT3: 0/0 there),
    so that a run checks the rest of what it maps; the same code otherwise."""

    def wrapped(inputs, objective, config, hparams):
        if not bool((inputs["labels"] != int(hparams["ignore_index"])).any()):
            raise Refused("every label ignored: torchtune's 0/0 (FINDINGS.md TT1, TT3)", switch=None)
        return function(inputs, objective, config, hparams)

    wrapped.__name__ = wrapped.__qualname__ = name
    wrapped.__doc__ = f"`{function.__name__}` without the all-ignored batch. " + (_with_valid_rows.__doc__ or "")
    wrapped.kind, wrapped.framework, wrapped.supports = function.kind, function.framework, dict(function.supports)
    return wrapped


head_loss_valid_rows = _with_valid_rows(head_loss, "head_loss_valid_rows")
head_loss_symmetric_valid_rows = _with_valid_rows(head_loss_symmetric, "head_loss_symmetric_valid_rows")


def head_loss_unmapped(inputs, objective, config, hparams):
    """`ForwardKLWithChunkedOutputLoss`'s value as torchtune returns it, without the teacher's entropy
    that `head_loss` subtracts: -sum_c p_c log q_c, judged against SPEC's KL(p || q) to show the gap
    (FINDINGS.md TT2; its repro). Forward KL only; everything else is refused."""
    _common_refusals(hparams, config["reduction"], ("mean",))
    if _side(objective, config, hparams) != "forward":
        raise Refused("head_loss_unmapped shows the forward KL only", switch="divergence", value=config["divergence"])
    b = int(hparams["batch"])
    loss_fn = ForwardKLWithChunkedOutputLoss(num_output_chunks=NUM_OUTPUT_CHUNKS, ignore_index=int(hparams["ignore_index"]))
    return loss_fn(_chunks(inputs["logits"], b), _chunks(inputs["teacher_logits"], b), inputs["labels"].reshape(b, -1)), {}


head_loss_unmapped.kind = "logits"
head_loss_unmapped.framework = "torch"
head_loss_unmapped.supports = dict(head_loss.supports)
