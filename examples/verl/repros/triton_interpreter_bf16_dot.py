"""Triton 3.8.0's interpreter (TRITON_INTERPRET=1) multiplies bf16 `tl.dot` operands as integers.

    TRITON_INTERPRET=1 .venv/bin/python examples/verl/repros/triton_interpreter_bf16_dot.py

The interpreter stores bf16 as uint16 (runtime/interpreter.py `_get_np_dtype`: "bfloat16 types are
stored as uint16") and `InterpreterBuilder.create_dot` converts only 8-bit floats before
`np.matmul(a, b, dtype=acc.dtype)`: two bf16 tiles are multiplied as their bit patterns. Compiled
Triton multiplies the bf16 values (exact products, f32 accumulation). verl's
`linear_cross_entropy` kernels (utils/kernel/kernels.py:303, :1495) do exactly this `tl.dot` on bf16
hidden states and weights; examples/verl/triton_adapter.py converts bf16 operands to f32 first.
Prints the largest difference from the f32 product of the same bf16 values, and the scale.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def dot(a_ptr, b_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
    m, n, k = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
    a = tl.load(a_ptr + m[:, None] * K + k[None, :])
    b = tl.load(b_ptr + k[:, None] * N + n[None, :])
    acc = tl.dot(a, b, tl.zeros((M, N), dtype=tl.float32))
    tl.store(c_ptr + m[:, None] * N + n[None, :], acc)


g = torch.Generator().manual_seed(0)
a = torch.randn(16, 16, generator=g).bfloat16()
b = torch.randn(16, 16, generator=g).bfloat16()
c = torch.empty(16, 16)
dot[(1,)](a, b, c, 16, 16, 16)
exact = a.float() @ b.float()
print(f"TRITON_INTERPRET={os.environ['TRITON_INTERPRET']}: max |tl.dot - (a @ b)| = "
      f"{(c - exact).abs().max().item():.6g}; max |a @ b| = {exact.abs().max().item():.6g}")
