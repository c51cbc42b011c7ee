"""Unsloth (unsloth-zoo 2026.10.9) GRPO loss behind docs/spec.md's torch adapter contract.

Check it (torch worker; the absolute path of this file):

    grpo-verify check --impl /abs/path/examples/unsloth/adapter.py:grpo_loss --objective trl:dapo
    grpo-verify check --impl /abs/path/examples/unsloth/adapter.py:grpo_loss_logits --objective trl:dapo

unsloth_zoo is AGPL-3.0 (its rl_replacements.py says so): this file only calls it. What runs
is what `grpo_accumulated_loss` (unsloth_zoo/rl_replacements.py) runs after the model's
forward, minus the trainer:
  - per-token log-probs, fused kind (`grpo_loss`): `grpo_chunked_hidden_states_logprobs`
    (-> fused_losses/fused_linear.py `fused_linear_logprobs`, its default path), or, with an
    entropy bonus, `chunked_hidden_states_selective_log_softmax_recompute(return_entropy=True)`
    (the same kernel, with entropies), both on hidden [B, T, H] and lm_head.T [V, H], applying
    Unsloth's logit_scale_multiply and logit_softcapping, then the temperature;
    logits kind (`grpo_loss_logits`): `chunked_selective_log_softmax(logits, ids, temperature)`,
    Unsloth's path for a model whose forward returns logits;
  - the loss: `UnslothEfficientGRPO.apply` (-> `grpo_compute_loss`, the policy term, KL and
    aggregation) and, for an entropy bonus, `grpo_entropy_bonus_weights` +
    `UnslothGRPOEntropyBonus.apply` (TRL >= 1.10's bonus: a token mean of the entropy).

Running on CPU. Set before unsloth_zoo is first imported (this module sets them with
`os.environ.setdefault`, so a caller's values win):
  UNSLOTH_IS_PRESENT=1        unsloth_zoo refuses to import without it ("Please install Unsloth");
                              `import unsloth` sets it; this adapter does not import unsloth
  UNSLOTH_COMPILE_DISABLE=1   run Unsloth's torch.compile'd regions eagerly (same code, no
                              Inductor C++ build per shape on CPU)
  UNSLOTH_FORCE_CPU=1         device type "cpu" even where a GPU is visible
  UNSLOTH_COMPILE_LOCATION    a temporary directory: importing unsloth_zoo otherwise creates
                              ./unsloth_compiled_cache in the current directory
On CPU fused_linear's torch path runs (no Triton kernel: `_use_triton` needs a CUDA device).

The mapping (docs/spec.md v2 -> grpo_compute_loss keywords):
  eps_low, eps_high, delta (two_sided), temperature, beta, sapo_tau_pos/neg
                                -> epsilon_low, epsilon_high, delta, temperature, beta,
                                   sapo_temperature_pos/neg (Python floats: static_hparams)
  ratio_level token | sequence  -> importance_sampling_level (GSPO; also for cispo / sapo)
  kl_times_ratio                -> use_bias_correction_kl
  logit_scale, logit_softcap    -> logit_scale_multiply, logit_softcapping (fused kind)
  is_weights [B, T] | [B, 1]    -> use_vllm + vllm_importance_sampling_correction, mode
                                   "token_mask" with no bounds, sampling_per_token_logps =
                                   old_logp - log(w): Unsloth forms the weight exp(old - sampling)
                                   itself (no precomputed weights); [B, 1] is broadcast to [B, T]
  policy_loss x aggregation     -> loss_type:
      ppo   token_mean            bnpo
      ppo | sapo  seq_mean_token_mean (or ..._over_constant with N = B)   grpo | sapo
      ppo   sum_over_constant, N = B * T    dr_grpo, max_completion_length = T
      ppo   sum_over_constant, other N      dapo, num_items_in_batch = N (Unsloth floors it at 1)
      cispo token_mean | sum_over_constant  cispo, num_items_in_batch = valid count | N
                                            (epsilon_high = 1 + eps_high: TRL's absolute cap,
                                            needs eps_low = inf)
  entropy_bonus (entropy_aggregation token_mean) -> grpo_entropy_bonus_weights(trl_version 1.15.0)
Unsloth's KL is k3 with d = ref - logp clamped to [-20, 20] and the KL (times r when
use_bias_correction_kl) clamped to [-10, 10]: SPEC's kl_log_ratio_clamp = 20, kl_max = 10
(verl's low_var_kl), the clamp after the ratio. TRL's k3 is unclamped.

Refused (NotImplementedError naming it): logp temperature mode; sequence_token ratios; a
finite log-ratio clamp; KL other than k3 with kl_log_ratio_clamp 20 and kl_max 10 and the
estimator's own gradient; kl_times_ratio with KL (Unsloth clamps kl * r, SPEC clamps kl before
the product); the entropy bonus as part of loss_t (entropy_aggregation "same"); CISPO with a
finite eps_low; SAPO / CISPO aggregations Unsloth has no loss_type for; rollout correction
on-policy (Unsloth's weight needs old_logp); logits kind: a logit transform or an entropy bonus
(Unsloth's raw-logits path leaves both to the model's forward / inline code).

Glue: masked token ids become 0; an unmasked id outside [0, V) is a ValueError (Unsloth's
fused kernel returns logp 0 for it); masked rollout log-weights become 0. Masked old / ref
log-probs are passed as they are: grpo_compute_loss zeroes new / old / ref there itself.
aux: "logp" (and "entropy" when the bonus computed it), Unsloth's own per-token values.

`UnslothEfficientGRPO` and `UnslothGRPOEntropyBonus` ignore their backward's grad_output
unless `upstream_scale` is given (the trainer's DeepSpeed path), on purpose: the mixed
precision scale is multiplied into the forward instead (UnslothGRPOEntropyBonus's docstring);
`grpo_compute_loss` itself is linear in its cotangent. `grpo_loss` passes upstream_scale = 1.0
so the gradient is the cotangent times d loss. `grpo_loss_trainer_scale`
calls them as the trainer does without DeepSpeed (upstream_scale None), and
`grpo_loss_trl_kl` maps TRL's unclamped k3 (and kl_times_ratio) onto Unsloth's clamped one:
both exist to show those two differences (FINDINGS.md).
"""

import functools
import math
import os
import pathlib
import tempfile

os.environ.setdefault("UNSLOTH_IS_PRESENT", "1")
os.environ.setdefault("UNSLOTH_COMPILE_DISABLE", "1")
os.environ.setdefault("UNSLOTH_FORCE_CPU", "1")
os.environ.setdefault("UNSLOTH_COMPILE_LOCATION", os.path.join(tempfile.gettempdir(), "unsloth_compiled_cache"))

import torch  # noqa: E402
from grpo_verify_worker.loader import import_file  # noqa: E402
from unsloth_zoo import rl_replacements  # noqa: E402

LIBRARY = "Unsloth (unsloth-zoo 2026.10.9) grpo_compute_loss"
TRL_VERSION = "1.15.0"  # the TRL whose entropy bonus grpo_entropy_bonus_weights reproduces
KL_LOG_RATIO_CLAMP = 20.0  # grpo_compute_loss: torch.clamp(ref - new, min=-20, max=20)
KL_MAX = 10.0  # grpo_compute_loss: torch.clamp(kl_i, min=-10, max=10)

# The refusal and the SPEC -> loss_type mapping every library adapter shares (imported by path: the
# worker loads this file by path, so examples/ is not on sys.path).
spec_mapping = import_file(pathlib.Path(__file__).parents[1] / "spec_mapping.py")
_refuse = functools.partial(spec_mapping.refuse, LIBRARY)


def _check_supported(kind, config, hparams, trl_kl):
    """NotImplementedError for every SPEC v2 switch / value Unsloth cannot compute.

    The worker sends every v2 key of config and hparams (docs/worker-protocol.md, "run"): none has a
    default here.
    """
    if config["temperature_mode"] != "logits":
        _refuse(
            "temperature_mode='logp': Unsloth divides the (scaled, softcapped) logits by the temperature",
            switch="temperature_mode", value=config["temperature_mode"],
        )
    transform = config["logit_transform"] and (
        hparams["logit_scale"] != 1.0 or not math.isinf(hparams["logit_softcap"])
    )
    if transform and kind == "logits":
        _refuse(
            "logit_transform on logits: Unsloth's raw-logits path leaves scale and softcap to the model's forward",
            switch="logit_transform", value=True,
        )
    if transform and hparams["logit_softcap"] <= 0.0:
        _refuse("logit_softcap <= 0", switch="logit_transform", value=True)
    level = config["ratio_level"]
    if level not in ("token", "sequence"):
        _refuse(
            f"ratio_level={level!r}: Unsloth's importance_sampling_level is 'token' or 'sequence'",
            switch="ratio_level", value=level,
        )
    if hparams["log_ratio_min"] != -math.inf or hparams["log_ratio_max"] != math.inf:
        _refuse("a finite log_ratio_min / log_ratio_max: Unsloth clamps the log-ratio only for rollout "
                "log-probs used as old ones (rollout_logps_as_old)", switch=None)
    policy = config["policy_loss"]
    if policy == "cispo" and hparams["eps_low"] != math.inf:
        _refuse("policy_loss='cispo' with a finite eps_low: Unsloth's CISPO caps the ratio at "
                "epsilon_high only (TRL's absolute cap), with no lower bound", switch="policy_loss", value="cispo")
    if config["kl"] and hparams["beta"] != 0.0:
        if config["kl_estimator"] != "k3":
            _refuse(
                f"kl_estimator={config['kl_estimator']!r}: Unsloth's KL is k3",
                switch="kl_estimator", value=config["kl_estimator"],
            )
        if config["kl_gradient"] != "own":
            _refuse(
                "kl_gradient='k2' (straight-through): Unsloth differentiates its clamped k3",
                switch="kl_gradient", value="k2",
            )
        clamp = hparams["kl_log_ratio_clamp"]
        kl_max = hparams["kl_max"]
        if not trl_kl:
            if (clamp, kl_max) != (KL_LOG_RATIO_CLAMP, KL_MAX):
                _refuse(f"kl_log_ratio_clamp={clamp}, kl_max={kl_max}: Unsloth's k3 clamps d to "
                        f"+-{KL_LOG_RATIO_CLAMP:g} and the KL to +-{KL_MAX:g} (TRL does not clamp)",
                        switch="kl", value=True)
            if config["kl_times_ratio"]:
                _refuse(
                    "kl_times_ratio: Unsloth clamps kl * r to +-10, SPEC clamps the KL before the ratio",
                    switch="kl_times_ratio", value=True,
                )
        elif not (clamp in (math.inf, KL_LOG_RATIO_CLAMP) and kl_max in (math.inf, KL_MAX)):
            _refuse(
                f"kl_log_ratio_clamp={clamp}, kl_max={kl_max}: neither TRL's k3 nor Unsloth's",
                switch="kl", value=True,
            )
    if config["entropy_bonus"] and hparams["entropy_coef"] != 0.0:
        if kind == "logits":
            _refuse(
                "entropy_bonus on logits: Unsloth computes raw-logit entropies inline in grpo_accumulated_loss",
                switch="entropy_bonus", value=True,
            )
        if config["entropy_aggregation"] != "token_mean":
            _refuse("entropy_aggregation='same': Unsloth's bonus (TRL >= 1.10) is a token mean of the "
                    "entropy whatever the loss_type", switch="entropy_aggregation", value=config["entropy_aggregation"])
    if config["rollout_correction"] and config["on_policy"]:
        _refuse(
            "rollout_correction on-policy: Unsloth forms the weight from old_logp - sampling log-probs",
            switch="rollout_correction", value=True,
        )


def _loss_type(config, hparams, mask):
    """grpo_compute_loss keywords (loss_type, max_completion_length, num_items_in_batch) for SPEC's
    aggregation; cispo's token mean passes the valid count (a tensor, floored at 1 by Unsloth)."""
    loss_type = spec_mapping.trl_loss_type(LIBRARY, config, hparams, mask)
    keywords = {"max_completion_length": loss_type.max_completion_length,
                "num_items_in_batch": loss_type.num_items_in_batch}
    return {"loss_type": loss_type.name, **{k: v for k, v in keywords.items() if v is not None}}


def _sampling_logps(old_logp, is_weights, valid):
    """sampling_per_token_logps with exp(old - sampling) = w at valid positions, 0 = log 1 elsewhere."""
    weights = is_weights.expand(valid.shape)
    log_weights = torch.where(valid, torch.log(torch.where(valid, weights, 1.0)), 0.0)
    return torch.where(valid, old_logp - log_weights, old_logp.new_zeros(()))


def adapt(kind, *, upstream_scale=1.0, trl_kl=False):
    """A docs/spec.md torch grpo_loss of `kind` ("fused" | "logits") around Unsloth's GRPO loss.

    upstream_scale: passed to UnslothEfficientGRPO / UnslothGRPOEntropyBonus (1.0: the backward
    multiplies by grad_output; None: as the trainer without DeepSpeed, it ignores it).
    trl_kl: accept TRL's unclamped k3 (and kl_times_ratio) for Unsloth's clamped one.
    """

    def grpo_loss(*, tokens, mask, advantages, old_logp, ref_logp, hparams, config, is_weights=None,
                  logits=None, hidden=None, lm_head=None):
        _check_supported(kind, config, hparams, trl_kl)
        loss_kwargs = _loss_type(config, hparams, mask)
        vocab = logits.shape[-1] if kind == "logits" else lm_head.shape[1]
        valid = mask > 0
        outside = valid & ((tokens < 0) | (tokens >= vocab))
        if bool(outside.any()):
            b, t = (int(i) for i in outside.nonzero()[0])
            raise ValueError(f"tokens[{b}, {t}] = {int(tokens[b, t])} is outside the vocabulary "
                             f"[0, {vocab}) at an unmasked position")
        safe_tokens = torch.where(valid, tokens, 0)
        temperature = hparams["temperature"]
        entropy_on = config["entropy_bonus"] and hparams["entropy_coef"] != 0.0

        aux = {}
        if kind == "logits":
            logp = rl_replacements.chunked_selective_log_softmax(
                logits, safe_tokens, temperature=temperature, chunks=4 * logits.shape[0]
            )
        else:
            transform = config["logit_transform"]
            scale = hparams["logit_scale"] if transform and hparams["logit_scale"] != 1.0 else 0.0
            cap = hparams["logit_softcap"] if transform and not math.isinf(hparams["logit_softcap"]) else 0.0
            args = (hidden, lm_head.t(), safe_tokens, 4 * hidden.shape[0], scale, 0.0, cap, temperature)
            if entropy_on:
                logp, entropy = rl_replacements.chunked_hidden_states_selective_log_softmax_recompute(
                    *args, return_entropy=True, entropy_requires_grad=True
                )
                aux["entropy"] = entropy
            else:
                logp = rl_replacements.grpo_chunked_hidden_states_logprobs(*args)
        aux["logp"] = logp

        policy = config["policy_loss"]
        rollout = config["rollout_correction"]
        extra = dict(
            loss_kwargs,
            epsilon_low=hparams["eps_low"],
            epsilon_high=(1.0 + hparams["eps_high"]) if policy == "cispo" else hparams["eps_high"],
            delta=hparams["delta"] if config["two_sided"] else None,
            importance_sampling_level=config["ratio_level"],
            sapo_temperature_pos=hparams["sapo_tau_pos"],
            sapo_temperature_neg=hparams["sapo_tau_neg"],
            use_bias_correction_kl=config["kl_times_ratio"],
            current_gradient_accumulation_steps=1,
            num_processes=1,
            use_vllm=rollout,
            vllm_importance_sampling_correction=rollout,
            vllm_importance_sampling_mode="token_mask",
            vllm_importance_sampling_clip_min=None,
            vllm_importance_sampling_clip_max=None,
        )
        sampling = _sampling_logps(old_logp, is_weights, valid) if rollout else None
        beta = hparams["beta"] if config["kl"] else 0.0
        loss, *_metrics = rl_replacements.UnslothEfficientGRPO.apply(
            logp, old_logp, ref_logp if config["kl"] else None, sampling, None, safe_tokens, mask,
            advantages, beta, None, 1, extra, upstream_scale,
        )
        if entropy_on:
            weights = rl_replacements.grpo_entropy_bonus_weights(
                mask, None, hparams["entropy_coef"], extra, trl_version=TRL_VERSION
            )
            loss = loss + rl_replacements.UnslothGRPOEntropyBonus.apply(aux["entropy"], weights, 1.0, upstream_scale)
        return loss, aux

    grpo_loss.framework = "torch"
    grpo_loss.spec_version = 2
    grpo_loss.static_hparams = True
    return grpo_loss


def _with_signature(function, kind):
    """`function` under a signature the suite reads the kind from (logits, or hidden and lm_head)."""
    if kind == "logits":
        def grpo_loss(*, logits, tokens, mask, advantages, old_logp, ref_logp, hparams, config, is_weights=None):
            return function(logits=logits, tokens=tokens, mask=mask, advantages=advantages, old_logp=old_logp,
                            ref_logp=ref_logp, hparams=hparams, config=config, is_weights=is_weights)
    else:
        def grpo_loss(*, hidden, lm_head, tokens, mask, advantages, old_logp, ref_logp, hparams, config,
                      is_weights=None):
            return function(hidden=hidden, lm_head=lm_head, tokens=tokens, mask=mask, advantages=advantages,
                            old_logp=old_logp, ref_logp=ref_logp, hparams=hparams, config=config,
                            is_weights=is_weights)
    grpo_loss.framework, grpo_loss.spec_version, grpo_loss.static_hparams = "torch", 2, True
    grpo_loss.__doc__ = f"docs/spec.md v2 GRPO loss ({kind} kind) through Unsloth's grpo_compute_loss."
    return grpo_loss


grpo_loss = _with_signature(adapt("fused"), "fused")
grpo_loss_logits = _with_signature(adapt("logits"), "logits")
grpo_loss_trainer_scale = _with_signature(adapt("fused", upstream_scale=None), "fused")
grpo_loss_trl_kl = _with_signature(adapt("fused", trl_kl=True), "fused")

# Declared precision conventions (docs/conventions.md): the bf16 roundings Unsloth's own code does on
# bf16 inputs on this CPU. Lines are of the installed unsloth-zoo 2026.10.9
# (.venv/lib/python3.11/site-packages/unsloth_zoo/fused_losses/fused_linear.py). On CUDA (sm >= 80) the
# head's GEMM writes f32 (`_logits_mode`, :181-190; `_mm_fp32`), and these would be bf16_grad_logits only.
FUSED_CPU_CONVENTIONS = (
    # :181-183 `_logits_mode` is (False, False) off CUDA, so the logits buffer is bf16 (:922-927), and
    # :954 `out[:, a:b].copy_(torch.mm(h, w[a:b].t()))` (via `_project`, :1466 forward, and
    # `tile_grad`, :1592 backward) stores the bf16 GEMM's output: the logits in bf16 once, before the
    # f32 transform, temperature and log-softmax (`_torch_forward`, :849-853).
    "bf16_logits",
    # :1219 `dz_out.copy_(dz.to(dz_out.dtype))`, with `dz_out = x` the bf16 logits tile (:1593): d logits
    # (f32 from `_torch_dz`) rounded to bf16 once before the f32-accumulated GEMMs for d hidden, d W.
    "bf16_grad_logits",
)
for _function in (grpo_loss, grpo_loss_trainer_scale, grpo_loss_trl_kl):
    _function.precision_conventions = FUSED_CPU_CONVENTIONS
# grpo_loss_logits declares none: `chunked_selective_log_softmax` (rl_replacements.py:160-168) upcasts
# each chunk of logits to f32 and does everything in f32; its only bf16 rounding is d logits' output
# rounding (the ToCopyBackward of :160), which needs no declaration.
