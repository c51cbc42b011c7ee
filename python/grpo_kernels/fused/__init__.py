"""The fused kind (docs/spec.md): GRPO loss from hidden [B, T, H] and lm_head [H, V], one file per backend.

`reference` materialises the logits and is the baseline of the tolerance
rule for this kind; `chunked_xla` (vocabulary-outer, two passes) and
`onepass_xla` (token-outer, one pass) never hold [B*T, V] logits;
`pallas_mosaic_tpu` (+ `_kernel`) tiles them in Pallas TPU kernels; `sharded`
splits lm_head's columns and the batch over a device mesh. `common` is what
they share: input checks, the online softmax statistics, the loss.
"""
