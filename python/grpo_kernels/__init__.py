"""GRPO loss implementations under test (see SPEC.md for the contract).

Every implementation is a function with the adapter signature of SPEC.md,
listed by name in `registry.BUILTINS`. `objective` holds the per-token math
they share; `reference` is the plain-JAX baseline of the tolerance rule.
"""
