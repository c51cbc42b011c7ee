"""The built-in implementations: stable name -> "module:function" target.

Adding a kernel is one file in this package and one line here. Targets are
strings so that listing the built-ins imports none of them.
"""

BUILTINS = {
    "reference": "grpo_kernels.reference:grpo_loss",
}
