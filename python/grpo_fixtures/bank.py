"""A real bank: positions of a real rollout and the LM head columns around them, for `check`'s real-model cases.

`check` draws some of its cases from a real model's numbers:
B*T positions of a real fixture (their final-norm hidden states and sampled
tokens) over a vocabulary subset that holds the sampled tokens and the
largest logits of those positions, with the real LM head's columns. This
module picks the positions and the columns once per fixture and writes
them to one small safetensors file (the bank); the harness
(src/case/real.rs) draws each case's rows and columns from it.

    hidden   [N, H] BF16  the fixture's hidden[b, t] of N valid positions
    tokens   [N]    I32   the token sampled there (a vocabulary id)
    top      [N, K] I32   the ids of the K largest logits there, largest first
    columns  [U]    I32   every id the bank holds, ascending: the tokens, the
                          top ids, and `tail` ids drawn uniformly from the rest
    lm_head  [H, U] BF16  the LM head's columns of those ids
    where    [N, 2] I32   (b, t) of each position in the fixture

The logits are the fused kind's (docs/spec.md): hidden (bf16) @ lm_head
(bf16), exact products summed in f32, the way the sampler formed them. The
positions are N of the fixture's valid ones, evenly spaced (all of them
when it has fewer). Banks are cached under the registry cache
(`gguf_model.cache_root()/banks/`), named by the fixture's arrays sha256,
its head's sha256 and the parameters: the same inputs give the same file.
"""

import hashlib
import json
import os

import numpy as np

from grpo_fixtures import fixture, gguf_model, resolve, tensor_files

FORMAT = "grpo-real-bank version 1"
POSITIONS, TOP, TAIL, SEED = 512, 16, 512, 0


def _arrays_sha256(fixture_dir):
    digest = hashlib.sha256()
    with open(os.path.join(fixture_dir, fixture.ARRAYS_FILE), "rb") as stream:
        while block := stream.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def bank_path(fixture_dir, manifest, positions, top, tail, seed):
    """Where the bank of these inputs lives in the cache."""
    key = f"{_arrays_sha256(fixture_dir)}-{manifest['lm_head']['sha256']}-{positions}-{top}-{tail}-{seed}"
    name = os.path.basename(os.path.normpath(fixture_dir))
    return os.path.join(gguf_model.cache_root(), "banks", f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.safetensors")


# LM heads resolved in this process, by sha256: the fixtures of one model share one.
_HEADS = {}


def make_bank(fixture_dir, positions=POSITIONS, top=TOP, tail=TAIL, seed=SEED, model_dir=None):
    """The bank file of a real fixture (made on first use, cached after); returns its path."""
    if positions < 1 or top < 1 or tail < 0:
        raise ValueError(f"--positions {positions}, --top {top}, --tail {tail}: need positions, top >= 1, tail >= 0")
    manifest, arrays = fixture.load(fixture_dir)
    if manifest["synthetic"]:
        raise ValueError(f"--fixture {fixture_dir}: a synthetic fixture; a bank holds a real model's numbers")
    path = bank_path(fixture_dir, manifest, positions, top, tail, seed)
    if os.path.isfile(path):
        return path
    sha256 = manifest["lm_head"]["sha256"]
    if sha256 not in _HEADS:
        _HEADS[sha256] = resolve.lm_head(fixture_dir, manifest, model_dir)  # [H, V], sha256 checked
    head = _HEADS[sha256]
    vocab = head.shape[1]
    valid = np.argwhere(np.asarray(arrays["mask"]) > 0)
    if len(valid) == 0:
        raise ValueError(f"--fixture {fixture_dir}: no valid position")
    picked = valid[np.unique(np.linspace(0, len(valid) - 1, min(positions, len(valid))).round().astype(int))]
    hidden = np.asarray(arrays["hidden"])[picked[:, 0], picked[:, 1]]
    tokens = np.asarray(arrays["tokens"])[picked[:, 0], picked[:, 1]].astype(np.int32)
    top_ids = np.empty((len(picked), top), np.int32)
    for start, logits in fixture.logit_rows(hidden, head):
        best = np.argpartition(-logits, top - 1, axis=1)[:, :top]
        order = np.argsort(-np.take_along_axis(logits, best, axis=1), axis=1, kind="stable")
        top_ids[start : start + logits.shape[0]] = np.take_along_axis(best, order, axis=1)
    held = np.union1d(tokens, top_ids.reshape(-1))
    rest = np.setdiff1d(np.arange(vocab, dtype=np.int32), held)
    rng = np.random.Generator(np.random.PCG64(seed))
    tail_ids = np.sort(rng.choice(rest, size=min(tail, rest.size), replace=False)).astype(np.int32)
    columns = np.union1d(held, tail_ids).astype(np.int32)
    tensors = {
        "hidden": hidden,
        "tokens": tokens,
        "top": top_ids,
        "columns": columns,
        "lm_head": np.ascontiguousarray(head[:, columns]),
        "where": picked.astype(np.int32),
    }
    os.makedirs(os.path.dirname(path), exist_ok=True)
    metadata = {
        "format": FORMAT,
        "about": json.dumps({
            "fixture": os.path.basename(os.path.normpath(fixture_dir)),
            "model": manifest["model"]["name"],
            "lm_head_sha256": manifest["lm_head"]["sha256"],
            "temperature": manifest["sampling"]["temperature"],
            "positions": int(len(picked)), "top": top, "tail": int(tail_ids.size), "seed": seed, "vocab": vocab,
        }),
    }
    tensor_files.write(path, tensors, metadata=metadata)
    return path
