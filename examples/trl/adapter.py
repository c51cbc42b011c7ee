"""TRL 1.15.0's GRPO loss behind docs/spec.md's torch adapter contract (SPEC v2).

    grpo-verify check --impl /abs/path/examples/trl/adapter.py:grpo_loss --objective trl:dapo
    grpo-verify check --impl /abs/path/examples/trl/adapter.py:grpo_loss_fused --kind fused ...

TRL 1.15.0 has no GRPO loss function: the loss is the method
`GRPOTrainer._compute_loss(self, model, inputs)` (trl/trainer/grpo_trainer.py:2946),
and the per-token log-probs and entropies it starts from are not computed from
logits at all but from the model's last hidden states, by the fused LM head that
`add_fused_lm_head` (trl/trainer/utils.py:1545) patches into the model's forward:
the Triton kernel `trl.kernels.ChunkedLogProbFunction` (kernels/chunked_logprob.py),
which applies the model config's `logit_scale` and `final_logit_softcapping`,
then 1 / temperature, in tiles. So this adapter calls TRL's real code twice over:

  - `GRPOTrainer._compute_loss`, unbound, on `_TrainerStandIn`: an object with
    only the attributes the method (and `_get_per_token_logps_and_entropies`,
    which it calls) reads, each documented there. This is fragile across TRL
    versions: a new attribute read raises AttributeError, which is re-raised
    naming it; the adapter refuses to load under another TRL version unless
    GRPO_VERIFY_TRL_ANY_VERSION=1.
  - `add_fused_lm_head` on `_StandInCausalLM`: a model whose backbone returns
    the case's hidden states, and whose LM head is the case's [V, H] weight.
    `grpo_loss_fused` (fused kind) passes SPEC's hidden and lm_head.T;
    `grpo_loss` (logits kind) passes the logits as hidden states and the
    identity [V, V] as the head: x @ I is exact in any float dtype (one
    nonzero product per output, the rest exact zeros), forward and backward,
    so TRL's kernel sees exactly the case's logits.

On CPU the Triton kernel runs under Triton's interpreter (TRITON_INTERPRET=1,
set below before anything imports Triton): TRL's kernel code, with NumPy's
float32 math in place of the GPU's (tl.exp is libm's exp here, not
ex2.approx). One fix to the interpreter, not to TRL: Triton 3.8.0's interpreter
turns `x.to(tl.bfloat16)` into truncation toward zero, where compiled Triton
rounds to nearest even (repros/triton_interpreter_bf16_truncation.py); TRL's
backward stores its logits gradient with exactly that cast, so on bf16 inputs
the interpreter would hand the suite gradients a GPU never produces.
`grpo_verify_worker.triton_interpreter.round_bf16_casts_to_nearest` makes that
one conversion round to nearest even (FINDINGS.md, "Triton's interpreter").

SPEC v2 -> TRL (GRPOConfig field, or what `_compute_loss` reads):
  policy_loss ppo + aggregation seq_mean_token_mean  -> loss_type "grpo"
  policy_loss ppo + token_mean                       -> loss_type "bnpo"
  policy_loss ppo + sum_over_constant, N = B * T     -> loss_type "dr_grpo", max_completion_length = T
  policy_loss ppo + sum_over_constant, other N       -> loss_type "dapo", num_items_in_batch = N
  policy_loss cispo + sum_over_constant              -> loss_type "cispo", epsilon_high = 1 + eps_high
                                                        (SPEC's eps_low = inf: TRL's cap has no floor)
  policy_loss sapo + seq_mean_token_mean             -> loss_type "sapo" (TRL aggregates it like "grpo")
  ratio_level token | sequence                       -> importance_sampling_level
  eps_low, eps_high                                  -> epsilon, epsilon_high
  two_sided (ppo only), delta                        -> delta (None when off)
  kl, beta (k3, own gradient, unclamped)             -> beta, ref_per_token_logps
  kl_times_ratio                                     -> use_bias_correction_kl
  entropy_bonus + entropy_aggregation token_mean     -> entropy_coef
  rollout_correction, is_weights                     -> use_vllm + vllm_importance_sampling_correction,
                                                        inputs["importance_sampling_ratio"]
  temperature (logits mode)                          -> temperature
  logit_transform: logit_scale, logit_softcap        -> model config logit_scale, final_logit_softcapping
  on_policy                                          -> no old_per_token_logps (TRL detaches its own)
  sapo_tau_pos, sapo_tau_neg                         -> sapo_temperature_pos, sapo_temperature_neg
Everything else raises NotImplementedError naming it (see `_trl_settings`).

Glue (what TRL's own pipeline does before the loss, not loss math): old and
ref log-probs at masked positions are set to 0, which is what TRL's fused
head returns there (its log-probs are zero where the label is -100), so the
+-1e9 garbage SPEC allows there never meets exp(); an unmasked token id
outside [0, V) makes the loss and logp NaN (TRL's kernel would silently use
logit 0 for it: kernels/chunked_logprob.py, `if (local >= 0) & (local < n_cols)`).
"""

import collections
import contextlib
import functools
import math
import os
import pathlib
import types

import torch
from grpo_verify_worker import triton_interpreter
from grpo_verify_worker.loader import import_file

if not torch.cuda.is_available():
    # Must precede the first import of triton: @triton.jit reads it at decoration time.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import transformers  # noqa: E402
import trl  # noqa: E402
from trl.trainer.grpo_trainer import GRPOTrainer  # noqa: E402
from trl.trainer.utils import add_fused_lm_head  # noqa: E402

TRL_VERSION = "1.15.0"
LIBRARY = f"TRL {TRL_VERSION} GRPOTrainer"
if trl.__version__ != TRL_VERSION and os.environ.get("GRPO_VERIFY_TRL_ANY_VERSION") != "1":
    raise ImportError(
        f"examples/trl/adapter.py drives GRPOTrainer._compute_loss through a stand-in written "
        f"against TRL {TRL_VERSION}; this is TRL {trl.__version__}. Read the method for new "
        "attributes, then set GRPO_VERIFY_TRL_ANY_VERSION=1."
    )


from trl.kernels import chunked_logprob  # noqa: E402

triton_interpreter.require(chunked_logprob._forward_kernel, "TRL's fused LM head")
if not torch.cuda.is_available():
    triton_interpreter.round_bf16_casts_to_nearest()
    triton_interpreter.bf16_arithmetic_as_floats()  # bf16 + - * / on values, not on their uint16 storage


# --- SPEC v2 -> TRL's settings ----------------------------------------------------------

# The refusal and the SPEC -> loss_type mapping every library adapter shares (imported by path: the
# worker loads this file by path, so examples/ is not on sys.path).
spec_mapping = import_file(pathlib.Path(__file__).parents[1] / "spec_mapping.py")
_refuse = functools.partial(spec_mapping.refuse, LIBRARY)


def _trl_settings(hparams, config, mask):
    """The GRPOConfig values (and num_items_in_batch) that make TRL compute SPEC's objective.

    Refuses (NotImplementedError) every switch or value TRL cannot express. The worker sends every
    v2 key of config and hparams (docs/worker-protocol.md, "run"), so none is looked up with a default.
    """
    h = {k: float(v) for k, v in hparams.items()}
    if config["temperature_mode"] != "logits":
        _refuse(
            "temperature_mode 'logp': TRL divides the logits by the temperature (fused head's inv_t)",
            switch="temperature_mode", value=config["temperature_mode"],
        )
    if config["ratio_level"] not in ("token", "sequence"):
        _refuse(
            f"ratio_level {config['ratio_level']!r}: importance_sampling_level is 'token' or 'sequence'",
            switch="ratio_level", value=config["ratio_level"],
        )
    if math.isfinite(h["log_ratio_min"]) or math.isfinite(h["log_ratio_max"]):
        _refuse("a log-ratio clamp: coef_1 = exp(log_ratio) is never clamped (grpo_trainer.py:3021)", switch=None)

    policy = config["policy_loss"]
    aggregation = config["aggregation"]
    normalizer = h["normalizer"]
    # This adapter maps fewer aggregations onto TRL's loss types than spec_mapping.trl_loss_type (which
    # Liger's and Unsloth's adapters take whole): these are refused first, with the reasons it gives.
    if policy == "ppo" and aggregation == "seq_mean_token_mean_over_constant":
        _refuse(
            f"aggregation {aggregation!r} with the PPO term: no loss_type aggregates so",
            switch="aggregation", value=aggregation,
        )
    if policy == "cispo":
        if aggregation != "sum_over_constant":
            _refuse(
                f"aggregation {aggregation!r} with CISPO: loss_type 'cispo' divides the sum by num_items_in_batch",
                switch="policy_loss", value="cispo",
            )
        if not math.isinf(h["eps_low"]):
            _refuse(
                "CISPO with a lower bound (eps_low finite): TRL caps the ratio above only (epsilon_high)",
                switch="policy_loss", value="cispo",
            )
    if policy == "sapo" and aggregation != "seq_mean_token_mean":
        _refuse(
            f"aggregation {aggregation!r} with SAPO: loss_type 'sapo' aggregates like 'grpo', "
            "a per-sequence token mean then the batch mean (grpo_trainer.py:3079)",
            switch="policy_loss", value="sapo",
        )
    if aggregation == "sum_over_constant" and normalizer < 1.0:
        _refuse(f"normalizer {normalizer} < 1: TRL clamps num_items_in_batch to at least 1", switch=None)
    loss_type = spec_mapping.trl_loss_type(LIBRARY, config, h, mask)

    if config["kl"]:
        if config["kl_estimator"] != "k3" or config["kl_gradient"] != "own":
            _refuse(
                "a KL other than k3 with its own gradient: TRL's per_token_kl is k3 (grpo_trainer.py:3027)",
                switch="kl_estimator" if config["kl_estimator"] != "k3" else "kl_gradient",
            )
        if math.isfinite(h["kl_log_ratio_clamp"]) or math.isfinite(h["kl_max"]):
            _refuse("a clamped k3: TRL's k3 is unclamped", switch="kl", value=True)
    if config["entropy_bonus"] and config["entropy_aggregation"] != "token_mean":
        _refuse(
            "entropy_aggregation 'same': TRL's bonus is a token mean of its own, whatever loss_type",
            switch="entropy_aggregation", value=config["entropy_aggregation"],
        )

    logit_scale, softcap = 1.0, None
    if config["logit_transform"]:
        logit_scale = h["logit_scale"]
        softcap = h["logit_softcap"] if math.isfinite(h["logit_softcap"]) else None

    two_sided = config["two_sided"] and policy == "ppo"  # SPEC: delta belongs to ppo alone
    return {
        "loss_type": loss_type.name,
        "importance_sampling_level": config["ratio_level"],
        "epsilon_low": h["eps_low"],
        # TRL's CISPO cap is absolute: clamp(coef_1, max=epsilon_high).
        "epsilon_high": 1.0 + h["eps_high"] if policy == "cispo" else h["eps_high"],
        "delta": h["delta"] if two_sided else None,
        "beta": h["beta"] if config["kl"] else 0.0,
        "use_bias_correction_kl": config["kl_times_ratio"],
        "entropy_coef": h["entropy_coef"] if config["entropy_bonus"] else 0.0,
        "rollout_correction": config["rollout_correction"],
        "temperature": h["temperature"],
        "sapo_temperature_pos": h["sapo_tau_pos"],
        "sapo_temperature_neg": h["sapo_tau_neg"],
        # Read by dr_grpo alone (sum / (B * max_completion_length)); the completion length otherwise.
        "max_completion_length": loss_type.max_completion_length or mask.shape[1],
        "num_items_in_batch": loss_type.num_items_in_batch,
        "logit_scale": logit_scale,
        "final_logit_softcapping": softcap,
    }


# --- the stand-ins ----------------------------------------------------------------------


class _Accelerator:
    """What `_compute_loss` asks of `self.accelerator`, for one process: autocast() (off:
    the case's dtypes are the ones under test), gather / gather_for_metrics / reduce (the
    identity with one process), num_processes, sync_gradients, is_main_process (profiling)."""

    num_processes = 1
    sync_gradients = True
    is_main_process = True

    def autocast(self):
        return contextlib.nullcontext()

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x


class _TrainerStandIn:
    """Exactly the attributes GRPOTrainer._compute_loss (TRL 1.15.0) reads, set as
    GRPOTrainer.__init__ would from a GRPOConfig (grpo_trainer.py:760-960):

      loss_type, importance_sampling_level, epsilon_low, epsilon_high, beta,
      entropy_coef                     <- args of the same names (epsilon_low <- epsilon)
      max_completion_length            <- args.max_completion_length (dr_grpo's denominator / B)
      use_vllm, vllm_importance_sampling_correction
                                       <- both True when is_weights is given
      top_entropy_quantile = 1.0       (no high-entropy token mask)
      off_policy_mask_threshold = None (no off-policy sequence mask)
      aux_loss_enabled = False         (not a mixture of experts)
      use_adaptive_entropy = False; _entropy_bonus_enabled = entropy_coef != 0 (as __init__)
      _last_world_entropy, _entropy_window_stats (adaptive entropy state, unused)
      current_gradient_accumulation_steps = 1 (one micro-batch is the whole step)
      model = the model (`model.training` picks train mode), _metrics (logging sink)
      accelerator (`_Accelerator`), state.global_step and args.report_to (profiling_decorator)
      args: delta, use_bias_correction_kl, sapo_temperature_pos / _neg,
            steps_per_generation = 1 (dapo / cispo normaliser), entropy_target (adaptive only)
    and `_get_per_token_logps_and_entropies`, GRPOTrainer's own, bound to this object.
    """

    def __init__(self, s, model):
        self.loss_type = s["loss_type"]
        self.importance_sampling_level = s["importance_sampling_level"]
        self.epsilon_low = s["epsilon_low"]
        self.epsilon_high = s["epsilon_high"]
        self.beta = s["beta"]
        self.entropy_coef = s["entropy_coef"]
        self.max_completion_length = s["max_completion_length"]
        self.use_vllm = s["rollout_correction"]
        self.vllm_importance_sampling_correction = s["rollout_correction"]
        self.top_entropy_quantile = 1.0
        self.off_policy_mask_threshold = None
        self.aux_loss_enabled = False
        self.use_adaptive_entropy = False
        self._entropy_bonus_enabled = self.entropy_coef != 0.0
        self._last_world_entropy = float("inf")
        self._entropy_window_stats = None
        self.current_gradient_accumulation_steps = 1
        self.model = model
        self._metrics = {"train": collections.defaultdict(list), "eval": collections.defaultdict(list)}
        self.accelerator = _Accelerator()
        self.state = types.SimpleNamespace(global_step=0)
        self.args = types.SimpleNamespace(
            report_to=[],
            delta=s["delta"],
            use_bias_correction_kl=s["use_bias_correction_kl"],
            sapo_temperature_pos=s["sapo_temperature_pos"],
            sapo_temperature_neg=s["sapo_temperature_neg"],
            steps_per_generation=1,
            entropy_target=0.0,
        )
        self._get_per_token_logps_and_entropies = types.MethodType(
            GRPOTrainer._get_per_token_logps_and_entropies, self
        )


class _Backbone:
    """The model's `base_model`: returns the case's hidden states [B, T, H] as the last
    hidden states of prompt (1 token) + completion (T tokens). The fused head scores
    position i against input token i + 1, so completion token t is scored from
    position t: the hidden states are followed by one unused position."""

    def __init__(self, hidden):
        self.hidden = hidden

    def __call__(self, input_ids, attention_mask=None, **kwargs):
        pad = self.hidden.new_zeros(self.hidden.shape[0], 1, self.hidden.shape[2])
        return types.SimpleNamespace(last_hidden_state=torch.cat([self.hidden, pad], dim=1))


class _StandInCausalLM(torch.nn.Module):
    """What add_fused_lm_head reads of a causal LM: config.get_text_config() (with
    logit_scale and final_logit_softcapping, SPEC's logit transform), forward, base_model,
    get_output_embeddings() (a module with weight [V, H] and bias None)."""

    def __init__(self, hidden, weight, logit_scale, softcap):
        super().__init__()
        self.config = transformers.PretrainedConfig()
        self.config.logit_scale = logit_scale
        if softcap is not None:
            self.config.final_logit_softcapping = softcap
        self.base_model = _Backbone(hidden)
        self.head = types.SimpleNamespace(weight=weight, bias=None)

    def get_output_embeddings(self):
        return self.head

    def forward(self, *args, **kwargs):
        raise RuntimeError("the stand-in model is only called with fused_lm_head=True")


# --- the adapter ------------------------------------------------------------------------


def _trl_loss(hidden, weight, *, tokens, mask, advantages, old_logp, ref_logp, hparams,
              config, is_weights, cast_lm_head_to_fp32=False):
    """(loss, aux) of GRPOTrainer._compute_loss on hidden [B, T, H] and a head weight [V, H]."""
    batch, time = mask.shape
    s = _trl_settings(hparams, config, mask)
    model = _StandInCausalLM(hidden, weight, s["logit_scale"], s["final_logit_softcapping"])
    # As GRPOTrainer.__init__ does (grpo_trainer.py:1042).
    add_fused_lm_head(
        model, temperature=s["temperature"], cast_lm_head_to_fp32=cast_lm_head_to_fp32,
        outputs=("log_probs", "entropy"),
    )
    fused_forward, captured = model.forward, {}

    def forward_capturing_outputs(*args, **kwargs):
        captured["outputs"] = out = fused_forward(*args, **kwargs)
        return out

    model.forward = forward_capturing_outputs

    valid = mask > 0
    inputs = {
        "prompt_ids": torch.zeros(batch, 1, dtype=torch.long),
        "prompt_mask": torch.ones(batch, 1, dtype=mask.dtype),
        # Masked ids (-100, >= V) become label -100 from the attention mask (grpo_trainer.py:1453).
        "completion_ids": tokens.long(),
        "completion_mask": mask,
        "advantages": advantages,
    }
    if old_logp is not None:
        inputs["old_per_token_logps"] = torch.where(valid, old_logp, 0.0)
    if config["kl"]:
        inputs["ref_per_token_logps"] = torch.where(valid, ref_logp, 0.0)
    if s["rollout_correction"]:
        inputs["importance_sampling_ratio"] = is_weights
    if s["num_items_in_batch"] is not None:
        inputs["num_items_in_batch"] = torch.tensor(s["num_items_in_batch"], dtype=torch.float32)

    trainer = _TrainerStandIn(s, model)
    try:
        loss = GRPOTrainer._compute_loss(trainer, model, inputs)
    except AttributeError as e:
        raise RuntimeError(
            f"TRL {trl.__version__}'s GRPOTrainer._compute_loss read something the stand-in "
            f"(written against {TRL_VERSION}) lacks: {e}"
        ) from e

    outputs = captured["outputs"]
    logp = outputs.log_probs[:, -time:]
    entropy = outputs.entropy[:, -time:]
    out_of_vocab = valid & ((tokens < 0) | (tokens >= weight.shape[0]))
    if bool(out_of_vocab.any()):
        loss = loss + float("nan")
        logp = torch.where(out_of_vocab, float("nan"), logp)
    return loss, {"logp": logp, "entropy": entropy}


# The largest [V, V] identity the logits kind builds: 2 GiB (V = 32768 in bf16). At
# production V (151936: 46 GB in bf16) it is refused; grpo_loss_fused runs there.
IDENTITY_LIMIT_BYTES = 2 << 30


def grpo_loss(*, logits, tokens, mask, advantages, old_logp, ref_logp, hparams, config,
              is_weights=None):
    """Logits kind: TRL's loss with the logits as hidden states and the identity as LM head."""
    vocab = logits.shape[-1]
    if vocab * vocab * logits.element_size() > IDENTITY_LIMIT_BYTES:
        _refuse(
            f"the logits kind at V = {vocab}: it runs TRL's fused head with a [V, V] identity as LM head "
            f"({vocab * vocab * logits.element_size() / 2**30:.0f} GiB); check grpo_loss_fused (hidden, lm_head) there",
            switch=None,
        )
    identity = torch.eye(vocab, dtype=logits.dtype)
    return _trl_loss(
        logits, identity, tokens=tokens, mask=mask, advantages=advantages, old_logp=old_logp,
        ref_logp=ref_logp, hparams=hparams, config=config, is_weights=is_weights,
    )


def grpo_loss_fused(*, hidden, lm_head, tokens, mask, advantages, old_logp, ref_logp, hparams,
                    config, is_weights=None):
    """Fused kind: TRL's loss on SPEC's hidden [B, T, H] and lm_head [H, V] (TRL's weight is [V, H]).

    GRPOConfig.cast_lm_head_to_fp32 is False (TRL's default): with bf16 inputs the
    [tokens, V] logits tile is a bf16 matmul output, as on a GPU under bf16 autocast.
    """
    return _trl_loss(
        hidden, lm_head.T, tokens=tokens, mask=mask, advantages=advantages, old_logp=old_logp,
        ref_logp=ref_logp, hparams=hparams, config=config, is_weights=is_weights,
    )


def grpo_loss_fused_fp32(*, hidden, lm_head, tokens, mask, advantages, old_logp, ref_logp,
                         hparams, config, is_weights=None):
    """Fused kind with GRPOConfig.cast_lm_head_to_fp32=True: the head's matmul in float32."""
    return _trl_loss(
        hidden, lm_head.T, tokens=tokens, mask=mask, advantages=advantages, old_logp=old_logp,
        ref_logp=ref_logp, hparams=hparams, config=config, is_weights=is_weights,
        cast_lm_head_to_fp32=True,
    )


for _f in (grpo_loss, grpo_loss_fused, grpo_loss_fused_fp32):
    _f.framework = "torch"
    _f.spec_version = 2
    _f.static_hparams = True

# Declared precision conventions (docs/conventions.md): the bf16 roundings TRL's own code does on bf16
# inputs. Lines are of the installed trl 1.15.0 (.venv/lib/python3.11/site-packages/trl/).
# grpo_loss (logits kind) declares none: its head is the exact bf16 identity, so the bf16 tile of
# kernels/chunked_logprob.py:231 holds the case's logits exactly, and the bf16 store of d logits
# (:171) is the returned gradient's own output rounding (x @ I and :325's cast are exact).
grpo_loss.precision_conventions = ()
grpo_loss_fused.precision_conventions = (
    # kernels/chunked_logprob.py:204-206 compute_dtype = the autocast dtype, else the hidden states'
    # (bf16 here); :222 the tile buffer in compute_dtype; :231 `torch.mm(hidden_chunk,
    # weight[start:end].to(compute_dtype).t(), out=tile)`: the logits stored in bf16 before the
    # kernel's f32 scale, softcap, 1/tau and log-sum-exp (:234 `_forward_kernel`). Backward, :299 again.
    "bf16_logits",
    # :171 `tl.store(ptrs, grad.to(mm_ptr.dtype.element_ty), mask=mask)`: d logits (f32 in the kernel)
    # stored into the bf16 tile, then the f32-accumulated GEMMs (:318-320, `_addmm_fp32`).
    "bf16_grad_logits",
)
# grpo_loss_fused_fp32 declares none: with cast_lm_head_to_fp32 the hidden states are cast to f32 and
# autocast is off (trainer/utils.py:1626-1628), so the tile and d logits are f32; the only bf16 roundings
# are the returned gradients' (:325-326, and the ToCopyBackward of utils.py:1627).
grpo_loss_fused_fp32.precision_conventions = ()
