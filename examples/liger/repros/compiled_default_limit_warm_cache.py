"""Liger's compiled=True loss against compiled=False under torch's default recompile limit, cold then warm cache.

    .venv/bin/python examples/liger/repros/compiled_default_limit_warm_cache.py          # 40 calls, two passes
    .venv/bin/python examples/liger/repros/compiled_default_limit_warm_cache.py 20       # N calls
    .venv/bin/python examples/liger/repros/compiled_default_limit_warm_cache.py 40 --specialize-float

Liger-Kernel 0.8.5, torch 2.14.1 (CPU, Inductor's C++ backend). The same loop as
compiled_inductor_cache_wrong_loss.py (varied shapes, loss types and hyperparameters; each call with
compiled=False and compiled=True), but with torch's own Dynamo settings: after `recompile_limit` (8)
recompiles of a frame Dynamo runs that frame eagerly, as Liger's users get it. Pass 1 runs in a child
process on an empty cache directory, pass 2 in another child process on the cache pass 1 left (a warm
cache). Each pass prints the calls whose compiled loss or gradients differ from the eager ones by more
than 1e-4 (relative), and a count. Exit 1 if any call of either pass disagrees. `--specialize-float`
sets `torch._dynamo.config.specialize_float = True` in both passes (Python floats are baked into the
graph, never made dynamic), the setting under which pytorch#194976's reproducer is correct.

Measured (2-core CPU machine, about 80 s): pass 1 0 of 40; pass 2 2 of 40, calls 35 and 36 (loss
relative 0.11 and 0.032, gradients equal). With --specialize-float: 0 of 40 in both passes (60 s).
"""

import os
import subprocess
import sys
import tempfile


def one_pass(n_calls, specialize_float=False):
    import random

    import torch
    import torch._dynamo

    if specialize_float:
        torch._dynamo.config.specialize_float = True
    from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    rng = random.Random(0)
    mismatches = 0
    for i in range(n_calls):
        B, T, V, H = 2, rng.randint(1, 8), rng.choice([1, 2, 9, 40, 257]), rng.choice([1, 3, 16])
        eps_low, eps_high = rng.choice([0.1, 0.2, 0.28, 0.3]), rng.choice([0.0, 0.2, 0.28, 0.4])
        tau, beta = rng.choice([0.1, 0.7, 1.0, 2.0]), rng.choice([0.0, 0.04, 1.0])
        loss_type = rng.choice(["dapo", "grpo", "bnpo", "dr_grpo"])
        num_items = rng.choice([None, 1.0, 3.0]) if loss_type == "dapo" else None
        g = torch.Generator().manual_seed(i)
        hidden = torch.randn(B, T, H, generator=g, requires_grad=True)
        weight = torch.randn(V, H, generator=g, requires_grad=True)
        ids = torch.randint(0, V, (B, T), generator=g)
        mask = (torch.rand(B, T, generator=g) > 0.2).float()
        adv = torch.randn(B, generator=g)
        old, ref = torch.randn(B, T, generator=g) - 2, torch.randn(B, T, generator=g) - 2
        out = {}
        for compiled in (False, True):
            loss_fn = LigerFusedLinearGRPOLoss(
                beta=beta, compiled=compiled, use_ref_model=beta != 0, epsilon_low=eps_low,
                epsilon_high=eps_high, loss_type=loss_type, temperature=tau,
                max_completion_length=T if loss_type == "dr_grpo" else None)
            loss, _ = loss_fn(hidden, weight, ids, mask, adv, ref_per_token_logps=ref if beta else None,
                              old_per_token_logps=old, num_items_in_batch=num_items)
            out[compiled] = (loss.detach(), torch.autograd.grad(loss, (hidden, weight)))
        (eager, eager_grads), (comp, comp_grads) = out[False], out[True]
        rel = ((comp - eager).abs() / eager.abs().clamp(min=1e-30)).item()
        grad_rel = max(((c - e).abs().max() / e.abs().max().clamp(min=1e-30)).item()
                       for c, e in zip(comp_grads, eager_grads))
        if rel > 1e-4 or grad_rel > 1e-4:
            mismatches += 1
            print(f"  call {i:2d} {loss_type:8s} T={T} V={V:3d} H={H:2d} eps={eps_low}/{eps_high} tau={tau} "
                  f"beta={beta}: eager {eager.item():.6g} compiled {comp.item():.6g} "
                  f"(loss rel {rel:.2g}, grads rel {grad_rel:.2g})", flush=True)
    print(f"  {mismatches} of {n_calls} calls disagree", flush=True)
    return mismatches


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        sys.exit(1 if one_pass(int(sys.argv[2]), "--specialize-float" in sys.argv) else 0)
    args = [a for a in sys.argv[1:] if a != "--specialize-float"]
    n_calls = int(args[0]) if args else 40
    extra = ["--specialize-float"] if "--specialize-float" in sys.argv else []
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(prefix="liger-compiled-warm-"))
    failed = False
    for name in ("pass 1 (empty cache)", "pass 2 (warm cache)"):
        print(name, flush=True)
        rc = subprocess.run([sys.executable, __file__, "--child", str(n_calls), *extra], env=env).returncode
        failed = failed or rc != 0
    sys.exit(1 if failed else 0)
