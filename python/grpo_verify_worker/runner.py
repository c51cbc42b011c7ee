"""Run an implementation: one compiled value-and-VJP step per signature.

A signature is (implementation, config, array names/dtypes/shapes, the mesh
shape, and the hyperparameter values when the implementation wants them
static). The step is

    loss, vjp, aux = jax.vjp(lambda *floats: impl(...), *floats, has_aux=True)
    grads = vjp(cotangent)

with the hyperparameters and the cotangent as traced f32 scalars, so new
values never recompile. A request with a mesh is traced, compiled and run
with that mesh as the ambient one (`ambient_mesh`); an implementation that
does not use it simply ignores it. Exceptions are sorted into the protocol's
kinds: NotImplementedError while tracing -> "unsupported", anything else -> "impl".
"""

import collections
import contextlib
import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

from grpo_verify_worker import adapter_call
from grpo_verify_worker.adapter_call import Outputs
from grpo_verify_worker.protocol import implementation_failure
from grpo_verify_worker.request import MESH_AXES

MAX_CACHED_STEPS = 256
# Steps of at most this many logits (B * T * V) compile with XLA:CPU's LLVM
# at -O0 (`compiler_options`). Measured on the 2-core CI machine: their
# compile takes 40-50% of the -O2 time (reference 0.47 -> 0.25 s, pallas_logits
# 1.89 -> 0.91 s, fused_chunked 0.92 -> 0.41 s at B=4 T=24 V=2100 H=64) and
# each run gains 5-40 ms; a signature compiles once for up to 8 draws, so
# up to this size the compile saving is the larger. Above it (production
# shapes, gradcheck) runs are long and keep the full optimisation, and so do
# benchmarks. The program is the same HLO either way, but the machine code
# for dot products and transcendentals differs, so outputs differ by rounding
# (at B=3 T=7 V=777 H=40 over the built-ins: a loss by <= 3 ulps, gradient
# elements near cancellation by more, a bf16 gradient by one bf16 rounding):
# both are programs the tolerance rule must accept, and neither is what a TPU
# runs.
FAST_COMPILE_MAX_LOGITS = 1 << 19
# What "fast" compiles with. XLA:CPU's fusion emitters (an MLIR pipeline per
# fusion, on by default in this jaxlib) took about half of a small step's
# compile: the mutant prec_fused_logits_bf16 (30 compiles, fused chunked
# steps up to B=4 T=24 V=2100 H=64, one worker, no compile cache) spent
# 19.5-19.7 s compiling with them and 7.4-9.4 s without (two runs each,
# alternated). Without them XLA emits each fusion with its older elemental
# emitter: the same HLO, rounded as a machine may round it. (JAX 0.12.0.1's
# jaxlib has no such option; `_known_options` drops it there.)
FAST_COMPILE_OPTIONS = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}


@dataclasses.dataclass(frozen=True)
class _Step:
    executable: object
    aux_ignored: tuple


@functools.lru_cache(maxsize=None)
def _mesh(shape):
    """The jax.sharding.Mesh of the first data * model devices, axes ("data", "model")."""
    devices = np.asarray(jax.devices()[: shape[0] * shape[1]]).reshape(shape)
    return jax.sharding.Mesh(devices, MESH_AXES)


def ambient_mesh(mesh_shape):
    """A context in which `jax.set_mesh` makes the request's mesh ambient (none: no change).

    Inside it, an implementation reads the mesh while tracing with
    jax.sharding.get_abstract_mesh() and `jax.shard_map` uses it by default.
    """
    if mesh_shape is None:
        return contextlib.nullcontext()
    return jax.set_mesh(_mesh(tuple(mesh_shape)))


def _host_array(array, what=None):
    """An output on the host as it travels: f32 and bf16 kept, any other dtype -> f32."""
    array = np.asarray(array)
    if array.dtype.name in ("float32", "bfloat16"):
        return array
    return array.astype(np.float32)


def build_step(implementation, request):
    """(step, aux_ignored): the value-and-VJP step of a request's signature.

    step(floats, others, hparams, cotangent) -> (loss, grads, aux), called on
    what `Runner._arguments` returns; tracing it fills the list aux_ignored.
    `run` compiles it, `lower` (lowering.py) exports it.
    """
    config = dict(request.config)
    static_hparams = dict(request.hparams) if implementation.static_hparams else None
    aux_ignored = []

    def step(floats, others, hparams, cotangent):
        def objective(*float_inputs):
            given = dict(static_hparams) if static_hparams is not None else hparams
            loss, aux = adapter_call.call(implementation, float_inputs, others, given, config)
            aux_ignored[:] = adapter_call.ignored_aux(aux)
            return jnp.asarray(loss), {key: jnp.asarray(value) for key, value in adapter_call.compared_aux(aux).items()}

        loss, vjp, aux = jax.vjp(objective, *floats, has_aux=True)
        grads = vjp(jnp.broadcast_to(cotangent, loss.shape).astype(loss.dtype))
        return loss, grads, aux

    return step, aux_ignored


def fast_compile_max_logits():
    """FAST_COMPILE_MAX_LOGITS, or None where small steps are fully optimised too."""
    if os.environ.get("GRPO_VERIFY_FAST_COMPILE", "1") == "0" or jax.default_backend() != "cpu":
        return None
    return FAST_COMPILE_MAX_LOGITS


def compiler_options(request):
    """XLA options for compiling a request's step: FAST_COMPILE_OPTIONS for small steps on CPU.

    Off on other backends and when $GRPO_VERIFY_FAST_COMPILE is "0"
    (`grpo-verify --no-fast-compile`).
    """
    vocab_holder = request.arrays.get("logits", request.arrays.get("lm_head"))
    tokens = request.arrays.get("tokens")
    if vocab_holder is None or tokens is None:
        return None
    return fast_compile_options(tokens.size * vocab_holder.shape[-1])


def fast_compile_options(logits):
    """FAST_COMPILE_OPTIONS (those this jaxlib knows) for a step of `logits` = rows * V elements on
    CPU, None above FAST_COMPILE_MAX_LOGITS or where fast compiles are off."""
    if fast_compile_max_logits() is None or logits > FAST_COMPILE_MAX_LOGITS:
        return None
    return _known_options(tuple(FAST_COMPILE_OPTIONS.items()))


@functools.lru_cache(maxsize=None)
def _known_options(options):
    """The options this jaxlib accepts, tried on a scalar step (one compile
    where all are known, else one per option).

    A compile with an option the jaxlib does not know fails ("No such compile
    option"); the user's JAX may be older or newer than the pinned one.
    """
    if _compiles_with(dict(options)):
        return dict(options)
    known = {}
    for name, value in options:
        if _compiles_with({**known, name: value}):
            known[name] = value
    return known


def _compiles_with(options):
    try:
        jax.jit(lambda x: x + 1).lower(np.float32(0)).compile(options)
    except jax.errors.JaxRuntimeError:
        return False
    return True


def traced_precision(implementation):
    """The scope a step is traced in: full f32 matmuls for the built-ins and baselines.

    Measured on an H100 (JAX 0.11.2, docs/tools.md, "On a GPU"): at the default
    precision (TF32) the fused baseline's f32 logp was 3425 u off against
    its analytic bound of 1024 u; traced under "highest", 0.46 u.
    """
    precision = implementation.matmul_precision
    return jax.default_matmul_precision(precision) if precision else contextlib.nullcontext()


class Runner:
    def __init__(self):
        self._steps = collections.OrderedDict()  # signature -> _Step, least recent first

    @staticmethod
    def _signature(implementation, request):
        arrays = tuple((n, a.dtype.name, a.shape) for n, a in request.arrays.items())
        static = tuple(request.hparams.items()) if implementation.static_hparams else None
        config = tuple(sorted(request.config.items()))
        return implementation.name, config, arrays, request.mesh, static

    @staticmethod
    def _arguments(implementation, request):
        floats = tuple(request.arrays[n] for n in implementation.float_params)
        others = {n: a for n, a in request.arrays.items() if n not in implementation.float_params}
        hparams = (
            {}
            if implementation.static_hparams
            else {n: np.float32(v) for n, v in request.hparams.items()}
        )
        return floats, others, hparams, np.float32(request.cotangent)

    @staticmethod
    def _compile(implementation, request, arguments, fast=True):
        """The compiled step; `fast=False` (benchmarks) always fully optimised."""
        step, aux_ignored = build_step(implementation, request)
        options = compiler_options(request) if fast else None
        try:
            with ambient_mesh(request.mesh), traced_precision(implementation):
                executable = jax.jit(step).lower(*arguments).compile(options)
        except Exception as error:
            raise implementation_failure(error) from error
        return _Step(executable, tuple(aux_ignored))

    def run(self, implementation, request):
        """Outputs of one run of a JAX implementation, compiling first when the signature is new."""
        signature = self._signature(implementation, request)
        arguments = self._arguments(implementation, request)
        step = self._steps.pop(signature, None)
        compiled = step is None
        if compiled:
            step = self._compile(implementation, request, arguments)
        self._steps[signature] = step
        if len(self._steps) > MAX_CACHED_STEPS:
            self._steps.popitem(last=False)
        try:
            with ambient_mesh(request.mesh):
                loss, grads, aux = jax.block_until_ready(step.executable(*arguments))
        except Exception as error:
            raise implementation_failure(error) from error
        arrays = adapter_call.outputs(implementation, loss, grads, aux, _host_array)
        return Outputs(compiled, arrays, list(step.aux_ignored))
