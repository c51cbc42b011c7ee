"""Frames of docs/worker-protocol.md: u32 LE header length, JSON header, raw arrays.

Arrays travel little-endian in C order: "f32", "bf16" (raw 16-bit patterns,
as ml_dtypes.bfloat16 here) and "i32". This module knows nothing about ops.
"""

import json
import struct
import traceback
from collections.abc import Mapping

import ml_dtypes
import numpy as np

DTYPES = {
    "f32": np.dtype("<f4"),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "i32": np.dtype("<i4"),
}
ERROR_KINDS = ("load", "unsupported", "impl", "protocol", "lowering", "setup")
AUX_KEYS = ("logp", "per_token_loss", "entropy")  # what a run compares of an implementation's aux


class WorkerError(Exception):
    """A request that fails with one of the protocol's error kinds."""

    def __init__(self, kind, message, traceback=None, switch=None, value=None):
        assert kind in ERROR_KINDS, kind
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.traceback = traceback
        # An `unsupported` error's refused switch and value, when the refusal gave them.
        self.switch = switch
        self.value = value


def is_unsupported(error):
    """Whether `error` or one of its causes is a NotImplementedError (SPEC: a refusal)."""
    while error is not None:
        if isinstance(error, NotImplementedError):
            return True
        error = error.__cause__
    return False


def refused_switch(error):
    """(switch, value) of the first NotImplementedError in `error`'s chain that says its switch as
    data (docs/spec.md, "Refusing a configuration"): a string `switch` attribute names it; a `switch`
    attribute that is None says no switch relaxes the refusal (a hyperparameter or a shape), given
    as "" ; else (None, None), and the suite reads the message's words."""
    while error is not None:
        if isinstance(error, NotImplementedError) and hasattr(error, "switch"):
            switch = error.switch
            if switch is None:
                return "", None
            if isinstance(switch, str):
                value = getattr(error, "value", None)
                return switch, value if value is None or isinstance(value, (bool, int, float, str)) else str(value)
        error = error.__cause__
    return None, None


def split_result(name, result):
    """(loss, aux dict) from what an implementation returned (either framework), or a clear TypeError."""
    if not (isinstance(result, tuple) and len(result) == 2):
        raise TypeError(f"{name} returned a {type(result).__name__}; expected (loss, aux dict)")
    loss, aux = result
    aux = {} if aux is None else aux
    if not isinstance(aux, Mapping):
        raise TypeError(f"{name} returned aux of type {type(aux).__name__}; expected a dict")
    return loss, aux


def implementation_failure(error):
    """The WorkerError of an implementation's exception: "unsupported" for a refusal, else "impl"."""
    if is_unsupported(error):
        switch, value = refused_switch(error)
        return WorkerError("unsupported", f"{type(error).__name__}: {error}", traceback.format_exc(), switch, value)
    return WorkerError("impl", f"{type(error).__name__}: {error}", traceback.format_exc())


class StreamBroken(WorkerError):
    """A frame that cannot be parsed: the byte stream cannot be trusted after it."""

    def __init__(self, message):
        super().__init__("protocol", message)


def _read_exactly(stream, size, what):
    data = stream.read(size)
    if data is None or len(data) != size:
        got = 0 if data is None else len(data)
        raise EOFError(f"stream ended inside a frame: {what} wanted {size} bytes, got {got}")
    return data


ARRAY_ENTRY = '{"name": str, "dtype": "f32" | "bf16" | "i32", "shape": [int >= 0, ...]}'


def is_array_entry(spec):
    """Is `spec` an array entry (docs/worker-protocol.md, "Frames")?"""
    return (
        isinstance(spec, dict)
        and isinstance(spec.get("name"), str)
        and spec.get("dtype") in DTYPES
        and isinstance(spec.get("shape"), list)
        and all(type(d) is int and d >= 0 for d in spec["shape"])
    )


def _array_specs(header):
    specs = header.get("arrays", [])
    if not isinstance(specs, list):
        raise StreamBroken(f'header["arrays"] must be a list, got {specs!r}')
    for spec in specs:
        if not is_array_entry(spec):
            raise StreamBroken(f"bad array entry {spec!r}: expected {ARRAY_ENTRY}")
    return specs


def read_frame(stream):
    """(header dict, {name: numpy array}), or None at a clean end of stream."""
    prefix = stream.read(4)
    if not prefix:
        return None
    if len(prefix) != 4:
        raise EOFError(f"stream ended inside a frame length ({len(prefix)} of 4 bytes)")
    (header_len,) = struct.unpack("<I", prefix)
    raw_header = _read_exactly(stream, header_len, "header")
    try:
        header = json.loads(raw_header.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise StreamBroken(f"frame header is not UTF-8 JSON: {error}") from error
    if not isinstance(header, dict):
        raise StreamBroken(f"frame header must be a JSON object, got {type(header).__name__}")
    arrays = {}
    for spec in _array_specs(header):
        dtype = DTYPES[spec["dtype"]]
        shape = tuple(spec["shape"])
        data = _read_exactly(stream, int(np.prod(shape)) * dtype.itemsize, spec["name"])
        if spec["name"] in arrays:
            raise StreamBroken(f"array {spec['name']!r} is listed twice")
        arrays[spec["name"]] = np.frombuffer(data, dtype=dtype).reshape(shape)
    return header, arrays


def wire_array(array):
    """(dtype name, little-endian C-order array) of a numpy array of a wire dtype."""
    array = np.asarray(array)
    for name, dtype in DTYPES.items():
        if array.dtype == dtype:
            # Not np.ascontiguousarray: it turns a 0-d array into shape [1].
            return name, np.require(array, dtype=dtype, requirements="C")
    raise TypeError(f"dtype {array.dtype} does not travel; convert to one of {sorted(DTYPES)}")


def write_frame(stream, header, arrays=()):
    """Write one frame: `header` plus an "arrays" entry for each (name, array)."""
    specs, payload = [], []
    for name, array in arrays:
        dtype_name, wire = wire_array(array)
        specs.append({"name": name, "dtype": dtype_name, "shape": list(wire.shape)})
        payload.append(wire.reshape(-1).view(np.uint8))
    raw_header = json.dumps({**header, "arrays": specs}).encode("utf-8")
    stream.write(struct.pack("<I", len(raw_header)))
    stream.write(raw_header)
    for chunk in payload:
        stream.write(chunk)
    stream.flush()


def error_reply(error):
    """The reply header of a WorkerError."""
    reply = {"ok": False, "error": error.kind, "message": error.message}
    if error.traceback:
        reply["traceback"] = error.traceback
    if error.switch is not None:
        reply["switch"], reply["value"] = error.switch, error.value
    return reply
