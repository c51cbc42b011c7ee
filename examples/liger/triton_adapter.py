"""Liger-Kernel 0.8.5's pure-Triton GRPO loss (`triton_grpo_loss`) behind docs/spec.md's torch adapter
contract (SPEC v2, logits kind).

    grpo-verify check --impl examples/liger/triton_adapter.py:grpo_loss --objective trl:dapo
    grpo-verify check --impl examples/liger/triton_adapter.py:grpo_loss_reduced --objective trl:grpo

What runs is Liger's own `liger_kernel.transformers.grpo_loss.triton_grpo_loss`
(transformers/grpo_loss.py:9) over `liger_kernel.ops.grpo_loss.GrpoLossFunction` (ops/grpo_loss.py:603):
the Triton kernels `_grpo_loss_fwd_kernel` / `_grpo_loss_bwd_kernel` (token level, :103, :426) or
`_selective_log_softmax_kernel` + `_grpo_loss_fwd_kernel_seq` / `_grpo_loss_bwd_kernel_seq`
(sequence level, :25, :232, :330). On a machine without a GPU they run in Triton's interpreter
(TRITON_INTERPRET=1, set below before any Triton kernel is decorated, as examples/trl/adapter.py
does), with NumPy's float32 math in place of the GPU's.

Two entry points, both with Liger's defaults `inplace=True` (the backward writes d logits into
the logits' own storage, ops/grpo_loss.py:932) and everything else as the caller sets it:

- `grpo_loss`: `reduce=False`, `triton_grpo_loss`'s default: the kernel returns the per-token
  losses (`loss * mask`, :845) and the aggregation is Liger's own `_reduce_grpo_loss`
  (transformers/grpo_loss.py:157) through autograd. aux: `per_token_loss` (the kernel's) and
  `logp`.
- `grpo_loss_reduced`: `reduce=True`: the kernel's own `_reduce_loss` (ops/grpo_loss.py:585) and
  the backward's hand-written per-loss-type scaling of d loss (:912-930). aux: `logp`.

aux `logp` is Liger's `fused_selective_log_softmax` (ops/grpo_loss.py:71, the Triton kernel its
TRL integration uses for old / ref log-probs), run on the same logits before the loss.

Layout: Liger takes the logits of the prompt's last position and the completion, (B, T + 1, V),
and drops the last row (row t scores completion_ids[:, t]; ops/grpo_loss.py:42, :140, :666). SPEC's
logits [B, T, V] score token t at row t, so the adapter appends one row of zeros
(`torch.cat`); the row never enters the loss and its gradient is zeroed by Liger (:1003) and
dropped by the cat's backward. Because of that copy, Liger's in-place backward overwrites the
adapter's (B, T + 1, V) buffer, never the harness's leaf tensor (FINDINGS.md, "Triton kernel").

SPEC v2 -> Liger (triton_grpo_loss arguments):
  eps_low, eps_high, temperature, beta             -> eps_low, eps_high, temperature, beta
  ratio_level token | sequence                     -> importance_sampling_level
  two_sided (ppo only), delta                      -> delta (None when off; ops/grpo_loss.py:646)
  kl (k3, own gradient, unclamped)                 -> beta, ref_logp
  kl_times_ratio                                   -> use_bias_correction_kl
  is_weights [B, T] | [B, 1]                       -> vllm_is_ratio
  sapo_tau_pos / sapo_tau_neg                      -> sapo_temperature_pos / _neg
  policy_loss x aggregation                        -> loss_type (as examples/liger/adapter.py):
      ppo   token_mean                                 bnpo
      ppo   seq_mean_token_mean (or ..._over_constant, N = B)   grpo
      ppo   sum_over_constant, N = valid count         dapo (Liger counts the mask)
      ppo   sum_over_constant, N = B * T               dr_grpo, max_completion_length = T
      ppo   sum_over_constant, other N >= 1            dapo, num_items_in_batch = N
      ppo   sum_over_constant, 0 < N < 1               dr_grpo, max_completion_length = N / B
      cispo token_mean | sum_over_constant             cispo (dapo's normaliser), eps_high = 1 + eps_high:
                                                       the kernel's raw cap (:185); needs eps_low = inf
      sapo  seq_mean_token_mean (or ..._over_constant, N = B)   sapo
Refused (NotImplementedError naming it): logp temperature mode; a logit scale or softcap;
sequence_token ratios; a finite log-ratio clamp; KL estimators other than unclamped k3 with its
own gradient; an entropy bonus with entropy_coef != 0 (the kernel computes no entropy); CISPO with
a finite eps_low; CISPO or SAPO at sequence level (Liger raises ValueError, :649); any other
aggregation.

Glue: none for masked positions. The kernels skip a masked token before loading its id, old_logp,
ref_logp or rollout weight (:134-138, :260-264, :459-466), so -100 ids and +-1e9 garbage there
are Liger's to handle, and are checked. An unmasked id outside [0, V) is a ValueError here: the
kernel would read the logits out of bounds (`tl.load(LOGITS + idx)`, :159).

One fix to Triton's interpreter, not to Liger (examples/trl/FINDINGS.md, H1): Triton 3.8.0's
interpreter truncates f32 -> bf16, where compiled Triton rounds to nearest even. The backward's
`tl.store(DLOGITS + cols, dlogits)` (:552, :422) into bf16 logits is that cast, so the adapter
makes it round to nearest even, as examples/trl/adapter.py does.
"""

import math
import os

import torch

if not torch.cuda.is_available():
    # Must precede the decoration of Liger's kernels: @triton.jit reads it when the kernel is defined.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import liger_kernel  # noqa: E402,F401
from liger_kernel.ops import grpo_loss as liger_ops_grpo  # noqa: E402
from liger_kernel.transformers.grpo_loss import _reduce_grpo_loss, triton_grpo_loss  # noqa: E402

LIBRARY = "Liger-Kernel 0.8.5 triton_grpo_loss"

# Liger's default (transformers/grpo_loss.py:20). Set GRPO_VERIFY_LIGER_INPLACE=0 to check inplace=False.
INPLACE = os.environ.get("GRPO_VERIFY_LIGER_INPLACE", "1") != "0"


def _interpreted():
    return type(liger_ops_grpo._grpo_loss_fwd_kernel).__name__ == "InterpretedFunction"


if not torch.cuda.is_available() and not _interpreted():
    raise ImportError(
        "Liger's triton_grpo_loss is a Triton kernel and there is no GPU: it needs Triton's interpreter, "
        "but its kernels were defined before this adapter set TRITON_INTERPRET=1. Start the worker with "
        "TRITON_INTERPRET=1 in its environment."
    )


def _round_bf16_to_nearest_in_interpreter():
    """float32 -> bfloat16 in Triton's interpreter rounded to nearest even, as compiled Triton does.

    The same patch as examples/trl/adapter.py (and with the same marker, so the two cooperate in
    one worker): InterpreterBuilder.cast_impl drops the low 16 bits; compiled Triton lowers the
    cast to LLVM fptrunc (nearest even).
    """
    import ml_dtypes
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    truncating = interpreter.InterpreterBuilder.cast_impl
    if getattr(truncating, "rounds_bf16_to_nearest", False):
        return

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            data = np.asarray(src.data, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)
            return interpreter.TensorHandle(data, dst_type.scalar)
        return truncating(self, src, dst_type)

    cast_impl.rounds_bf16_to_nearest = True
    interpreter.InterpreterBuilder.cast_impl = cast_impl


if _interpreted():
    _round_bf16_to_nearest_in_interpreter()


def _refuse(what):
    raise NotImplementedError(f"{LIBRARY}: {what}")


def _check_supported(config, hparams):
    """NotImplementedError for every SPEC v2 switch / value the Triton GRPO loss cannot compute."""
    if config["temperature_mode"] != "logits":
        _refuse("temperature_mode='logp': the kernel divides the logits by the temperature (ops/grpo_loss.py:151)")
    if config.get("logit_transform", False) and (
        hparams["logit_scale"] != 1.0 or not math.isinf(hparams["logit_softcap"])
    ):
        _refuse("logit_transform (logit_scale / logit_softcap): the kernel has no logit transform")
    level = config.get("ratio_level", "token")
    if level not in ("token", "sequence"):
        _refuse(f"ratio_level={level!r}: importance_sampling_level is 'token' or 'sequence' (ops/grpo_loss.py:633)")
    if hparams.get("log_ratio_min", -math.inf) != -math.inf or hparams.get("log_ratio_max", math.inf) != math.inf:
        _refuse("a finite log_ratio_min / log_ratio_max: the kernel never clamps the log-ratio (ops/grpo_loss.py:166)")
    policy = config.get("policy_loss", "ppo")
    if policy == "cispo" and hparams["eps_low"] != math.inf:
        _refuse("policy_loss='cispo' with a finite eps_low: the kernel's CISPO caps the ratio above only "
                "(ops/grpo_loss.py:185)")
    if policy in ("cispo", "sapo") and level == "sequence":
        _refuse(f"policy_loss={policy!r} at ratio_level='sequence': Liger raises ValueError (ops/grpo_loss.py:649)")
    if config["kl"]:
        if config.get("kl_estimator", "k3") != "k3":
            _refuse(f"kl_estimator={config['kl_estimator']!r}: the kernel's KL is k3 (ops/grpo_loss.py:218)")
        if config.get("kl_gradient", "own") != "own":
            _refuse("kl_gradient='k2' (straight-through): the kernel differentiates its k3 (ops/grpo_loss.py:543)")
        if hparams.get("kl_log_ratio_clamp", math.inf) != math.inf or hparams.get("kl_max", math.inf) != math.inf:
            _refuse("a finite kl_log_ratio_clamp / kl_max: the kernel's k3 is unclamped")
    if config["entropy_bonus"] and hparams["entropy_coef"] != 0.0:
        _refuse("entropy_bonus: the Triton GRPO loss computes no entropy")


def _loss_type(config, hparams, mask):
    """(loss_type, max_completion_length, num_items_in_batch) giving SPEC's aggregation."""
    policy = config.get("policy_loss", "ppo")
    aggregation = config["aggregation"]
    batch, time = mask.shape
    normalizer = hparams["normalizer"]
    valid = float(mask.sum())
    if aggregation == "seq_mean_token_mean_over_constant":
        if normalizer != batch:
            _refuse(f"aggregation={aggregation!r} with normalizer {normalizer} != B = {batch}: Liger's per-row "
                    "mean (grpo, sapo) divides by the batch size (ops/grpo_loss.py:588)")
        aggregation = "seq_mean_token_mean"
    if policy == "sapo":
        if aggregation != "seq_mean_token_mean":
            _refuse(f"policy_loss='sapo' with aggregation={aggregation!r}: Liger's sapo averages like grpo "
                    "(ops/grpo_loss.py:587)")
        return "sapo", None, None
    if aggregation == "seq_mean_token_mean":
        if policy == "cispo":
            _refuse("policy_loss='cispo' with seq_mean_token_mean: Liger's cispo divides by a token count")
        return "grpo", None, None
    if aggregation == "token_mean":
        return ("bnpo" if policy == "ppo" else "cispo"), None, None
    if aggregation == "sum_over_constant":
        loss_type = "dapo" if policy == "ppo" else "cispo"
        if normalizer == valid and valid >= 1.0:
            return loss_type, None, None
        if policy == "ppo" and normalizer == batch * time:
            return "dr_grpo", time, None
        if normalizer >= 1.0:
            return loss_type, None, normalizer
        if policy == "ppo":
            return "dr_grpo", normalizer / batch, None
        _refuse(f"cispo with normalizer {normalizer} < 1: Liger clamps num_items_in_batch to >= 1 "
                "(ops/grpo_loss.py:575)")
    _refuse(f"aggregation={aggregation!r}")


def _liger_call(logits, tokens, mask, advantages, old_logp, ref_logp, hparams, config, is_weights, reduce):
    _check_supported(config, hparams)
    loss_type, max_completion_length, num_items_in_batch = _loss_type(config, hparams, mask)
    batch, time, vocab = logits.shape
    valid = mask > 0
    outside = valid & ((tokens < 0) | (tokens >= vocab))
    if bool(outside.any()):
        b, t = (int(i) for i in outside.nonzero()[0])
        raise ValueError(f"tokens[{b}, {t}] = {int(tokens[b, t])} is outside the vocabulary [0, {vocab}) "
                         "at an unmasked position")
    # Liger's (B, T + 1, V): one more row, which Liger drops. A copy: the in-place backward writes here.
    padded = torch.cat([logits, logits.new_zeros(batch, 1, vocab)], dim=1)
    ids = tokens.contiguous()
    completion_mask = mask.contiguous()
    temperature = hparams["temperature"]
    policy = config.get("policy_loss", "ppo")
    use_ref = bool(config["kl"])
    logp = liger_ops_grpo.fused_selective_log_softmax(padded.detach(), ids, temperature, completion_mask)
    result = triton_grpo_loss(
        padded,
        None if old_logp is None else old_logp.contiguous(),
        ref_logp.contiguous() if use_ref else None,
        ids,
        advantages.contiguous(),
        completion_mask,
        temperature=temperature,
        beta=hparams["beta"] if use_ref else 0.0,
        eps_low=hparams["eps_low"],
        eps_high=(1.0 + hparams["eps_high"]) if policy == "cispo" else hparams["eps_high"],
        inplace=INPLACE,
        loss_type=loss_type,
        max_completion_length=max_completion_length,
        importance_sampling_level=config.get("ratio_level", "token"),
        reduce=reduce,
        sapo_temperature_pos=hparams.get("sapo_tau_pos", 1.0),
        sapo_temperature_neg=hparams.get("sapo_tau_neg", 1.05),
        vllm_is_ratio=is_weights.contiguous() if config.get("rollout_correction", False) else None,
        # SPEC: delta belongs to ppo alone (Liger raises ValueError for cispo / sapo with a delta, :642).
        delta=hparams["delta"] if (config["two_sided"] and policy == "ppo") else None,
        use_bias_correction_kl=bool(config.get("kl_times_ratio", False)),
        num_items_in_batch=num_items_in_batch,
    )
    return result, loss_type, max_completion_length, num_items_in_batch, logp


def grpo_loss(*, logits, tokens, mask, advantages, old_logp, ref_logp, hparams, config, is_weights=None):
    """SPEC v2 through triton_grpo_loss(reduce=False) and Liger's _reduce_grpo_loss: (loss, aux)."""
    (per_token_loss, _kl, _clipped), loss_type, max_len, num_items, logp = _liger_call(
        logits, tokens, mask, advantages, old_logp, ref_logp, hparams, config, is_weights, reduce=False
    )
    loss = _reduce_grpo_loss(per_token_loss, mask, loss_type, max_len, num_items_in_batch=num_items)
    return loss, {"logp": logp, "per_token_loss": per_token_loss}


def grpo_loss_reduced(*, logits, tokens, mask, advantages, old_logp, ref_logp, hparams, config, is_weights=None):
    """SPEC v2 through triton_grpo_loss(reduce=True): the kernel's own reduction and backward scaling."""
    (loss, _metrics), _loss_type_, _max_len, _num_items, logp = _liger_call(
        logits, tokens, mask, advantages, old_logp, ref_logp, hparams, config, is_weights, reduce=True
    )
    return loss, {"logp": logp}


for _f in (grpo_loss, grpo_loss_reduced):
    _f.framework = "torch"
    _f.spec_version = 2
    # The kernel takes temperature, beta, eps and delta as tl.constexpr (ops/grpo_loss.py:118-126).
    _f.static_hparams = True
    # Declared precision conventions (docs/conventions.md): none. Lines are of the installed
    # liger-kernel 0.8.5 (.venv/lib/python3.11/site-packages/liger_kernel/ops/grpo_loss.py). On bf16
    # logits every kernel loads them with `.to(tl.float32)` before `/ TEMPERATURE` (:151, :159, :549)
    # and does the log-sum-exp, ratio, KL and d logp in f32; the only bf16 rounding is the store of
    # d logits into the bf16 logits' storage (:552, :932 `logits.data` or `torch.empty_like(logits)`),
    # which is the returned gradient's own output rounding (the cat's backward only slices it). No
    # tl.dot, so no TF32.
    _f.precision_conventions = ()
