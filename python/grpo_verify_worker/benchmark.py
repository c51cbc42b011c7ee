"""The `bench` op (docs/worker-protocol.md): memory and time of one value-and-grad step.

The step is the one `run` compiles (runner.Runner), lowered from the input
specs alone, so `iters` 0 measures XLA's compiled memory of shapes far too
large to allocate. With iters > 0 the inputs are generated on the device
(nothing large crosses the pipe), with live statistics: tokens are sampled
from the softmax the inputs define and old log-probs sit near the policy's
own (ratios near 1), so the backward is not dead (a constant old log-prob
makes every ratio tiny or huge, and with A < 0 those tokens are clipped and
get no gradient). A request with a mesh generates, compiles and runs under
it, as `run` does.
"""

import dataclasses
import math
import statistics
import time

import jax
import jax.numpy as jnp

from grpo_kernels import objective
from grpo_verify_worker import request as run_request
from grpo_verify_worker.protocol import WorkerError
from grpo_verify_worker.runner import Runner, ambient_mesh

GENERATION_ROWS = 256  # logit rows materialised at a time (lax.map batch) while sampling
OLD_LOGP_NOISE = 0.1
IS_WEIGHTS_NOISE = 0.1  # is_weights = exp(this * N(0, 1)): rollout-correction ratios near 1


@dataclasses.dataclass(frozen=True)
class BenchRequest:
    run: run_request.RunRequest  # arrays: name -> jax.ShapeDtypeStruct
    iters: int
    warmup: int
    seed: int


def _protocol(message):
    return WorkerError("protocol", message)


def _count(header, name):
    value = header.get(name)
    if type(value) is not int or value < 0:
        raise _protocol(f"{name} = {value!r}; expected an integer >= 0")
    return value


def parse_bench(header, implementation):
    """A checked BenchRequest for `implementation` (a loader.Implementation)."""
    seed = header.get("seed")
    if type(seed) is not int:
        raise _protocol(f"seed = {seed!r} is not an integer")
    checked = run_request.parse_specs(header, implementation)
    specs = {name: jax.ShapeDtypeStruct(a.shape, a.dtype) for name, a in checked.arrays.items()}
    run = dataclasses.replace(checked, arrays=specs)
    return BenchRequest(run, _count(header, "iters"), _count(header, "warmup"), seed)


def _row_statistics(row_logits, key, temperature, temperature_mode):
    """(token, logp) of one logit row [V] f32: y ~ p of docs/spec.md, and logp of that y."""
    scores = row_logits / temperature if temperature_mode == "logits" else row_logits
    token = jax.random.categorical(key, scores).astype(jnp.int32)
    logp, _ = objective.token_logp_and_entropy(
        row_logits[None, None], token[None, None], temperature, temperature_mode
    )
    return token, logp[0, 0]


def generate_inputs(kind, specs, config, hparams, seed):
    """The bench inputs of docs/worker-protocol.md, on the device, in the order of `specs`."""
    def make(key):
        keys = jax.random.split(key, 7)
        arrays = {}
        if kind == "fused":
            batch, time_, width = specs["hidden"].shape
            vocab = specs["lm_head"].shape[1]
            draws = jax.random.normal(keys[0], (batch, time_, width), jnp.float32)
            draws = draws * jax.lax.rsqrt(jnp.mean(draws * draws, axis=-1, keepdims=True))
            arrays["hidden"] = draws.astype(specs["hidden"].dtype)
            arrays["lm_head"] = (
                jax.random.normal(keys[1], (width, vocab), jnp.float32) / math.sqrt(width)
            ).astype(specs["lm_head"].dtype)
            rows = arrays["hidden"].reshape(batch * time_, width)
            to_logits = lambda r: jnp.dot(r, arrays["lm_head"], preferred_element_type=jnp.float32)
        else:
            batch, time_, vocab = specs["logits"].shape
            draws = jax.random.normal(keys[0], (batch, time_, vocab), jnp.float32)
            arrays["logits"] = draws.astype(specs["logits"].dtype)
            rows = arrays["logits"].reshape(batch * time_, vocab)
            to_logits = lambda r: r.astype(jnp.float32)
        row_keys = jax.random.split(keys[2], batch * time_)
        tokens, logp = jax.lax.map(
            lambda xs: _row_statistics(
                objective.transform_logits(to_logits(xs[0]), hparams, config), xs[1],
                hparams["temperature"], config["temperature_mode"],
            ),
            (rows, row_keys),
            batch_size=min(GENERATION_ROWS, batch * time_),
        )
        logp = logp.reshape(batch, time_)
        arrays["tokens"] = tokens.reshape(batch, time_)
        arrays["mask"] = jnp.ones((batch, time_), jnp.float32)
        arrays["advantages"] = jax.random.normal(keys[3], (batch,), jnp.float32)
        noise = lambda k: OLD_LOGP_NOISE * jax.random.normal(k, (batch, time_), jnp.float32)
        if "old_logp" in specs:
            arrays["old_logp"] = logp + noise(keys[4])
        if "ref_logp" in specs:
            arrays["ref_logp"] = logp + noise(keys[5])
        if "is_weights" in specs:
            shape = specs["is_weights"].shape
            arrays["is_weights"] = jnp.exp(
                IS_WEIGHTS_NOISE * jax.random.normal(keys[6], shape, jnp.float32)
            )
        return {name: arrays[name] for name in specs}

    return jax.block_until_ready(jax.jit(make)(jax.random.key(seed)))


def _peak_bytes():
    stats = jax.devices()[0].memory_stats()
    return None if not stats else stats.get("peak_bytes_in_use")


def bench(implementation, request):
    """The reply fields of a bench (docs/worker-protocol.md, `bench`)."""
    with ambient_mesh(request.run.mesh):
        return _bench(implementation, request)


def _bench(implementation, request):
    run = request.run
    abstract = Runner._arguments(implementation, run)
    arrays = None
    if request.iters > 0:
        arrays = generate_inputs(
            implementation.kind, run.arrays, run.config, run.hparams, request.seed
        )
    started = time.perf_counter()
    executable = Runner._compile(implementation, run, abstract, fast=False).executable
    memory = executable.memory_analysis()
    reply = {
        "first_call_s": None,
        "avg_step_ms": None,
        "step_ms": [],
        "temp_bytes": int(memory.temp_size_in_bytes),
        "argument_bytes": int(memory.argument_size_in_bytes),
        "output_bytes": int(memory.output_size_in_bytes),
        "generated_code_bytes": int(memory.generated_code_size_in_bytes),
        "peak_bytes": None,
    }
    if request.iters == 0:
        return reply
    concrete = Runner._arguments(implementation, dataclasses.replace(run, arrays=arrays))
    # Where the compiled step wants its inputs: under a mesh XLA may shard them
    # (a committed array elsewhere is refused, not moved); else a no-op.
    concrete = jax.device_put(concrete, executable.input_shardings[0])

    def call():
        try:
            jax.block_until_ready(executable(*concrete))
        except Exception as error:
            raise WorkerError("impl", f"{type(error).__name__}: {error}") from error

    call()
    reply["first_call_s"] = time.perf_counter() - started
    for _ in range(request.warmup):
        call()
    step_ms = []
    for _ in range(request.iters):
        began = time.perf_counter()
        call()
        step_ms.append((time.perf_counter() - began) * 1e3)
    reply["step_ms"] = step_ms
    reply["avg_step_ms"] = statistics.median(step_ms)
    reply["peak_bytes"] = _peak_bytes()
    return reply
