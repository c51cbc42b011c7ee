"""The built-in implementations: stable name -> "module:function" target.

Adding a kernel is one file in this package and one line here. Targets are
strings so that listing the built-ins imports none of them.
"""

BUILTINS = {
    "reference": "grpo_kernels.reference:grpo_loss",
    "fused_reference": "grpo_kernels.fused_reference:grpo_loss",
    "fused_chunked": "grpo_kernels.fused_chunked:grpo_loss",
    "fused_onepass": "grpo_kernels.fused_onepass:grpo_loss",
    "fused_pallas": "grpo_kernels.fused_pallas:grpo_loss",
    "pallas_logits": "grpo_kernels.pallas_logits:grpo_loss",
    "sharded_logits": "grpo_kernels.sharded_logits:grpo_loss",
    "sharded_fused": "grpo_kernels.sharded_fused:grpo_loss",
}
