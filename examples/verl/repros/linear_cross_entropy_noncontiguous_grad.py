"""verl 0.9.1's linear_cross_entropy backward rejects a non-contiguous incoming gradient.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python examples/verl/repros/linear_cross_entropy_noncontiguous_grad.py

verl/utils/kernel/kernels.py:1553 `assert dlogprobs.is_contiguous() and dentropy.is_contiguous()` in
`efficient_entropy_backward`: autograd hands a Function's backward whatever layout the next op's backward
produced, and `logp.sum()` (or `entropy.mean()`) gives an expanded, stride-0 gradient. The kernels take
the strides (`dlogprobs.stride(0)`, `dentropy.stride(0)`, :1693-1696), so the assert, not the kernel,
refuses it; verl's own actor feeds the outputs through masked aggregations, whose gradients are
contiguous. Prints the AssertionError, then the same loss with the gradients made contiguous by a
multiplication by a ones tensor.
"""

import importlib.util
import pathlib
import traceback

import torch

HERE = pathlib.Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("verl_triton_adapter", HERE.parent / "triton_adapter.py")
adapter = importlib.util.module_from_spec(spec)
spec.loader.exec_module(adapter)

g = torch.Generator().manual_seed(0)
hidden = torch.randn(4, 128, generator=g, requires_grad=True)
weight = torch.randn(50, 128, generator=g, requires_grad=True)
labels = torch.tensor([1, 2, 3, 4])
logp, entropy = adapter.linear_cross_entropy(hidden, weight, labels, 1.0, "none")
try:
    torch.autograd.grad(logp.sum() + entropy.sum(), (hidden, weight))
except AssertionError:
    print("logp.sum() + entropy.sum():", traceback.format_exc().strip().splitlines()[-2].strip(), "-> AssertionError")
logp, entropy = adapter.linear_cross_entropy(hidden, weight, labels, 1.0, "none")
ones = torch.ones(4)
d_hidden, _ = torch.autograd.grad((logp * ones).sum() + (entropy * ones).sum(), (hidden, weight))
print("(logp * ones).sum() + (entropy * ones).sum(): d hidden finite:", bool(d_hidden.isfinite().all()))
