"""Entry point: claim stdin/stdout for frames, then serve requests.

Before anything else is imported, the original standard output is kept on a
private descriptor for frames and descriptor 1 becomes a copy of 2, so that
whatever an implementation, JAX or a C library prints lands on standard
error. Standard input is kept likewise and descriptor 0 reads /dev/null.

An environment without the packages the worker needs, or with too old a
version (environment.py), answers the harness's first request (`hello`)
with a "setup" error naming the package and the version found, and exits:
the harness reports it and exits 2.
"""

import json
import os
import struct
import sys


def _claim_stdio():
    frames_in = os.fdopen(os.dup(0), "rb")
    frames_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdout = sys.stderr
    return frames_in, frames_out


def _deterministic_xla():
    """Ask XLA for run-to-run determinism where the backend needs a flag for it.

    XLA:GPU picks GEMM algorithms by autotuning and implements scatters and
    some reductions with atomics, so the same step can differ in its last
    bits from run to run; `--xla_gpu_deterministic_ops` rules both out. It
    must be in XLA_FLAGS before JAX starts; a user's own setting of it wins.
    XLA:CPU and TPU are deterministic without it (it changes nothing there).
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_gpu_deterministic_ops" not in flags:
        os.environ["XLA_FLAGS"] = (flags + " --xla_gpu_deterministic_ops=true").strip()


def _refuse(frames_out, message):
    """Answer the first request with a setup error (stdlib only: numpy may be what is missing)."""
    header = json.dumps({"ok": False, "error": "setup", "message": message, "arrays": []}).encode("utf-8")
    frames_out.write(struct.pack("<I", len(header)) + header)
    frames_out.flush()
    print(f"grpo_verify_worker: {message}", file=sys.stderr)
    return 2


def main():
    frames_in, frames_out = _claim_stdio()
    from grpo_verify_worker import environment  # stdlib only

    problems = environment.problems()
    if problems:
        return _refuse(frames_out, "; ".join(problems))
    _deterministic_xla()
    # A fatal signal (a segfault in a C++ or CUDA extension) prints the Python
    # stack to stderr, whose last lines the harness reports with the crash.
    import faulthandler

    faulthandler.enable()
    from grpo_verify_worker.server import serve  # imports jax: after the claim

    return serve(frames_in, frames_out)


if __name__ == "__main__":
    sys.exit(main())
