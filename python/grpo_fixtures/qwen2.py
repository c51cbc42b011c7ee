"""Qwen2 in JAX: a forward from a Hugging Face checkpoint and a KV-cache sampler.

The architecture (Qwen2ForCausalLM; Qwen2.5 is the same) per layer, with x
the residual stream:

    a = RMSNorm(x); q, k, v = a Wq + bq, a Wk + bk, a Wv + bv
    q, k = RoPE(q), RoPE(k)            HF "rotate_half": x cos + [-x2, x1] sin
    x = x + softmax(q k^T / sqrt(D), causal) v Wo     grouped-query: nH / nKV query heads per KV head
    x = x + (silu(RMSNorm(x) Wg) * RMSNorm(x) Wu) Wd
    hidden = RMSNorm_final(x);  logits = hidden @ lm_head   (lm_head [H, V] = embed^T when tied)

RMSNorm(x) = w * x / sqrt(mean(x^2) + eps), computed in f32. Activations are
in `dtype` (float32 by default; bfloat16 halves the memory of a 1.5B model
on a small accelerator); matmuls accumulate in f32.

`sample` is the rollout a GRPO step trains on: it records, for each
completion position t, the final-norm hidden state that predicts token t
(rounded to bf16: the fixture's `hidden`), the token drawn from
softmax(z / tau) with z = hidden_bf16 @ lm_head_bf16 in f32 (the fused
kind's logits, docs/spec.md), and log softmax(z / tau)[token] in f32 (the
fixture's `old_logp`). One prefill of the prompt, then one token per step
against a KV cache, so a 1.5B model at T = 8192 is a single compiled loop.
`qwen2_numpy` is the independent float64 check of this forward.
"""

import dataclasses
import functools
import json
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from grpo_fixtures import tensor_files

F32 = jnp.float32
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
REQUIRED_KEYS = (
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "rms_norm_eps", "vocab_size",
)
# The id a padding position of `tokens` holds (as TRL and most samplers do).
PAD_TOKEN = -100


@dataclasses.dataclass(frozen=True)
class Qwen2Config:
    """The config.json values the architecture needs (HF defaults where a key may be absent)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    rms_norm_eps: float
    vocab_size: int
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 32768
    eos_token_ids: tuple = ()
    # bos / eos / pad ids the config names: random prompts are drawn below the smallest.
    special_token_ids: tuple = ()

    @property
    def head_dim(self):
        return self.hidden_size // self.num_attention_heads


def load_config(model_dir):
    """Qwen2Config from model_dir/config.json; ValueError naming the file for what is unsupported."""
    path = os.path.join(model_dir, "config.json")
    try:
        with open(path) as stream:
            raw = json.load(stream)
    except OSError as error:
        raise ValueError(f"{path}: cannot read the model config: {error.strerror or error}") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not JSON: {error}") from None
    missing = [key for key in REQUIRED_KEYS if key not in raw]
    if missing:
        raise ValueError(f"{path}: missing {missing}; is this a Qwen2 config?")
    if raw.get("model_type", "qwen2") != "qwen2":
        raise ValueError(f"{path}: model_type = {raw['model_type']!r}; this forward implements 'qwen2' only")
    if raw.get("use_sliding_window"):
        raise ValueError(f"{path}: use_sliding_window = true is not implemented (Qwen2.5 checkpoints ship false)")
    if raw.get("rope_scaling"):
        raise ValueError(f"{path}: rope_scaling = {raw['rope_scaling']!r} is not implemented")
    heads = raw["num_attention_heads"]
    if raw["hidden_size"] % heads or heads % raw["num_key_value_heads"]:
        raise ValueError(
            f"{path}: hidden_size {raw['hidden_size']}, num_attention_heads {heads}, num_key_value_heads "
            f"{raw['num_key_value_heads']}: heads must divide hidden_size and KV heads must divide heads"
        )
    if raw.get("head_dim", raw["hidden_size"] // heads) != raw["hidden_size"] // heads:
        raise ValueError(f"{path}: head_dim = {raw['head_dim']} != hidden_size / num_attention_heads")

    def ids(key):
        value = raw.get(key)
        return () if value is None else tuple(value) if isinstance(value, list) else (value,)

    return Qwen2Config(
        hidden_size=raw["hidden_size"],
        intermediate_size=raw["intermediate_size"],
        num_hidden_layers=raw["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=raw["num_key_value_heads"],
        rms_norm_eps=float(raw["rms_norm_eps"]),
        vocab_size=raw["vocab_size"],
        rope_theta=float(raw.get("rope_theta", 10000.0)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        max_position_embeddings=raw.get("max_position_embeddings", 32768),
        eos_token_ids=ids("eos_token_id"),
        special_token_ids=tuple(sorted(set(ids("bos_token_id") + ids("eos_token_id") + ids("pad_token_id")))),
    )


class Qwen2Model(NamedTuple):
    config: Qwen2Config
    params: dict  # see load_model
    lm_head: jax.Array  # [H, V], stored dtype (bf16 for Qwen2.5): the sampler's logits
    lm_head_source: "LMHead"


class LMHead(NamedTuple):
    """The LM head in [H, V] layout (logits = hidden @ lm_head), in the checkpoint's dtype."""

    array: np.ndarray
    sha256: str
    tensor: str  # the checkpoint tensor it is the transpose of
    dtype: str  # safetensors name, e.g. "BF16"


def checkpoint_lm_head(model_dir, config=None):
    """The [H, V] LM head of a checkpoint: lm_head.weight^T, or embed_tokens.weight^T when tied.

    HF stores both as [V, H]; the transpose is materialised (C order) so its
    bytes are what the sha256 covers, in the stored dtype.
    """
    config = config or load_config(model_dir)
    checkpoint = tensor_files.Checkpoint(model_dir)
    tensor = "model.embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight"
    stored = checkpoint.get(tensor)
    if stored.shape != (config.vocab_size, config.hidden_size):
        raise ValueError(
            f"{model_dir}: {tensor} has shape {list(stored.shape)}; expected [V, H] = "
            f"[{config.vocab_size}, {config.hidden_size}]"
        )
    array = np.ascontiguousarray(stored.T)
    return LMHead(array, tensor_files.tensor_sha256(array), tensor, tensor_files.dtype_name(array.dtype))


def load_model(model_dir, dtype="float32"):
    """Config, parameters in `dtype` (norm weights f32) and the LM head, from a HF checkpoint.

    params = {"embed": [V, H], "final_norm": [H], "layers": {name: [L, ...]}}
    with every projection transposed to [in, out] (y = x @ W + b) and the
    layers stacked for a lax.scan.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype = {dtype!r}; expected one of {sorted(DTYPES)}")
    config = load_config(model_dir)
    checkpoint = tensor_files.Checkpoint(model_dir)
    np_dtype = np.float32 if dtype == "float32" else ml_dtypes.bfloat16

    def weight(name, transpose=False, norm=False):
        array = checkpoint.get(name)
        array = array.T if transpose else array
        return np.asarray(array, dtype=np.float32 if norm else np_dtype)

    def stacked(suffix, transpose=False, norm=False):
        return jnp.asarray(np.stack([
            weight(f"model.layers.{layer}.{suffix}", transpose, norm)
            for layer in range(config.num_hidden_layers)
        ]))

    layers = {
        "input_norm": stacked("input_layernorm.weight", norm=True),
        "post_norm": stacked("post_attention_layernorm.weight", norm=True),
        "o_w": stacked("self_attn.o_proj.weight", transpose=True),
        "gate_w": stacked("mlp.gate_proj.weight", transpose=True),
        "up_w": stacked("mlp.up_proj.weight", transpose=True),
        "down_w": stacked("mlp.down_proj.weight", transpose=True),
    }
    for name in ("q", "k", "v"):
        layers[f"{name}_w"] = stacked(f"self_attn.{name}_proj.weight", transpose=True)
        layers[f"{name}_b"] = stacked(f"self_attn.{name}_proj.bias")
    params = {
        "embed": jnp.asarray(weight("model.embed_tokens.weight")),
        "final_norm": jnp.asarray(weight("model.norm.weight", norm=True)),
        "layers": layers,
    }
    head = checkpoint_lm_head(model_dir, config)
    return Qwen2Model(config, params, jnp.asarray(head.array), head)


def _dot(x, w):
    """x @ w with f32 accumulation, returned in x's dtype (HIGHEST: true f32 on TPU too)."""
    out = jnp.matmul(x, w.astype(x.dtype), precision=jax.lax.Precision.HIGHEST, preferred_element_type=F32)
    return out.astype(x.dtype)


def _rms_norm(x, weight, eps):
    x32 = x.astype(F32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (weight * normed).astype(x.dtype)


def _rotary(positions, head_dim, theta):
    """(cos, sin), each [B, S, D], of HF's Qwen2 rotary embedding at positions [B, S] (f32, as HF computes it)."""
    inverse_frequency = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=F32) / head_dim))
    angles = positions.astype(F32)[..., None] * inverse_frequency
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def _apply_rotary(x, cos, sin):
    """x [B, S, heads, D] rotated: x cos + rotate_half(x) sin, rotate_half(x) = [-x2, x1]."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    out = x.astype(F32) * cos[:, :, None, :] + rotated.astype(F32) * sin[:, :, None, :]
    return out.astype(x.dtype)


def _attention(config, p, x, layer, start, cos, sin, cache_k, cache_v, pad):
    """Causal GQA of x [B, S, H] in slots start.., against the KV cache of `layer`.

    The cache [L, B, S_max, nKV, D] is indexed by slot, so the causal mask
    (key slot <= query slot) also hides the slots not written yet; row b's
    first pad[b] slots are left padding, hidden from every query. Only the S
    new rows of this layer are written.
    """
    batch, length, _ = x.shape
    heads, kv_heads, head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    q = (_dot(x, p["q_w"]) + p["q_b"].astype(x.dtype)).reshape(batch, length, heads, head_dim)
    k = (_dot(x, p["k_w"]) + p["k_b"].astype(x.dtype)).reshape(batch, length, kv_heads, head_dim)
    v = (_dot(x, p["v_w"]) + p["v_b"].astype(x.dtype)).reshape(batch, length, kv_heads, head_dim)
    q, k = _apply_rotary(q, cos, sin), _apply_rotary(k, cos, sin)
    cache_k = jax.lax.dynamic_update_slice(cache_k, k[None].astype(cache_k.dtype), (layer, 0, start, 0, 0))
    cache_v = jax.lax.dynamic_update_slice(cache_v, v[None].astype(cache_v.dtype), (layer, 0, start, 0, 0))
    keys, values = cache_k[layer], cache_v[layer]  # [B, S_max, nKV, D]

    grouped = q.reshape(batch, length, kv_heads, heads // kv_heads, head_dim)
    scores = jnp.einsum(
        "bsngd,btnd->bngst", grouped, keys,
        precision=jax.lax.Precision.HIGHEST, preferred_element_type=F32,
    ) / np.sqrt(head_dim)
    query_slots = start + jnp.arange(length)
    key_slots = jnp.arange(keys.shape[1])
    allowed = (key_slots[None, None, :] <= query_slots[None, :, None]) & (
        key_slots[None, None, :] >= pad[:, None, None]
    )  # [B, S, S_max]
    scores = jnp.where(allowed[:, None, None], scores, jnp.finfo(F32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(x.dtype)
    out = jnp.einsum(
        "bngst,btnd->bsngd", probs, values,
        precision=jax.lax.Precision.HIGHEST, preferred_element_type=F32,
    ).astype(x.dtype)
    return _dot(out.reshape(batch, length, heads * head_dim), p["o_w"]), cache_k, cache_v


def _mlp(p, x):
    gate = _dot(x, p["gate_w"])
    return _dot(jax.nn.silu(gate) * _dot(x, p["up_w"]), p["down_w"])


def _decode(config, params, token_ids, start, cache, pad):
    """Final-norm hidden states [B, S, H] of token_ids [B, S] in slots start..start+S-1.

    cache = (k, v), each [L, B, S_max, nKV, D], holds slots < start and gets
    slots start.. written; returns (hidden, cache). Row b's first pad[b]
    slots are left padding (their ids are ignored): its token in slot s sits
    at position s - pad[b], so every row's first real token is at position 0,
    as if it had been run alone.
    """
    x = params["embed"][jnp.maximum(token_ids, 0)]
    positions = start + jnp.arange(token_ids.shape[1])[None, :] - pad[:, None]
    cos, sin = _rotary(positions, config.head_dim, config.rope_theta)

    def layer_step(carry, p):
        x, cache_k, cache_v, layer = carry
        attn, cache_k, cache_v = _attention(
            config, p, _rms_norm(x, p["input_norm"], config.rms_norm_eps), layer, start, cos, sin, cache_k, cache_v,
            pad,
        )
        x = x + attn
        x = x + _mlp(p, _rms_norm(x, p["post_norm"], config.rms_norm_eps))
        return (x, cache_k, cache_v, layer + 1), None

    (x, cache_k, cache_v, _), _ = jax.lax.scan(layer_step, (x, *cache, 0), params["layers"])
    return _rms_norm(x, params["final_norm"], config.rms_norm_eps), (cache_k, cache_v)


def _empty_cache(config, batch, length, dtype):
    shape = (config.num_hidden_layers, batch, length, config.num_key_value_heads, config.head_dim)
    return jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)


@functools.partial(jax.jit, static_argnames=("config",))
def _hidden_states(params, token_ids, *, config):
    dtype = params["embed"].dtype
    no_padding = jnp.zeros(token_ids.shape[:1], jnp.int32)
    hidden, _ = _decode(config, params, token_ids, 0, _empty_cache(config, *token_ids.shape, dtype), no_padding)
    return hidden


def hidden_states(model, token_ids):
    """Final-norm hidden states [B, S, H] (model dtype) of token_ids [B, S], positions 0..S-1."""
    return _hidden_states(model.params, jnp.asarray(token_ids, jnp.int32), config=model.config)


class Samples(NamedTuple):
    """A rollout of T completion tokens per row; padding after a row's end-of-sequence."""

    hidden: np.ndarray  # [B, T, H] bf16, 0 at padding
    tokens: np.ndarray  # [B, T] int32, PAD_TOKEN at padding
    mask: np.ndarray  # [B, T] f32 in {0, 1}; the end-of-sequence token itself has mask 1
    old_logp: np.ndarray  # [B, T] f32, log softmax(z / tau)[token], 0 at padding
    max_prob: np.ndarray  # [B, T] f32, max of softmax(z / tau)
    rank: np.ndarray  # [B, T] int32, #{v : z_v > z_token} (0 = the argmax)
    steps: int  # decoding steps run (< T when every row ended early)


@functools.partial(jax.jit, static_argnames=("config", "num_tokens", "eos_token_ids"))
def _sample(params, lm_head, prompts, pad, key, temperature, *, config, num_tokens, eos_token_ids):
    batch, prompt_len = prompts.shape
    dtype = params["embed"].dtype
    cache = _empty_cache(config, batch, prompt_len + num_tokens, dtype)
    hidden, cache = _decode(config, params, prompts, 0, cache, pad)
    eos = jnp.asarray(eos_token_ids if eos_token_ids else (-1,), jnp.int32)
    outputs = (
        jnp.zeros((batch, num_tokens, config.hidden_size), jnp.bfloat16),
        jnp.full((batch, num_tokens), PAD_TOKEN, jnp.int32),
        jnp.zeros((batch, num_tokens), F32),
        jnp.zeros((batch, num_tokens), F32),
        jnp.zeros((batch, num_tokens), F32),
        jnp.zeros((batch, num_tokens), jnp.int32),
    )

    def unfinished(state):
        step, _, _, done, _ = state
        return (step < num_tokens) & ~jnp.all(done)

    def step_once(state):
        step, last_hidden, cache, done, outputs = state
        h = last_hidden.astype(jnp.bfloat16)
        logits = jnp.matmul(h, lm_head, preferred_element_type=F32)  # [B, V]
        # Centred before dividing by tau, as objective.token_logp_and_entropy does.
        scaled = (logits - jnp.max(logits, axis=-1, keepdims=True)) / temperature
        log_probs = jax.nn.log_softmax(scaled, axis=-1)
        token = jax.random.categorical(jax.random.fold_in(key, step), scaled, axis=-1).astype(jnp.int32)
        chosen_logp = jnp.take_along_axis(log_probs, token[:, None], axis=-1)[:, 0]
        chosen_logit = jnp.take_along_axis(logits, token[:, None], axis=-1)
        rank = jnp.sum(logits > chosen_logit, axis=-1).astype(jnp.int32)
        active = ~done
        columns = (
            jnp.where(active[:, None], h, jnp.zeros_like(h)),
            jnp.where(active, token, PAD_TOKEN),
            active.astype(F32),
            jnp.where(active, chosen_logp, 0.0),
            jnp.where(active, jnp.exp(jnp.max(log_probs, axis=-1)), 0.0),
            jnp.where(active, rank, 0),
        )
        outputs = tuple(out.at[:, step].set(column) for out, column in zip(outputs, columns))
        done = done | (active & jnp.isin(token, eos))
        next_hidden, cache = _decode(config, params, token[:, None], prompt_len + step, cache, pad)
        return step + 1, next_hidden[:, 0], cache, done, outputs

    state = (jnp.int32(0), hidden[:, -1], cache, jnp.zeros((batch,), bool), outputs)
    steps, _, _, _, outputs = jax.lax.while_loop(unfinished, step_once, state)
    return steps, outputs


def left_padded(prompts):
    """([B, P] int32 left-padded with PAD_TOKEN, pad [B]) of a list of prompts (id lists) of any lengths."""
    lengths = [len(p) for p in prompts]
    if not prompts or min(lengths) < 1:
        raise ValueError(f"prompt lengths {lengths}: every row needs a prompt of at least one token")
    width = max(lengths)
    padded = np.full((len(prompts), width), PAD_TOKEN, np.int32)
    for row, prompt in enumerate(prompts):
        padded[row, width - len(prompt):] = prompt
    return padded, np.asarray([width - n for n in lengths], np.int32)


def sample(model, prompts, num_tokens, temperature, eos_token_ids, seed, pad=None):
    """Sample num_tokens completion tokens per row of prompts [B, P] at temperature tau.

    Rows stop after the first token in eos_token_ids (that token has mask 1;
    the positions after it are padding); an empty tuple never stops. The
    random stream is jax.random.key(seed), folded with the step index.
    Prompts of different lengths are left-padded (`left_padded`): row b's
    first pad[b] ids are PAD_TOKEN, and its prompt sits at positions
    0..P - pad[b] - 1, its completion token t at P - pad[b] + t, exactly as
    if the row had been sampled alone (the padding is masked out of attention).
    """
    prompts = np.asarray(prompts, np.int32)
    if prompts.ndim != 2 or prompts.shape[1] < 1:
        raise ValueError(f"prompts has shape {list(prompts.shape)}; expected [B, P] with P >= 1")
    pad = np.zeros(prompts.shape[0], np.int32) if pad is None else np.asarray(pad, np.int32)
    if pad.shape != prompts.shape[:1] or pad.min() < 0 or pad.max() >= prompts.shape[1]:
        raise ValueError(f"pad = {pad.tolist()}; expected [B] counts in [0, P) with P = {prompts.shape[1]}")
    real = np.arange(prompts.shape[1])[None, :] >= pad[:, None]
    if np.any(real & ((prompts < 0) | (prompts >= model.config.vocab_size))):
        raise ValueError(
            f"prompt token ids span [{prompts[real].min()}, {prompts[real].max()}]; "
            f"expected [0, {model.config.vocab_size})"
        )
    if np.any(~real & (prompts != PAD_TOKEN)):
        raise ValueError(f"the left padding of the prompts must hold {PAD_TOKEN}")
    if not temperature > 0:
        raise ValueError(f"temperature = {temperature}; must be > 0")
    total = prompts.shape[1] + num_tokens
    if total > model.config.max_position_embeddings:
        raise ValueError(
            f"prompt length {prompts.shape[1]} + {num_tokens} tokens = {total} exceeds "
            f"max_position_embeddings = {model.config.max_position_embeddings}"
        )
    steps, outputs = _sample(
        model.params, model.lm_head, jnp.asarray(prompts), jnp.asarray(pad), jax.random.key(seed),
        jnp.float32(temperature), config=model.config, num_tokens=num_tokens,
        eos_token_ids=tuple(int(i) for i in eos_token_ids),
    )
    return Samples(*(np.asarray(out) for out in outputs), steps=int(steps))
