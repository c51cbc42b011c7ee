"""The GRPO objective of docs/spec.md as small pure-JAX building blocks.

Each block is one formula of docs/spec.md on [B, T] (or [B, T, V]) arrays, in f32.
Every built-in computes logp and the entropy (its kernel's job; the logits
side: `transform_logits`, `token_logp_and_entropy`) and hands them to
`loss_and_aux` / `loss_and_per_token`, the one composition of the per-token
side and the aggregation (`logits/reference.py` shows the whole objective in
order). The deliberately broken fixtures of the suite swap exactly one block.

Version 1 and 2 of docs/spec.md. A v1 config (without the v2 keys) reads every
v2 switch as its v1 value (`setting`) and runs exactly v1's operations: the
v2 blocks (log-ratio clamp, estimators other than v1's k3, ...) are only
traced when the static config asks for them.

Masked positions (mask = 0) may hold anything: token ids like -100, old/ref
log-probs like +-1e9. `safe_token_ids` and `neutralise_masked` replace those
values before any gather or exp, so nothing inf or NaN is ever formed there,
in the forward or the backward, and the aggregation weights (0 there) make
their contribution exactly zero.

Hyperparameters may be traced f32 scalars: no block branches on their values.
"""

import jax
import jax.numpy as jnp

from grpo_kernels import schema

# The switches' values and v2's defaults, from schema.json (grpo_kernels/schema.py).
TEMPERATURE_MODES = schema.switch_values("temperature_mode")
AGGREGATIONS_V1 = schema.switch_values("aggregation", spec_version=1)
AGGREGATIONS = schema.switch_values("aggregation")
RATIO_LEVELS = schema.switch_values("ratio_level")
POLICY_LOSSES = schema.switch_values("policy_loss")
KL_ESTIMATORS = schema.switch_values("kl_estimator")
KL_GRADIENTS = schema.switch_values("kl_gradient")
ENTROPY_AGGREGATIONS = schema.switch_values("entropy_aggregation")
V2_CONFIG_DEFAULTS = schema.V2_CONFIG_DEFAULTS


def setting(config, key):
    """config[key], or a v2 switch's v1 value when config is a v1 one (without it)."""
    return config[key] if key in config else V2_CONFIG_DEFAULTS[key]


def safe_token_ids(mask, tokens):
    """Token ids [B, T] with every masked position set to 0 (a valid id)."""
    return jnp.where(mask > 0, tokens, 0)


ROW_SUM_BLOCK = 128


def blocked_row_sum(terms):
    """Sums over the last axis in two levels: blocks of 128 first, then the block sums.

    XLA:CPU may emit a row reduction as one sequential sum (under shard_map
    it does for the entropy: 1e-5 relative error on a flat row of 3507), whose
    f32 error grows with V. Two explicit levels bound the terms any one sum
    adds to 128 + V / 128, whatever XLA does with each level.
    """
    vocab = terms.shape[-1]
    pad = -vocab % ROW_SUM_BLOCK
    terms = jnp.pad(terms, [(0, 0)] * (terms.ndim - 1) + [(0, pad)])
    blocks = terms.reshape(terms.shape[:-1] + (-1, ROW_SUM_BLOCK))
    return jnp.sum(jnp.sum(blocks, axis=-1), axis=-1)


def log_softmax(scores, row_sum=None):
    """Max-subtracted log-softmax over the last (vocabulary) axis.

    row_sum: None for jax.nn.logsumexp; else a row-sum function (say
    `blocked_row_sum`) applied to exp(scores), for scores already centred
    on their row maximum (as token_logp_and_entropy's are).
    """
    if row_sum is None:
        return scores - jax.nn.logsumexp(scores, axis=-1, keepdims=True)
    return scores - jnp.log(row_sum(jnp.exp(scores)))[..., None]


def transform_logits(logits_f32, hparams, config):
    """The logit transforms of docs/spec.md v2, applied before the temperature, f32 [..., V].

    z' = logit_scale * z, then z'' = c * tanh(z' / c) with c = logit_softcap
    unless c = +inf; z itself when config's logit_transform is false. c may be
    traced: its inf branch is a `where`, with c = 1 in the untaken softcap
    branch so that neither inf * tanh(0) nor its backward forms a NaN.
    """
    if not setting(config, "logit_transform"):
        return logits_f32
    scaled = hparams["logit_scale"] * logits_f32
    cap = jnp.asarray(hparams["logit_softcap"], jnp.float32)
    capped = jnp.isfinite(cap)
    safe_cap = jnp.where(capped, cap, 1.0)
    return jnp.where(capped, safe_cap * jnp.tanh(scaled / safe_cap), scaled)


def token_logp_and_entropy(logits_f32, safe_tokens, temperature, temperature_mode, row_sum=None):
    """(logp, entropy), each [B, T], from f32 logits [B, T, V].

    logits mode: logp = log_softmax(z / tau)[y],  entropy of softmax(z / tau);
    logp mode:   logp = log_softmax(z)[y] / tau,  entropy of softmax(z).

    z is centred on its row maximum before the division by tau: both are
    shift-invariant, and z - max(z) is exact where z / tau would round a
    large common offset (all-negative logits near -1e4) into the result.
    row_sum: how rows are summed (None: jnp.sum and jax.nn.logsumexp; the
    reference's choice; `blocked_row_sum` for an order XLA cannot make sequential).
    """
    centred = logits_f32 - jax.lax.stop_gradient(jnp.max(logits_f32, axis=-1, keepdims=True))
    if temperature_mode == "logits":
        log_probs = log_softmax(centred / temperature, row_sum)
        scale = 1.0
    elif temperature_mode == "logp":
        log_probs = log_softmax(centred, row_sum)
        scale = 1.0 / temperature
    else:
        raise ValueError(
            f"temperature_mode = {temperature_mode!r}; expected one of {TEMPERATURE_MODES}"
        )
    chosen = jnp.take_along_axis(log_probs, safe_tokens[..., None], axis=-1)[..., 0]
    terms = jnp.exp(log_probs) * log_probs
    entropy = -(jnp.sum(terms, axis=-1) if row_sum is None else row_sum(terms))
    return chosen * scale, entropy


class Refusal(NotImplementedError):
    """An unsupported configuration, with the switch it refuses (and the refused value) as data
    (docs/spec.md, "Refusing a configuration"): the suite's plan and coverage read `switch`
    instead of searching the message."""

    def __init__(self, message, switch, value=None):
        super().__init__(message)
        self.switch = switch
        self.value = value


def refuse_unless(implementation, config, key, supported, reason):
    """A Refusal (docs/spec.md: unsupported, raised while tracing) when the v2 switch
    config[key] (its v1 value when absent) is not one of `supported`; reason says why."""
    value = setting(config, key)
    if value not in supported:
        raise Refusal(
            f"{implementation}: {key}={value!r} {reason}; only {' or '.join(map(repr, supported))} "
            "is supported",
            switch=key,
            value=value,
        )


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
    """logp with NaN wherever an unmasked token id is outside [0, V).

    Such an id is bad input (docs/spec.md); NaN makes it loud instead of a silent
    clamp. Masked positions are left alone: any id is allowed there.
    """
    outside = (tokens < 0) | (tokens >= vocab_size)
    return jnp.where((mask > 0) & outside, jnp.nan, logp)


def neutralise_masked(mask, logp, old_logp, ref_logp):
    """(old, ref) log-probs, [B, T], safe to exponentiate against `logp`.

    Absent `old_logp` (on-policy) gives old = stop_gradient(logp), so r = 1.
    At masked positions old and ref become stop_gradient(logp) whatever they
    held, so r = 1 and the KL term is 0 there. `ref` is None when `ref_logp` is.
    """
    detached = jax.lax.stop_gradient(logp)
    valid = mask > 0
    old = detached if old_logp is None else jnp.where(valid, old_logp, detached)
    ref = None if ref_logp is None else jnp.where(valid, ref_logp, detached)
    return old, ref


def clip_branches(logp, old, eps_low, eps_high, delta, two_sided):
    """The two ratios whose advantage-weighted minimum is the PPO objective.

    r = exp(logp - old); unclipped = min(r, delta) when two-sided, else r
    (delta is then ignored); clipped = clip(r, 1 - eps_low, 1 + eps_high).
    """
    ratio = jnp.exp(logp - old)
    unclipped = jnp.minimum(ratio, delta) if two_sided else ratio
    clipped = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    return unclipped, clipped


def ppo_per_token(logp, old, advantages, eps_low, eps_high, delta, two_sided):
    """ppo = -min(min(r, delta) * A, clip(r, 1 - eps_low, 1 + eps_high) * A), [B, T]."""
    unclipped, clipped = clip_branches(logp, old, eps_low, eps_high, delta, two_sided)
    per_sequence = advantages[:, None]
    return -jnp.minimum(unclipped * per_sequence, clipped * per_sequence)


def kl_per_token(logp, ref, beta):
    """The k3 estimator: beta * (exp(ref - logp) - (ref - logp) - 1), [B, T]."""
    log_ratio = ref - logp
    return beta * (jnp.exp(log_ratio) - log_ratio - 1.0)


def sequence_log_ratio(logp, old, mask):
    """L_b = sum_t m (logp - old) / max(sum_t m, 1), [B, 1] (docs/spec.md v2, "Ratio level")."""
    count = jnp.maximum(jnp.sum(mask, axis=1, keepdims=True), 1.0)
    return jnp.sum(mask * (logp - old), axis=1, keepdims=True) / count


def ratio_exponents(logp, old, mask, hparams, config):
    """(a, b) with log r_t = a - b (docs/spec.md v2, "Ratio level"); a is [B, T], b [B, T] or 0.

    token:          a = clamp(logp - old)
    sequence:       a = clamp(L_b) for every t
    sequence_token: a = clamp(sg(L_b) + (logp - sg(logp)))   (value L_b, gradient per token)
    clamp = clip to [log_ratio_min, log_ratio_max]. A v1 call (no log-ratio
    hparams, token level) gets (logp, old) itself: the ratio then comes from
    exactly v1's operations, exp(logp - old). The pair feeds `clip_branches`
    and `ppo_per_token`, which form r = exp(a - b).
    """
    level = setting(config, "ratio_level")
    if level == "token":
        if "log_ratio_min" not in hparams and "log_ratio_max" not in hparams:
            return logp, old
        exponent = logp - old
    elif level == "sequence":
        exponent = jnp.broadcast_to(sequence_log_ratio(logp, old, mask), logp.shape)
    elif level == "sequence_token":
        detached = jax.lax.stop_gradient
        exponent = detached(sequence_log_ratio(logp, old, mask)) + (logp - detached(logp))
    else:
        raise ValueError(f"ratio_level = {level!r}; expected one of {RATIO_LEVELS}")
    low = hparams.get("log_ratio_min", -jnp.inf)
    high = hparams.get("log_ratio_max", jnp.inf)
    return jnp.clip(exponent, low, high), 0.0


def policy_per_token(logp, exponents, advantages, hparams, config):
    """The policy term of docs/spec.md v2 ("Policy loss"), [B, T], with r = exp(a - b) of `exponents`.

    ppo:   v1's ppo_per_token (delta only when two_sided);
    cispo: -sg(clip(r, 1 - eps_low, 1 + eps_high)) * A * logp   (the token's own logp);
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
        return -jax.lax.stop_gradient(clipped) * per_sequence * logp
    if kind == "sapo":
        ratio = jnp.exp(ratio_exponent - ratio_offset)
        k = jnp.where(per_sequence > 0, hparams["sapo_tau_pos"], hparams["sapo_tau_neg"])
        return -jax.nn.sigmoid(k * (ratio - 1.0)) * (4.0 / k) * per_sequence
    raise ValueError(f"policy_loss = {kind!r}; expected one of {POLICY_LOSSES}")


def half_square(log_ratio):
    """The k2 estimator d^2 / 2."""
    return 0.5 * jnp.square(log_ratio)


def kl_estimate(logp, ref, hparams, config):
    """The KL estimate of docs/spec.md v2 before `times r` and `times beta`, [B, T]; d = ref - logp.

    k1: -d;  abs: |d|;  k2: d^2 / 2;  k3: exp(dc) - dc - 1 with dc = clip(d, +-kl_log_ratio_clamp),
    then clipped to [-kl_max, kl_max]. kl_gradient "k2": k2(d) + sg(estimate - k2(d)).
    """
    log_ratio = ref - logp
    estimator = setting(config, "kl_estimator")
    if estimator == "k1":
        estimate = -log_ratio
    elif estimator == "abs":
        estimate = jnp.abs(log_ratio)
    elif estimator == "k2":
        estimate = half_square(log_ratio)
    elif estimator == "k3":
        bound = hparams["kl_log_ratio_clamp"]
        clamped = jnp.clip(log_ratio, -bound, bound)
        # With a finite kl_max, d is also capped where k3 is past it for sure
        # (k3(2 log(kl_max + 2)) > kl_max), and below f32 exp's overflow: the
        # value there is kl_max either way, and its gradient 0, not 0 * inf
        # (exp(d) of an uncapped d past 88.7 is inf: verl #751's shape).
        kl_max = jnp.asarray(hparams["kl_max"], jnp.float32)
        cap = jnp.where(jnp.isfinite(kl_max), jnp.minimum(2.0 * jnp.log(kl_max + 2.0), 88.0), jnp.inf)
        clamped = jnp.minimum(clamped, cap)
        # v1's k3 block (one formula for both versions) on the clamped d: ref - logp = dc - 0.
        estimate = kl_per_token(0.0, clamped, 1.0)
        estimate = jnp.clip(estimate, -hparams["kl_max"], hparams["kl_max"])
    else:
        raise ValueError(f"kl_estimator = {estimator!r}; expected one of {KL_ESTIMATORS}")
    gradient = setting(config, "kl_gradient")
    if gradient == "k2":
        surrogate = half_square(log_ratio)
        estimate = surrogate + jax.lax.stop_gradient(estimate - surrogate)
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
        estimate = estimate * jnp.exp(ratio_exponent - ratio_offset)
    return hparams["beta"] * estimate


def rollout_weights(mask, is_weights, shape):
    """The rollout-correction weights [B, T]: constants (stop_gradient), 0 where masked."""
    if is_weights is None:
        raise ValueError("config['rollout_correction'] is true but is_weights is None")
    weights = jnp.broadcast_to(jax.lax.stop_gradient(is_weights), shape)
    return jnp.where(mask > 0, weights, 0.0)


def policy_and_kl(logp, mask, old, ref, advantages, is_weights, hparams, config):
    """policy_t + kl_t of docs/spec.md (v1, or v2 with any switches), [B, T]; kl only when config['kl']."""
    exponents = ratio_exponents(logp, old, mask, hparams, config)
    loss = policy_per_token(logp, exponents, advantages, hparams, config)
    if setting(config, "rollout_correction"):
        loss = rollout_weights(mask, is_weights, loss.shape) * loss
    if config["kl"]:
        loss = loss + kl_term(logp, ref, exponents, hparams, config)
    return loss


def loss_and_per_token(logp, entropy, mask, old, ref, advantages, is_weights, hparams, config,
                       weights=None, token_mean_weights=None):
    """(loss, loss_t) of docs/spec.md: the per-token side and the aggregation, for every built-in.

    logp, entropy, mask, old, ref [R, C] (old/ref from `neutralise_masked`);
    advantages [R], one per row (a sequence, or a token in [n, 1] columns);
    is_weights [R, C] / [R, 1] or None. loss_t = policy_t + kl_t - entropy_coef * ent_t.
    weights: the aggregation weights w (default `aggregation_weights`; the
    sharded paths pass their global ones), loss = sum(w * loss_t) when
    entropy_aggregation is "same"; for "token_mean" the entropy is averaged
    with token_mean_weights (default token_mean's w) instead:
    loss = sum(w * (policy_t + kl_t)) - entropy_coef * sum(w_tm * ent).
    A v1 config (no v2 keys) runs exactly v1's operations.
    """
    loss_t = policy_and_kl(logp, mask, old, ref, advantages, is_weights, hparams, config)
    if weights is None:
        weights = aggregation_weights(mask, config["aggregation"], hparams["normalizer"])
    if not config["entropy_bonus"]:
        return jnp.sum(weights * loss_t), loss_t
    with_entropy = loss_t - hparams["entropy_coef"] * entropy
    aggregation = setting(config, "entropy_aggregation")
    if aggregation == "same":
        return jnp.sum(weights * with_entropy), with_entropy
    if aggregation != "token_mean":
        raise ValueError(
            f"entropy_aggregation = {aggregation!r}; expected one of {ENTROPY_AGGREGATIONS}"
        )
    if token_mean_weights is None:
        token_mean_weights = aggregation_weights(mask, "token_mean", hparams["normalizer"])
    entropy_mean = jnp.sum(token_mean_weights * entropy)
    return jnp.sum(weights * loss_t) - hparams["entropy_coef"] * entropy_mean, with_entropy


def loss_and_aux(logp, entropy, *, tokens, mask, advantages, old_logp, ref_logp, is_weights,
                 vocab, hparams, config, weights=None, token_mean_weights=None):
    """(loss, {"logp", "per_token_loss", "entropy"}) of the adapter from a kernel's logp and entropy.

    logp poisoned at unmasked ids outside [0, vocab), old/ref neutralised at
    masked positions, then `loss_and_per_token` (which see for the shapes and
    the optional weights).
    """
    logp = poison_out_of_vocab(logp, mask, tokens, vocab)
    old, ref = neutralise_masked(mask, logp, old_logp, ref_logp)
    loss, loss_t = loss_and_per_token(
        logp, entropy, mask, old, ref, advantages, is_weights, hparams, config,
        weights, token_mean_weights,
    )
    return loss, {"logp": logp, "per_token_loss": loss_t, "entropy": entropy}


def per_token_loss(logp, entropy, old, ref, advantages, hparams, config, mask=None, is_weights=None):
    """loss_t = policy_t + kl_t - entropy_coef * entropy (each term only when its switch is on).

    `loss_and_per_token` without the aggregation, for callers that aggregate
    themselves; mask is needed only at the sequence ratio levels and for
    rollout correction.
    """
    if mask is None:
        mask = jnp.ones_like(logp)
    loss = policy_and_kl(logp, mask, old, ref, advantages, is_weights, hparams, config)
    if config["entropy_bonus"]:
        loss = loss - hparams["entropy_coef"] * entropy
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
        return mask / jnp.maximum(jnp.sum(mask), 1.0)
    if aggregation == "seq_mean_token_mean":
        per_row = jnp.maximum(jnp.sum(mask, axis=1, keepdims=True), 1.0)
        return mask / (mask.shape[0] * per_row)
    if aggregation == "sum_over_constant":
        return mask / normalizer
    if aggregation == "seq_mean_token_mean_over_constant":
        per_row = jnp.maximum(jnp.sum(mask, axis=1, keepdims=True), 1.0)
        return mask / (per_row * normalizer)
    raise ValueError(f"aggregation = {aggregation!r}; expected one of {AGGREGATIONS}")
