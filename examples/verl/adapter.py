"""verl 0.9.1 behind docs/spec.md v2's PyTorch adapter contract: two implementations.

    grpo-verify check --impl examples/verl/adapter.py:grpo_loss --objective verl:vanilla
    grpo-verify check --impl examples/verl/adapter.py:grpo_loss_fused --objective verl:gspo

Everything numerical is verl's own code (Apache-2.0), as its PPO actor runs it:

- `grpo_loss` (logits kind): the FSDP engine's temperature, `_scale_logits_by_temperature`
  (verl/workers/engine/fsdp/transformer_impl.py:98-103: logits / tau, tau cast to the
  logits' dtype), then `verl.utils.torch_functional.logprobs_from_logits` and
  `entropy_from_logits` (transformer_impl.py:1383-1397 and 1435-1441).
- `grpo_loss_fused` (fused kind): `verl.utils.experimental.torch_functional.FusedLinearForPPO`
  (torch backend), as verl's patched model forward calls it
  (verl/models/transformers/dense_common.py:122-128) with the [V, H] weight lm_head.T.
- both: `verl.workers.utils.losses.ppo_loss`, the actor's loss in 0.9.1 (there is no
  dp_actor.py any more): the policy loss of `core_algos.get_policy_loss_fn(loss_mode)`
  (`vanilla`, `gspo`, `cispo`, `sapo`), minus entropy_coeff times the entropy
  aggregated by `agg_loss`, plus kl_loss_coef times `kl_penalty` aggregated by
  `agg_loss` (losses.py:57-144).

The glue maps SPEC's inputs onto verl's: the per-sequence advantage broadcast to
verl's per-token advantages times the response mask (as
compute_grpo_outcome_advantage does, core_algos.py:329); SPEC's switches onto an
`ActorConfig`; SPEC's aggregations onto `loss_agg_mode` with the global-batch
numbers verl's trainer passes (`global_batch_size`, `batch_num_tokens`,
`loss_scale_factor`); the [B, T] log-probs into the packed layout `ppo_loss`
unpacks (`no_padding_2_padding`). On-policy, verl still receives old log-probs
(its trainer recomputes them with the same weights): they are logp.detach().
Masked positions are sanitised before verl sees them (token id 0, old and ref
log-probs equal to logp.detach()). What verl cannot do is refused with
NotImplementedError naming the switch and where verl fixes it. verl's
policy losses return only the aggregated loss, so `aux` has `logp` and
`entropy` and no `per_token_loss`.
"""

import functools
import math
import pathlib
import warnings

import torch
from grpo_verify_worker.loader import import_file
from tensordict import TensorDict

with warnings.catch_warnings():
    # verl's engine package warns that Megatron is not installed; it is not used here.
    warnings.simplefilter("ignore")
    from verl.utils import tensordict_utils as verl_tu
    from verl.utils import torch_functional as verl_F
    from verl.utils.experimental.torch_functional import FusedLinearForPPO
    from verl.workers.config import ActorConfig, PolicyLossConfig
    from verl.workers.engine.fsdp.transformer_impl import (
        _is_scalar_unit_temperature,
        _scale_logits_by_temperature,
    )
    from verl.workers.utils.losses import ppo_loss

# verl's fixed clamps (SPEC v2 hyperparameters that must equal them).
TOKEN_LOG_RATIO_CLAMP = 20.0  # vanilla, cispo, sapo: core_algos.py:1338, 2071, 1666
GSPO_LOG_RATIO_MAX = 10.0  # gspo: core_algos.py:1590 (no lower clamp)
LOW_VAR_KL_CLAMP = 20.0  # kl_penalty_forward "low_var_kl": core_algos.py:2242
LOW_VAR_KL_MAX = 10.0  # core_algos.py:2245

# SPEC (policy_loss, ratio_level) -> verl's policy loss_mode.
LOSS_MODES = {
    ("ppo", "token"): "vanilla",
    ("ppo", "sequence_token"): "gspo",
    ("cispo", "token"): "cispo",
    ("sapo", "token"): "sapo",
}

# SPEC kl_estimator -> verl kl_loss_type (kl_penalty_forward, core_algos.py:2216-2251).
KL_LOSS_TYPES = {"k1": "k1", "abs": "abs", "k2": "k2", "k3": "low_var_kl"}

LIBRARY = "verl 0.9.1"

# The refusal every library adapter shares (imported by path: the worker loads this file by path, so
# examples/ is not on sys.path).
spec_mapping = import_file(pathlib.Path(__file__).parents[1] / "spec_mapping.py")
refuse = functools.partial(spec_mapping.refuse, LIBRARY)


def actor_config(hparams, config):
    """The ActorConfig (verl/workers/config/actor.py) that is SPEC's config and hparams, or a refusal.

    The worker sends every v2 key of config and hparams (docs/worker-protocol.md, "run"): none has a
    default here.
    """
    if config["temperature_mode"] != "logits":
        refuse(
            f"temperature_mode={config['temperature_mode']!r}: "
            "verl divides the logits by the temperature (engine/fsdp/transformer_impl.py:103)",
            switch="temperature_mode", value=config["temperature_mode"],
        )
    if config["logit_transform"]:
        refuse("logit_transform: verl applies no logit scale or softcap", switch="logit_transform", value=True)
    policy, level = config["policy_loss"], config["ratio_level"]
    loss_mode = LOSS_MODES.get((policy, level))
    if loss_mode is None:
        refuse(
            f"policy_loss={policy!r} at ratio_level={level!r}: "
            "verl's policy losses are vanilla/cispo/sapo (token ratio) and gspo (GSPO-token); "
            "no sequence-level ratio with a per-sequence gradient",
            switch="ratio_level", value=level,
        )
    low, high = hparams["log_ratio_min"], hparams["log_ratio_max"]
    clamp = (-math.inf, GSPO_LOG_RATIO_MAX) if loss_mode == "gspo" else (-TOKEN_LOG_RATIO_CLAMP, TOKEN_LOG_RATIO_CLAMP)
    if (low, high) != clamp:
        refuse(
            f"log-ratio clamp [{low}, {high}]: "
            f"verl's {loss_mode} clamps the log-ratio to [{clamp[0]}, {clamp[1]}], fixed in core_algos.py",
            switch=None,
        )
    two_sided = config["two_sided"] and policy == "ppo"  # SPEC: delta belongs to ppo alone
    if two_sided and loss_mode != "vanilla":
        refuse(
            f"two_sided (dual-clip): only verl's vanilla loss has clip_ratio_c, not {loss_mode}",
            switch="two_sided", value=True,
        )

    aggregation = config["aggregation"]
    if loss_mode == "sapo" and aggregation not in ("seq_mean_token_mean", "seq_mean_token_mean_over_constant"):
        refuse(
            f"aggregation={aggregation!r} with sapo: "
            "verl's sapo always aggregates seq-mean-token-mean (core_algos.py:1689-1691)",
            switch="policy_loss", value="sapo",
        )
    if config["entropy_bonus"] and config["entropy_aggregation"] != "same":
        refuse(
            f"entropy_aggregation={config['entropy_aggregation']!r}: "
            "verl aggregates the entropy with the policy's loss_agg_mode (workers/utils/losses.py:123-128)",
            switch="entropy_aggregation", value=config["entropy_aggregation"],
        )
    kl_loss_type = "low_var_kl"
    if config["kl"]:
        estimator = config["kl_estimator"]
        kl_loss_type = KL_LOSS_TYPES[estimator]
        if estimator == "k3":
            bound, kl_max = hparams["kl_log_ratio_clamp"], hparams["kl_max"]
            if (bound, kl_max) != (LOW_VAR_KL_CLAMP, LOW_VAR_KL_MAX):
                refuse(
                    f"k3 with kl_log_ratio_clamp={bound}, kl_max={kl_max}: "
                    "verl's low_var_kl clamps d to +-20 and the estimate to +-10 (core_algos.py:2240-2245)",
                    switch="kl", value=True,
                )
        if config["kl_gradient"] == "k2":
            kl_loss_type += "+"  # straight-through: k2's gradient (kl_penalty, core_algos.py:2188-2213)
        if config["kl_times_ratio"]:
            refuse(
                "kl_times_ratio: verl's KL loss has no importance-ratio factor (workers/utils/losses.py:132-141)",
                switch="kl_times_ratio", value=True,
            )

    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        policy_loss=PolicyLossConfig(loss_mode=loss_mode),
        clip_ratio_low=hparams["eps_low"],
        clip_ratio_high=hparams["eps_high"],
        # SPEC's delta is verl's dual-clip constant c (identical for A < 0, never binding for A >= 0);
        # without two_sided, c = +inf: verl's dual-clip term -A * c never is the minimum.
        clip_ratio_c=hparams["delta"] if two_sided else math.inf,
        loss_agg_mode={
            "token_mean": "token-mean",
            "seq_mean_token_mean": "seq-mean-token-mean",
            "seq_mean_token_mean_over_constant": "seq-mean-token-mean",
            "sum_over_constant": "seq-mean-token-sum-norm",
        }[aggregation],
        # seq-mean-token-sum-norm: sum / global_batch_size / loss_scale_factor, with global_batch_size 1.
        loss_scale_factor=hparams["normalizer"] if aggregation == "sum_over_constant" else None,
        entropy_coeff=hparams["entropy_coef"] if config["entropy_bonus"] else 0.0,
        use_kl_loss=config["kl"],
        kl_loss_coef=hparams["beta"] if config["kl"] else 0.0,
        kl_loss_type=kl_loss_type,
        tau_pos=hparams["sapo_tau_pos"],
        tau_neg=hparams["sapo_tau_neg"],
    )


def global_batch_size(mask, hparams, aggregation):
    """verl's `global_batch_size` (the sequences its seq-mean divides by) for SPEC's aggregation.

    verl's trainer passes the mini-batch size, empty rows included (trainer/ppo/ray_trainer.py:1352-1362):
    SPEC's seq_mean_token_mean is that with B; seq_mean_token_mean_over_constant passes SPEC's
    normalizer (agg_loss's own default is the non-empty rows, core_algos.py:1195-1201).
    """
    if aggregation == "seq_mean_token_mean_over_constant":
        return hparams["normalizer"]
    if aggregation == "sum_over_constant":
        return 1
    return mask.shape[0]


def safe_tokens(tokens, mask, vocab):
    """Token ids with masked positions set to 0; an unmasked id outside [0, V) is an error."""
    valid = mask > 0
    outside = valid & ((tokens < 0) | (tokens >= vocab))
    if outside.any():
        b, t = (int(i) for i in outside.nonzero()[0])
        raise ValueError(f"tokens[{b}, {t}] = {int(tokens[b, t])} is outside the vocabulary [0, {vocab})")
    return torch.where(valid, tokens, torch.zeros_like(tokens)).long()


def verl_actor_loss(logp, entropy, *, mask, advantages, old_logp, ref_logp, is_weights, hparams, config):
    """verl's `ppo_loss` (workers/utils/losses.py) on SPEC's [B, T] log-probs and entropy."""
    verl_config = actor_config(hparams, config)
    batch, length = logp.shape
    valid = mask > 0
    detached = logp.detach()
    old = detached if old_logp is None else torch.where(valid, old_logp.float(), detached)
    fields = {
        "response_mask": mask,
        "old_log_probs": old,
        # GRPO's per-token advantages: the sequence's score times the response mask (core_algos.py:329).
        "advantages": advantages.float()[:, None] * mask,
        # The packed layout ppo_loss unpacks: each row a 1-token prompt and the response.
        "prompts": torch.zeros(batch, 1, dtype=torch.long),
        "responses": torch.zeros(batch, length, dtype=torch.long),
        "attention_mask": torch.ones(batch, 1 + length, dtype=torch.long),
    }
    if config["kl"]:
        fields["ref_log_prob"] = torch.where(valid, ref_logp.float(), detached)
    if config["rollout_correction"]:
        weights = torch.broadcast_to(is_weights.float(), logp.shape)
        fields["rollout_is_weights"] = torch.where(valid, weights, torch.zeros_like(weights))
    data = TensorDict(fields, batch_size=[batch])
    verl_tu.assign_non_tensor(
        data,
        dp_size=1,
        batch_num_tokens=mask.sum().item(),  # the trainer's global count (engine/fsdp/transformer_impl.py:730)
        global_batch_size=global_batch_size(mask, hparams, config["aggregation"]),
    )

    def packed(per_token):
        # Row b's response at [b (T + 1), b (T + 1) + T): the log-prob of position i predicts token i + 1.
        return torch.cat([per_token, per_token.new_zeros(batch, 1)], dim=1).reshape(-1)

    model_output = {"log_probs": packed(logp)}
    if config["entropy_bonus"]:
        model_output["entropy"] = packed(entropy)
    loss, _metrics = ppo_loss(verl_config, model_output, data)
    return loss


def grpo_loss(*, logits, tokens, mask, advantages, old_logp, ref_logp, hparams, config, is_weights=None):
    """SPEC v2 (logits kind) by verl 0.9.1's actor: temperature, log-probs, entropy, ppo_loss."""
    actor_config(hparams, config)  # refuse before any work
    batch, length, vocab = logits.shape
    temperature = hparams["temperature"]
    # The engine's per-sample temperature [B, 1, 1] in f32 (transformer_impl.py:1173-1176, 1477-1479).
    per_sample = torch.full((batch, 1, 1), temperature, dtype=torch.float32)
    scaled = _scale_logits_by_temperature(
        logits, per_sample, is_unit_temperature=_is_scalar_unit_temperature(temperature)
    )
    # The engine's remove-padding path: rows of [total_tokens, V] (transformer_impl.py:1383-1427).
    rows = scaled.reshape(batch * length, vocab)
    labels = safe_tokens(tokens, mask, vocab).reshape(-1)
    logp = verl_F.logprobs_from_logits(rows, labels, inplace_backward=False).reshape(batch, length)
    entropy = verl_F.entropy_from_logits(rows).reshape(batch, length)
    loss = verl_actor_loss(
        logp, entropy, mask=mask, advantages=advantages, old_logp=old_logp, ref_logp=ref_logp,
        is_weights=is_weights, hparams=hparams, config=config,
    )
    return loss, {"logp": logp, "entropy": entropy}


def grpo_loss_fused(*, hidden, lm_head, tokens, mask, advantages, old_logp, ref_logp, hparams, config,
                    is_weights=None):
    """SPEC v2 (fused kind) by verl 0.9.1: FusedLinearForPPO on hidden and lm_head.T, then ppo_loss."""
    actor_config(hparams, config)
    vocab = lm_head.shape[1]
    # verl's fused kernels take one scalar temperature (transformer_impl.py:1162-1166, 1315-1316).
    logp, entropy = FusedLinearForPPO(impl_backend="torch")(
        hidden_states=hidden,
        vocab_weights=lm_head.t(),
        input_ids=safe_tokens(tokens, mask, vocab),
        temperature=hparams["temperature"],
    )
    loss = verl_actor_loss(
        logp, entropy, mask=mask, advantages=advantages, old_logp=old_logp, ref_logp=ref_logp,
        is_weights=is_weights, hparams=hparams, config=config,
    )
    return loss, {"logp": logp, "entropy": entropy}


for _function in (grpo_loss, grpo_loss_fused):
    _function.framework = "torch"
    _function.spec_version = 2
    _function.static_hparams = True  # verl's ActorConfig takes Python floats

# Declared precision conventions (docs/conventions.md): the bf16 roundings verl's own code does on
# bf16 inputs, as this adapter calls it on CPU (no flash-attn, no autocast). Lines are of the installed
# verl 0.9.1 (.venv/lib/python3.11/site-packages/verl/). What fits none of the list stays a finding
# (FINDINGS.md, class 2): the entropy aggregated in bf16 (workers/utils/losses.py:93 makes the mask
# bool, so trainer/ppo/core_algos.py:1175, 1182, 1196 keep a bf16 entropy in bf16) and its cotangent,
# and in the fused kind the f32 entropy returned in bf16 (utils/experimental/torch_functional.py:58).
grpo_loss.precision_conventions = (
    # workers/engine/fsdp/transformer_impl.py:103 `logits / temperature.clamp(min=1e-8).to(logits.dtype)`:
    # the quotient is a bf16 tensor: the softmax's argument is stored in bf16 once. At tau == 1 the
    # division is skipped (:101-102): the bf16 logits go in as they are.
    "bf16_logits when temperature != 1",
    # utils/torch_functional.py:194, 199-206: bf16 logits take `F.log_softmax(row_logits)` in bf16 (:203),
    # returning bf16 log-probs (:204-206); :243-244 `entropy_from_logits` is softmax, logsumexp, p * z
    # and their sum all in bf16. Backward: the bf16 log-prob's and entropy's cotangents cast to bf16,
    # their log-softmax / softmax / logsumexp backward in bf16, and the bf16 sum of the four
    # contributions to d rows (log_softmax :203 via unbind :202, logsumexp :244, softmax :243, the z of
    # p * z :244): docs/conventions.md's 3 roundings of the log-prob part and 8 of the entropy part.
    "bf16_softmax",
)
# verl does two more roundings that are not declared, because the two declarations above already
# allow more than they move (`grpo-verify necessity --impl examples/verl/adapter.py:grpo_loss
# --objective verl:vanilla --cases 300`: no case fails without either; docs/conventions.md, "Every
# declaration needed"): the temperature cast to bf16 before the division (:103, 0.7 -> 0.69921875; the
# suite's conventions::the_softmax_allowances_bound_a_bf16_log_softmax checks that the quotient's and
# the softmax's allowances cover it), and DivBackward of :103 dividing d logits by the bf16
# temperature in bf16 (one relative rounding, within the moved softmax's share of each element).
grpo_loss_fused.precision_conventions = (
    # utils/experimental/torch_functional.py:42 `(hidden_states @ vocab_weights.t()) / temperature`:
    # the bf16 GEMM's output is rounded to bf16, then the quotient by the (f32) Python-float
    # temperature is rounded again, before the f32 log-softmax (:44, :54); the backward recomputes
    # the same two roundings (:69). Two stages, one at tau == 1, where / 1.0 is exact.
    "bf16_logits",
    "bf16_logits when temperature != 1",
    # :88 `dlogits.to(orig_dtype) / temperature`: d logits rounded to bf16 before the bf16 GEMMs of
    # :90-91. The division by tau in bf16 rounds once more at tau != 1, not declared: the first
    # stage and the moved softmax already allow more than it moves (`grpo-verify necessity --impl
    # examples/verl/adapter.py:grpo_loss_fused --objective verl:vanilla --switch entropy_bonus=false`:
    # no case fails without it).
    "bf16_grad_logits",
    # :91 `dlogits.t() @ hidden_states` per chunk of 512 flattened tokens (FusedLinearForPPO's
    # chunk_size=512, :221, :104; loop :183-204) is a bf16 GEMM output, added into
    # `torch.zeros_like(vocab_weights)` (:180, bf16) at :204: d W (= d lm_head through lm_head.t())
    # summed in bf16 over 512-token chunks, each chunk's share rounded first.
    "bf16_accumulation:d_lm_head:tokens=512",
)
