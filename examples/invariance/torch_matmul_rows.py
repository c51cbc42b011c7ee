"""Does a row of torch's f32 matmul on CPU depend on how many rows are multiplied?

The question behind Liger's chunked loss (1 ulp under `alone`, `padded`,
`micro_batches`, docs/invariance.md) and verl's Triton path's d hidden:
both form a token's result in one torch matmul over all B * T rows. Here
the same rows are multiplied alone and inside larger matrices, and the
rows' bits compared:

    .venv/bin/python examples/invariance/torch_matmul_rows.py

Prints, for each (rows, H, V), how many of the first block's elements differ
from the block multiplied alone, and the largest difference in ulps at the
scale of the terms (sum_h |x_h w_h|, as `grpo-verify invariance` measures).
"""

import numpy as np
import torch

torch.set_num_threads(1)


def ulps(a, b, scale):
    """|a - b| in f32 ulps at `scale` (each element's sum of |x_h w_h|: what it is formed from)."""
    spacing = np.spacing(scale.numpy().astype(np.float32)).astype(np.float64)
    return np.abs(a.numpy().astype(np.float64) - b.numpy().astype(np.float64)) / spacing


def main():
    generator = torch.Generator().manual_seed(0)
    print(f"torch {torch.__version__}, 1 thread")
    for block, hidden, vocab in [(3, 32, 13), (4, 32, 13), (3, 64, 300), (4, 64, 300), (8, 1536, 512)]:
        weight = torch.randn(vocab, hidden, generator=generator)
        for rows in (2 * block, 4 * block, 16 * block, 64 * block):
            x = torch.randn(rows, hidden, generator=generator)
            alone = x[:block] @ weight.T
            inside = (x @ weight.T)[:block]
            differ = int((alone != inside).sum())
            scale = x[:block].abs() @ weight.abs().T
            worst = ulps(alone, inside, scale).max()
            print(f"block of {block} rows in {rows:4d}, H={hidden:5d} V={vocab:4d}: "
                  f"{differ:5d} of {alone.numel()} elements differ, max {worst:.2f} ulps")


if __name__ == "__main__":
    main()
