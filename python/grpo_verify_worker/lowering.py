"""The `lower` op: export the value-and-grad step `run` compiles, for a platform, without running it.

docs/worker-protocol.md, `lower`. The request names the inputs a `run` would
carry (`specs`: names, dtypes, shapes) but no data. They are checked exactly
as `run` checks its arrays, on zero-strided stand-ins (nothing of the shape
is allocated), then the step of `runner.build_step` is exported with
`jax.export.export(jax.jit(step), platforms=[platform])` on
`jax.ShapeDtypeStruct`s, under the request's mesh when it names one (as `run`
traces it). Exporting lowers (for TPU: Pallas's Mosaic lowering,
which enforces the block tiling rules) but never compiles or executes, so a
CPU host can lower for TPU at any shape.
"""

import re
import time
import traceback

import jax
import numpy as np

from grpo_verify_worker import request as run_request
from grpo_verify_worker.protocol import WorkerError, error_reply
from grpo_verify_worker.protocol import is_unsupported, refused_switch
from grpo_verify_worker.runner import Runner, ambient_mesh, build_step, traced_precision

MESSAGE_LINES = 20  # of an exception's text; Mosaic's complaints come first
# jax.export takes any platform name and lowers platform-dependent code for an
# unknown one with the default branch, so a typo would "lower": check the name.
PLATFORMS = ("cpu", "cuda", "rocm", "tpu")


def _abstract(value):
    value = np.asarray(value)
    return jax.ShapeDtypeStruct(value.shape, value.dtype)


def _first_lines(error):
    lines = f"{type(error).__name__}: {error}".splitlines()
    kept = lines[:MESSAGE_LINES]
    if len(lines) > MESSAGE_LINES:
        kept.append(f"... ({len(lines) - MESSAGE_LINES} more lines)")
    return "\n".join(kept)


def lower(implementation, header):
    """The reply header of a `lower` request for a loaded implementation."""
    started = time.perf_counter()
    platform = header.get("platform")
    if platform not in PLATFORMS:
        raise WorkerError("protocol", f'"platform" = {platform!r}; expected one of {PLATFORMS}')
    # Checked as a run would be; the cotangent is a traced scalar of the export, its value unused.
    checked = run_request.parse_specs(header, implementation)
    arguments = jax.tree.map(_abstract, Runner._arguments(implementation, checked))
    step, _ = build_step(implementation, checked)
    try:
        with ambient_mesh(checked.mesh), traced_precision(implementation):
            exported = jax.export.export(jax.jit(step), platforms=[platform])(*arguments)
    except Exception as error:
        if is_unsupported(error):
            raise WorkerError("unsupported", _first_lines(error), traceback.format_exc(), *refused_switch(error)) from error
        # A `lowering` error reply (docs/worker-protocol.md, `lower`), returned
        # rather than raised: the export's failure is this request's answer.
        return error_reply(WorkerError("lowering", _first_lines(error), traceback.format_exc()))
    return {
        "ok": True,
        "seconds": time.perf_counter() - started,
        "platform": platform,
        "f32_matmul_precisions": f32_matmul_precisions(exported.mlir_module()),
    }


_DOT = re.compile(r"stablehlo\.dot_general .*: \(tensor<[^>]*f32>")
_PRECISION = re.compile(r"precision = \[(\w+), \w+\]")


def f32_matmul_precisions(module_text):
    """How many dot_generals with f32 operands the module has, per precision.

    DEFAULT and HIGH are TF32 on NVIDIA GPUs (JAX's and Triton's default)
    and fewer bf16 passes on TPU; only HIGHEST is f32 everywhere. Dots inside
    a Mosaic or Triton custom call are not visible here.
    """
    counts = {}
    for line in module_text.splitlines():
        if _DOT.search(line):
            # No precision attribute: the default.
            named = _PRECISION.search(line)
            precision = named.group(1) if named else "DEFAULT"
            counts[precision] = counts.get(precision, 0) + 1
    return counts
