"""GRPO loss implementations under test (see docs/spec.md for the contract).

One folder per kind of input, one file per backend (as tokamax lays out its
ops): `logits/` takes logits [B, T, V], `fused/` takes hidden [B, T, H] and
lm_head [H, V]. Every implementation is a function with the adapter
signature of docs/spec.md; `registry.BUILTINS` lists the built-in ones by name.
Beside the two folders: `objective`, the per-token math they all share, and
`sharding`, what the shard_map implementations of both kinds share.
"""
