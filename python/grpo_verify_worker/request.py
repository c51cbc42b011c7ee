"""Check a `run` request (also `lower`, `bench`) against docs/worker-protocol.md and docs/spec.md.

Anything wrong here is a harness bug, so every failure is a "protocol" error
whose message names the input and what was wrong with it.
"""

import dataclasses
import json
import math

import jax
import numpy as np

from grpo_kernels import schema
from grpo_verify_worker.protocol import ARRAY_ENTRY, DTYPES, WorkerError, is_array_entry

# The config keys and their choices, and the hyperparameter names, per docs/spec.md
# version (schema.json; v2 = v1's keys + its own).
CONFIG_CHOICES = schema.CONFIG_CHOICES
HPARAM_NAMES = schema.HPARAM_NAMES
MESH_AXES = ("data", "model")
FLOAT_DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class RunRequest:
    impl: str
    config: dict
    hparams: dict  # name -> Python float holding an f32 value (or +-inf); delta = inf unless two_sided
    cotangent: float
    arrays: dict  # name -> numpy array, in the order the adapter lists them
    mesh: tuple | None = None  # (data, model) sizes of the ambient mesh; None = no mesh


def _protocol(message):
    return WorkerError("protocol", message)


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_keys(what, given, expected, spec_version):
    """A protocol error naming the missing and extra keys of a config / hparams dict."""
    if not isinstance(given, dict):
        raise _protocol(f"{what} must be an object, got {given!r}")
    missing = [key for key in expected if key not in given]
    extra = sorted(key for key in given if key not in expected)
    if missing or extra:
        raise _protocol(
            f"{what} of a SPEC v{spec_version} implementation must have exactly the keys "
            f"{list(expected)}; missing {missing}, extra {extra}"
        )


def parse_config(config, spec_version=1):
    """The config of a run for an implementation of that docs/spec.md version, checked."""
    choices_of = CONFIG_CHOICES[spec_version]
    _check_keys("config", config, list(choices_of), spec_version)
    for key, choices in choices_of.items():
        if config[key] not in choices or type(config[key]) is not type(choices[0]):
            raise _protocol(f"config[{key!r}] = {config[key]!r}; expected one of {choices}")
    return dict(config)


def parse_hparams(hparams, two_sided, spec_version=1):
    """Hyperparameters as f32 values (Python floats); delta = inf unless two-sided.

    A request writes +-inf as the strings "inf" and "-inf" (schema.INFINITIES).
    """
    names = HPARAM_NAMES[spec_version]
    _check_keys("hparams", hparams, names, spec_version)
    parsed = {}
    for name in names:
        value = hparams[name]
        if isinstance(value, str) and value in schema.INFINITIES:
            value = schema.INFINITIES[value]
        if not _is_number(value):
            raise _protocol(f'hparams[{name!r}] = {value!r} is not a number (or "inf", "-inf")')
        parsed[name] = float(np.float32(value))
    if not two_sided:
        parsed["delta"] = math.inf
    return parsed


def parse_mesh(mesh):
    """(data, model) of a request's optional "mesh" header key; None when absent or null.

    The step then runs under a mesh of the first data * model devices
    (runner.ambient_mesh), so the worker must have that many.
    """
    if mesh is None:
        return None
    if not isinstance(mesh, dict) or set(mesh) != set(MESH_AXES):
        raise _protocol(
            f'"mesh" must be an object with exactly the keys {list(MESH_AXES)}, got {mesh!r}'
        )
    for axis in MESH_AXES:
        if type(mesh[axis]) is not int or mesh[axis] < 1:
            raise _protocol(f"mesh[{axis!r}] = {mesh[axis]!r}; expected an integer >= 1")
    shape = tuple(mesh[axis] for axis in MESH_AXES)
    devices = shape[0] * shape[1]
    if devices > jax.device_count():
        raise _protocol(
            f'"mesh" = {json.dumps(mesh)} needs {devices} devices but the worker has '
            f"{jax.device_count()} ({jax.default_backend()}); start the worker with at least "
            f"{devices}, e.g. with XLA_FLAGS=--xla_force_host_platform_device_count={devices} on CPU"
        )
    return shape


def _expected_arrays(float_params, config):
    names = list(float_params) + ["tokens", "mask", "advantages"]
    if not config["on_policy"]:
        names.append("old_logp")
    if config["kl"]:
        names.append("ref_logp")
    if config.get("rollout_correction", False):
        names.append("is_weights")
    return names


def _check_shapes(arrays, kind):
    if kind == "logits":
        if arrays["logits"].ndim != 3:
            raise _protocol(f"logits has shape {arrays['logits'].shape}; expected [B, T, V]")
        batch, time, vocab = arrays["logits"].shape
        expected = {"logits": (batch, time, vocab)}
    else:
        if arrays["hidden"].ndim != 3 or arrays["lm_head"].ndim != 2:
            raise _protocol(
                f"hidden {arrays['hidden'].shape} and lm_head {arrays['lm_head'].shape}: "
                "expected [B, T, H] and [H, V]"
            )
        batch, time, hidden = arrays["hidden"].shape
        vocab = arrays["lm_head"].shape[1]
        expected = {"hidden": (batch, time, hidden), "lm_head": (hidden, vocab)}
    if min(batch, time, vocab) < 1:
        raise _protocol(f"B = {batch}, T = {time}, V = {vocab}: all must be at least 1")
    for name in ("tokens", "mask", "old_logp", "ref_logp"):
        expected[name] = (batch, time)
    expected["advantages"] = (batch,)
    for name, array in arrays.items():
        allowed = [(batch, time), (batch, 1)] if name == "is_weights" else [expected[name]]
        if array.shape not in allowed:
            wanted = " or ".join(str(list(shape)) for shape in allowed)
            raise _protocol(f"{name} has shape {list(array.shape)}; expected {wanted}")
    return vocab


def _check_values(arrays, vocab):
    mask, tokens = arrays["mask"], arrays["tokens"]
    not_binary = np.argwhere((mask != 0) & (mask != 1))
    if len(not_binary):
        b, t = not_binary[0]
        raise _protocol(f"mask[{b}, {t}] = {mask[b, t]} is not 0 or 1")
    outside = np.argwhere((mask != 0) & ((tokens < 0) | (tokens >= vocab)))
    if len(outside):
        b, t = outside[0]
        raise _protocol(
            f"tokens[{b}, {t}] = {tokens[b, t]} is outside the vocabulary [0, {vocab}) "
            "at an unmasked position"
        )


def parse_run(header, arrays, implementation):
    """A checked RunRequest for `implementation` (a loader.Implementation)."""
    version = implementation.spec_version
    config = parse_config(header.get("config"), version)
    hparams = parse_hparams(header.get("hparams"), config["two_sided"], version)
    cotangent = header.get("cotangent")
    if not _is_number(cotangent):
        raise _protocol(f"cotangent = {cotangent!r} is not a number")
    expected = _expected_arrays(implementation.float_params, config)
    if sorted(arrays) != sorted(expected):
        raise _protocol(
            f"run of a {implementation.kind}-kind implementation with on_policy = "
            f"{config['on_policy']}, kl = {config['kl']}"
            + (f", rollout_correction = {config['rollout_correction']}" if version >= 2 else "")
            + f" takes the arrays {expected}; got {list(arrays)}"
        )
    for name in expected:
        if name in implementation.float_params:
            want = FLOAT_DTYPES
        else:
            want = ("int32",) if name == "tokens" else ("float32",)
        if arrays[name].dtype.name not in want:
            raise _protocol(f"{name} has dtype {arrays[name].dtype.name}; expected one of {want}")
    _check_values(arrays, _check_shapes(arrays, implementation.kind))
    ordered = {name: arrays[name] for name in expected}
    mesh = parse_mesh(header.get("mesh"))
    return RunRequest(header["impl"], config, hparams, float(np.float32(cotangent)), ordered, mesh)


def stand_ins(specs):
    """{name: zero-strided numpy array of the spec's dtype and shape}.

    `lower` and `bench` name the inputs a run would carry (`specs`) without
    data; these stand-ins let `parse_run` check them exactly as it checks a
    run's arrays, without allocating anything of the shape.
    """
    if not isinstance(specs, list):
        raise _protocol(f'"specs" must be a list, got {specs!r}')
    arrays = {}
    for spec in specs:
        if not is_array_entry(spec):
            raise _protocol(f"bad spec {spec!r}: expected {ARRAY_ENTRY}")
        if spec["name"] in arrays:
            raise _protocol(f"spec {spec['name']!r} is listed twice")
        arrays[spec["name"]] = np.broadcast_to(np.zeros((), DTYPES[spec["dtype"]]), tuple(spec["shape"]))
    return arrays


def parse_specs(header, implementation):
    """The RunRequest of a `lower` or `bench` header: checked like a run, arrays as stand-ins."""
    return parse_run({**header, "cotangent": 1.0}, stand_ins(header.get("specs")), implementation)
