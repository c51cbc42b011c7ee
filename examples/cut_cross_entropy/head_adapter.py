"""cut-cross-entropy 25.1.1's `linear_cross_entropy` behind docs/spec.md's head-loss adapter (fused kind, torch).

Check it (torch worker; the absolute path of this file):

    grpo-verify check --objective cross_entropy --dtype bf16 --impl /abs/path/examples/cut_cross_entropy/head_adapter.py:head_loss
    grpo-verify check --objective cross_entropy --dtype bf16 --impl /abs/path/examples/cut_cross_entropy/head_adapter.py:head_loss_exact
    grpo-verify check --objective cross_entropy --dtype f32 --impl /abs/path/examples/cut_cross_entropy/head_adapter.py:head_loss_compiled

What runs is the installed `cut_cross_entropy.linear_cross_entropy` (linear_cross_entropy.py:29-66):
with `impl="cce"` (`head_loss`, `head_loss_exact`) `cce_linear_cross_entropy` (cce.py:135-180), whose
autograd function (cce.py:35-117) runs three Triton kernels: the log-sum-exp of e @ c.T over vocabulary
blocks (cce_lse_forward.py), the target logit (indexed_dot.py) and the fused backward
(cce_backward.py), which recomputes the logits block by block and accumulates d e and d c; with
`impl="torch_compile"` (`head_loss_compiled`) `torch_compile_linear_cross_entropy` (torch_compile.py),
`F.cross_entropy((e @ c.T).float())` under `torch.compile`. On a machine without a GPU the Triton
kernels run in Triton's interpreter (TRITON_INTERPRET=1, set before the library's kernels are
decorated), with the shim's fixes to the interpreter (grpo_verify_worker/triton_interpreter.py: bf16
casts rounded to nearest, bf16 `tl.dot` on the values, float arguments as fp32 scalars, and the two
CCE needed first: bf16 elementwise arithmetic on the values, and libdevice's `tanh` and `log1p`,
stubs in the interpreter, taken from NumPy). The library
also runs two small `torch.compile` functions on every call (cce.py:30-32 `sort_logit_avg`, and
utils.py:5-7 `softcapping` under a softcap): Inductor builds them in C++ on the CPU.

The mapping (docs/spec.md -> cut-cross-entropy):
  hidden [N, H]              -> e [N, D]
  lm_head [H, V]             -> c = lm_head.t() [V, D] (a view; its gradient comes back through it)
  labels [N]                 -> targets (int64), shift=False (SPEC's labels are each row's target)
  ignore_index               -> ignore_index
  softcap (None when inf)    -> softcap: s * tanh(z / s) (tl_utils.py:23-24, utils.py:5-7), SPEC's; but
                                impl "cce" counts a padded column of the forward's last 128-column
                                block as a class at logit -s where V % 128 != 0 (CC1, a bug)
  reduction none | sum | mean -> the same; mean is over the unignored rows (cce.py:69, :94)
  (head_loss)                -> filter_eps="high", the library's default (linear_cross_entropy.py:37):
                                the backward skips a 128 x 128 block of d logits whose every
                                |softmax - onehot| is below bf16 eps / 32 (utils.py:20-23,
                                cce_backward.py:167-169)
  (head_loss_exact)          -> filter_eps=None: no block skipped
Declared unsupported (`supports`) and refused: label smoothing, a z-loss, class weights, a
temperature other than 1 (`linear_cross_entropy` has none of them) and a bias (this release has no
bias argument, linear_cross_entropy.py:29-38), over_count and batchmean, distillation. Refused too:
for impl "cce" f32 inputs, which its backward refuses
(cce_backward.py:259-262, "Backwards requires embeddings to be bf16 or fp16"; FINDINGS.md, CC2).
"""

import os
import pathlib

import torch
from grpo_verify_worker import triton_interpreter
from grpo_verify_worker.loader import import_file

if not torch.cuda.is_available():
    # Must precede the decoration of CCE's kernels: @triton.jit reads it when the kernel is defined.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from cut_cross_entropy import cce_backward, linear_cross_entropy, tl_utils  # noqa: E402

# A plain @triton.jit function of CCE's (its kernels are wrapped twice in triton.heuristics, and the
# shim's `interpreted` looks one wrapper deep); all of them are decorated at the same import.
triton_interpreter.require(cce_backward._mm_backward, "cut-cross-entropy's CCE kernels")
if not torch.cuda.is_available():
    triton_interpreter.round_bf16_casts_to_nearest()
    triton_interpreter.multiply_bf16_dots_as_floats()
    triton_interpreter.pass_float_args_as_f32()
    triton_interpreter.bf16_arithmetic_as_floats()  # indexed_dot.py:64 (e * c in bf16), tl_utils.py:46 (bf16 tiles added)
    triton_interpreter.libdevice_module_for(tl_utils)  # tl_utils.py:14 (tanh: the softcap), :19 (log1p: the lse merge, :34-37)


# The library compiles with `torch.compile(fullgraph=True, dynamic=True)` (torch_compile.py:14, cce.py:30,
# utils.py:5): each new reduction, softcap presence or size-1 dimension is a recompile, and at torch's
# `recompile_limit` (8) fullgraph=True makes the next one an error, FailOnRecompileLimitHit (CC5). By
# default the adapter leaves torch's settings (what the library's users get);
# GRPO_VERIFY_CCE_RECOMPILE_LIMIT=N raises the limit so that a run checks every case past CC5.
if os.environ.get("GRPO_VERIFY_CCE_RECOMPILE_LIMIT"):
    import torch._dynamo

    torch._dynamo.config.recompile_limit = int(os.environ["GRPO_VERIFY_CCE_RECOMPILE_LIMIT"])


# The adapters' one refusal (docs/spec.md, "Refusing a configuration"): `switch` names a switch of
# schema.json ("reduction" for the head losses), None a hyperparameter no switch relaxes.
Refused = import_file(pathlib.Path(__file__).parents[1] / "spec_mapping.py").Refusal


def _call(inputs, objective, config, hparams, impl, filter_eps="high"):
    if objective != "cross_entropy":
        raise Refused("linear_cross_entropy is a cross-entropy", switch=None)
    reduction = config["reduction"]
    if reduction not in ("none", "sum", "mean"):
        raise Refused("linear_cross_entropy reduces by none, sum or mean", switch="reduction", value=reduction)
    for name, off in (("label_smoothing", 0.0), ("z_loss", 0.0), ("temperature", 1.0)):
        if hparams[name] != off:
            raise Refused(f"linear_cross_entropy takes no {name}", switch=None)
    if inputs.get("class_weights") is not None:
        raise Refused("linear_cross_entropy takes no class weights", switch=None)
    if inputs.get("bias") is not None:
        raise Refused("cut-cross-entropy 25.1.1's linear_cross_entropy takes no bias", switch=None)
    hidden, lm_head = inputs["hidden"], inputs["lm_head"]
    if impl == "cce" and hidden.dtype not in (torch.bfloat16, torch.float16):
        # cce_backward.py:259-262 asserts it in the backward, after a forward that accepts f32 (CC2).
        raise Refused("CCE's backward takes bf16 or fp16 embeddings only", switch=None)
    softcap = None if hparams["softcap"] == float("inf") else float(hparams["softcap"])
    loss = linear_cross_entropy(
        hidden, lm_head.t(), inputs["labels"], ignore_index=int(hparams["ignore_index"]), softcap=softcap,
        reduction=reduction, shift=False, filter_eps=filter_eps, impl=impl,
    )
    return loss, {}


def head_loss(inputs, objective, config, hparams):
    """`linear_cross_entropy(..., impl="cce")` with the library's default `filter_eps="high"`."""
    return _call(inputs, objective, config, hparams, "cce")


def head_loss_exact(inputs, objective, config, hparams):
    """`linear_cross_entropy(..., impl="cce", filter_eps=None)`: no gradient block skipped."""
    return _call(inputs, objective, config, hparams, "cce", filter_eps=None)


def head_loss_compiled(inputs, objective, config, hparams):
    """`linear_cross_entropy(..., impl="torch_compile")`: e @ c.T, the softcap, then
    `F.cross_entropy(logits.float())` (torch_compile.py:14-31), Inductor's C++ on the CPU."""
    return _call(inputs, objective, config, hparams, "torch_compile")


def head_loss_compiled_past_cc3(inputs, objective, config, hparams):
    """`head_loss_compiled` refusing only the case of CC3 (a mean over a batch whose every label is
    ignored: torch's 0/0), which the plan pins early in every run, and with torch's recompile limit
    raised to at least 256 in its worker (CC5), so that a run checks the rest."""
    if config["reduction"] == "mean" and bool((inputs["labels"] == int(hparams["ignore_index"])).all()):
        raise Refused("a mean with every label ignored: F.cross_entropy's 0/0 (FINDINGS.md, CC3)", switch=None)
    import torch._dynamo

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 256)
    return head_loss_compiled(inputs, objective, config, hparams)


for _entry in (head_loss, head_loss_exact, head_loss_compiled, head_loss_compiled_past_cc3):
    _entry.kind = "fused"
    _entry.framework = "torch"
    # What the draws keep to (docs/spec.md, "The head-loss adapter"); the refusals above stay as the guard.
    _entry.supports = {"reductions": ["none", "sum", "mean"], "temperature": False, "label_smoothing": False,
                       "z_loss": False, "class_weights": False, "bias": False}
