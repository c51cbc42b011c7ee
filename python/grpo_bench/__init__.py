"""Benchmark-side tools the Rust harness runs as separate processes.

`numpy_oracle`: the oracle's math in NumPy float64, the comparison point of
`grpo-verify bench-oracle`. `wandb_log`: optional Weights & Biases logging
of bench figures.
"""
