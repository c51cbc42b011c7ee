"""The fixture format of fixtures/README.md: write it, load it (every check), its arithmetic.

A fixture is a directory with `manifest.json` (what the arrays are, how
they were made, which LM head they belong to and its sha256) and
`arrays.safetensors`:

    hidden      [B, T, H] BF16  final-norm hidden states; hidden[b, t] @ lm_head = the logits predicting tokens[b, t]
    tokens      [B, T]    I32   sampled completion tokens; PAD_TOKEN (-100) at padding
    mask        [B, T]    F32   1 on the completion, then 0 (padding only after a row's end)
    old_logp    [B, T]    F32   sampler's log softmax(z / tau)[token] (logits mode); 0 at padding
    advantages  [B]       F32   group-normalised rewards
    prompts     [B, P]    I32   (fixtures made from a model) the prompt token ids

The LM head [H, V] is never stored in the fixture: it is read from a
checkpoint (a path relative to the fixture directory) or regenerated from a
seed (`synthetic`), and must hash to the manifest's sha256 (its raw bytes in
the stored dtype, [H, V] C order); `resolve` finds and checks it. `load`
checks a fixture against its manifest and raises FixtureError listing every
problem found.

arrays.safetensors is written by the `safetensors` package with one
metadata key, so that writing the same arrays gives the same bytes
(tensor_files).
"""

import json
import os
import platform
import re

import ml_dtypes
import numpy as np

from grpo_fixtures import tensor_files

FORMAT = "grpo-fixture"
FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
ARRAYS_FILE = "arrays.safetensors"
PAD_TOKEN = -100
LM_HEAD_LAYOUT = "[H, V]: logits = hidden @ lm_head (Flax layout; the transpose of the Hugging Face [V, H] weight)"
TEMPERATURE_MODES = ("logits", "logp")
# name -> (safetensors dtype, shape in the manifest's dimension names)
REQUIRED_ARRAYS = {
    "hidden": ("BF16", ("B", "T", "H")),
    "tokens": ("I32", ("B", "T")),
    "mask": ("F32", ("B", "T")),
    "old_logp": ("F32", ("B", "T")),
    "advantages": ("F32", ("B",)),
}
OPTIONAL_ARRAYS = {"prompts": ("I32", ("B", "P"))}
LM_HEAD_DTYPES = ("BF16", "F32")
# verify --deep: largest |recomputed old_logp - stored| accepted (f32 sums in another order differ by ~1e-5).
OLD_LOGP_TOLERANCE = 1e-3


class FixtureError(Exception):
    """A fixture (or its LM head) that does not match its manifest; the message names the problem."""

    exit_code = 2


def write(out_dir, manifest, arrays):
    """Write arrays.safetensors and manifest.json (its "arrays" section filled in), then load it back.

    Loading (with every check of `load`) means a maker never leaves a fixture
    behind that `verify` would reject.
    """
    os.makedirs(out_dir, exist_ok=True)
    ordered = {name: arrays[name] for name in (*REQUIRED_ARRAYS, *OPTIONAL_ARRAYS) if name in arrays}
    tensor_files.write(
        os.path.join(out_dir, ARRAYS_FILE), ordered, metadata={"format": f"{FORMAT} version {FORMAT_VERSION}"}
    )
    manifest = dict(manifest)
    manifest["arrays"] = {"file": ARRAYS_FILE}
    for name, array in ordered.items():
        manifest["arrays"][name] = {"dtype": tensor_files.dtype_name(array.dtype), "shape": list(array.shape)}
    with open(os.path.join(out_dir, MANIFEST_FILE), "w") as stream:
        json.dump(manifest, stream, indent=2)
        stream.write("\n")
    return load(out_dir)


def read_manifest(fixture_dir):
    path = os.path.join(fixture_dir, MANIFEST_FILE)
    try:
        with open(path) as stream:
            manifest = json.load(stream)
    except FileNotFoundError:
        raise FixtureError(f"{path}: not found; is {fixture_dir} a fixture directory?") from None
    except OSError as error:
        raise FixtureError(f"{path}: cannot read: {error.strerror or error}") from None
    except json.JSONDecodeError as error:
        raise FixtureError(f"{path}: not JSON: {error}") from None
    if not isinstance(manifest, dict):
        raise FixtureError(f"{path}: a JSON {type(manifest).__name__}, not an object")
    return manifest


def _manifest_problems(manifest):
    """Problems of the manifest alone, as messages; the dimensions {B, T, H, V[, P]} when readable."""
    problems = []
    if manifest.get("format") != FORMAT or manifest.get("format_version") != FORMAT_VERSION:
        problems.append(
            f"format {manifest.get('format')!r} version {manifest.get('format_version')!r}; "
            f"this reader knows {FORMAT!r} version {FORMAT_VERSION}"
        )
    for key in ("model", "synthetic", "shapes", "arrays", "lm_head", "sampling", "rewards", "generated_by"):
        if key not in manifest:
            problems.append(f"missing key {key!r}")
    if problems:
        return problems, None
    shapes = manifest["shapes"]
    dims = {}
    for name in ("B", "T", "H", "V", "P"):
        value = shapes.get(name) if isinstance(shapes, dict) else None
        if name == "P" and value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < (0 if name == "P" else 1):
            problems.append(f"shapes.{name} = {value!r}; expected a positive integer")
        dims[name] = value
    if not isinstance(manifest["synthetic"], bool):
        problems.append(f"synthetic = {manifest['synthetic']!r}; expected true or false")
    head = manifest["lm_head"]
    if not isinstance(head, dict):
        return problems + ["lm_head is not an object"], dims
    if head.get("dtype") not in LM_HEAD_DTYPES:
        problems.append(f"lm_head.dtype = {head.get('dtype')!r}; expected one of {LM_HEAD_DTYPES}")
    if head.get("shape") != [dims.get("H"), dims.get("V")]:
        problems.append(
            f"lm_head.shape = {head.get('shape')!r}; expected [H, V] = [{dims.get('H')}, {dims.get('V')}]"
        )
    if not re.fullmatch(r"[0-9a-f]{64}", str(head.get("sha256"))):
        problems.append(f"lm_head.sha256 = {head.get('sha256')!r}; expected 64 lowercase hex digits")
    source = head.get("source")
    kind = source.get("kind") if isinstance(source, dict) else None
    if kind == "checkpoint":
        if not isinstance(source.get("checkpoint_dir"), str) or not isinstance(source.get("tensor"), str):
            problems.append("lm_head.source (checkpoint) needs checkpoint_dir and tensor strings")
    elif kind == "synthetic":
        if not isinstance(source.get("seed"), int):
            problems.append(f"lm_head.source.seed = {source.get('seed')!r}; expected an integer")
    elif kind == "registry":
        if not isinstance(source.get("model"), str) or not isinstance(source.get("tensor"), str):
            problems.append("lm_head.source (registry) needs model and tensor strings")
    else:
        problems.append(f"lm_head.source.kind = {kind!r}; expected 'checkpoint', 'registry' or 'synthetic'")
    sampling = manifest["sampling"]
    temperature = sampling.get("temperature") if isinstance(sampling, dict) else None
    if not isinstance(temperature, (int, float)) or not temperature > 0:
        problems.append(f"sampling.temperature = {temperature!r}; expected a number > 0")
    if not isinstance(sampling, dict) or sampling.get("temperature_mode") not in TEMPERATURE_MODES:
        problems.append(f"sampling.temperature_mode must be one of {TEMPERATURE_MODES}")
    return problems, dims


def _array_problems(manifest, dims, arrays):
    """Problems of the arrays against the manifest and the format's promises."""
    problems = []
    declared = manifest["arrays"] if isinstance(manifest["arrays"], dict) else {}
    wanted = dict(REQUIRED_ARRAYS)
    wanted.update({name: spec for name, spec in OPTIONAL_ARRAYS.items() if name in arrays})
    for name, (dtype, dim_names) in wanted.items():
        if name not in arrays:
            problems.append(f"{ARRAYS_FILE} has no array {name!r}")
            continue
        shape = [dims.get(d) for d in dim_names]
        got_dtype, got_shape = tensor_files.dtype_name(arrays[name].dtype), list(arrays[name].shape)
        if (got_dtype, got_shape) != (dtype, shape):
            problems.append(f"{name} is {got_dtype} {got_shape}; expected {dtype} {shape} ({', '.join(dim_names)})")
        if declared.get(name) != {"dtype": got_dtype, "shape": got_shape}:
            problems.append(
                f"manifest arrays.{name} = {declared.get(name)!r}; the file holds {got_dtype} {got_shape}"
            )
    if problems:
        return problems  # the value checks below need the shapes right

    tokens, mask = np.asarray(arrays["tokens"]), np.asarray(arrays["mask"])
    hidden = arrays["hidden"]
    old_logp, advantages = np.asarray(arrays["old_logp"]), np.asarray(arrays["advantages"])
    valid, padding = mask == 1, mask == 0
    if not np.all(valid | padding):
        b, t = np.argwhere(~(valid | padding))[0]
        problems.append(f"mask[{b}, {t}] = {mask[b, t]}; the mask holds 0 or 1 only")
    if np.any(np.diff(valid.astype(np.int8), axis=1) > 0):
        b, t = np.argwhere(np.diff(valid.astype(np.int8), axis=1) > 0)[0]
        problems.append(
            f"mask[{b}, {t + 1}] = 1 after mask[{b}, {t}] = {mask[b, t]}; padding must come after the completion"
        )
    outside = valid & ((tokens < 0) | (tokens >= dims["V"]))
    if outside.any():
        b, t = np.argwhere(outside)[0]
        problems.append(
            f"tokens[{b}, {t}] = {tokens[b, t]} is outside the vocabulary [0, {dims['V']}) where mask = 1"
        )
    if np.any(padding & (tokens != PAD_TOKEN)):
        b, t = np.argwhere(padding & (tokens != PAD_TOKEN))[0]
        problems.append(f"tokens[{b}, {t}] = {tokens[b, t]} at padding; the format puts {PAD_TOKEN} there")
    for name, array in (("old_logp", old_logp), ("advantages", advantages)):
        if not np.all(np.isfinite(array)):
            problems.append(f"{name} holds {int(np.sum(~np.isfinite(array)))} non-finite values")
    if np.any(valid & (old_logp > 0)):
        b, t = np.argwhere(valid & (old_logp > 0))[0]
        problems.append(f"old_logp[{b}, {t}] = {old_logp[b, t]} > 0 is not a log-probability")
    if np.any(padding & (old_logp != 0)):
        b, t = np.argwhere(padding & (old_logp != 0))[0]
        problems.append(f"old_logp[{b}, {t}] = {old_logp[b, t]} at padding; the format puts 0 there")
    for b in range(hidden.shape[0]):
        row = np.asarray(hidden[b], np.float32)
        if not np.all(np.isfinite(row)):
            problems.append(f"hidden[{b}] holds non-finite values")
        if np.any(row[padding[b]] != 0):
            problems.append(f"hidden[{b}] is nonzero at padding; the format puts 0 there")
    lengths, row_sums = manifest["sampling"].get("completion_lengths"), [int(n) for n in mask.sum(axis=1)]
    if lengths != row_sums:
        problems.append(f"sampling.completion_lengths = {lengths!r}; the mask's row sums are {row_sums}")
    if "prompts" in arrays:
        prompts = np.asarray(arrays["prompts"])
        prompt_lengths = manifest["sampling"].get("prompt_lengths") or [prompts.shape[1]] * prompts.shape[0]
        if len(prompt_lengths) != prompts.shape[0] or any(
            not isinstance(n, int) or not 0 < n <= prompts.shape[1] for n in prompt_lengths
        ):
            problems.append(f"sampling.prompt_lengths = {prompt_lengths!r}; expected B lengths in [1, P]")
        else:
            real = np.arange(prompts.shape[1])[None, :] >= prompts.shape[1] - np.asarray(prompt_lengths)[:, None]
            if np.any(real & ((prompts < 0) | (prompts >= dims["V"]))):
                b, p = np.argwhere(real & ((prompts < 0) | (prompts >= dims["V"])))[0]
                problems.append(f"prompts[{b}, {p}] = {prompts[b, p]} is outside the vocabulary [0, {dims['V']})")
            if np.any(~real & (prompts != PAD_TOKEN)):
                b, p = np.argwhere(~real & (prompts != PAD_TOKEN))[0]
                problems.append(
                    f"prompts[{b}, {p}] = {prompts[b, p]} in row {b}'s left padding; the format puts {PAD_TOKEN} there"
                )
    return problems


def load(fixture_dir):
    """(manifest, {name: array}) of a fixture that passes every check; FixtureError listing the problems."""
    manifest = read_manifest(fixture_dir)
    problems, dims = _manifest_problems(manifest)
    if not problems:
        path = os.path.join(fixture_dir, ARRAYS_FILE)
        if not os.path.exists(path):
            raise FixtureError(f"{fixture_dir}: {ARRAYS_FILE} not found")
        try:
            arrays = tensor_files.read(path)
        except tensor_files.TensorFileError as error:
            raise FixtureError(str(error)) from None
        problems = _array_problems(manifest, dims, arrays)
    if problems:
        listing = "\n".join(f"  - {problem}" for problem in problems)
        raise FixtureError(f"{fixture_dir}: malformed fixture ({len(problems)} problem(s)):\n{listing}")
    return manifest, arrays


def logit_rows(hidden_rows, lm_head, rows_per_chunk=128):
    """Yield (start, logits [n, V] f32) of hidden_rows [N, H] @ lm_head [H, V], a chunk of rows at a time.

    Inputs are widened to f32 exactly (bf16 -> f32 is exact), so each logit
    is the exact product summed in f32: the fused kind's logits (docs/spec.md).
    """
    head = np.asarray(lm_head, np.float32)
    for start in range(0, hidden_rows.shape[0], rows_per_chunk):
        yield start, np.asarray(hidden_rows[start : start + rows_per_chunk], np.float32) @ head


def token_statistics(logits, tokens, temperature):
    """(logp, max_prob, rank), each [n], of logits [n, V] f32 at the chosen tokens [n].

    logp = log softmax(z / tau)[y] (logits mode), in float64 then f32;
    max_prob = max softmax(z / tau); rank = #{v : z_v > z_y} (0: y is an argmax).
    """
    rows = np.arange(logits.shape[0])
    chosen = logits[rows, tokens]
    scaled = (logits - logits.max(axis=-1, keepdims=True)).astype(np.float64) / temperature
    log_norm = np.log(np.exp(scaled).sum(axis=-1))
    logp = scaled[rows, tokens] - log_norm
    max_prob = np.exp(-log_norm)  # the max of scaled is 0
    rank = np.sum(logits > chosen[:, None], axis=-1)
    return logp.astype(np.float32), max_prob.astype(np.float32), rank.astype(np.int32)


def recompute_old_logp(fixture_dir, manifest, arrays, lm_head):
    """Max |log softmax(hidden @ lm_head / tau)[y] - old_logp| over the unmasked positions.

    lm_head [H, V] is the fixture's own, checked (`resolve.lm_head`).
    """
    if manifest["sampling"]["temperature_mode"] != "logits":
        raise FixtureError(f"{fixture_dir}: recomputing old_logp is implemented for temperature_mode 'logits' only")
    mask, tokens = np.asarray(arrays["mask"]), np.asarray(arrays["tokens"])
    where = np.argwhere(mask > 0)
    hidden_rows = np.asarray(arrays["hidden"])[where[:, 0], where[:, 1]]
    worst = 0.0
    for start, logits in logit_rows(hidden_rows, lm_head):
        b, t = where[start : start + logits.shape[0]].T
        logp, _, _ = token_statistics(logits, tokens[b, t], manifest["sampling"]["temperature"])
        worst = max(worst, float(np.max(np.abs(logp - np.asarray(arrays["old_logp"])[b, t]))))
    if worst > OLD_LOGP_TOLERANCE:
        raise FixtureError(
            f"{fixture_dir}: old_logp differs from log softmax(hidden @ lm_head / tau)[tokens] by up to "
            f"{worst:.3g} > {OLD_LOGP_TOLERANCE}: hidden, tokens, old_logp or the LM head do not belong together"
        )
    return worst


def group_advantages(rewards, group_size):
    """GRPO advantages [B]: (r - group mean) / (group std + 1e-6), groups of consecutive rows.

    A group of one has no group to compare with: its reward (uniform on
    [0, 1)) is z-scored against that distribution, (r - 1/2) / sqrt(1/12).
    """
    rewards = np.asarray(rewards, np.float64)
    if group_size < 1 or rewards.shape[0] % group_size:
        raise ValueError(f"group size {group_size} does not divide the batch {rewards.shape[0]}")
    if group_size == 1:
        return ((rewards - 0.5) / np.sqrt(1.0 / 12.0)).astype(np.float32)
    groups = rewards.reshape(-1, group_size)
    centred = groups - groups.mean(axis=1, keepdims=True)
    return (centred / (groups.std(axis=1, keepdims=True) + 1e-6)).reshape(-1).astype(np.float32)


ADVANTAGES_METHOD = (
    "advantages = (r - group mean) / (group std + 1e-6) over groups of consecutive rows "
    "(population std); a group of one: (r - 1/2) / sqrt(1/12)"
)
REWARDS_METHOD = (
    "stand-in verifier: reward[b] ~ Uniform[0, 1) from the seed (the completions are not judged); " + ADVANTAGES_METHOD
)
# How a rollout's prompts of different lengths are stored and where its tokens sit (make_rollout).
PROMPT_PADDING = (
    "left, with -100: row b's prompt is prompts[b, P - prompt_lengths[b]:], the ids before it are -100"
)
POSITIONS = (
    "row b's prompt occupies positions 0 .. L - 1 (L = prompt_lengths[b]) and completion token t position L + t; "
    "hidden[b, t] is the final-norm hidden state at position L + t - 1, computed from the prompt and "
    "tokens[b, :t] alone, which predicts tokens[b, t]"
)


def _summary(values):
    values = np.asarray(values, np.float64)
    return {
        "mean": round(float(values.mean()), 4),
        "min": round(float(values.min()), 4),
        "p10": round(float(np.percentile(values, 10)), 4),
        "p50": round(float(np.percentile(values, 50)), 4),
        "p90": round(float(np.percentile(values, 90)), 4),
        "max": round(float(values.max()), 4),
    }


def sampling_statistics(max_prob, rank, old_logp, mask):
    """How peaked the sampler's distributions were, over the unmasked positions (manifest "statistics")."""
    valid = np.asarray(mask) > 0
    rank = np.asarray(rank)[valid]
    return {
        "positions": int(valid.sum()),
        "max_prob": _summary(np.asarray(max_prob)[valid]),
        "sampled_prob": _summary(np.exp(np.asarray(old_logp, np.float64)[valid])),
        "sampled_rank": {
            "top1": round(float(np.mean(rank == 0)), 4),
            "top5": round(float(np.mean(rank < 5)), 4),
            "top10": round(float(np.mean(rank < 10)), 4),
            "top100": round(float(np.mean(rank < 100)), 4),
            "mean": round(float(rank.mean()), 2),
            "max": int(rank.max()),
        },
        "note": (
            "at the sampling temperature; rank = number of logits strictly above the sampled token's (0 = argmax)"
        ),
    }


def versions(with_jax=False):
    """Versions of what made a fixture (its numbers depend on them). JAX is imported only when asked for."""
    found = {"python": platform.python_version(), "numpy": np.__version__, "ml_dtypes": ml_dtypes.__version__}
    if with_jax:
        import jax

        found["jax"] = jax.__version__
        found["jax_backend"] = jax.default_backend()
    return found
