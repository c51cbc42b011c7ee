"""verl 0.9.1's Triton fused linear cross-entropy behind docs/spec.md v2's PyTorch adapter contract
(fused kind).

    grpo-verify check --impl examples/verl/triton_adapter.py:grpo_loss_fused --objective verl:vanilla \\
        --max-hidden 256

What runs is `verl.utils.kernel.linear_cross_entropy.linear_cross_entropy` (linear_cross_entropy.py:119,
the `LinearCrossEntropy` autograd Function, :38), the GPU path behind verl's fused log-probs and entropy:
verl's patched model forward calls it as `linear_cross_entropy(hidden_states, self.lm_head.weight,
rolled_labels, temperature, "none")` when `_verl_fused_kernels_backend` is "triton"
(models/transformers/dense_common.py:139-195). Its Triton kernels (utils/kernel/kernels.py): the forward
mainloop over 1024-column vocabulary splits (`efficient_entropy_kernel_general_mainloop`, :188) and the
epilogue that merges the splits (`efficient_entropy_triton_kernel_epilogue`, :351); the backward's
default `_Split_Dlogits_N` (:168, :1663-1721): d logits per 9504-column split
(`efficient_entropy_backward_kernel_general_d_logits_split_N`, :1388) stored in the hidden states' dtype,
then torch matmuls for d hidden and d weight. The log-probs and entropies then go through verl's actor
loss exactly as examples/verl/adapter.py's `grpo_loss_fused` sends its torch-backend ones
(`verl.workers.utils.losses.ppo_loss`, with that adapter's mapping, refusals and glue, imported from it).

On CPU three things stand between verl's code and the interpreter, and the adapter handles each
without touching verl's files:

1. Triton's interpreter: TRITON_INTERPRET=1 is set below before verl's kernels are decorated (as
   examples/trl/adapter.py does).
2. `assert hidden.is_cuda and ...` in the host functions (kernels.py:577, 634, 1532, 1554, 1570, 1576).
   Setting PYTHONOPTIMIZE in os.environ here is too late: asserts are compiled out only when the
   interpreter starts with -O (sys.flags.optimize is read once, at start-up; a run with
   os.environ["PYTHONOPTIMIZE"] = "1" set before the import still raises at kernels.py:577). Instead the
   adapter compiles kernels.py itself, from its own source, with the `X.is_cuda` operands removed from
   those asserts and every other check kept (contiguity, shapes, `hidden_size % 128 == 0`), and installs
   it as `verl.utils.kernel.kernels` before `LinearCrossEntropy.forward` imports it (`from . import
   kernels`, linear_cross_entropy.py:67). Alternatively, start grpo-verify with PYTHONOPTIMIZE=1 in its
   environment (the worker inherits it; then verl's module is imported as it is, every assert stripped,
   the worker's and every library's too).
3. Two bugs of Triton 3.8.0's interpreter (not verl's, not on a GPU), fixed in the interpreter:
   f32 -> bf16 casts truncate (examples/trl/FINDINGS.md, H1; here the store of d logits into the bf16
   buffer, kernels.py:1510) and `tl.dot` on bf16 operands multiplies their uint16 storage as integers
   (`InterpreterBuilder.create_dot` converts only 8-bit floats; repros/triton_interpreter_bf16_dot.py):
   bf16 operands are converted to f32 first, exact, as the GPU's MMA multiplies them.

verl's kernel needs hidden_size % 128 == 0 (kernels.py:596, 1544): other H are refused with
NotImplementedError. Everything examples/verl/adapter.py refuses is refused here too. One more piece of
glue: verl's backward asserts that the incoming gradients are contiguous (kernels.py:1553), which
adapter.py's packed layout does not give for B > 1; `_ContiguousGradient` makes them so.

Speed: the interpreter's `tl.dot` is NumPy's matmul; with OpenBLAS threads on a loaded machine a tile
product takes milliseconds, with OPENBLAS_NUM_THREADS=1 tens of microseconds. Run grpo-verify with
OPENBLAS_NUM_THREADS=1 (the worker inherits it): about 1 s per case at V <= 300 instead of 5.
"""

import ast
import importlib.util
import os
import pathlib
import sys

import torch
from grpo_verify_worker import triton_interpreter
from grpo_verify_worker.loader import import_file

if not torch.cuda.is_available():
    # Must precede the decoration of verl's kernels: @triton.jit reads it when the kernel is defined.
    os.environ.setdefault("TRITON_INTERPRET", "1")

KERNELS = "verl.utils.kernel.kernels"


class _DropDeviceChecks(ast.NodeTransformer):
    """Remove the `X.is_cuda` operands of `assert a and b and ...`, keeping every other operand."""

    def __init__(self):
        self.lines = []

    def visit_Assert(self, node):
        test = node.test
        operands = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
        kept = [v for v in operands if not (isinstance(v, ast.Attribute) and v.attr == "is_cuda")]
        if len(kept) == len(operands):
            return node
        self.lines.append(node.lineno)
        if not kept:
            return ast.copy_location(ast.Pass(), node)
        node.test = kept[0] if len(kept) == 1 else ast.copy_location(ast.BoolOp(op=ast.And(), values=kept), test)
        return node


def _load_kernels_without_device_asserts():
    """verl.utils.kernel.kernels compiled from its source without its `is_cuda` asserts (see above)."""
    if sys.flags.optimize:  # PYTHONOPTIMIZE / -O: verl's module runs as it is, every assert stripped
        import verl.utils.kernel.kernels as module

        return module, []
    spec = importlib.util.find_spec(KERNELS)
    path = spec.origin
    tree = ast.parse(pathlib.Path(path).read_text(), path)
    dropper = _DropDeviceChecks()
    tree = ast.fix_missing_locations(dropper.visit(tree))
    module = importlib.util.module_from_spec(spec)
    previous = sys.modules.get(KERNELS)
    sys.modules[KERNELS] = module
    try:
        exec(compile(tree, path, "exec"), module.__dict__)  # filename kept: Triton reads the kernels' source
    except BaseException:
        if previous is None:
            del sys.modules[KERNELS]
        else:
            sys.modules[KERNELS] = previous
        raise
    import verl.utils.kernel as package

    package.kernels = module
    return module, dropper.lines


verl_kernels, DROPPED_ASSERT_LINES = _load_kernels_without_device_asserts()
from verl.utils.kernel.linear_cross_entropy import linear_cross_entropy  # noqa: E402


triton_interpreter.require(verl_kernels.efficient_entropy_kernel_general_mainloop, "verl's linear_cross_entropy")
INTERPRETED = triton_interpreter.interpreted(verl_kernels.efficient_entropy_kernel_general_mainloop)
if INTERPRETED:
    triton_interpreter.round_bf16_casts_to_nearest()
    triton_interpreter.bf16_arithmetic_as_floats()  # bf16 + - * / on values, not on their uint16 storage
    triton_interpreter.multiply_bf16_dots_as_floats()


# examples/verl/adapter.py, for its verl actor loss (mapping, refusals and glue): the module the
# worker loads for `adapter.py:...`, the same object.
verl_adapter = import_file(pathlib.Path(__file__).with_name("adapter.py"))

HIDDEN_MULTIPLE = 128  # kernels.py:596 (forward) and :1544 (backward): `assert hidden_size % 128 == 0`


class _ContiguousGradient(torch.autograd.Function):
    """The identity, whose backward makes the incoming gradient contiguous.

    verl's backward asserts `dlogprobs.is_contiguous() and dentropy.is_contiguous()` (kernels.py:1553);
    the packed layout of examples/verl/adapter.py (`torch.cat([per_token, zeros], dim=1)`) hands back a
    strided slice for B > 1 (CatBackward's narrow). In verl's trainer the log-probs reach the loss
    through gathers whose gradients are fresh tensors; this glue restores that (FINDINGS.md, VT2).
    """

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous()


def grpo_loss_fused(*, hidden, lm_head, tokens, mask, advantages, old_logp, ref_logp, hparams, config,
                    is_weights=None):
    """SPEC v2 (fused kind) by verl 0.9.1: linear_cross_entropy (Triton) on hidden and lm_head.T, then ppo_loss."""
    verl_adapter.actor_config(hparams, config)  # refuse before any work
    batch, length, hidden_size = hidden.shape
    if hidden_size % HIDDEN_MULTIPLE:
        verl_adapter.spec_mapping.refuse(
            f"{verl_adapter.LIBRARY} linear_cross_entropy",
            f"hidden_size {hidden_size} is not a multiple of {HIDDEN_MULTIPLE} "
            "(utils/kernel/kernels.py:596, 1544 assert hidden_size % 128 == 0)",
            switch=None,
        )
    vocab = lm_head.shape[1]
    labels = verl_adapter.safe_tokens(tokens, mask, vocab)
    # verl's weight is the LM head's [V, H], contiguous (kernels.py:580); SPEC's lm_head is [H, V].
    weight = lm_head.t().contiguous()
    logp, entropy = linear_cross_entropy(hidden.contiguous(), weight, labels.contiguous(),
                                         float(hparams["temperature"]), "none")
    logp = _ContiguousGradient.apply(logp).view(batch, length)
    entropy = _ContiguousGradient.apply(entropy).view(batch, length)
    loss = verl_adapter.verl_actor_loss(
        logp, entropy, mask=mask, advantages=advantages, old_logp=old_logp, ref_logp=ref_logp,
        is_weights=is_weights, hparams=hparams, config=config,
    )
    return loss, {"logp": logp, "entropy": entropy}


grpo_loss_fused.framework = "torch"
grpo_loss_fused.spec_version = 2
grpo_loss_fused.static_hparams = True  # the kernel takes one Python-float temperature (linear_cross_entropy.py:64)
# Declared precision conventions (docs/conventions.md). Lines are of the installed verl 0.9.1
# (.venv/lib/python3.11/site-packages/verl/utils/kernel/kernels.py). The forward keeps the logits in f32:
# `tl.dot(_hidden, _weight.trans(), logits)` accumulates into an f32 tile (:271, :303), so no bf16_logits;
# log-probs and entropy are returned in f32 (:602, :610).
grpo_loss_fused.precision_conventions = (
    # :1510-1512 `tl.store(d_logits_ptr + ..., d_logits, mask)`: the f32 d logits stored into `_d_logits`,
    # allocated in the hidden states' dtype (:1667, bf16), before the matmuls of :1712-1721.
    "bf16_grad_logits",
    # :1664 vocab_per_split = 9504; :1716 `d_hidden += torch.matmul(_d_logits, weight[split])`: d hidden
    # summed in bf16 (:1563, hidden's dtype) over 9504-column splits, each split's share rounded first.
    "bf16_accumulation:d_hidden:columns=9504",
)
if not INTERPRETED:
    # On a GPU `tl.dot` on f32 operands runs in TF32 (Triton's default input_precision; :303, :1495). The
    # interpreter multiplies in f32 (np.matmul), so on CPU it is not declared.
    grpo_loss_fused.precision_conventions += ("tf32_matmul",)
