"""verl 0.9.1's Triton linear_cross_entropy on all-negative logits: the epilogue's running max starts at 0.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python examples/verl/repros/linear_cross_entropy_max_identity_zero.py

verl/utils/kernel/kernels.py (0.9.1): the forward mainloop's per-split max starts at -inf (:262; the
`tl.zeros` start is commented out at :261), but the epilogue that merges the 1024-column splits starts
its running max at 0 (`global_max = tl.zeros(...)`, :384) and loads the padding splits as 0
(`tl.load(max_ptrs, ..., other=0.0)`, :391). So for a row whose logits / tau are all negative the stored
`maximum` is 0, not the row's max, and the sum of exponentials is accumulated as exp(split max - 0) *
(split's sum) (:406-408). Below about -87.3 (f32's smallest normal exponent) that factor is subnormal and
loses bits; below about -103.3 it is 0: log(0) = -inf, logp = -(0 + log(0) - z_y) = +inf (:428-430) and
entropy_b = 0 / 0 = NaN (:416, :422). verl PR #7439 (open) changes the identity and the masked value to
-inf. Runs the kernel through examples/verl/triton_adapter.py's loader (Triton's interpreter on CPU; a
GPU flushes subnormals to zero, so there the loss of bits becomes +inf from about -87.3 on).

Prints, for logits z = offset + N(0, 1) (V = 300, H = 128, tau = 1), verl's logp and entropy of one row
against float64 torch.
"""

import importlib.util
import pathlib

import torch

HERE = pathlib.Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("verl_triton_adapter", HERE.parent / "triton_adapter.py")
adapter = importlib.util.module_from_spec(spec)
spec.loader.exec_module(adapter)

g = torch.Generator().manual_seed(0)
N, H, V = 2, 128, 300
hidden = torch.randn(N, H, generator=g) / H**0.5
hidden[:, 0] = 1.0
weight = torch.randn(V, H, generator=g)
labels = torch.tensor([3, 7])
print(f"{'offset':>8} {'verl logp':>12} {'exact logp':>12} {'verl entropy':>13} {'exact entropy':>13}")
for offset in (0.0, -50.0, -90.0, -95.0, -100.0, -103.0, -105.0, -107.0, -110.0, -1000.0):
    w = weight.clone()
    w[:, 0] = offset  # logits = offset + hidden[:, 1:] @ w[:, 1:].T
    logp, entropy = adapter.linear_cross_entropy(hidden, w, labels, 1.0, "none")
    z = hidden.double() @ w.double().T
    exact_logp = torch.log_softmax(z, -1).gather(-1, labels[:, None])[:, 0]
    p = torch.softmax(z, -1)
    exact_entropy = -(p * torch.log_softmax(z, -1)).sum(-1)
    print(f"{offset:>8} {logp[0].item():>12.6g} {exact_logp[0].item():>12.6g} "
          f"{entropy[0].item():>13.6g} {exact_entropy[0].item():>13.6g}")
