"""tokamax 0.0.12's linear softmax cross-entropy behind docs/spec.md's head-loss adapter (fused kind, JAX).

Check it (JAX worker; the absolute path of this file):

    grpo-verify check --objective cross_entropy --impl /abs/path/examples/tokamax/head_adapter.py:fused_head_loss

What runs is `tokamax.linear_softmax_cross_entropy_loss(x, labels, weights, reduction=...,
implementation="xla")` (tokamax/_src/ops/linear_softmax_cross_entropy_loss/api.py:42-102), the op
`base.LinearSoftmaxCrossEntropyLoss`: a `jax.custom_vjp` (tokamax/_src/ops/op.py) whose forward is
`reference.linear_softmax_cross_entropy_loss_fwd_reference` (reference.py:24-46: the logits `x @ w`
formed whole, `jax.nn.log_softmax`, the loss summed in f32) and whose backward is its own
`..._bwd_reference` (reference.py:49-70: softmax(x @ w - lse) - one_hot, times w.T and x.T). The
worker differentiates it with `jax.vjp`, which calls that backward. The Mosaic TPU kernel
(`implementation="mosaic_tpu"`) runs only on a TPU (`supported_on`, pallas_mosaic_tpu.py:143-144);
`lower_tpu.py` beside this file lowers it for a TPU from a CPU host.

The mapping (docs/spec.md -> tokamax):
  hidden [N, H], labels [N]       -> x [B, H], labels [B] (tokamax's B is our N = B * T rows)
  lm_head [H, V]                  -> weights [H, V] (the same Flax layout: logits = x @ weights)
  reduction sum | mean            -> the same: sum, or the sum / x.shape[0] (reference.py:39-44),
                                     which is SPEC's mean with no ignored row and no class weights
  precision                       -> None (api.py:88-92 raises NotImplementedError for any other)
Declared unsupported (`supports`) and refused: the reductions none, over_count, batchmean; ignored
rows (tokamax has no ignore_index: FINDINGS.md, TK3); label smoothing, a z-loss, class weights, a
softcap, a temperature other than 1, an LM-head bias (its signature has none of them); distillation.
The labels are traced inside the worker's jit, so the ignored-row refusal only fires when the adapter
is called on concrete arrays; under the suite `supports` (ignored_rows: False) is the guard.

`probe_out_of_range_labels` is not a mapping tokamax documents: it passes SPEC's ignored labels
(-100 or -1) to tokamax as they are, under `sum` only, where tokamax's forward coincides with SPEC's
(`jax.nn.one_hot` of a label outside [0, V) is a zero row, so the row adds 0). It checks whether
tokamax's backward is the derivative of its own forward on such a row (FINDINGS.md, TK3).
"""

import pathlib

import jax
import numpy as np
import tokamax
from grpo_verify_worker.loader import import_file

# The adapters' one refusal (docs/spec.md, "Refusing a configuration"): `switch` names a switch of
# schema.json ("reduction" for the head losses), None a hyperparameter no switch relaxes.
Refused = import_file(pathlib.Path(__file__).parents[1] / "spec_mapping.py").Refusal

IMPLEMENTATION = "xla"


def _refusals(inputs, objective, config, hparams, reductions):
    if objective != "cross_entropy":
        raise Refused("tokamax's linear_softmax_cross_entropy_loss is a cross-entropy", switch=None)
    reduction = config["reduction"]
    if reduction not in reductions:
        raise Refused(f"tokamax's linear_softmax_cross_entropy_loss reduces by {' or '.join(reductions)}",
                      switch="reduction", value=reduction)
    for name, off in (("label_smoothing", 0.0), ("z_loss", 0.0), ("softcap", float("inf")), ("temperature", 1.0)):
        if hparams[name] != off:
            raise Refused(f"tokamax's linear_softmax_cross_entropy_loss takes no {name}", switch=None)
    if inputs.get("class_weights") is not None:
        raise Refused("tokamax's linear_softmax_cross_entropy_loss takes no class weights", switch=None)
    if inputs.get("bias") is not None:
        raise Refused("tokamax's linear_softmax_cross_entropy_loss takes no LM-head bias", switch=None)


def _call(inputs, reduction):
    return tokamax.linear_softmax_cross_entropy_loss(
        inputs["hidden"], inputs["labels"], inputs["lm_head"], reduction=reduction, precision=None,
        implementation=IMPLEMENTATION,
    )


def fused_head_loss(inputs, objective, config, hparams):
    """tokamax's XLA path on hidden [N, H], lm_head [H, V] and labels [N]: sum or mean."""
    _refusals(inputs, objective, config, hparams, ("sum", "mean"))
    labels = inputs["labels"]
    if not isinstance(labels, jax.core.Tracer) and np.any(np.asarray(labels) == int(hparams["ignore_index"])):
        raise Refused("tokamax's linear_softmax_cross_entropy_loss has no ignore_index", switch=None)
    return _call(inputs, config["reduction"]), {}


fused_head_loss.kind = "fused"
fused_head_loss.framework = "jax"
# What the draws keep to (docs/spec.md, "The head-loss adapter"); the refusals above stay as the guard.
fused_head_loss.supports = {
    "reductions": ["sum", "mean"], "ignored_rows": False, "label_smoothing": False, "z_loss": False,
    "class_weights": False, "softcap": False, "temperature": False, "bias": False,
}


def probe_out_of_range_labels(inputs, objective, config, hparams):
    """A probe, not a mapping: SPEC's ignored labels (negative) passed to tokamax unchanged, under
    `sum`, where a zero one-hot row makes tokamax's forward SPEC's (the row adds 0)."""
    _refusals(inputs, objective, config, hparams, ("sum",))
    return _call(inputs, "sum"), {}


probe_out_of_range_labels.kind = "fused"
probe_out_of_range_labels.framework = "jax"
probe_out_of_range_labels.supports = dict(fused_head_loss.supports, reductions=["sum"], ignored_rows=True)
