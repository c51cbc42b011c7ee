"""The logits kind (docs/spec.md): GRPO loss from logits [B, T, V], one file per backend.

`reference` is the plain-JAX baseline of the tolerance rule for this kind;
`pallas_mosaic_tpu` (+ `_kernel`) computes the [B, T, V] work in Pallas TPU
kernels; `sharded` splits the batch over a device mesh with shard_map.
"""
