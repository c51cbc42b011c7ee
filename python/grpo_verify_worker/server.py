"""The request loop: read a frame, dispatch its op, write one reply frame.

Ops (docs/worker-protocol.md): hello, load, run, head_run, bench, lower, shutdown. A failing request
gets an error reply and the worker keeps serving, except after a frame that
cannot be parsed, when the stream can no longer be trusted.
"""

import os
import platform
import sys
import time
import traceback

import jax

from grpo_kernels import registry
from grpo_verify_worker import benchmark, environment, head, lowering
from grpo_verify_worker import request as run_request
from grpo_verify_worker.loader import Loader
from grpo_verify_worker.protocol import StreamBroken, WorkerError, error_reply, read_frame, write_frame
from grpo_verify_worker.runner import Runner, fast_compile_max_logits


def use_compile_cache():
    """JAX's persistent compilation cache in $GRPO_VERIFY_COMPILE_CACHE (unset: off).

    Every compiled step is kept, however quick its compile: on CPU most take
    0.1-1 s, below JAX's default threshold, and they are what a rerun repeats.
    """
    directory = os.environ.get("GRPO_VERIFY_COMPILE_CACHE")
    if not directory:
        return None
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return directory


def _torch_version():
    from grpo_verify_worker import torch_runner  # imports torch: only for torch implementations

    return torch_runner.version()


def _jax_only(implementation, op):
    """Refuse `op` (lower, bench) for a torch implementation: both are XLA programs."""
    if implementation.framework != "jax":
        raise WorkerError(
            "unsupported",
            f"{implementation.name} is a {implementation.framework} implementation; `{op}` "
            "compiles an XLA program and applies to JAX implementations only",
        )
    return implementation


class Server:
    def __init__(self):
        self.loader = Loader()
        self.runner = Runner()
        self.head_runner = head.HeadRunner()
        self.head_implementations = {}

    def hello(self, header, arrays):
        return {
            "ok": True,
            "python": platform.python_version(),
            "jax": jax.__version__,
            "versions": environment.versions(),
            "backend": jax.default_backend(),
            "device_count": jax.device_count(),
            "compile_cache": jax.config.jax_compilation_cache_dir,
            "fast_compile_max_logits": fast_compile_max_logits(),
            # "false" unless the user set it: workers share one device (process.rs).
            "xla_preallocate": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE"),
            # --xla_gpu_deterministic_ops=true unless the user set it (__main__._deterministic_xla).
            "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "builtins": [
                {
                    "name": builtin.name,
                    "target": builtin.target,
                    "kind": builtin.kind,
                    "sharded": builtin.sharded,
                    "gradcheck_default": builtin.gradcheck_default,
                    "spec_version": builtin.spec_version,
                    "refuses": {switch: list(values) for switch, values in builtin.refuses},
                }
                for builtin in registry.BUILTINS.values()
            ],
            "baselines": dict(registry.BASELINES),
            "head_builtins": dict(registry.HEAD_BUILTINS),
        }, []

    def _implementation(self, header):
        name = header.get("impl")
        if not isinstance(name, str) or not name:
            raise WorkerError("protocol", f'"impl" must be a non-empty string, got {name!r}')
        return self.loader.load(name)

    def load(self, header, arrays):
        implementation = self._implementation(header)
        return {
            "ok": True,
            "impl": implementation.name,
            "kind": implementation.kind,
            "static_hparams": implementation.static_hparams,
            "spec_version": implementation.spec_version,
            "framework": implementation.framework,
            "precision_conventions": list(implementation.precision_conventions),
            **({"torch": _torch_version()} if implementation.framework == "torch" else {}),
        }, []

    def run(self, header, arrays):
        started = time.perf_counter()
        implementation = self._implementation(header)
        checked = run_request.parse_run(header, arrays, implementation)
        if implementation.framework == "torch":
            from grpo_verify_worker import torch_runner  # imports torch: only when one is run

            outputs = torch_runner.run(implementation, checked)
        else:
            outputs = self.runner.run(implementation, checked)
        return {
            "ok": True,
            "compiled": outputs.compiled,
            "seconds": time.perf_counter() - started,
            "aux_ignored": outputs.aux_ignored,
        }, outputs.arrays

    def head_run(self, header, arrays):
        name = header.get("impl")
        if not isinstance(name, str) or not name:
            raise WorkerError("protocol", f'"impl" must be a non-empty string, got {name!r}')
        if name not in self.head_implementations:
            self.head_implementations[name] = head.load(name)
        implementation = self.head_implementations[name]
        if header.get("load_only"):
            return {"ok": True, "impl": name, "kind": implementation.kind, "framework": implementation.framework,
                    "supports": getattr(implementation.function, "supports", None)}, []
        if header.get("bench"):
            return head.bench(_jax_only(implementation, "bench"), header), []
        return self.head_runner.run(implementation, header, arrays)

    def bench(self, header, arrays):
        implementation = _jax_only(self._implementation(header), "bench")
        checked = benchmark.parse_bench(header, implementation)
        return {"ok": True, **benchmark.bench(implementation, checked)}, []

    def lower(self, header, arrays):
        return lowering.lower(_jax_only(self._implementation(header), "lower"), header), []

    def handle(self, header, arrays):
        """(reply header, reply arrays) for one request."""
        op = header.get("op")
        handlers = {
            "hello": self.hello, "load": self.load, "run": self.run, "head_run": self.head_run,
            "bench": self.bench, "lower": self.lower,
        }
        if op not in handlers:
            raise WorkerError(
                "protocol", f"unknown op {op!r}; expected one of {sorted(handlers) + ['shutdown']}"
            )
        return handlers[op](header, arrays)


def serve(frames_in, frames_out):
    """Serve requests until shutdown or end of input; the process exit code."""
    use_compile_cache()
    server = Server()
    while True:
        try:
            frame = read_frame(frames_in)
        except StreamBroken as error:
            write_frame(frames_out, error_reply(error))
            print(f"grpo_verify_worker: {error.message}; exiting", file=sys.stderr)
            return 1
        except EOFError as error:
            print(f"grpo_verify_worker: {error}; exiting", file=sys.stderr)
            return 1
        if frame is None:
            return 0
        header, arrays = frame
        if header.get("op") == "shutdown":
            write_frame(frames_out, {"ok": True})
            return 0
        try:
            reply, reply_arrays = server.handle(header, arrays)
        except WorkerError as error:
            reply, reply_arrays = error_reply(error), []
        except Exception as error:  # a bug of the worker itself: say so, keep serving
            reply = error_reply(
                WorkerError("impl", f"worker error: {type(error).__name__}: {error}",
                            traceback.format_exc())
            )
            reply_arrays = []
        write_frame(frames_out, reply, reply_arrays)
