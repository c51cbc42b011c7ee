"""The one list of built-in implementations: name, target, kind, mesh, role.

Adding a kernel is one file in `logits/` or `fused/` and one line here. The
worker's `hello` sends this list to the harness (docs/worker-protocol.md),
so the Rust side names no built-in itself. Targets are "module:function"
strings so that listing the built-ins imports none of them; the worker's
loader still reads the kind from the signature and checks it against this.

`refuses` declares, as data, the switch values a built-in raises a
Refusal for (docs/spec.md, "Refusing a configuration"), as torch's OpInfo
declares the dtypes an operator supports. The declaration is checked, never
trusted: `check` fails a built-in that refuses a configuration its entry
does not declare, or runs one it does (docs/checking.md), and
python/grpo_verify_worker/tests/test_registry.py runs each built-in on
every value of every switch.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Builtin:
    name: str  # stable: reports, repro files and the CLI use it
    target: str  # "module:function"
    kind: str  # "logits" | "fused" (docs/spec.md, "Implementation adapter")
    sharded: bool = False  # runs under a device mesh (jax.shard_map): the harness passes one
    gradcheck_default: bool = False  # in `grpo-verify gradcheck`'s default set
    spec_version: int = 2  # its function's `spec_version` (docs/spec.md "Version 2"); the loader checks
    # ((switch, (value, ...)), ...): the values of each switch it refuses (schema names); () = none
    refuses: tuple = ()

    def refused(self, config):
        """(switch, value) of the first declared refusal `config` meets (None: it declares it supported)."""
        for switch, values in self.refuses:
            if config.get(switch) in values:
                return switch, config[switch]
        return None


# The vocabulary-tiled fused paths see raw hidden @ lm_head tiles: no logit transform.
_RAW_TILES = (("logit_transform", (True,)),)

BUILTINS = {
    builtin.name: builtin
    for builtin in (
        Builtin("reference", "grpo_kernels.logits.reference:grpo_loss", "logits", gradcheck_default=True),
        Builtin("fused_reference", "grpo_kernels.fused.reference:grpo_loss", "fused"),
        Builtin("fused_chunked", "grpo_kernels.fused.chunked_xla:grpo_loss", "fused", gradcheck_default=True,
                refuses=_RAW_TILES),
        Builtin("fused_onepass", "grpo_kernels.fused.onepass_xla:grpo_loss", "fused",
                refuses=_RAW_TILES + (("ratio_level", ("sequence", "sequence_token")),)),
        Builtin("fused_pallas", "grpo_kernels.fused.pallas_mosaic_tpu:grpo_loss", "fused", refuses=_RAW_TILES),
        Builtin("pallas_logits", "grpo_kernels.logits.pallas_mosaic_tpu:grpo_loss", "logits", gradcheck_default=True),
        Builtin("sharded_logits", "grpo_kernels.logits.sharded:grpo_loss", "logits", sharded=True),
        Builtin("sharded_fused", "grpo_kernels.fused.sharded:grpo_loss", "fused", sharded=True),
    )
}

# The plain-JAX baseline of the tolerance rule for each kind (docs/spec.md): every
# implementation of that kind is judged relative to its errors.
BASELINES = {"logits": "reference", "fused": "fused_reference"}

# The built-in head-loss implementations (docs/spec.md, "The head-loss adapter"): cross-entropy and
# distillation on the same head. name -> "module:function"; the function's `kind` attribute says
# logits or fused. The baseline of each kind is listed first.
HEAD_BUILTINS = {
    "head_reference": "grpo_kernels.head_losses:head_loss",
    "head_fused_reference": "grpo_kernels.head_losses:fused_head_loss",
    "head_fused_chunked": "grpo_kernels.fused.head_chunked:head_loss",
}
