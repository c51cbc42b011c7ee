"""docs/spec.md v2 in PyTorch: a port of the plain-JAX reference, block for block.

`grpo_loss` (logits kind) and `grpo_loss_fused` (fused kind: logits =
hidden @ lm_head in f32, then the same) are what python/grpo_kernels/
objective.py, logits/reference.py and fused/reference.py compute, with
torch.Tensor for jax.Array and `.detach()` exactly where JAX has
stop_gradient. Every block keeps its JAX name, so the two read side by side.

A starting point for porting a kernel. Swap one block for your kernel's
version (most often `token_logp_and_entropy`, the [B, T, V] part), keep the
rest, and check it from the repository root:

    target/release/grpo-verify check --impl $PWD/examples/torch_reference/adapter.py:grpo_loss \\
        --objective all --cases 300
    target/release/grpo-verify check --impl $PWD/examples/torch_reference/adapter.py:grpo_loss_fused \\
        --objective all --cases 300

(`--objective trl:grpo` etc. for one preset; no --objective for SPEC v1
cases only). A failure prints a shrunk repro file and the command to replay
it. This file itself passes: it is what a correct torch port looks like.

Conventions (docs/spec.md, "Implementations in PyTorch"):
  - all math in f32; bf16 inputs are upcast first (`.to(MATH_DTYPE)`), so autograd
    returns their gradients in bf16 by itself;
  - hyperparameters arrive as 0-d float32 tensors (no `static_hparams`) and
    no block branches on their values (the JAX blocks are traced);
  - masked positions (mask = 0) may hold any token id (-100, >= V) and any
    old/ref log-prob (+-1e9): `safe_token_ids` and `neutralise_masked` replace
    them before any gather or exp, so nothing inf or NaN forms there in the
    forward or the backward (torch.where's backward, like jnp.where's, sends
    the cotangent only to the branch taken, so a finite guard suffices);
  - kinks (clip edges, clamps) use torch.minimum / torch.maximum, which split
    the gradient at a tie as jnp.minimum / jnp.maximum / jnp.clip do
    (torch.clamp does not); at a kink any coefficient in the admissible
    interval passes anyway.
"""

import math

import torch

# docs/spec.md: all math in f32 (crosscheck_jax.py sets it to float64 for an f64 opinion of the port).
MATH_DTYPE = torch.float32

TEMPERATURE_MODES = ("logits", "logp")
AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "sum_over_constant",
                "seq_mean_token_mean_over_constant")
RATIO_LEVELS = ("token", "sequence", "sequence_token")
POLICY_LOSSES = ("ppo", "cispo", "sapo")
KL_ESTIMATORS = ("k1", "abs", "k2", "k3")
KL_GRADIENTS = ("own", "k2")
ENTROPY_AGGREGATIONS = ("same", "token_mean")

# docs/spec.md "Version 2": the static switches it adds with their v1 values (what a
# v1 config, which lacks them, means).
V2_CONFIG_DEFAULTS = {
    "logit_transform": False,
    "ratio_level": "token",
    "policy_loss": "ppo",
    "kl_estimator": "k3",
    "kl_gradient": "own",
    "kl_times_ratio": False,
    "entropy_aggregation": "same",
    "rollout_correction": False,
}


def setting(config, key):
    """config[key] for a v2 switch, or its v1 value when config is a v1 one (without it)."""
    return config.get(key, V2_CONFIG_DEFAULTS[key])


def hparams_as_tensors(hparams):
    """hparams as 0-d f32 tensors (Python floats, say from a static caller, become tensors)."""
    return {name: torch.as_tensor(value, dtype=MATH_DTYPE) for name, value in hparams.items()}


def clip(x, low, high):
    """clip(x, low, high) as jnp.clip computes it: min(max(x, low), high), ties split."""
    return torch.minimum(torch.maximum(x, torch.as_tensor(low, dtype=MATH_DTYPE)),
                         torch.as_tensor(high, dtype=MATH_DTYPE))


def safe_token_ids(mask, tokens):
    """Token ids [B, T] (int64, for gather) with every masked position set to 0 (a valid id)."""
    return torch.where(mask > 0, tokens.long(), 0)


def transform_logits(logits_f32, hparams, config):
    """The logit transforms of docs/spec.md v2, before the temperature, f32 [..., V].

    z' = logit_scale * z, then z'' = c * tanh(z' / c) with c = logit_softcap
    unless c = +inf; z itself when config's logit_transform is false. The inf
    branch is a `where`, with c = 1 in the untaken softcap branch so that
    neither inf * tanh(0) nor its backward forms a NaN.
    """
    if not setting(config, "logit_transform"):
        return logits_f32
    scaled = hparams["logit_scale"] * logits_f32
    cap = hparams["logit_softcap"]
    capped = torch.isfinite(cap)
    safe_cap = torch.where(capped, cap, 1.0)
    return torch.where(capped, safe_cap * torch.tanh(scaled / safe_cap), scaled)


def token_logp_and_entropy(logits_f32, safe_tokens, temperature, temperature_mode):
    """(logp, entropy), each [B, T], from f32 logits [B, T, V].

    logits mode: logp = log_softmax(z / tau)[y],  entropy of softmax(z / tau);
    logp mode:   logp = log_softmax(z)[y] / tau,  entropy of softmax(z).

    z is centred on its (detached) row maximum before the division by tau:
    both are shift-invariant, and z - max(z) is exact where z / tau would
    round a large common offset (all-negative logits near -1e4) into the result.
    """
    centred = logits_f32 - logits_f32.amax(dim=-1, keepdim=True).detach()
    if temperature_mode == "logits":
        scores, scale = centred / temperature, 1.0
    elif temperature_mode == "logp":
        scores, scale = centred, 1.0 / temperature
    else:
        raise ValueError(
            f"temperature_mode = {temperature_mode!r}; expected one of {TEMPERATURE_MODES}"
        )
    log_probs = scores - torch.logsumexp(scores, dim=-1, keepdim=True)
    chosen = torch.gather(log_probs, -1, safe_tokens[..., None])[..., 0]
    entropy = -torch.sum(torch.exp(log_probs) * log_probs, dim=-1)
    return chosen * scale, entropy


def check_policy_inputs(old_logp, ref_logp, config):
    """A ValueError when old_logp / ref_logp disagree with config's on_policy / kl."""
    if config["on_policy"] != (old_logp is None):
        raise ValueError(
            f"config['on_policy'] = {config['on_policy']} but old_logp is "
            f"{'absent' if old_logp is None else 'given'}"
        )
    if config["kl"] and ref_logp is None:
        raise ValueError("config['kl'] is true but ref_logp is None")


def poison_out_of_vocab(logp, mask, tokens, vocab_size):
    """logp with NaN wherever an unmasked token id is outside [0, V) (bad input: loud, not clamped)."""
    outside = (tokens < 0) | (tokens >= vocab_size)
    return torch.where((mask > 0) & outside, torch.nan, logp)


def neutralise_masked(mask, logp, old_logp, ref_logp):
    """(old, ref) log-probs, [B, T], safe to exponentiate against `logp`.

    Absent `old_logp` (on-policy) gives old = logp.detach(), so r = 1. At
    masked positions old and ref become logp.detach() whatever they held, so
    r = 1 and the KL term is 0 there. `ref` is None when `ref_logp` is.
    """
    detached = logp.detach()
    valid = mask > 0
    old = detached if old_logp is None else torch.where(valid, old_logp, detached)
    ref = None if ref_logp is None else torch.where(valid, ref_logp, detached)
    return old, ref


def clip_branches(logp, old, eps_low, eps_high, delta, two_sided):
    """The two ratios whose advantage-weighted minimum is the PPO objective.

    r = exp(logp - old); unclipped = min(r, delta) when two-sided, else r
    (delta is then ignored); clipped = clip(r, 1 - eps_low, 1 + eps_high).
    """
    ratio = torch.exp(logp - old)
    unclipped = torch.minimum(ratio, delta) if two_sided else ratio
    clipped = clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    return unclipped, clipped


def ppo_per_token(logp, old, advantages, eps_low, eps_high, delta, two_sided):
    """ppo = -min(min(r, delta) * A, clip(r, 1 - eps_low, 1 + eps_high) * A), [B, T]."""
    unclipped, clipped = clip_branches(logp, old, eps_low, eps_high, delta, two_sided)
    per_sequence = advantages[:, None]
    return -torch.minimum(unclipped * per_sequence, clipped * per_sequence)


def kl_per_token(logp, ref, beta):
    """The k3 estimator: beta * (exp(ref - logp) - (ref - logp) - 1), [B, T]."""
    log_ratio = ref - logp
    return beta * (torch.exp(log_ratio) - log_ratio - 1.0)


def sequence_log_ratio(logp, old, mask):
    """L_b = sum_t m (logp - old) / max(sum_t m, 1), [B, 1] (docs/spec.md v2, "Ratio level")."""
    count = torch.clamp(torch.sum(mask, dim=1, keepdim=True), min=1.0)  # mask: no gradient
    return torch.sum(mask * (logp - old), dim=1, keepdim=True) / count


def ratio_exponents(logp, old, mask, hparams, config):
    """(a, b) with log r_t = a - b (docs/spec.md v2, "Ratio level"); a is [B, T], b [B, T] or 0.

    token:          a = clamp(logp - old)
    sequence:       a = clamp(L_b) for every t
    sequence_token: a = clamp(L_b.detach() + (logp - logp.detach()))   (value L_b, gradient per token)
    clamp = clip to [log_ratio_min, log_ratio_max]. A v1 call (no log-ratio
    hparams, token level) gets (logp, old) itself: exactly v1's exp(logp - old).
    """
    level = setting(config, "ratio_level")
    if level == "token":
        if "log_ratio_min" not in hparams and "log_ratio_max" not in hparams:
            return logp, old
        exponent = logp - old
    elif level == "sequence":
        exponent = sequence_log_ratio(logp, old, mask).expand(logp.shape)
    elif level == "sequence_token":
        exponent = sequence_log_ratio(logp, old, mask).detach() + (logp - logp.detach())
    else:
        raise ValueError(f"ratio_level = {level!r}; expected one of {RATIO_LEVELS}")
    low = hparams.get("log_ratio_min", -torch.inf)
    high = hparams.get("log_ratio_max", torch.inf)
    return clip(exponent, low, high), 0.0


def policy_per_token(logp, exponents, advantages, hparams, config):
    """The policy term of docs/spec.md v2 ("Policy loss"), [B, T], with r = exp(a - b) of `exponents`.

    ppo:   v1's ppo_per_token (delta only when two_sided);
    cispo: -clip(r, 1 - eps_low, 1 + eps_high).detach() * A * logp   (the token's own logp);
    sapo:  -sigmoid(k (r - 1)) * (4 / k) * A, k = sapo_tau_pos if A > 0 else sapo_tau_neg.
    """
    kind = setting(config, "policy_loss")
    ratio_exponent, ratio_offset = exponents
    eps_low, eps_high, delta = hparams["eps_low"], hparams["eps_high"], hparams["delta"]
    per_sequence = advantages[:, None]
    if kind == "ppo":
        return ppo_per_token(
            ratio_exponent, ratio_offset, advantages, eps_low, eps_high, delta, config["two_sided"]
        )
    if kind == "cispo":
        _, clipped = clip_branches(ratio_exponent, ratio_offset, eps_low, eps_high, delta, False)
        return -clipped.detach() * per_sequence * logp
    if kind == "sapo":
        ratio = torch.exp(ratio_exponent - ratio_offset)
        k = torch.where(per_sequence > 0, hparams["sapo_tau_pos"], hparams["sapo_tau_neg"])
        return -torch.sigmoid(k * (ratio - 1.0)) * (4.0 / k) * per_sequence
    raise ValueError(f"policy_loss = {kind!r}; expected one of {POLICY_LOSSES}")


def half_square(log_ratio):
    """The k2 estimator d^2 / 2."""
    return 0.5 * torch.square(log_ratio)


def kl_estimate(logp, ref, hparams, config):
    """The KL estimate of docs/spec.md v2 before `times r` and `times beta`, [B, T]; d = ref - logp.

    k1: -d;  abs: |d|;  k2: d^2 / 2;  k3: exp(dc) - dc - 1 with dc = clip(d, +-kl_log_ratio_clamp),
    then clipped to [-kl_max, kl_max]. kl_gradient "k2": k2(d) + (estimate - k2(d)).detach().
    """
    log_ratio = ref - logp
    estimator = setting(config, "kl_estimator")
    if estimator == "k1":
        estimate = -log_ratio
    elif estimator == "abs":
        # torch.abs has gradient 0 at d = 0, jnp.abs 1: both in the kink's interval [-1, 1].
        estimate = torch.abs(log_ratio)
    elif estimator == "k2":
        estimate = half_square(log_ratio)
    elif estimator == "k3":
        bound = hparams["kl_log_ratio_clamp"]
        clamped = clip(log_ratio, -bound, bound)
        # With a finite kl_max, d is capped too where k3 is past it for sure, below
        # f32 exp's overflow: the value there is kl_max, its gradient 0, not 0 * inf.
        if math.isfinite(hparams["kl_max"]):
            clamped = torch.clamp(clamped, max=min(2.0 * math.log(hparams["kl_max"] + 2.0), 88.0))
        # v1's k3 block (one formula for both versions) on the clamped d: ref - logp = dc - 0.
        estimate = kl_per_token(0.0, clamped, 1.0)
        estimate = clip(estimate, -hparams["kl_max"], hparams["kl_max"])
    else:
        raise ValueError(f"kl_estimator = {estimator!r}; expected one of {KL_ESTIMATORS}")
    gradient = setting(config, "kl_gradient")
    if gradient == "k2":
        surrogate = half_square(log_ratio)
        estimate = surrogate + (estimate - surrogate).detach()
    elif gradient != "own":
        raise ValueError(f"kl_gradient = {gradient!r}; expected one of {KL_GRADIENTS}")
    return estimate


def kl_term(logp, ref, exponents, hparams, config):
    """kl_t of docs/spec.md: v1's k3 (`kl_per_token`) for a v1 config, else v2's estimator,
    times r_t when kl_times_ratio (gradient through r), times beta."""
    if ref is None:
        raise ValueError("config['kl'] is true but ref_logp is None")
    if "kl_estimator" not in config:
        return kl_per_token(logp, ref, hparams["beta"])
    estimate = kl_estimate(logp, ref, hparams, config)
    if config["kl_times_ratio"]:
        ratio_exponent, ratio_offset = exponents
        estimate = estimate * torch.exp(ratio_exponent - ratio_offset)
    return hparams["beta"] * estimate


def rollout_weights(mask, is_weights, shape):
    """The rollout-correction weights [B, T]: constants (detached), 0 where masked."""
    if is_weights is None:
        raise ValueError("config['rollout_correction'] is true but is_weights is None")
    weights = is_weights.detach().expand(shape)
    return torch.where(mask > 0, weights, 0.0)


def policy_and_kl(logp, mask, old, ref, advantages, is_weights, hparams, config):
    """policy_t + kl_t of docs/spec.md (v1, or v2 with any switches), [B, T]; kl only when config['kl']."""
    exponents = ratio_exponents(logp, old, mask, hparams, config)
    loss = policy_per_token(logp, exponents, advantages, hparams, config)
    if setting(config, "rollout_correction"):
        loss = rollout_weights(mask, is_weights, loss.shape) * loss
    if config["kl"]:
        loss = loss + kl_term(logp, ref, exponents, hparams, config)
    return loss


def aggregation_weights(mask, aggregation, normalizer):
    """Weights w [B, T] with loss = sum(w * loss_t) (docs/spec.md, "Aggregation").

    token_mean:                        m / max(sum m, 1)
    seq_mean_token_mean:               m / (B * max(sum_t m, 1))
    sum_over_constant:                 m / normalizer
    seq_mean_token_mean_over_constant: m / (max(sum_t m, 1) * normalizer)   (v2)
    A fully masked batch gets w = 0: loss 0 and exactly-zero gradients.
    """
    if aggregation == "token_mean":
        return mask / torch.clamp(torch.sum(mask), min=1.0)
    if aggregation == "seq_mean_token_mean":
        per_row = torch.clamp(torch.sum(mask, dim=1, keepdim=True), min=1.0)
        return mask / (mask.shape[0] * per_row)
    if aggregation == "sum_over_constant":
        return mask / normalizer
    if aggregation == "seq_mean_token_mean_over_constant":
        per_row = torch.clamp(torch.sum(mask, dim=1, keepdim=True), min=1.0)
        return mask / (per_row * normalizer)
    raise ValueError(f"aggregation = {aggregation!r}; expected one of {AGGREGATIONS}")


def loss_and_per_token(logp, entropy, mask, old, ref, advantages, is_weights, hparams, config):
    """(loss, loss_t) of docs/spec.md: the per-token side and the aggregation.

    loss_t = policy_t + kl_t - entropy_coef * ent_t, loss = sum(w * loss_t)
    when entropy_aggregation is "same"; for "token_mean" (TRL) the entropy is
    averaged with token_mean's weights instead:
    loss = sum(w * (policy_t + kl_t)) - entropy_coef * sum(w_tm * ent).
    """
    loss_t = policy_and_kl(logp, mask, old, ref, advantages, is_weights, hparams, config)
    weights = aggregation_weights(mask, config["aggregation"], hparams["normalizer"])
    if not config["entropy_bonus"]:
        return torch.sum(weights * loss_t), loss_t
    with_entropy = loss_t - hparams["entropy_coef"] * entropy
    aggregation = setting(config, "entropy_aggregation")
    if aggregation == "same":
        return torch.sum(weights * with_entropy), with_entropy
    if aggregation != "token_mean":
        raise ValueError(
            f"entropy_aggregation = {aggregation!r}; expected one of {ENTROPY_AGGREGATIONS}"
        )
    token_mean_weights = aggregation_weights(mask, "token_mean", hparams["normalizer"])
    entropy_mean = torch.sum(token_mean_weights * entropy)
    return torch.sum(weights * loss_t) - hparams["entropy_coef"] * entropy_mean, with_entropy


def loss_and_aux(logp, entropy, *, tokens, mask, advantages, old_logp, ref_logp, is_weights,
                 vocab, hparams, config):
    """(loss, {"logp", "per_token_loss", "entropy"}) from a kernel's logp and entropy ([B, T] f32).

    logp poisoned at unmasked ids outside [0, vocab), old/ref neutralised at
    masked positions, then `loss_and_per_token`.
    """
    logp = poison_out_of_vocab(logp, mask, tokens, vocab)
    old, ref = neutralise_masked(mask, logp, old_logp, ref_logp)
    loss, loss_t = loss_and_per_token(
        logp, entropy, mask, old, ref, advantages, is_weights, hparams, config
    )
    return loss, {"logp": logp, "per_token_loss": loss_t, "entropy": entropy}


def grpo_loss(*, logits, tokens, mask, advantages, old_logp, ref_logp, hparams, config,
              is_weights=None):
    """GRPO loss of docs/spec.md (v1 and v2), logits kind: (loss, {"logp", "per_token_loss", "entropy"}).

    logits [B, T, V] bf16|f32; tokens [B, T] int64|int32; mask [B, T] f32 in {0, 1};
    advantages [B] f32; old_logp, ref_logp [B, T] f32 or None;
    is_weights [B, T] or [B, 1] f32, or None (v2 rollout correction).
    """
    check_policy_inputs(old_logp, ref_logp, config)
    hparams = hparams_as_tensors(hparams)
    logits_f32 = transform_logits(logits.to(MATH_DTYPE), hparams, config)
    logp, entropy = token_logp_and_entropy(
        logits_f32, safe_token_ids(mask, tokens), hparams["temperature"], config["temperature_mode"]
    )
    return loss_and_aux(
        logp, entropy, tokens=tokens, mask=mask, advantages=advantages, old_logp=old_logp,
        ref_logp=ref_logp, is_weights=is_weights, vocab=logits.shape[-1], hparams=hparams,
        config=config,
    )


def grpo_loss_fused(*, hidden, lm_head, tokens, mask, advantages, old_logp, ref_logp, hparams,
                    config, is_weights=None):
    """GRPO loss of docs/spec.md (v1 and v2), fused kind: logits = hidden @ lm_head in f32, then `grpo_loss`.

    hidden [B, T, H] bf16|f32; lm_head [H, V] bf16|f32 (SPEC's layout: a
    torch nn.Linear weight [V, H] is passed as weight.T); the rest as in
    `grpo_loss`. The whole [B, T, V] f32 logits tensor is materialised: the
    memory a chunked kernel exists to avoid.
    """
    if hidden.dim() != 3 or lm_head.dim() != 2 or lm_head.shape[0] != hidden.shape[-1]:
        raise ValueError(
            f"hidden {list(hidden.shape)} and lm_head {list(lm_head.shape)}: expected [B, T, H] "
            "and [H, V] (a [V, H] weight is passed as weight.T)"
        )
    logits = hidden.to(MATH_DTYPE) @ lm_head.to(MATH_DTYPE)
    return grpo_loss(
        logits=logits, tokens=tokens, mask=mask, advantages=advantages, old_logp=old_logp,
        ref_logp=ref_logp, hparams=hparams, config=config, is_weights=is_weights,
    )


for _function in (grpo_loss, grpo_loss_fused):
    _function.framework = "torch"
    _function.spec_version = 2
