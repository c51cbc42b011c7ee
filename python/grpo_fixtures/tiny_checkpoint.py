"""A tiny random Qwen2 checkpoint in the Hugging Face layout, from a seed.

config.json (Qwen2ForCausalLM, model_type qwen2) and model.safetensors in
bf16, with the weight names of the real checkpoints: enough to run the
whole fixture pipeline (forward, sampler, `make`, `verify`, `lm-head`) in
seconds on a CPU, and to check the JAX forward against the NumPy one.

Scales. Linear weights are N(0, 1/fan_in); biases and norm weights are near
trained-looking values (0 and 1). The embedding (tied: it is also the LM
head) is scaled so that the final-norm hidden states, whose RMS is about
`final_norm_gain`, give logits with a standard deviation of about
`logit_std`. With tied embeddings a random model copies: the input token's
embedding rides the residual stream to the output and scores itself. The
branches that write into the residual stream (o_proj, down_proj) get a gain
`branch_gain` so the layers, not the embedding, dominate: a token repeats
its predecessor about 20% of the time (about 80% with no gain). With the defaults, `python
-m grpo_fixtures make` on this checkpoint (seed 0, --batch 8 --time 64
--temperature 1 --prompt-len 8 --group 1 --eos none) records in its
manifest statistics a max softmax probability of mean 0.50 (p10 0.21, p90
0.85) and the argmax sampled 51% of the time: peaked-ish, not degenerate.
The output is a deterministic function of the seed (NumPy PCG64).
"""

import dataclasses
import json
import os

import ml_dtypes
import numpy as np

from grpo_fixtures import tensor_files


@dataclasses.dataclass(frozen=True)
class TinyConfig:
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    vocab_size: int = 512
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    # The two highest ids are special, as in Qwen2 (<|endoftext|>, <|im_end|> sit above the text ids).
    bos_token_id: int | None = None  # None: vocab_size - 2
    eos_token_id: int | None = None  # None: vocab_size - 1
    final_norm_gain: float = 2.0
    logit_std: float = 4.0
    # Gain of o_proj and down_proj (the branches written into the residual stream); see the module doc.
    branch_gain: float = 6.0

    def hf_config(self):
        """The config.json dict, with the keys of Qwen/Qwen2.5-1.5B-Instruct's."""
        return {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "hidden_act": "silu",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "vocab_size": self.vocab_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": None,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": True,
            "use_sliding_window": False,
            "bos_token_id": self.vocab_size - 2 if self.bos_token_id is None else self.bos_token_id,
            "eos_token_id": self.vocab_size - 1 if self.eos_token_id is None else self.eos_token_id,
            "torch_dtype": "bfloat16",
        }


def tiny_weights(config, seed):
    """{HF weight name: float32 array} of a random Qwen2 model (before the bf16 rounding)."""
    rng = np.random.Generator(np.random.PCG64(seed))
    width, inner = config.hidden_size, config.intermediate_size
    head_dim = width // config.num_attention_heads
    kv_width = config.num_key_value_heads * head_dim

    def linear(out_dim, in_dim, gain=1.0):
        # HF layout [out, in]: y = x @ W.T.
        return gain * rng.standard_normal((out_dim, in_dim), dtype=np.float32) / np.sqrt(in_dim)

    def near_one(size):
        return 1.0 + 0.1 * rng.standard_normal(size, dtype=np.float32)

    weights = {}
    embed_std = config.logit_std / (config.final_norm_gain * np.sqrt(width))
    embed = rng.standard_normal((config.vocab_size, width), dtype=np.float32)
    weights["model.embed_tokens.weight"] = embed_std * embed
    for layer in range(config.num_hidden_layers):
        prefix = f"model.layers.{layer}."
        weights[prefix + "input_layernorm.weight"] = near_one(width)
        for name, out_dim in (("q_proj", width), ("k_proj", kv_width), ("v_proj", kv_width)):
            weights[prefix + f"self_attn.{name}.weight"] = linear(out_dim, width)
            weights[prefix + f"self_attn.{name}.bias"] = 0.1 * rng.standard_normal(out_dim, dtype=np.float32)
        weights[prefix + "self_attn.o_proj.weight"] = linear(width, width, config.branch_gain)
        weights[prefix + "post_attention_layernorm.weight"] = near_one(width)
        weights[prefix + "mlp.gate_proj.weight"] = linear(inner, width)
        weights[prefix + "mlp.up_proj.weight"] = linear(inner, width)
        weights[prefix + "mlp.down_proj.weight"] = linear(width, inner, config.branch_gain)
    weights["model.norm.weight"] = config.final_norm_gain * near_one(width)
    return weights


def write_tiny_checkpoint(out_dir, seed=0, config=TinyConfig()):
    """Write config.json and model.safetensors (bf16) to out_dir; returns out_dir."""
    os.makedirs(out_dir, exist_ok=True)
    weights = {name: value.astype(ml_dtypes.bfloat16) for name, value in tiny_weights(config, seed).items()}
    tensor_files.write(
        os.path.join(out_dir, tensor_files.SINGLE_FILE),
        weights,
        metadata={"format": "pt", "generator": f"grpo_fixtures.tiny_checkpoint seed {seed}"},
    )
    with open(os.path.join(out_dir, "config.json"), "w") as stream:
        json.dump(config.hf_config(), stream, indent=2)
        stream.write("\n")
    return out_dir


# A chat template in Qwen's shape: a system turn, the messages, the assistant's opening.
TINY_CHAT_TEMPLATE = (
    "<|im_start|>system\nYou are tiny.<|im_end|>\n"
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TINY_SPECIAL_TOKENS = ("<|im_start|>", "<|endoftext|>", "<|im_end|>")


def _byte_symbols():
    """The 256 printable symbols a byte-level BPE writes bytes as (GPT-2's convention, as Qwen2's tokenizer
    reads them): printable Latin-1 bytes stand for themselves, the others for 256 + their rank among them."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1), *range(ord("\u00ae"), 256)]
    symbols, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            symbols[byte] = chr(byte)
        else:
            symbols[byte] = chr(256 + extra)
            extra += 1
    return [symbols[b] for b in range(256)]


def write_tiny_tokenizer(out_dir, vocab_size):
    """A byte-level BPE tokenizer without merges (one id per byte) with a chat template, into a tiny checkpoint.

    Ids 0..255 are the bytes, then fillers, and the top three ids the
    special tokens <|im_start|>, <|endoftext|> and <|im_end|> (the config's
    bos and eos are the top two). transformers reads it as the Qwen2
    tokenizer it reads the real checkpoint's with, so `make --tasks` runs the
    whole rollout path (the chat template, prompts of different lengths,
    decoding, the verifiers) on a random model in seconds. Needs the
    `tokenizers` and `transformers` packages (the torch lock).
    """
    import tokenizers
    import transformers

    if vocab_size < 256 + len(TINY_SPECIAL_TOKENS):
        raise ValueError(f"--vocab-size {vocab_size}: a byte-level tokenizer needs at least {256 + len(TINY_SPECIAL_TOKENS)}")
    vocab = {symbol: i for i, symbol in enumerate(_byte_symbols())}
    vocab.update({f"<|filler{i}|>": i for i in range(256, vocab_size - len(TINY_SPECIAL_TOKENS))})
    vocab.update({token: vocab_size - len(TINY_SPECIAL_TOKENS) + k for k, token in enumerate(TINY_SPECIAL_TOKENS)})
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE(vocab, merges=[]))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tokenizers.decoders.ByteLevel()
    tokenizer.add_special_tokens(list(TINY_SPECIAL_TOKENS))
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=TINY_CHAT_TEMPLATE,
    )
    fast.save_pretrained(out_dir)
    return out_dir
