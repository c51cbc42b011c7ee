"""The safetensors file format, read and written without the `safetensors` package.

A file is: a u64 little-endian header length N; N bytes of a JSON object
{name: {"dtype": str, "shape": [int, ...], "data_offsets": [begin, end]},
 "__metadata__": {str: str} (optional)}; then the tensors' raw little-endian
C-order bytes, offsets counted from the first byte after the header. The
writer pads the header with spaces to a multiple of 8 bytes, as the
reference implementation does.

Reading memory-maps the file: a 467 MB LM head costs no copy until it is
used. `Checkpoint` reads a Hugging Face checkpoint directory, single-file
(model.safetensors) or sharded (model.safetensors.index.json, whose
"weight_map" names the shard of every tensor).
"""

import hashlib
import json
import os
import struct

import ml_dtypes
import numpy as np

# safetensors dtype name -> NumPy dtype (little-endian). BF16 is ml_dtypes.bfloat16.
DTYPES = {
    "BOOL": np.dtype("?"),
    "U8": np.dtype("u1"),
    "I8": np.dtype("i1"),
    "U16": np.dtype("<u2"),
    "I16": np.dtype("<i2"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "U32": np.dtype("<u4"),
    "I32": np.dtype("<i4"),
    "F32": np.dtype("<f4"),
    "U64": np.dtype("<u8"),
    "I64": np.dtype("<i8"),
    "F64": np.dtype("<f8"),
}
# Largest header the reader accepts (the reference implementation's limit).
MAX_HEADER_BYTES = 100 * 1024 * 1024
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


class SafetensorsError(ValueError):
    """A file or checkpoint that is not valid safetensors; the message names it."""


def dtype_name(dtype):
    """The safetensors name of a NumPy dtype ("BF16" for ml_dtypes.bfloat16)."""
    dtype = np.dtype(dtype)
    for name, known in DTYPES.items():
        if known == dtype:
            return name
    raise SafetensorsError(f"dtype {dtype} has no safetensors name; known: {sorted(DTYPES)}")


def read_header(path):
    """(header dict without "__metadata__", metadata dict, byte offset of the data section)."""
    try:
        with open(path, "rb") as stream:
            size_bytes = stream.read(8)
            if len(size_bytes) != 8:
                raise SafetensorsError(f"{path}: {len(size_bytes)} bytes; too short for a safetensors header")
            (header_len,) = struct.unpack("<Q", size_bytes)
            if header_len > MAX_HEADER_BYTES:
                raise SafetensorsError(f"{path}: header length {header_len} exceeds {MAX_HEADER_BYTES} bytes")
            raw = stream.read(header_len)
    except OSError as error:
        raise SafetensorsError(f"{path}: cannot read: {error.strerror or error}") from None
    if len(raw) != header_len:
        raise SafetensorsError(f"{path}: header says {header_len} bytes but the file ends after {len(raw)}")
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SafetensorsError(f"{path}: header is not JSON: {error}") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: header is a JSON {type(header).__name__}, not an object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise SafetensorsError(f"{path}: __metadata__ must map strings to strings")
    return header, metadata, 8 + header_len


class SafetensorsFile:
    """One .safetensors file, memory-mapped; `get(name)` is a read-only view, no copy."""

    def __init__(self, path):
        self.path = os.fspath(path)
        self.header, self.metadata, data_start = read_header(self.path)
        file_size = os.path.getsize(self.path)
        data_size = file_size - data_start
        for name, entry in self.header.items():
            self._check_entry(name, entry, data_size)
        self._data = (
            np.memmap(self.path, dtype=np.uint8, mode="r", offset=data_start, shape=(data_size,))
            if data_size > 0
            else np.zeros(0, np.uint8)
        )

    def _check_entry(self, name, entry, data_size):
        where = f"{self.path}: tensor {name!r}"
        if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= set(entry):
            raise SafetensorsError(f"{where}: entry {entry!r} lacks dtype, shape or data_offsets")
        if entry["dtype"] not in DTYPES:
            raise SafetensorsError(f"{where}: dtype {entry['dtype']!r} is not one of {sorted(DTYPES)}")
        shape, offsets = entry["shape"], entry["data_offsets"]
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise SafetensorsError(f"{where}: shape {shape!r} is not a list of non-negative integers")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            raise SafetensorsError(f"{where}: data_offsets {offsets!r} is not [begin, end]")
        begin, end = offsets
        want = int(np.prod(shape, dtype=np.int64)) * DTYPES[entry["dtype"]].itemsize
        if not 0 <= begin <= end <= data_size:
            raise SafetensorsError(f"{where}: data_offsets {offsets} outside the {data_size}-byte data section")
        if end - begin != want:
            raise SafetensorsError(
                f"{where}: data_offsets {offsets} hold {end - begin} bytes; "
                f"{entry['dtype']} {shape} needs {want}"
            )

    def names(self):
        return list(self.header)

    def __contains__(self, name):
        return name in self.header

    def spec(self, name):
        """(dtype name, shape) of a tensor."""
        entry = self._entry(name)
        return entry["dtype"], tuple(entry["shape"])

    def _entry(self, name):
        try:
            return self.header[name]
        except KeyError:
            raise SafetensorsError(f"{self.path}: no tensor named {name!r}") from None

    def get(self, name):
        """The tensor as a read-only NumPy array backed by the file."""
        entry = self._entry(name)
        begin, end = entry["data_offsets"]
        return self._data[begin:end].view(DTYPES[entry["dtype"]]).reshape(entry["shape"])


def write(path, tensors, metadata=None):
    """Write {name: array} (in the given order) and optional {str: str} metadata to path."""
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    arrays = {}
    offset = 0
    for name, array in tensors.items():
        array = np.asarray(array)
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        array = np.ascontiguousarray(array)
        header[name] = {
            "dtype": dtype_name(array.dtype),
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        arrays[name] = array
        offset += array.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as stream:
        stream.write(struct.pack("<Q", len(raw)))
        stream.write(raw)
        for array in arrays.values():
            # memoryview of the raw bytes: no copy, any dtype (bf16 included).
            stream.write(memoryview(array.reshape(-1).view(np.uint8)))
    os.replace(tmp, path)


class Checkpoint:
    """A Hugging Face checkpoint directory: model.safetensors or a sharded index."""

    def __init__(self, directory):
        self.directory = os.fspath(directory)
        index_path = os.path.join(self.directory, INDEX_FILE)
        single_path = os.path.join(self.directory, SINGLE_FILE)
        self._files = {}
        if os.path.exists(index_path):
            try:
                with open(index_path) as stream:
                    weight_map = json.load(stream)["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as error:
                raise SafetensorsError(f"{index_path}: not a safetensors index with a weight_map: {error}") from None
            self._shard_of = dict(weight_map)
        elif os.path.exists(single_path):
            self._shard_of = {name: SINGLE_FILE for name in self._open(SINGLE_FILE).names()}
        else:
            raise SafetensorsError(f"{self.directory}: neither {SINGLE_FILE} nor {INDEX_FILE} found")

    def _open(self, shard):
        if shard not in self._files:
            self._files[shard] = SafetensorsFile(os.path.join(self.directory, shard))
        return self._files[shard]

    def names(self):
        return list(self._shard_of)

    def __contains__(self, name):
        return name in self._shard_of

    def get(self, name):
        """The tensor as stored (memory-mapped, read-only)."""
        if name not in self._shard_of:
            raise SafetensorsError(f"{self.directory}: checkpoint has no tensor named {name!r}")
        return self._open(self._shard_of[name]).get(name)

    def spec(self, name):
        if name not in self._shard_of:
            raise SafetensorsError(f"{self.directory}: checkpoint has no tensor named {name!r}")
        return self._open(self._shard_of[name]).spec(name)


def tensor_sha256(array):
    """sha256 hex of a tensor's raw bytes as safetensors stores them (little-endian, C order)."""
    array = np.ascontiguousarray(array)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return hashlib.sha256(memoryview(array.reshape(-1).view(np.uint8))).hexdigest()
