"""The `bench` op (docs/worker-protocol.md): memory and time of one value-and-grad step.

The step is the one `run` compiles (runner.Runner), lowered from the input
specs alone, so `iters` 0 measures XLA's compiled memory of shapes far too
large to allocate. With iters > 0 the inputs are generated on the device
(nothing large crosses the pipe), with live statistics: tokens are sampled
from the softmax the inputs define and old log-probs sit near the policy's
own (ratios near 1), so the backward is not dead (LESSONS.md).
"""

import dataclasses
import math
import statistics
import time

import jax
import jax.numpy as jnp

from grpo_kernels import objective
from grpo_verify_worker import request as run_request
from grpo_verify_worker.protocol import DTYPES, WorkerError
from grpo_verify_worker.runner import Runner

GENERATION_ROWS = 256  # logit rows materialised at a time (lax.map batch) while sampling
OLD_LOGP_NOISE = 0.1


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


def _specs(header, implementation, config):
    """{name: ShapeDtypeStruct} in the adapter's order, checked like a run's arrays."""
    specs = header.get("specs")
    if not isinstance(specs, list):
        raise _protocol(f"specs must be a list of {{name, dtype, shape}}, got {specs!r}")
    parsed = {}
    for spec in specs:
        if not (
            isinstance(spec, dict)
            and isinstance(spec.get("name"), str)
            and spec.get("dtype") in DTYPES
            and isinstance(spec.get("shape"), list)
            and all(type(d) is int and d >= 0 for d in spec["shape"])
        ):
            raise _protocol(
                f"bad spec {spec!r}: expected "
                '{"name": str, "dtype": "f32" | "bf16" | "i32", "shape": [int >= 0, ...]}'
            )
        if spec["name"] in parsed:
            raise _protocol(f"spec {spec['name']!r} is listed twice")
        parsed[spec["name"]] = jax.ShapeDtypeStruct(tuple(spec["shape"]), DTYPES[spec["dtype"]])
    # The same presence, dtype and shape rules as a run's arrays (request.py).
    expected = run_request._expected_arrays(implementation.float_params, config)
    if sorted(parsed) != sorted(expected):
        raise _protocol(
            f"bench of a {implementation.kind}-kind implementation with on_policy = "
            f"{config['on_policy']}, kl = {config['kl']} takes the specs {expected}; "
            f"got {list(parsed)}"
        )
    for name in expected:
        if name in implementation.float_params:
            want = run_request.FLOAT_DTYPES
        else:
            want = ("int32",) if name == "tokens" else ("float32",)
        if parsed[name].dtype.name not in want:
            raise _protocol(f"{name} has dtype {parsed[name].dtype.name}; expected one of {want}")
    run_request._check_shapes(parsed, implementation.kind)
    return {name: parsed[name] for name in expected}


def parse_bench(header, implementation):
    """A checked BenchRequest for `implementation` (a loader.Implementation)."""
    config = run_request.parse_config(header.get("config"))
    hparams = run_request.parse_hparams(header.get("hparams"), config["two_sided"])
    seed = header.get("seed")
    if type(seed) is not int:
        raise _protocol(f"seed = {seed!r} is not an integer")
    specs = _specs(header, implementation, config)
    run = run_request.RunRequest(header["impl"], config, hparams, 1.0, specs)
    return BenchRequest(run, _count(header, "iters"), _count(header, "warmup"), seed)


def _row_statistics(row_logits, key, temperature, temperature_mode):
    """(token, logp) of one logit row [V] f32: y ~ p of SPEC.md, and logp of that y."""
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
                to_logits(xs[0]), xs[1], hparams["temperature"], config["temperature_mode"]
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
        return {name: arrays[name] for name in specs}

    return jax.block_until_ready(jax.jit(make)(jax.random.key(seed)))


def _peak_bytes():
    stats = jax.devices()[0].memory_stats()
    return None if not stats else stats.get("peak_bytes_in_use")


def bench(implementation, request):
    """The reply fields of a bench (docs/worker-protocol.md, `bench`)."""
    run = request.run
    abstract = Runner._arguments(implementation, run)
    arrays = None
    if request.iters > 0:
        arrays = generate_inputs(
            implementation.kind, run.arrays, run.config, run.hparams, request.seed
        )
    started = time.perf_counter()
    executable = Runner._compile(implementation, run, abstract).executable
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
