"""Entry point: claim stdin/stdout for frames, then serve requests.

Before anything else is imported, the original standard output is kept on a
private descriptor for frames and descriptor 1 becomes a copy of 2, so that
whatever an implementation, JAX or a C library prints lands on standard
error. Standard input is kept likewise and descriptor 0 reads /dev/null.
"""

import os
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


def main():
    frames_in, frames_out = _claim_stdio()
    # A fatal signal (a segfault in a C++ or CUDA extension) prints the Python
    # stack to stderr, whose last lines the harness reports with the crash.
    import faulthandler

    faulthandler.enable()
    from grpo_verify_worker.server import serve  # imports jax: after the claim

    return serve(frames_in, frames_out)


if __name__ == "__main__":
    sys.exit(main())
