"""XLA:CPU's row reduction depends on the batch it runs in (docs/invariance.md).

The same [T, V] rows, summed over V by `jnp.sum(jnp.exp(z), axis=-1)` (the log-sum-exp's
sum) as a batch of two rows and as a batch of one, give different bits for some rows at
some shapes: the reduction's vectorisation follows the whole array's shape. This is why
the plain-JAX reference is variant under `alone` and `micro_batches` on CPU (1 f32 ulp of
logp). Run:

    PYTHONPATH=python .venv/bin/python examples/xla/row_sum_depends_on_batch.py

Prints, per shape, how many rows differ; exit 1 when any does.
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np

row_sum = jax.jit(lambda z: jnp.sum(jnp.exp(z), axis=-1))
rng = np.random.default_rng(0)
differ = 0
for time, vocab in [(12, 171), (8, 300), (3, 40), (16, 257)]:
    x = (rng.standard_normal((2, time, vocab)) * 3).astype(np.float32)
    in_batch = np.asarray(row_sum(jnp.asarray(x)))[1]
    alone = np.asarray(row_sum(jnp.asarray(x[1:2])))[0]
    n = int((in_batch != alone).sum())
    differ += n
    print(f"T={time} V={vocab}: {n} of {time} rows differ between B=2 and B=1 ({jax.default_backend()}, jax {jax.__version__})")
sys.exit(1 if differ else 0)
