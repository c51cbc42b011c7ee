"""A fixture's LM head, found from its manifest's source and checked against its sha256.

The source is a checkpoint (a path relative to the fixture directory, or
--model-dir), a model of the package registry (`gguf_model`: fetched and
converted into the cache on first use), or the synthetic generator's seed
(`synthetic.lm_head`). Here,
not in `fixture`, because the synthetic maker writes fixtures: the format
module stays below both.
"""

import os

import numpy as np

from grpo_fixtures import gguf_model, synthetic, tensor_files
from grpo_fixtures.fixture import FixtureError


class CheckpointMissing(FixtureError):
    """The checkpoint a fixture's LM head comes from is not on this machine: skip, do not fail."""

    exit_code = 3


def checkpoint_dir(fixture_dir, manifest, model_dir=None):
    """Where a checkpoint-backed fixture's LM head lives: model_dir, else the manifest's path from fixture_dir."""
    if model_dir is not None:
        return model_dir
    return os.path.normpath(os.path.join(fixture_dir, manifest["lm_head"]["source"]["checkpoint_dir"]))


def lm_head(fixture_dir, manifest, model_dir=None):
    """The fixture's LM head [H, V] in its stored dtype, its sha256 checked against the manifest.

    Raises CheckpointMissing (exit code 3: skip) when the checkpoint is not
    on this machine, FixtureError when what is found does not match.
    """
    head = manifest["lm_head"]
    source = head["source"]
    if source["kind"] == "synthetic":
        array = synthetic.lm_head(source["seed"], *head["shape"], version=source.get("generator_version"))
        where = f"synthetic LM head (seed {source['seed']})"
    else:
        if source["kind"] == "registry" and model_dir is None:
            # From the package registry: fetched and converted on first use, never absent (gguf_model).
            directory = gguf_model.ensure_checkpoint(gguf_model.model_by_key(source["model"]), body=False)
        else:
            directory = checkpoint_dir(fixture_dir, manifest, model_dir)
        try:
            checkpoint = tensor_files.Checkpoint(directory)
        except tensor_files.TensorFileError as error:
            model = manifest.get("model", {})
            name, revision = model.get("name", "?"), model.get("revision") or "main"
            raise CheckpointMissing(
                f"fixture {fixture_dir} needs the LM head {source['tensor']!r} of checkpoint {name} "
                f"(revision {revision}) at {directory}, which is not usable here ({error}). Download it: "
                f"huggingface-cli download {name} --revision {revision} --local-dir {directory} "
                f"(or pass --model-dir). The fixture was made with: {manifest['generated_by'].get('command')}"
            ) from None
        try:
            stored = checkpoint.get(source["tensor"])
        except tensor_files.TensorFileError as error:
            raise FixtureError(str(error)) from None
        array = np.ascontiguousarray(stored.T if source.get("transpose", True) else stored)
        where = f"{directory}: {source['tensor']}"
    got = (tensor_files.dtype_name(array.dtype), list(array.shape))
    if got != (head["dtype"], head["shape"]):
        raise FixtureError(f"{where} is {got[0]} {got[1]}; the manifest wants {head['dtype']} {head['shape']}")
    digest = tensor_files.tensor_sha256(array)
    if digest != head["sha256"]:
        raise FixtureError(
            f"{where}: sha256 {digest} but the manifest of {fixture_dir} says {head['sha256']}: "
            f"not the LM head these hidden states were made with (another checkpoint revision, "
            f"or a changed generator)"
        )
    return array
