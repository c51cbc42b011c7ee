"""The `head_run` op: a cross-entropy or distillation case on a head-loss adapter.

docs/spec.md, "The head-loss adapter", is the contract: the adapter is
`head_loss(inputs, objective, config, hparams) -> (loss, aux)` with a `kind`
attribute ("logits" or "fused"); the worker differentiates it with jax.vjp,
pulling back the request's cotangent (a scalar, or per-row weights [N] for
reduction "none"). docs/worker-protocol.md, `head_run`, is the wire.
"""

import contextlib
import dataclasses
import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from grpo_kernels import head_losses, registry, schema
from grpo_verify_worker.loader import resolve_target
from grpo_verify_worker.protocol import WorkerError, is_unsupported, refused_switch
from grpo_verify_worker.runner import fast_compile_options

OBJECTIVES = head_losses.OBJECTIVES
REDUCTIONS = head_losses.REDUCTIONS
DIVERGENCES = head_losses.DIVERGENCES
HPARAMS = tuple(schema.HEAD_HPARAMS)
KINDS = ("logits", "fused")
# The differentiated inputs of each kind, in the order their gradients come back.
DIFFERENTIATED = {"logits": ("logits",), "fused": ("hidden", "lm_head", "bias")}


def _protocol(message):
    return WorkerError("protocol", message)


@dataclasses.dataclass(frozen=True)
class HeadImplementation:
    name: str
    function: object
    kind: str
    framework: str = "jax"

    @property
    def builtin(self):
        return self.name in registry.HEAD_BUILTINS


def load(name):
    """The head-loss adapter `name`: a built-in, module:function or path/to/file.py:function."""
    target = registry.HEAD_BUILTINS.get(name, name)
    if ":" not in target:
        raise WorkerError(
            "load",
            f"{name!r} is not a built-in head-loss implementation ({', '.join(sorted(registry.HEAD_BUILTINS))}); "
            "name one as module:function or path/to/file.py:function",
        )
    try:
        function = resolve_target(target)
    except Exception as error:
        raise WorkerError("load", f"{name}: cannot load it: {type(error).__name__}: {error}") from error
    kind = getattr(function, "kind", "logits")
    if kind not in KINDS:
        raise WorkerError("load", f"{name}: its `kind` attribute is {kind!r}; expected one of {KINDS}")
    framework = getattr(function, "framework", "jax")
    if framework not in ("jax", "torch"):
        raise WorkerError("load", f"{name}: its `framework` attribute is {framework!r}; expected jax or torch")
    return HeadImplementation(name, function, kind, framework)


def _number(hparams, key):
    value = hparams.get(key)
    if value == "inf":
        return math.inf
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise _protocol(f'hparams[{key!r}] = {value!r} is not a number (or "inf")')
    return float(value)


def parse(header, arrays, implementation):
    """(objective, config, hparams, inputs, cotangent) of a head_run request, checked."""
    objective = header.get("objective")
    if objective not in OBJECTIVES:
        raise _protocol(f"objective {objective!r}; expected one of {OBJECTIVES}")
    config = header.get("config")
    if not isinstance(config, dict) or set(config) != {"reduction", "divergence"}:
        raise _protocol(f'config must be {{"reduction", "divergence"}}, got {config!r}')
    if config["reduction"] not in REDUCTIONS or config["divergence"] not in DIVERGENCES:
        raise _protocol(f"config {config!r}: reduction one of {REDUCTIONS}, divergence one of {DIVERGENCES}")
    given = header.get("hparams")
    if not isinstance(given, dict) or set(given) != set(HPARAMS):
        raise _protocol(f"hparams must have exactly the keys {list(HPARAMS)}, got {given!r}")
    hparams = {key: _number(given, key) for key in HPARAMS}
    hparams["ignore_index"] = int(hparams["ignore_index"])
    hparams["batch"] = int(hparams["batch"])
    inputs = dict(arrays)
    labels = inputs.get("labels")
    if labels is None or labels.ndim != 1:
        raise _protocol("a head_run request needs labels [N] (i32)")
    n = labels.shape[0]
    needed = {"logits": ("logits",), "fused": ("hidden", "lm_head")}[implementation.kind]
    if objective == "distillation":
        needed += ("teacher_logits",) if implementation.kind == "logits" else ("teacher_hidden", "teacher_lm_head")
    missing = [name for name in needed if name not in inputs]
    if missing:
        raise _protocol(f"{implementation.name} is of the {implementation.kind} kind: missing arrays {missing}")
    if implementation.kind == "logits" and inputs["logits"].shape[0] != n:
        raise _protocol(f"logits has {inputs['logits'].shape[0]} rows, labels {n}")
    if implementation.kind == "fused" and inputs["hidden"].shape[0] != n:
        raise _protocol(f"hidden has {inputs['hidden'].shape[0]} rows, labels {n}")
    cotangent = inputs.pop("cotangent", None)
    if config["reduction"] == "none":
        if cotangent is None or cotangent.shape != (n,):
            raise _protocol(f'reduction "none" pulls back a cotangent array [N = {n}]')
    else:
        if cotangent is not None:
            raise _protocol("a scalar reduction's cotangent is the header's `cotangent`, not an array")
        value = header.get("cotangent")
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise _protocol(f"cotangent {value!r} is not a number")
        cotangent = np.float32(value)
    return objective, config, hparams, inputs, cotangent


def _options(inputs):
    """The runner's fast-compile options for a small step on CPU (runner.fast_compile_options)."""
    vocab = next(inputs[name].shape[-1] for name in ("logits", "lm_head") if name in inputs)
    return fast_compile_options(inputs["labels"].shape[0] * vocab)


def _wire_float(array):
    """A returned loss as it travels: bf16 kept (its one output rounding is allowed), else f32."""
    array = np.asarray(array)
    return array if array.dtype.name == "bfloat16" else array.astype(np.float32)


def _key(value):
    return tuple(sorted(value.items()))


class HeadRunner:
    """Compiled steps, one per (implementation, objective, config, hparams, shapes)."""

    def __init__(self):
        self.steps = {}

    def run(self, implementation, header, arrays):
        started = time.perf_counter()
        objective, config, hparams, inputs, cotangent = parse(header, arrays, implementation)
        differentiated = [name for name in DIFFERENTIATED[implementation.kind] if name in inputs]
        if implementation.framework == "torch":
            return run_torch(implementation, objective, config, hparams, inputs, cotangent, differentiated, started)
        shapes = tuple((name, value.shape, str(value.dtype)) for name, value in sorted(inputs.items()))
        key = (implementation.name, objective, _key(config), _key(hparams), shapes)
        compiled = key not in self.steps
        try:
            arguments = ({k: jnp.asarray(v) for k, v in inputs.items()}, jnp.asarray(cotangent))
            if compiled:
                if len(self.steps) > 256:
                    self.steps.clear()
                step = self._step(implementation, objective, config, hparams, differentiated)
                # The built-ins trace with full f32 matmuls (TF32 on a GPU otherwise), as GRPO's do.
                scope = jax.default_matmul_precision("highest") if implementation.builtin else contextlib.nullcontext()
                with scope:
                    lowered = step.lower(*arguments)
                self.steps[key] = lowered.compile(_options(inputs))
            loss, aux, grads = self.steps[key](*arguments)
            loss, grads = np.asarray(loss), [np.asarray(g) for g in grads]
            aux = {k: np.asarray(v) for k, v in aux.items()}
        except WorkerError:
            raise
        except Exception as error:
            if is_unsupported(error):
                switch, value = refused_switch(error)
                raise WorkerError("unsupported", f"{type(error).__name__}: {error}", switch=switch, value=value) from error
            raise WorkerError("impl", f"{implementation.name}: {type(error).__name__}: {error}") from error
        out = [("loss", _wire_float(loss))]
        if "z_loss" in aux:
            out.append(("z_loss", _wire_float(aux["z_loss"])))
        for name, grad in zip(differentiated, grads):
            if grad.shape != inputs[name].shape:
                raise WorkerError("impl", f"{implementation.name}: d {name} has shape {grad.shape}, {name} {inputs[name].shape}")
            out.append((f"d_{name}", grad if grad.dtype == inputs[name].dtype else grad.astype(np.float32)))
        return {"ok": True, "compiled": compiled, "seconds": time.perf_counter() - started}, out

    @staticmethod
    def _step(implementation, objective, config, hparams, differentiated):
        function = implementation.function

        @jax.jit
        def step(inputs, cotangent):
            rest = {k: v for k, v in inputs.items() if k not in differentiated}

            def loss_of(*values):
                loss, aux = function(dict(rest, **dict(zip(differentiated, values))), objective, config, hparams)
                return loss, aux

            loss, pullback, aux = jax.vjp(loss_of, *[inputs[name] for name in differentiated], has_aux=True)
            grads = pullback(cotangent.astype(loss.dtype).reshape(loss.shape))
            return loss, aux, grads

        return step


def run_torch(implementation, objective, config, hparams, inputs, cotangent, differentiated, started):
    """A torch head-loss adapter: its inputs as torch tensors (bf16 bit for bit, labels int64), the
    differentiated ones leaves that require grad; the VJP is torch.autograd.grad with the cotangent
    (a scalar, or the per-row weights under `none`) as grad_outputs, so a custom backward gets it."""
    import torch

    from grpo_verify_worker import torch_runner

    device = torch_runner.DEVICE
    tensors = {name: torch_runner._to_torch(np.asarray(value)).to(device) for name, value in inputs.items()}
    leaves = [tensors[name].requires_grad_(True) for name in differentiated]
    try:
        with torch.enable_grad(), device:
            loss, aux = implementation.function(tensors, objective, config, hparams)
            if not isinstance(loss, torch.Tensor):
                raise TypeError(f"the loss is a {type(loss).__name__}, not a torch.Tensor")
            grad_output = torch_runner._to_torch(np.asarray(cotangent, np.float32)).to(device).to(loss.dtype).reshape(loss.shape)
            if loss.requires_grad:
                grads = torch.autograd.grad(loss, leaves, grad_outputs=grad_output, allow_unused=True)
            else:
                grads = [None] * len(leaves)
            grads = [torch.zeros_like(x) if g is None else g for x, g in zip(leaves, grads)]
        out = [("loss", _wire_float(torch_runner._to_host(loss, "loss")))]
        if "z_loss" in aux:
            out.append(("z_loss", _wire_float(torch_runner._to_host(aux["z_loss"], "z_loss"))))
        for name, grad in zip(differentiated, grads):
            host = torch_runner._to_host(grad, f"d {name}")
            if host.shape != inputs[name].shape:
                raise TypeError(f"d {name} has shape {host.shape}, {name} {inputs[name].shape}")
            out.append((f"d_{name}", host if host.dtype == inputs[name].dtype else host.astype(np.float32)))
    except Exception as error:
        if is_unsupported(error):
            switch, value = refused_switch(error)
            raise WorkerError("unsupported", f"{type(error).__name__}: {error}", switch=switch, value=value) from error
        raise WorkerError("impl", f"{implementation.name}: {type(error).__name__}: {error}") from error
    return {"ok": True, "compiled": False, "seconds": time.perf_counter() - started}, out


def bench(implementation, header):
    """The `head_bench` op: XLA's compiled memory of one value-and-grad step of a head loss at a
    shape (nothing allocated), and with `iters` > 0 its median step time on inputs generated on
    the device. The loss is cross-entropy or distillation under `mean`, no smoothing, z-loss or
    softcap, tau = 1: the plain SFT / distillation step."""
    objective = header.get("objective")
    if objective not in OBJECTIVES:
        raise _protocol(f"objective {objective!r}; expected one of {OBJECTIVES}")
    try:
        batch, time_, vocab, hidden = (int(header[k]) for k in ("batch", "time", "vocab", "hidden"))
        iters, warmup = int(header.get("iters", 0)), int(header.get("warmup", 1))
    except (KeyError, TypeError, ValueError) as error:
        raise _protocol(f"head_bench needs integer batch, time, vocab, hidden: {error}") from error
    dtype = {"f32": jnp.float32, "bf16": jnp.bfloat16}.get(header.get("dtype"))
    if dtype is None or min(batch, time_, vocab, hidden) < 1:
        raise _protocol(f"head_bench: dtype f32 or bf16 and sizes >= 1, got {header!r}")
    n = batch * time_
    config = {"reduction": "mean", "divergence": "forward_kl"}
    hparams = {"ignore_index": -100, "label_smoothing": 0.0, "z_loss": 0.0, "softcap": math.inf, "temperature": 1.0,
               "beta": 0.5, "num_items": float(n), "batch": batch}
    if implementation.kind == "logits":
        specs = {"logits": ((n, vocab), dtype)}
        if objective == "distillation":
            specs["teacher_logits"] = ((n, vocab), dtype)
    else:
        specs = {"hidden": ((n, hidden), dtype), "lm_head": ((hidden, vocab), dtype)}
        if objective == "distillation":
            specs.update(teacher_hidden=((n, hidden), dtype), teacher_lm_head=((hidden, vocab), dtype))
    specs["labels"] = ((n,), jnp.int32)
    differentiated = [name for name in DIFFERENTIATED[implementation.kind] if name in specs]
    step = HeadRunner._step(implementation, objective, config, hparams, differentiated)
    shapes = {name: jax.ShapeDtypeStruct(shape, d) for name, (shape, d) in specs.items()}
    started = time.perf_counter()
    scope = jax.default_matmul_precision("highest") if implementation.builtin else contextlib.nullcontext()
    with scope:
        compiled = step.lower(shapes, jax.ShapeDtypeStruct((), jnp.float32)).compile()
    compile_seconds = time.perf_counter() - started
    memory = compiled.memory_analysis()
    result = {
        "ok": True, "impl": implementation.name, "objective": objective, "compile_seconds": compile_seconds,
        "temp_bytes": getattr(memory, "temp_size_in_bytes", None),
        "argument_bytes": getattr(memory, "argument_size_in_bytes", None),
        "output_bytes": getattr(memory, "output_size_in_bytes", None),
        "step_ms": [], "median_ms": None,
    }
    if iters > 0:
        keys = iter(jax.random.split(jax.random.key(0), len(specs) + 1))
        inputs = {}
        for name, (shape, d) in specs.items():
            key = next(keys)
            if name == "labels":
                inputs[name] = jax.random.randint(key, shape, 0, vocab, jnp.int32)
            else:
                fan_in = shape[0] if name.endswith("lm_head") else 1
                inputs[name] = (jax.random.normal(key, shape, jnp.float32) / math.sqrt(fan_in)).astype(d)
        cotangent = jnp.float32(1.0)
        for _ in range(warmup):
            jax.block_until_ready(compiled(inputs, cotangent))
        for _ in range(iters):
            started = time.perf_counter()
            jax.block_until_ready(compiled(inputs, cotangent))
            result["step_ms"].append((time.perf_counter() - started) * 1e3)
        result["median_ms"] = sorted(result["step_ms"])[len(result["step_ms"]) // 2]
    return result
