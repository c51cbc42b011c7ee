"""Hidden-state fixtures for the fused GRPO kind: make, check, resolve.

A fixture (fixtures/README.md) is a directory with `manifest.json` and
`arrays.safetensors` (hidden, tokens, mask, old_logp, advantages); its LM
head is never stored in it but resolved from a checkpoint or regenerated
from a seed, and checked against the manifest's sha256.

    tensor_files     safetensors files and HF checkpoints, through the `safetensors` package
    fixture          the fixture format: write, load, verify; the arithmetic the makers share
    resolve          a fixture's LM head from its source (checkpoint or seed), sha256 checked
    qwen2            Qwen2 forward and KV-cache sampler in JAX
    make             a fixture from a checkpoint: prompts -> rollout -> rewards
    qwen2_numpy      an independent float64 NumPy forward that checks `qwen2`
    tiny_checkpoint  a tiny random Qwen2 checkpoint in the Hugging Face layout
    synthetic        a fixture at Qwen2.5-1.5B dimensions from a seed alone

`python -m grpo_fixtures --help` lists the commands.
"""
