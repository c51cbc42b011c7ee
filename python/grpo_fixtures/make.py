"""A fixture from a real checkpoint: prompts -> `qwen2.sample` rollout -> rewards -> fixture.

Rows come in groups of G consecutive rows sharing one prompt (GRPO's group
of samples per prompt). Prompts are all of one length P: read from a JSON
file of token ids, or drawn from the seed as ids below the lowest special
id the config names (for Qwen2.5 that is 151643: ordinary text ids only).
The LM head is not copied into the fixture: the manifest names the
checkpoint directory (relative to the fixture), the tensor, and its sha256.
"""

import hashlib
import json
import os
import re
import sys
import time as clock

import numpy as np

from grpo_fixtures import fixture, qwen2

STREAM_PROMPTS, STREAM_REWARDS = 10, 11


def _rng(seed, stream):
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, stream])))


def read_prompts(path, batch, group):
    """Prompt ids [B, P] from a JSON file: [[id, ...], ...] or {"prompts": [[...], ...]}.

    B/G prompts (one per group, repeated G times) or B prompts (one per row),
    all of the same length.
    """
    try:
        with open(path, "rb") as stream:
            raw = stream.read()
        prompts = json.loads(raw)
    except OSError as error:
        raise ValueError(f"{path}: cannot read the prompts file: {error.strerror or error}") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not JSON: {error}") from None
    if isinstance(prompts, dict):
        prompts = prompts.get("prompts")
    if not (isinstance(prompts, list) and prompts and all(isinstance(p, list) and p for p in prompts)):
        raise ValueError(f'{path}: expected a non-empty list of non-empty token-id lists (or {{"prompts": ...}})')
    if any(not isinstance(i, int) for p in prompts for i in p):
        raise ValueError(f"{path}: token ids must be integers")
    lengths = sorted({len(p) for p in prompts})
    if len(lengths) != 1:
        raise ValueError(f"{path}: prompts have lengths {lengths}; all must have one length (pad or trim them)")
    if len(prompts) == batch // group:
        prompts = [p for p in prompts for _ in range(group)]
    elif len(prompts) != batch:
        raise ValueError(
            f"{path}: {len(prompts)} prompts; expected {batch // group} (one per group) or {batch} (one per row)"
        )
    return np.asarray(prompts, np.int32), f"file {path} (sha256 {hashlib.sha256(raw).hexdigest()})"


def random_prompts(config, batch, group, prompt_len, seed):
    """Prompt ids [B, P], one random prompt per group, ids below the lowest special id."""
    limit = min(config.special_token_ids, default=config.vocab_size)
    limit = limit if 0 < limit <= config.vocab_size else config.vocab_size
    per_group = _rng(seed, STREAM_PROMPTS).integers(0, limit, size=(batch // group, prompt_len), dtype=np.int32)
    return np.repeat(per_group, group, axis=0), f"random ids in [0, {limit}) from seed {seed}, one per group"


def parse_eos(eos, config):
    """End-of-sequence ids: "config" (config.json's eos_token_id), "none", or "ID,ID,..."."""
    if eos == "config":
        return tuple(config.eos_token_ids)
    if eos == "none":
        return ()
    try:
        ids = tuple(int(part) for part in eos.split(","))
    except ValueError:
        raise ValueError(f"--eos {eos!r}: expected 'config', 'none' or comma-separated token ids") from None
    for token in ids:
        if not 0 <= token < config.vocab_size:
            raise ValueError(f"--eos id {token} is outside the vocabulary [0, {config.vocab_size})")
    return ids


def infer_revision(model_dir):
    """The commit of a Hugging Face cache snapshot path (.../snapshots/<40 hex>), else None."""
    match = re.search(r"snapshots[/\\]([0-9a-f]{40})", os.path.abspath(model_dir))
    return match.group(1) if match else None


def make_fixture(
    model_dir, out_dir, *, batch, time, temperature, seed, prompt_len=16, group=None,
    prompts_file=None, eos="config", model_name=None, revision=None, dtype="float32", command=None,
):
    """Sample a rollout from the checkpoint at model_dir and write it as a fixture; returns the manifest."""
    group = group or batch
    if batch < 1 or time < 1 or batch % group:
        raise ValueError(
            f"--batch {batch}, --time {time}, --group {group}: need batch, time >= 1 and group dividing batch"
        )
    if not temperature > 0:
        raise ValueError(f"--temperature {temperature}: must be > 0")
    config = qwen2.load_config(model_dir)
    if prompts_file:
        prompts, prompt_source = read_prompts(prompts_file, batch, group)
    else:
        if prompt_len < 1:
            raise ValueError(f"--prompt-len {prompt_len}: must be >= 1")
        prompts, prompt_source = random_prompts(config, batch, group, prompt_len, seed)
    if prompts.min() < 0 or prompts.max() >= config.vocab_size:
        raise ValueError(
            f"prompt token ids span [{prompts.min()}, {prompts.max()}]; expected [0, {config.vocab_size})"
        )
    eos_ids = parse_eos(eos, config)
    started = clock.perf_counter()
    model = qwen2.load_model(model_dir, dtype)
    loaded = clock.perf_counter()
    samples = qwen2.sample(model, prompts, time, temperature, eos_ids, seed)
    sampled = clock.perf_counter()

    rewards = _rng(seed, STREAM_REWARDS).random(batch)
    arrays = {
        "hidden": samples.hidden,
        "tokens": samples.tokens,
        "mask": samples.mask,
        "old_logp": samples.old_logp,
        "advantages": fixture.group_advantages(rewards, group),
        "prompts": prompts,
    }
    with open(os.path.join(model_dir, "config.json")) as stream:
        architectures = json.load(stream).get("architectures") or [None]
    head = model.lm_head_source
    os.makedirs(out_dir, exist_ok=True)
    manifest = {
        "format": fixture.FORMAT,
        "format_version": fixture.FORMAT_VERSION,
        "synthetic": False,
        "model": {
            "name": model_name or os.path.basename(os.path.normpath(model_dir)),
            "revision": revision or infer_revision(model_dir),
            "architecture": architectures[0],
        },
        "shapes": {
            "B": batch, "T": time, "H": config.hidden_size, "V": config.vocab_size, "P": int(prompts.shape[1]),
        },
        "arrays": None,  # filled in by fixture.write
        "lm_head": {
            "layout": fixture.LM_HEAD_LAYOUT,
            "dtype": head.dtype,
            "shape": [config.hidden_size, config.vocab_size],
            "sha256": head.sha256,
            "source": {
                "kind": "checkpoint",
                "checkpoint_dir": os.path.relpath(os.path.abspath(model_dir), os.path.abspath(out_dir)),
                "tensor": head.tensor,
                "transpose": True,
            },
        },
        "sampling": {
            "temperature": temperature,
            "temperature_mode": "logits",
            "logits": "hidden (bf16) @ lm_head, exact products summed in f32",
            "old_logp": "log softmax(z / tau)[token] of those logits, in f32; 0 at padding",
            "eos_token_ids": list(eos_ids),
            "prompt_lengths": [int(prompts.shape[1])] * batch,
            "prompt_source": prompt_source,
            "completion_lengths": [int(n) for n in samples.mask.sum(axis=1)],
            "group_size": group,
            "compute_dtype": dtype,
            "padding": {"tokens": fixture.PAD_TOKEN, "mask": 0, "old_logp": 0, "hidden": 0},
        },
        "rewards": {"method": fixture.REWARDS_METHOD, "rewards": [round(float(r), 6) for r in rewards]},
        "generated_by": {
            "command": command,
            "seed": seed,
            "tool": "grpo_fixtures.make",
            "versions": fixture.versions(with_jax=True),
        },
        "statistics": fixture.sampling_statistics(samples.max_prob, samples.rank, samples.old_logp, samples.mask),
    }
    manifest, _ = fixture.write(out_dir, manifest, arrays)
    print(
        f"loaded {model_dir} in {loaded - started:.1f} s; sampled {batch} x {samples.steps} steps "
        f"in {sampled - loaded:.1f} s (compile included)",
        file=sys.stderr,
    )
    return manifest
