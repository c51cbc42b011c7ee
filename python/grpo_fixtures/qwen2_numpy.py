"""An independent float64 NumPy forward of the Qwen2 architecture: the check on `qwen2`.

Written from the architecture's definition, sharing nothing with the JAX
forward but the checkpoint reader (tensor_files): the whole sequence at once, no KV
cache, every weight widened to float64. `check_forward` (the `check-forward`
command) compares the two on a checkpoint small enough for this to be
quick, and compares a fixture's recorded hidden states (taken one token at
a time from the sampler's KV cache) with a full-sequence forward of the
sampled text.

Per layer, with x the residual stream [S, H]:

    a = RMSNorm(x) ; q, k, v = a Wq^T + bq, a Wk^T + bk, a Wv^T + bv
    q, k = rotate(q), rotate(k)      HF rotate_half: x cos + [-x2, x1] sin
    x = x + softmax(q k^T / sqrt(D) + causal) v  Wo^T     (KV head = head // (nH / nKV))
    x = x + (silu(RMSNorm(x) Wg^T) * (RMSNorm(x) Wu^T)) Wd^T
    hidden = RMSNorm_final(x),   RMSNorm(x) = w * x / sqrt(mean(x^2) + eps)
"""

import json
import os

import ml_dtypes
import numpy as np

from grpo_fixtures import fixture, tensor_files


class _Float64Weights:
    """A checkpoint's tensors widened to float64 as they are read, none kept:
    a 1.5B model is 12 GB in float64, one layer's weights 0.4 GB."""

    def __init__(self, checkpoint):
        self.checkpoint = checkpoint

    def __getitem__(self, name):
        return np.asarray(self.checkpoint.get(name), dtype=np.float64)


class NumpyQwen2:
    """Weights of a Qwen2 checkpoint in float64 and the full-sequence forward."""

    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "config.json")) as stream:
            self.config = json.load(stream)
        self.weights = _Float64Weights(tensor_files.Checkpoint(model_dir))
        c = self.config
        self.heads = c["num_attention_heads"]
        self.kv_heads = c["num_key_value_heads"]
        self.head_dim = c["hidden_size"] // self.heads
        self.eps = c["rms_norm_eps"]
        self.theta = c.get("rope_theta", 10000.0)

    def _rms_norm(self, x, weight):
        return weight * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps)

    def _rotate(self, x, positions):
        """Rotary embedding of x [S, heads, D] at absolute positions [S], HF rotate_half pairing."""
        half = self.head_dim // 2
        inverse_frequency = self.theta ** (-np.arange(half, dtype=np.float64) * 2.0 / self.head_dim)
        angles = positions[:, None].astype(np.float64) * inverse_frequency[None, :]
        cos = np.cos(angles)[:, None, :]
        sin = np.sin(angles)[:, None, :]
        first, second = x[..., :half], x[..., half:]
        return np.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)

    def _attention(self, x, prefix, positions):
        w = self.weights
        length = x.shape[0]
        q = x @ w[prefix + "q_proj.weight"].T + w[prefix + "q_proj.bias"]
        k = x @ w[prefix + "k_proj.weight"].T + w[prefix + "k_proj.bias"]
        v = x @ w[prefix + "v_proj.weight"].T + w[prefix + "v_proj.bias"]
        q = self._rotate(q.reshape(length, self.heads, self.head_dim), positions)
        k = self._rotate(k.reshape(length, self.kv_heads, self.head_dim), positions)
        v = v.reshape(length, self.kv_heads, self.head_dim)
        group = self.heads // self.kv_heads
        future = positions[None, :] > positions[:, None]
        out = np.empty_like(q)
        for head in range(self.heads):
            kv = head // group
            scores = q[:, head, :] @ k[:, kv, :].T / np.sqrt(self.head_dim)
            scores = np.where(future, -np.inf, scores)
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            out[:, head, :] = (scores / scores.sum(axis=-1, keepdims=True)) @ v[:, kv, :]
        return out.reshape(length, -1) @ w[prefix + "o_proj.weight"].T

    def _mlp(self, x, prefix):
        w = self.weights
        gate = x @ w[prefix + "gate_proj.weight"].T
        up = x @ w[prefix + "up_proj.weight"].T
        return (gate / (1.0 + np.exp(-gate)) * up) @ w[prefix + "down_proj.weight"].T

    def hidden_states(self, token_ids):
        """Final-norm hidden states [B, S, H] float64 of token ids [B, S] (positions 0..S-1)."""
        token_ids = np.asarray(token_ids)
        positions = np.arange(token_ids.shape[1])
        embed = self.weights["model.embed_tokens.weight"]
        rows = [embed[row] for row in token_ids]
        del embed
        for layer in range(self.config["num_hidden_layers"]):  # layer by layer: each layer's weights read once
            prefix = f"model.layers.{layer}."
            for i, x in enumerate(rows):
                attn_in = self._rms_norm(x, self.weights[prefix + "input_layernorm.weight"])
                x = x + self._attention(attn_in, prefix + "self_attn.", positions)
                mlp_in = self._rms_norm(x, self.weights[prefix + "post_attention_layernorm.weight"])
                rows[i] = x + self._mlp(mlp_in, prefix + "mlp.")
        norm = self.weights["model.norm.weight"]
        return np.stack([self._rms_norm(x, norm) for x in rows])

    def lm_head(self):
        """[H, V] float64: lm_head.weight^T, or embed_tokens.weight^T when tied."""
        tied = self.config.get("tie_word_embeddings", False)
        return self.weights["model.embed_tokens.weight" if tied else "lm_head.weight"].T


def _relative_error(approx, exact):
    """max |approx - exact| / max |exact|, over the last axis, worst row."""
    approx = np.asarray(approx, np.float64)
    scale = np.max(np.abs(exact), axis=-1)
    return float(np.max(np.max(np.abs(approx - exact), axis=-1) / scale))


def check_forward(model_dir, batch=2, length=24, seed=0):
    """JAX f32 forward vs this float64 forward on random tokens: {"hidden_rel_err", ...}."""
    from grpo_fixtures import qwen2

    reference = NumpyQwen2(model_dir)
    rng = np.random.Generator(np.random.PCG64(seed))
    token_ids = rng.integers(0, reference.config["vocab_size"], size=(batch, length), dtype=np.int32)
    exact = reference.hidden_states(token_ids)
    model = qwen2.load_model(model_dir, dtype="float32")
    approx = np.asarray(qwen2.hidden_states(model, token_ids))
    logits_exact = exact @ reference.lm_head()
    logits_approx = approx.astype(np.float64) @ reference.lm_head()
    return {
        "batch": batch,
        "length": length,
        "hidden_rel_err": _relative_error(approx, exact),
        "hidden_max_abs_err": float(np.max(np.abs(approx - exact))),
        "hidden_rms": float(np.sqrt(np.mean(exact**2))),
        "logits_rel_err": _relative_error(logits_approx, logits_exact),
    }


def check_fixture_hidden(model_dir, fixture_dir):
    """A fixture's recorded hidden states vs this forward on prompt + sampled tokens.

    The sampler records, at completion position t, the hidden state of
    position P + t - 1 (the one predicting token t) rounded to bf16: the
    relative error is bf16's (up to 2^-8 of a row's largest entry), and
    nearly every entry equals the float64 value rounded to bf16 (the f32
    forward's error flips only near-ties).
    Also recomputes old_logp = log softmax(z / tau)[y] in float64 from the
    recorded (bf16) hidden states and the checkpoint's LM head.
    """
    manifest, arrays = fixture.load(fixture_dir)
    reference = NumpyQwen2(model_dir)
    prompts = np.asarray(arrays["prompts"])
    tokens, mask = np.asarray(arrays["tokens"]), np.asarray(arrays["mask"])
    hidden = np.asarray(arrays["hidden"], np.float64)
    temperature = manifest["sampling"]["temperature"]
    head = reference.lm_head()
    worst_hidden, worst_logp, equal, total = 0.0, 0.0, 0, 0
    for row in range(tokens.shape[0]):
        count = int(mask[row].sum())
        if count == 0:
            continue
        sequence = np.concatenate([prompts[row], tokens[row, : count - 1]])[None, :]
        exact = reference.hidden_states(sequence)[0, prompts.shape[1] - 1 :]
        worst_hidden = max(worst_hidden, _relative_error(hidden[row, :count], exact))
        equal += int(np.sum(hidden[row, :count] == exact.astype(ml_dtypes.bfloat16).astype(np.float64)))
        total += exact.size
        scaled = hidden[row, :count] @ head / temperature
        scaled -= scaled.max(axis=-1, keepdims=True)
        log_probs = scaled - np.log(np.exp(scaled).sum(axis=-1, keepdims=True))
        chosen = log_probs[np.arange(count), tokens[row, :count]]
        worst_logp = max(worst_logp, float(np.max(np.abs(chosen - arrays["old_logp"][row, :count]))))
    return {
        "fixture_hidden_rel_err": worst_hidden,
        "fixture_hidden_equal_to_rounded_float64": equal / max(total, 1),
        "fixture_old_logp_max_abs_err": worst_logp,
    }
