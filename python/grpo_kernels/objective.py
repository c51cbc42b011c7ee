"""The GRPO objective of SPEC.md as small pure-JAX building blocks.

Each block is one formula of SPEC.md on [B, T] (or [B, T, V]) arrays, in f32.
Implementations compose them (`logits/reference.py` shows the whole objective in
order); a kernel that computes some quantity its own way (say `logp` and the
entropy, tile by tile) reuses the rest. The deliberately broken fixtures of
the suite swap exactly one block.

Masked positions (mask = 0) may hold anything: token ids like -100, old/ref
log-probs like +-1e9. `safe_token_ids` and `neutralise_masked` replace those
values before any gather or exp, so nothing inf or NaN is ever formed there,
in the forward or the backward, and the aggregation weights (0 there) make
their contribution exactly zero.

Hyperparameters may be traced f32 scalars: no block branches on their values.
"""

import jax
import jax.numpy as jnp

TEMPERATURE_MODES = ("logits", "logp")
AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "sum_over_constant")


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

    Such an id is bad input (SPEC.md); NaN makes it loud instead of a silent
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


def per_token_loss(logp, entropy, old, ref, advantages, hparams, config):
    """loss_t = ppo + kl - entropy_coef * entropy, each term only when its switch is on."""
    loss = ppo_per_token(
        logp,
        old,
        advantages,
        hparams["eps_low"],
        hparams["eps_high"],
        hparams["delta"],
        config["two_sided"],
    )
    if config["kl"]:
        if ref is None:
            raise ValueError("config['kl'] is true but ref_logp is None")
        loss = loss + kl_per_token(logp, ref, hparams["beta"])
    if config["entropy_bonus"]:
        loss = loss - hparams["entropy_coef"] * entropy
    return loss


def aggregation_weights(mask, aggregation, normalizer):
    """Weights w [B, T] with loss = sum(w * loss_t) (SPEC.md, "Aggregation").

    token_mean:          m / max(sum m, 1)
    seq_mean_token_mean: m / (B * max(sum_t m, 1))
    sum_over_constant:   m / normalizer
    A fully masked batch gets w = 0: loss 0 and exactly-zero gradients.
    """
    if aggregation == "token_mean":
        return mask / jnp.maximum(jnp.sum(mask), 1.0)
    if aggregation == "seq_mean_token_mean":
        per_row = jnp.maximum(jnp.sum(mask, axis=1, keepdims=True), 1.0)
        return mask / (mask.shape[0] * per_row)
    if aggregation == "sum_over_constant":
        return mask / normalizer
    raise ValueError(f"aggregation = {aggregation!r}; expected one of {AGGREGATIONS}")
