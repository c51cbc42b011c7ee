"""Liger-Kernel 0.8.5's fused-linear GRPO loss behind docs/spec.md's torch adapter contract (fused kind).

Check it (torch worker; the absolute path of this file):

    grpo-verify check --impl /abs/path/examples/liger/adapter.py:grpo_loss --objective trl:dapo

What runs is Liger's own `LigerFusedLinearGRPOLoss` (liger_kernel/chunked_loss/grpo_loss.py,
on `LigerFusedLinearPPOBase` in fused_linear_ppo.py) with `compiled=False`: the per-token
log-probs come from Liger's vocabulary-chunked `_ChunkedSelectiveLogProbFunction`, the loss
from `LigerFusedLinearGRPOFunction.ppo_loss_fn`, forward and backward fused per batch chunk.
On CPU no Triton kernel is reached: the chunked loss is plain torch (no `liger_kernel.ops`
module is imported), and with `compiled=False` nothing goes through torch.compile / Inductor.

`grpo_loss_compiled` is the same call with `compiled=True` (Liger's default): the loss math on
the log-probs (`_compute_loss_from_logps`) goes through torch.compile, on CPU Inductor's C++
backend (FINDINGS.md, "compiled=True"). Liger's pure-Triton loss is `triton_adapter.py`.

The mapping (docs/spec.md v2 -> Liger):
  hidden [B, T, H]              -> `_input` [B, T, H] (Liger's `chunk_forward` unpacks three
                                   dimensions; its docstring's (B*T, H) is wrong)
  lm_head [H, V]                -> `lin_weight` = lm_head.T [V, H] (a view: autograd takes
                                   Liger's d weight back through the transpose)
  tokens, mask, advantages [B]  -> `selected_token_ids`, `attention_mask`, `advantages`
  old_logp / ref_logp           -> `old_per_token_logps` / `ref_per_token_logps` (None when absent)
  is_weights [B, T] | [B, 1]    -> `vllm_is_ratio` (applied to the policy term before the KL, as SPEC)
  eps_low, eps_high, temperature, beta, delta (two_sided), sapo_tau_pos/neg
                                -> epsilon_low, epsilon_high, temperature, beta, delta,
                                   sapo_temperature_pos/neg (Python floats: static_hparams)
  ratio_level token | sequence  -> importance_sampling_level "token" | "sequence" (GSPO)
  kl_times_ratio                -> use_bias_correction_kl
  policy_loss x aggregation     -> loss_type:
      ppo   token_mean                  bnpo   (sum / max(count, 1))
      ppo   seq_mean_token_mean         grpo   (mean over rows of the row's token mean)
      ppo   sum_over_constant, N = valid count          dapo  (Liger counts the mask itself)
      ppo   sum_over_constant, N = B * T                dr_grpo, max_completion_length = T
      ppo   sum_over_constant, any other N >= 1         dapo, num_items_in_batch = N
      ppo   seq_mean_token_mean_over_constant, N = B    grpo
      cispo token_mean | sum_over_constant as dapo      cispo (epsilon_high = 1 + eps_high: TRL's
                                                        absolute cap; needs eps_low = inf)
      sapo  seq_mean_token_mean (or ..._over_constant with N = B)   sapo (Liger and TRL 1.15 both
                                                        average sapo like grpo)
Refused (NotImplementedError naming it): logp temperature mode; a logit scale or softcap
(Liger has neither); sequence_token ratios; a finite log-ratio clamp; KL estimators other
than k3, kl_gradient k2, a finite kl_log_ratio_clamp or kl_max (Liger's k3 is unclamped);
an entropy bonus with entropy_coef != 0 (Liger computes no entropy); CISPO with a finite
eps_low (Liger's CISPO has no lower bound); CISPO / SAPO at sequence level (Liger raises);
an aggregation with no loss_type above.

Glue (what Liger does not do and the contract asks for): masked positions get token id 0 and
old / ref log-probs equal to the token's own log-prob (Liger's selective log-prob, taken once
more under no_grad), so the ratio is 1 and the KL 0 there and nothing overflows (Liger's
k3 of a garbage ref = +1e9 is inf, and inf * mask 0 is NaN); masked rollout weights become 0;
an unmasked id outside [0, V) is a ValueError (Liger would silently give it logp = -logsumexp).
aux "logp" is that no_grad log-prob (Liger computes neither per-token losses nor entropies:
its metrics are the mean KL and the clip fraction).
"""

import functools
import math
import os
import pathlib

import torch
from grpo_verify_worker.loader import import_file
from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss
from liger_kernel.chunked_loss.fused_linear_ppo import LigerFusedLinearPPOBase

LIBRARY = "Liger-Kernel 0.8.5 LigerFusedLinearGRPOLoss"

# The refusal and the SPEC -> loss_type mapping every library adapter shares (imported by path: the
# worker loads this file by path, so examples/ is not on sys.path).
spec_mapping = import_file(pathlib.Path(__file__).parents[1] / "spec_mapping.py")


def _check_supported(config, hparams, library=LIBRARY):
    """NotImplementedError for every SPEC v2 switch / value Liger cannot compute.

    Liger's Triton kernel (triton_adapter.py, with its own `library`) takes the same switches: its
    refusals are these (their lines in ops/grpo_loss.py are in that module's docstring). The worker
    sends every v2 key of config and hparams (docs/worker-protocol.md, "run"): none has a default here.
    """
    refuse = functools.partial(spec_mapping.refuse, library)
    if config["temperature_mode"] != "logits":
        refuse(
            "temperature_mode='logp': Liger divides the logits by the temperature (logits mode)",
            switch="temperature_mode", value=config["temperature_mode"],
        )
    if config["logit_transform"] and (
        hparams["logit_scale"] != 1.0 or not math.isinf(hparams["logit_softcap"])
    ):
        refuse(
            "logit_transform (logit_scale / logit_softcap): Liger has no logit transform",
            switch="logit_transform", value=True,
        )
    level = config["ratio_level"]
    if level not in ("token", "sequence"):
        refuse(
            f"ratio_level={level!r}: Liger's importance_sampling_level is 'token' or 'sequence'",
            switch="ratio_level", value=level,
        )
    if hparams["log_ratio_min"] != -math.inf or hparams["log_ratio_max"] != math.inf:
        refuse("a finite log_ratio_min / log_ratio_max: Liger does not clamp the log-ratio", switch=None)
    policy = config["policy_loss"]
    if policy == "cispo" and hparams["eps_low"] != math.inf:
        refuse("policy_loss='cispo' with a finite eps_low: Liger's CISPO caps the ratio at "
                "epsilon_high only (TRL's absolute cap), with no lower bound", switch="policy_loss", value="cispo")
    if policy in ("cispo", "sapo") and level == "sequence":
        refuse(
            f"policy_loss={policy!r} at ratio_level='sequence': Liger raises ValueError",
            switch="ratio_level", value=level,
        )
    if config["kl"]:
        if config["kl_estimator"] != "k3":
            refuse(
                f"kl_estimator={config['kl_estimator']!r}: Liger's KL is k3",
                switch="kl_estimator", value=config["kl_estimator"],
            )
        if config["kl_gradient"] != "own":
            refuse("kl_gradient='k2' (straight-through): Liger differentiates its k3", switch="kl_gradient", value="k2")
        if hparams["kl_log_ratio_clamp"] != math.inf or hparams["kl_max"] != math.inf:
            refuse("a finite kl_log_ratio_clamp / kl_max: Liger's k3 is unclamped", switch="kl", value=True)
    if config["entropy_bonus"] and hparams["entropy_coef"] != 0.0:
        refuse("entropy_bonus: Liger's GRPO loss computes no entropy", switch="entropy_bonus", value=True)


def _loss_type(config, hparams, mask, library=LIBRARY):
    """(loss_type, max_completion_length, num_items_in_batch) giving SPEC's aggregation (the Triton kernel's too).

    Liger counts the mask itself when num_items_in_batch is None (bnpo and cispo divide by
    max(sum(mask), 1)), so the valid count is left to it.
    """
    loss_type = spec_mapping.trl_loss_type(library, config, hparams, mask, own_count=True)
    return loss_type.name, loss_type.max_completion_length, loss_type.num_items_in_batch


def _check_tokens(tokens, mask, vocab):
    """ValueError for an unmasked id outside [0, V) (Liger would read a wrong or out-of-bounds logit); the valid mask."""
    valid = mask > 0
    outside = valid & ((tokens < 0) | (tokens >= vocab))
    if bool(outside.any()):
        b, t = (int(i) for i in outside.nonzero()[0])
        raise ValueError(f"tokens[{b}, {t}] = {int(tokens[b, t])} is outside the vocabulary [0, {vocab}) "
                         "at an unmasked position")
    return valid


def _liger_grpo_loss(hidden, lm_head, tokens, mask, advantages, old_logp, ref_logp, hparams, config,
                     is_weights, compiled):
    """docs/spec.md v2 GRPO loss through Liger's LigerFusedLinearGRPOLoss: (loss, {"logp"})."""
    _check_supported(config, hparams)
    loss_type, max_completion_length, num_items_in_batch = _loss_type(config, hparams, mask)
    valid = _check_tokens(tokens, mask, lm_head.shape[1])
    safe_tokens = torch.where(valid, tokens, 0)
    weight = lm_head.t()  # Liger's [V, H]
    temperature = hparams["temperature"]

    # The token's own log-prob from Liger's selective log-prob, to neutralise masked positions.
    with torch.no_grad():
        own_logp = LigerFusedLinearPPOBase.chunk_forward(
            hidden.detach(), weight.detach(), safe_tokens, temperature=temperature
        )
    if old_logp is not None:
        old_logp = torch.where(valid, old_logp, own_logp)
    use_ref = bool(config["kl"])
    ref = torch.where(valid, ref_logp, own_logp) if use_ref else None
    weights = None
    if config["rollout_correction"]:
        weights = is_weights if is_weights.shape[1] == 1 else torch.where(valid, is_weights, 0.0)

    level = config["ratio_level"]
    loss_fn = LigerFusedLinearGRPOLoss(
        beta=hparams["beta"] if use_ref else 0.0,
        compiled=compiled,
        use_ref_model=use_ref,
        epsilon_low=hparams["eps_low"],
        epsilon_high=(1.0 + hparams["eps_high"]) if config["policy_loss"] == "cispo" else hparams["eps_high"],
        loss_type=loss_type,
        max_completion_length=max_completion_length,
        importance_sampling_level=level,
        sapo_temperature_pos=hparams["sapo_tau_pos"],
        sapo_temperature_neg=hparams["sapo_tau_neg"],
        temperature=temperature,
        delta=hparams["delta"] if config["two_sided"] else None,
        use_bias_correction_kl=config["kl_times_ratio"],
    )
    loss, _metrics = loss_fn(
        hidden,
        weight,
        safe_tokens,
        mask,
        advantages,
        ref_per_token_logps=ref,
        old_per_token_logps=old_logp,
        vllm_is_ratio=weights,
        num_items_in_batch=num_items_in_batch,
    )
    return loss, {"logp": own_logp}


def grpo_loss(*, hidden, lm_head, tokens, mask, advantages, old_logp, ref_logp, hparams, config,
              is_weights=None):
    """docs/spec.md v2 GRPO loss through LigerFusedLinearGRPOLoss(compiled=False): (loss, {"logp"})."""
    return _liger_grpo_loss(hidden, lm_head, tokens, mask, advantages, old_logp, ref_logp, hparams, config,
                            is_weights, compiled=False)


def _dynamo_never_falls_back():
    """With GRPO_VERIFY_LIGER_DYNAMO_NEVER_FALL_BACK=1: recompile for every new case instead of going eager.

    Liger compiles `_compute_loss_from_logps` with its hyperparameters bound by functools.partial
    (fused_linear_ppo.py:261-281): Dynamo recompiles for new values and shapes, and after
    `recompile_limit` (8) recompiles it runs the function eagerly from then on, with a warning. By
    default the adapter leaves that as torch sets it (what Liger's users get); this raises the limit
    and makes hitting it an error. Torch 2.14.1's Dynamo then raises "sources must not be empty for
    symbol sN" on some later recompiles (FINDINGS.md, "compiled=True").
    """
    import torch._dynamo

    torch._dynamo.config.recompile_limit = 1 << 20
    torch._dynamo.config.accumulated_recompile_limit = 1 << 20
    torch._dynamo.config.fail_on_recompile_limit_hit = True


def grpo_loss_compiled(*, hidden, lm_head, tokens, mask, advantages, old_logp, ref_logp, hparams, config,
                       is_weights=None):
    """The same with compiled=True (Liger's default, grpo_loss.py:424): the loss math through torch.compile.

    On CPU torch.compile's Inductor emits C++ (g++ here) for `_compute_loss_from_logps`
    (fused_linear_ppo.py:281, :320); the chunked log-probs (`chunk_forward`) stay eager (:300-318).
    """
    if os.environ.get("GRPO_VERIFY_LIGER_DYNAMO_NEVER_FALL_BACK") == "1":  # default: torch's own limits
        _dynamo_never_falls_back()
    return _liger_grpo_loss(hidden, lm_head, tokens, mask, advantages, old_logp, ref_logp, hparams, config,
                            is_weights, compiled=True)


for _f in (grpo_loss, grpo_loss_compiled):
    _f.framework = "torch"
    _f.spec_version = 2
    _f.static_hparams = True
# Declared precision conventions (docs/conventions.md): the bf16 roundings Liger's own code does on
# bf16 inputs. Lines are of the installed liger-kernel 0.8.5
# (.venv/lib/python3.11/site-packages/liger_kernel/chunked_loss/). What fits none of the list stays a
# finding (FINDINGS.md, class 2): the cotangent applied in bf16 to the already-bf16 d hidden and
# d W (fused_linear_ppo.py:576-581).
_LIGER_CONVENTIONS = (
    # fused_linear_ppo.py:49 (forward) and :114 (backward's recompute)
    # `(hidden_chunk @ weight_chunk.to(hidden.dtype).t()).float()`: a bf16 GEMM output, rounded to
    # bf16, then upcast; the temperature (:52, :117 `mul_(inv_t)`), log-sum-exp and d logits are f32.
    "bf16_logits",
    # :171 `grad_weight.to(weight.dtype)`: each batch chunk's f32 d W cast to bf16, then summed into
    # `torch.zeros_like(weight)` (:255, bf16) by `grad_weight.add_` (:360). The chunks are along the
    # batch (:381-382, `torch.chunk(_input, max(1, B // chunk_size), dim=0)`), chunk_size=1 by default
    # (grpo_loss.py:426, passed at :527): d lm_head summed in bf16 over chunks of one sequence.
    "bf16_accumulation:d_lm_head:sequences=1",
)
grpo_loss.precision_conventions = _LIGER_CONVENTIONS
# The compiled path runs the same chunk_forward and the same bf16 casts (:49, :171, :255, :360): only
# the f32 loss math on the log-probs is compiled.
grpo_loss_compiled.precision_conventions = _LIGER_CONVENTIONS
