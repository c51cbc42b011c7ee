"""impl="torch_compile" raises FailOnRecompileLimitHit at the 9th distinct configuration of a process (CC5).

    .venv/bin/python examples/cut_cross_entropy/repros/compiled_recompile_limit.py     # exit 1 at call 9

cut-cross-entropy 25.1.1, torch 2.14.1 (CPU, Inductor's C++ backend). `torch_compile_linear_cross_entropy_apply`
is compiled with `torch.compile(fullgraph=True, dynamic=True)` (torch_compile.py:14). Dynamo guards on the
reduction string, on whether a softcap is given (torch_compile.py:26) and specializes dimensions of size 1,
so each new combination is a recompile; at torch's `recompile_limit` (8, torch._dynamo.config) a frame
compiled with fullgraph=True raises instead of running eagerly. This calls linear_cross_entropy(...,
impl="torch_compile") with the three reductions, with and without a softcap, on a [1, 1] and a [5, 7]
embedding: twelve configurations, each valid and each a documented use. Prints each call; exit 1 on the
error (at call 9 here), 0 if all twelve run.
"""

import itertools
import sys

import torch
from cut_cross_entropy import linear_cross_entropy

torch.manual_seed(0)
for k, ((n, h), softcap, reduction) in enumerate(
        itertools.product(((1, 1), (5, 7)), (None, 30.0), ("mean", "sum", "none")), start=1):
    e = torch.randn(n, h, requires_grad=True)
    c = torch.randn(11, h, requires_grad=True)
    t = torch.randint(0, 11, (n,))
    try:
        loss = linear_cross_entropy(e, c, t, softcap=softcap, reduction=reduction, impl="torch_compile")
    except Exception as error:  # torch._dynamo.exc.FailOnRecompileLimitHit
        print(f"call {k}: N={n} H={h} softcap={softcap} reduction={reduction}: {type(error).__name__}: "
              f"{str(error).splitlines()[0]}")
        sys.exit(1)
    print(f"call {k}: N={n} H={h} softcap={softcap} reduction={reduction}: ok")
sys.exit(0)
