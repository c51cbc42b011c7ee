"""Triton 3.8.0's interpreter (TRITON_INTERPRET=1) truncates float32 -> bfloat16 in `x.to(tl.bfloat16)`.

    TRITON_INTERPRET=1 .venv/bin/python examples/trl/repros/triton_interpreter_bf16_truncation.py

Compiled Triton rounds to nearest even there (language/semantic.py `cast`: a
float downcast defaults to ROUNDING_MODE.RTNE and lowers to `create_fp_trunc`,
LLVM fptrunc). The interpreter's `create_fp_trunc` is `cast_impl`, which calls
`_convert_float(..., rounding_mode=None)` for f32 <-> bf16 (runtime/interpreter.py,
InterpreterBuilder.cast_impl): the low 16 bits are dropped, rounding toward zero.
Prints how many of 4096 random floats the kernel's bf16 differs from torch's
(round to nearest even) on, and one of them.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def to_bf16(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(src_ptr + offsets, mask=mask)
    tl.store(dst_ptr + offsets, x.to(tl.bfloat16), mask=mask)


x = torch.randn(4096, generator=torch.Generator().manual_seed(0))
out = torch.empty(4096, dtype=torch.bfloat16)
to_bf16[(4,)](x, out, 4096, BLOCK=1024)
nearest = x.to(torch.bfloat16)
toward_zero = (x.view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)
differ = (out != nearest).nonzero().flatten()
print(f"TRITON_INTERPRET={os.environ['TRITON_INTERPRET']}: {len(differ)} of 4096 differ from round-to-nearest-even; "
      f"{int((out == toward_zero).sum())} of 4096 equal truncation")
if len(differ):
    i = int(differ[0])
    print(f"x[{i}] = {x[i].item()!r}: kernel {out[i].item()!r}, nearest {nearest[i].item()!r}")
