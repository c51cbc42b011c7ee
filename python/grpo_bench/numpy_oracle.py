"""The logits-kind forward and backward of docs/spec.md in NumPy float64.

`grpo-verify bench-oracle` times this next to the Rust f64 oracle, on the
same inputs (raw files the harness writes) and the same configuration
(src/bench/oracle.rs, `bench_config`: logits temperature mode, clip band
[1 - eps_low, 1 + eps_high], off-policy, entropy bonus, loss summed over a
constant). Two forms: the plain one (`--block-rows 0`: whole-array operations on all
[T, V] at once, as the math is usually written) and a cache-blocked one
(whole-array operations on blocks of rows, temporaries that fit in cache).

Prints one JSON object: {"seconds": [...], "loss": f, "grad_sum_squares": f}.
"""

import argparse
import json
import sys
import time

import numpy as np

def loss_and_grad(logits, tokens, advantage, old_logp, hp, grad, block_rows):
    """loss; writes d loss / d logits into grad [T, V] f64 (mask all ones, B = 1).

    block_rows: rows per block of whole-array operations (0: all rows at once,
    the plain form: every temporary is a [T, V] f64 array).
    """
    rows, _ = logits.shape
    block_rows = block_rows or rows
    tau = hp["temperature"]
    weight = 1.0 / hp["normalizer"]
    loss = 0.0
    for start in range(0, rows, block_rows):
        stop = min(start + block_rows, rows)
        picked = np.arange(stop - start)
        y = tokens[start:stop]
        x = logits[start:stop].astype(np.float64) / tau
        log_p = x - x.max(axis=1, keepdims=True)
        log_p -= np.log(np.exp(log_p).sum(axis=1, keepdims=True))
        p = np.exp(log_p)
        entropy = -(p * log_p).sum(axis=1)
        logp = log_p[picked, y]
        ratio = np.exp(logp - old_logp[start:stop])
        unclipped = ratio * advantage
        clipped = np.clip(ratio, 1.0 - hp["eps_low"], 1.0 + hp["eps_high"]) * advantage
        ppo = -np.minimum(unclipped, clipped)
        loss += weight * np.sum(ppo - hp["entropy_coef"] * entropy)
        # d ppo / d logp = -A r where the unclipped term is the minimum (inside the
        # band both terms are r A and both slopes A), 0 where the clipped one is (docs/spec.md).
        c_logp = np.where(unclipped <= clipped, -advantage * ratio, 0.0) / tau
        c_ent = hp["entropy_coef"] / tau
        g = grad[start:stop]
        np.multiply(p, -c_logp[:, None], out=g)
        g += c_ent * p * (log_p + entropy[:, None])
        g[picked, y] += c_logp
        g *= weight
    return loss


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m grpo_bench.numpy_oracle")
    parser.add_argument("--dir", required=True)
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--vocab", type=int, required=True)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--block-rows", type=int, default=0)
    for name in ("eps-low", "eps-high", "temperature", "entropy-coef", "normalizer"):
        parser.add_argument(f"--{name}", type=float, required=True)
    args = parser.parse_args(argv)
    read = lambda name, dtype: np.fromfile(f"{args.dir}/{name}", dtype=dtype)
    logits = read("logits.f32", np.float32).reshape(args.rows, args.vocab)
    tokens = read("tokens.i32", np.int32)
    advantage = float(read("advantages.f32", np.float32)[0])
    old_logp = read("old_logp.f32", np.float32).astype(np.float64)
    hp = {
        "eps_low": args.eps_low,
        "eps_high": args.eps_high,
        "temperature": args.temperature,
        "entropy_coef": args.entropy_coef,
        "normalizer": args.normalizer,
    }
    grad = np.zeros((args.rows, args.vocab))  # allocated and touched outside the timed region
    seconds = []
    for _ in range(max(args.reps, 1)):
        started = time.perf_counter()
        loss = loss_and_grad(logits, tokens, advantage, old_logp, hp, grad, args.block_rows)
        seconds.append(time.perf_counter() - started)
    json.dump(
        {"seconds": seconds, "loss": loss, "grad_sum_squares": float(np.sum(grad * grad))},
        sys.stdout,
    )
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
