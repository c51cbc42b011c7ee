"""Tensors on disk, through the `safetensors` package (its NumPy API): files and checkpoints.

What the package leaves to us: a Hugging Face checkpoint directory, single
file (model.safetensors) or sharded (model.safetensors.index.json, whose
"weight_map" names the shard of every tensor); errors that name the file;
writing through a temporary file so that a reader never sees half a file;
the sha256 of a tensor's bytes as the format stores them.

BF16 tensors are NumPy arrays of `ml_dtypes.bfloat16` both ways (the
package reads and writes that dtype as safetensors' BF16, raw bf16 bits).
The package's writer lays the tensors out sorted by dtype, then by name,
whatever the order of the dict, and writes "__metadata__" in no fixed key
order: a file is the same bytes on every write only with at most one
metadata key.
"""

import hashlib
import json
import os

import ml_dtypes  # noqa: F401 -- registers "bfloat16" with NumPy, the dtype the package maps BF16 to
import numpy as np
import safetensors
import safetensors.numpy

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


class TensorFileError(ValueError):
    """A file or checkpoint that is not valid safetensors; the message names it."""


def read(path):
    """{name: array} of a safetensors file (ml_dtypes.bfloat16 for BF16)."""
    try:
        return safetensors.numpy.load_file(path)
    except (OSError, safetensors.SafetensorError) as error:
        raise TensorFileError(f"{path}: not a readable safetensors file: {error}") from None


def write(path, tensors, metadata=None):
    """Write {name: array} and optional {str: str} metadata to path (via path.tmp, then renamed)."""
    arrays = {name: np.ascontiguousarray(array) for name, array in tensors.items()}
    tmp = f"{path}.tmp"
    safetensors.numpy.save_file(arrays, tmp, metadata=metadata)
    os.replace(tmp, path)


def dtype_name(dtype):
    """The safetensors name of a NumPy dtype ("BF16" for ml_dtypes.bfloat16), as the package records it."""
    try:
        return safetensors.TensorSpec(dtype=np.dtype(dtype).name, shape=[0], data_ptr=0, data_len=0).dtype
    except safetensors.SafetensorError as error:
        raise TensorFileError(f"dtype {np.dtype(dtype)} has no safetensors name: {error}") from None


def tensor_sha256(array):
    """sha256 hex of a tensor's raw bytes as safetensors stores them (little-endian, C order)."""
    array = np.ascontiguousarray(array)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return hashlib.sha256(memoryview(array.reshape(-1).view(np.uint8))).hexdigest()


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
                raise TensorFileError(f"{index_path}: not a safetensors index with a weight_map: {error}") from None
            self._shard_of = dict(weight_map)
        elif os.path.exists(single_path):
            self._shard_of = {name: SINGLE_FILE for name in self._open(SINGLE_FILE).keys()}
        else:
            raise TensorFileError(f"{self.directory}: neither {SINGLE_FILE} nor {INDEX_FILE} found")

    def _open(self, shard):
        """The shard's safe_open handle (kept open: its header is parsed once)."""
        if shard not in self._files:
            path = os.path.join(self.directory, shard)
            try:
                self._files[shard] = safetensors.safe_open(path, framework="numpy")
            except (OSError, safetensors.SafetensorError) as error:
                raise TensorFileError(f"{path}: not a readable safetensors file: {error}") from None
        return self._files[shard]

    def names(self):
        return list(self._shard_of)

    def __contains__(self, name):
        return name in self._shard_of

    def get(self, name):
        """The tensor as stored (a NumPy array; ml_dtypes.bfloat16 for BF16)."""
        if name not in self._shard_of:
            raise TensorFileError(f"{self.directory}: checkpoint has no tensor named {name!r}")
        try:
            return self._open(self._shard_of[name]).get_tensor(name)
        except safetensors.SafetensorError as error:
            raise TensorFileError(f"{self.directory}: tensor {name!r}: {error}") from None
