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

import os
import pathlib

import torch
from grpo_verify_worker import triton_interpreter
from grpo_verify_worker.loader import import_file

if not torch.cuda.is_available():
    # Must precede the decoration of Liger's kernels: @triton.jit reads it when the kernel is defined.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import liger_kernel  # noqa: E402,F401
from liger_kernel.ops import grpo_loss as liger_ops_grpo  # noqa: E402
from liger_kernel.transformers.grpo_loss import _reduce_grpo_loss, triton_grpo_loss  # noqa: E402

LIBRARY = "Liger-Kernel 0.8.5 triton_grpo_loss"

# Liger's default (transformers/grpo_loss.py:20). Set GRPO_VERIFY_LIGER_INPLACE=0 to check inplace=False.
INPLACE = os.environ.get("GRPO_VERIFY_LIGER_INPLACE", "1") != "0"


triton_interpreter.require(liger_ops_grpo._grpo_loss_fwd_kernel, "Liger's triton_grpo_loss")
if not torch.cuda.is_available():
    triton_interpreter.round_bf16_casts_to_nearest()
    triton_interpreter.bf16_arithmetic_as_floats()  # bf16 + - * / on values, not on their uint16 storage


# Liger's chunked loss (adapter.py) and its Triton kernel take the same switches and loss types: the
# refusals and the loss_type mapping are adapter.py's, under this adapter's name. The module the worker
# loads for `adapter.py:...`, the same object.
liger_adapter = import_file(pathlib.Path(__file__).with_name("adapter.py"))


def _liger_call(logits, tokens, mask, advantages, old_logp, ref_logp, hparams, config, is_weights, reduce):
    liger_adapter._check_supported(config, hparams, LIBRARY)
    loss_type, max_completion_length, num_items_in_batch = liger_adapter._loss_type(config, hparams, mask, LIBRARY)
    batch, _, vocab = logits.shape
    liger_adapter._check_tokens(tokens, mask, vocab)
    # Liger's (B, T + 1, V): one more row, which Liger drops. A copy: the in-place backward writes here.
    padded = torch.cat([logits, logits.new_zeros(batch, 1, vocab)], dim=1)
    ids = tokens.contiguous()
    completion_mask = mask.contiguous()
    temperature = hparams["temperature"]
    policy = config["policy_loss"]
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
        importance_sampling_level=config["ratio_level"],
        reduce=reduce,
        sapo_temperature_pos=hparams["sapo_tau_pos"],
        sapo_temperature_neg=hparams["sapo_tau_neg"],
        vllm_is_ratio=is_weights.contiguous() if config["rollout_correction"] else None,
        # SPEC: delta belongs to ppo alone (Liger raises ValueError for cispo / sapo with a delta, :642).
        delta=hparams["delta"] if (config["two_sided"] and policy == "ppo") else None,
        use_bias_correction_kl=config["kl_times_ratio"],
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
