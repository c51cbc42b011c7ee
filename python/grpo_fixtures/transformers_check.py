"""Our Qwen2 forward (`qwen2.py`, what fixtures are made with) against transformers' Qwen2ForCausalLM.

    python -m grpo_fixtures.transformers_check [--model-dir DIR] [--batch 2 --length 24 --seed 0]
        [--break swap-layers|no-rotary]

`qwen2_numpy` checks the JAX forward against a float64 forward we wrote too:
the same reading of the architecture twice. This checks it against the
library that defines Qwen2 for everyone else, on the same checkpoint (a tiny
random one made from `--seed` unless `--model-dir` names one) and the same
token ids. What a fixture stores is the final-norm hidden state (after
`model.norm`, transformers' `last_hidden_state`, which is also its
`hidden_states[-1]`) at position P + t - 1, rounded to bf16, and old_logp =
log softmax(z / tau)[y] with z = bf16(hidden) @ bf16(lm_head) summed in f32.
So the checks are:

  lm_head         the [H, V] head fixtures hash (`qwen2.checkpoint_lm_head`) is
                  transformers' lm_head.weight^T bit for bit (tied to the embedding).
  hidden_f32      our f32 forward's final-norm hidden states.
  logits_f32      hidden_f32 @ lm_head in f32 against transformers' logits.
  hidden_bf16     our forward with bf16 activations (`make --dtype bfloat16`).
  fixture_hidden  the sampler's recorded hidden states (KV cache, one token at a
                  time, f32 activations, rounded to bf16): the fixture itself.
  fixture_logp    the sampler's old_logp.

The tolerance (the project's rule, docs/tolerance.md, with transformers as the
baseline). The oracle is transformers run in float64 (`dtype=torch.float64`):
the library's own most precise evaluation. It keeps three float32 islands
(RMSNorm, the rotary tables, the attention softmax are computed in f32 whatever
the dtype: modeling_qwen2.py), so it is itself off the exact function by a few
f32 ulps; the float64 NumPy forward measures that (`oracle_vs_numpy64` in the
output). Errors are normalised by the activations' scale, per row: err(x) =
max over rows of max_i |x_i - oracle_i| / max_i |oracle_i|. Two float32
evaluations of the same network differ from the exact one by roundings of the
same kind: every output is a dot product of the same length n (H for the
projections, D for the scores, S for the attention sum, I for down_proj), and
any summation order of n terms errs by at most gamma_n sum |x_i w_i|
(Higham, Accuracy and Stability, Thm 3.1), with gamma_n = n u / (1 - n u).
XLA's dot order and torch's sgemm order are two such orders, so our forward's
error is of the size of transformers' own f32 error on the same input, and the
rule is

    err(ours) <= 2 * err(transformers, same dtype) + 16 u          (u = 2^-24)

with transformers' own error bounded first by the first-order worst case of the
longest chain of dot products, err(transformers) <= N u with
N = L (3H + D + S + H + I) (an f32 run that far off means the float64 run is
not the same network, and the comparison would mean nothing). The factor 2
admits a worst row that lands on the unlucky side of both orders; 16 u is the
floor for a baseline that happens to be almost exact. A structural difference
(a layer out of order, the rotary embedding missing, a wrong GQA head map, a
missing bias) moves the hidden states by a good fraction of their scale:
10^5 u and more. For bf16 activations the same rule holds with transformers in
bf16 as the baseline (its cap, N 2^-8, exceeds 1 at these sizes and guards nothing:
the f32 run's cap is the one that vouches for the oracle).

The fixture checks are bounds on the rounding to bf16, elementwise: with
delta = (2 err(transformers f32) + 16 u) * row scale (the f32 forward's part),
|fixture - oracle| <= 2^-8 (|oracle| + delta) + delta (bf16's unit roundoff is
2^-8); and for the logits, with W the head, |dz_v| <= sum_i |dh_i| |W_iv| +
gamma_H sum_i |h_i W_iv| (the sampler's f32 sum), so |d old_logp| <= 2 max_v |dz_v|
/ tau + 16 u |logp|.

Exit 0: every check holds (JSON of the figures on stdout). Exit 1: a check
failed; stderr says which, by how much and against what bound. Exit 2: bad
input (no such checkpoint, not a Qwen2 config). Exit 3: torch or transformers
is not installed (python/requirements-torch.txt); a test should skip.
"""

import argparse
import gc
import json
import os
import sys
import tempfile
import time

import numpy as np

U32 = 2.0**-24
U_BF16 = 2.0**-8
FLOOR = 16 * U32
BREAKS = ("swap-layers", "no-rotary")


def row_error(approx, exact):
    """max over rows of max_i |approx_i - exact_i| / max_i |exact_i|: the error relative to each row's scale."""
    approx, exact = np.asarray(approx, np.float64), np.asarray(exact, np.float64)
    scale = np.max(np.abs(exact), axis=-1)
    return float(np.max(np.max(np.abs(approx - exact), axis=-1) / scale))


class Transformers:
    """transformers' Qwen2ForCausalLM on a checkpoint, in float64 (the oracle), float32 and bfloat16.

    One model is held at a time (a 1.5B model is 12 GB in float64): asking
    for another dtype releases the one held.
    """

    DTYPES = ("float64", "float32", "bfloat16")

    def __init__(self, model_dir):
        import torch
        import transformers

        transformers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity_error()
        self.torch, self.transformers, self.model_dir = torch, transformers, model_dir
        self.held = (None, None)

    def model(self, dtype):
        if self.held[0] != dtype:
            self.held = (None, None)
            gc.collect()
            loaded = self.transformers.Qwen2ForCausalLM.from_pretrained(
                self.model_dir, dtype=getattr(self.torch, dtype), attn_implementation="eager"
            ).eval()
            self.held = (dtype, loaded)
        return self.held[1]

    def release(self):
        self.held = (None, None)
        gc.collect()

    def run(self, dtype, token_ids):
        """(final-norm hidden [B, S, H], logits [B, S, V]) as float64 NumPy arrays."""
        model = self.model(dtype)
        with self.torch.no_grad():
            out = model(self.torch.as_tensor(np.asarray(token_ids), dtype=self.torch.long), output_hidden_states=True)
        hidden = out.hidden_states[-1]
        return hidden.double().numpy(), out.logits.double().numpy()

    def lm_head(self):
        """The bf16 model's LM head, [H, V] (transposed from its [V, H] weight), and whether it is the embedding."""
        model = self.model("bfloat16")
        weight = model.lm_head.weight.detach()
        tied = weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
        return weight.T.float().numpy(), tied


def _break_forward(qwen2, model, how):
    """Our forward made wrong on purpose (--break), to see the check fail."""
    if how == "swap-layers":
        order = np.arange(model.config.num_hidden_layers)
        order[:2] = order[1::-1]
        layers = {name: stacked[order] for name, stacked in model.params["layers"].items()}
        return model._replace(params={**model.params, "layers": layers})
    if how == "no-rotary":
        qwen2._apply_rotary = lambda x, cos, sin: x
        return model
    return model


def _verdict(name, err, baseline, cap, what):
    bound = 2 * baseline + FLOOR
    ok = err <= bound and baseline <= cap
    return {
        "check": name, "what": what, "pass": bool(ok),
        "err": err, "err_in_u": err / U32, "bound": bound, "bound_in_u": bound / U32,
        "transformers_err": baseline, "transformers_err_in_u": baseline / U32, "transformers_cap_in_u": cap / U32,
    }


def check(model_dir, batch, length, seed, prompt_len, sample_tokens, temperature, break_how=None):
    """Every check of the module doc on model_dir: {"checks": [...], "figures": {...}}.

    Each model is loaded, run on everything it is needed for, and released
    before the next (ours in f32, then bf16; transformers' in float64,
    float32, bfloat16), so a real 1.5B checkpoint fits in a 24 GB machine.
    """
    import jax
    import ml_dtypes

    from grpo_fixtures import qwen2, qwen2_numpy

    config = qwen2.load_config(model_dir)
    hf = Transformers(model_dir)
    rng = np.random.Generator(np.random.PCG64(seed))
    low_special = min(config.special_token_ids) if config.special_token_ids else config.vocab_size
    token_ids = rng.integers(0, low_special, size=(batch, length), dtype=np.int32)
    prompts = rng.integers(0, low_special, size=(batch, prompt_len), dtype=np.int32)

    chain = config.num_hidden_layers * (
        3 * config.hidden_size + config.head_dim + max(length, prompt_len + sample_tokens)
        + config.hidden_size + config.intermediate_size
    )
    cap = chain * U32
    checks = []
    ours = qwen2.checkpoint_lm_head(model_dir, config)
    head = ours.array.astype(np.float64)

    # Ours, f32: the full-sequence forward and the sampler (the fixture path).
    model = _break_forward(qwen2, qwen2.load_model(model_dir, dtype="float32"), break_how)
    ours_hidden = np.asarray(qwen2.hidden_states(model, token_ids), np.float64)
    ours_logits = np.asarray(jax.numpy.matmul(
        ours_hidden.astype(np.float32), ours.array.astype(np.float32), precision=jax.lax.Precision.HIGHEST,
    ), np.float64)
    samples = qwen2.sample(model, prompts, sample_tokens, temperature, eos_token_ids=(), seed=seed)
    del model
    gc.collect()
    sequence = np.concatenate([prompts, samples.tokens], axis=1)
    # Ours, bf16 activations (make --dtype bfloat16).
    model_bf16 = _break_forward(qwen2, qwen2.load_model(model_dir, dtype="bfloat16"), break_how)
    ours_bf16 = np.asarray(qwen2.hidden_states(model_bf16, token_ids).astype(np.float32), np.float64)
    del model_bf16
    gc.collect()

    # transformers, one dtype at a time.
    oracle_hidden, oracle_logits = hf.run("float64", token_ids)
    full_hidden, full_logits = hf.run("float64", sequence)
    hf_hidden, hf_logits = hf.run("float32", token_ids)
    hf32_sequence, _ = hf.run("float32", sequence)
    hf_bf16, _ = hf.run("bfloat16", token_ids)
    theirs, tied = hf.lm_head()
    hf.release()

    # The LM head fixtures hash and multiply by.
    same = ours.array.shape == theirs.shape and bool(np.array_equal(ours.array.astype(np.float32), theirs))
    checks.append({
        "check": "lm_head", "pass": same and tied == config.tie_word_embeddings,
        "what": f"qwen2.checkpoint_lm_head ({ours.tensor}^T, {ours.dtype} {list(ours.array.shape)}) == "
                f"transformers lm_head.weight^T bit for bit; tied to the embedding: {tied}",
    })
    hidden_base = row_error(hf_hidden, oracle_hidden)
    checks.append(_verdict("hidden_f32", row_error(ours_hidden, oracle_hidden), hidden_base, cap,
                           "final-norm hidden states, float32 activations"))
    checks.append(_verdict("logits_f32", row_error(ours_logits, oracle_logits), row_error(hf_logits, oracle_logits),
                           cap + config.hidden_size * U32, "hidden_f32 @ lm_head in float32"))
    checks.append(_verdict("hidden_bf16", row_error(ours_bf16, oracle_hidden), row_error(hf_bf16, oracle_hidden),
                           chain * U_BF16, "final-norm hidden states, bfloat16 activations"))

    # The fixture path: the sampler (KV cache, one token at a time, f32 activations), recorded in bf16.
    # Completion position t is predicted from position P + t - 1.
    aligned = slice(prompt_len - 1, prompt_len - 1 + sample_tokens)
    oracle_fixture = full_hidden[:, aligned]
    delta = (2 * row_error(hf32_sequence[:, aligned], oracle_fixture) + FLOOR) * np.max(
        np.abs(oracle_fixture), axis=-1, keepdims=True)
    recorded = np.asarray(samples.hidden.astype(np.float32), np.float64)
    hidden_bound = U_BF16 * (np.abs(oracle_fixture) + delta) + delta
    excess = np.abs(recorded - oracle_fixture) / hidden_bound
    equal = float(np.mean(recorded == oracle_fixture.astype(ml_dtypes.bfloat16).astype(np.float64)))
    checks.append({
        "check": "fixture_hidden", "pass": bool(np.max(excess) <= 1.0),
        "what": "the sampler's recorded bf16 hidden states at P + t - 1 (KV cache path)",
        "worst_err_over_bound": float(np.max(excess)),
        "err": row_error(recorded, oracle_fixture),
        "equal_to_bf16_of_oracle": equal,
    })
    gamma_h = config.hidden_size * U32 / (1 - config.hidden_size * U32)
    dz = np.abs(recorded - oracle_fixture) @ np.abs(head)  # how far the recorded rounding can move z
    dz_bound = hidden_bound @ np.abs(head) + gamma_h * (np.abs(recorded) @ np.abs(head))
    oracle_z = full_logits[:, aligned] / temperature
    oracle_z -= oracle_z.max(axis=-1, keepdims=True)
    oracle_logp = oracle_z - np.log(np.exp(oracle_z).sum(axis=-1, keepdims=True))
    chosen = np.take_along_axis(oracle_logp, samples.tokens[..., None].astype(np.int64), axis=-1)[..., 0]
    logp_bound = 2 * np.max(dz_bound, axis=-1) / temperature + 16 * U32 * np.abs(chosen)
    logp_err = np.abs(samples.old_logp - chosen)
    checks.append({
        "check": "fixture_logp", "pass": bool(np.all(logp_err <= logp_bound)),
        "what": "the sampler's old_logp = log softmax(bf16(h) @ lm_head / tau)[y] against transformers' float64",
        "worst_err": float(np.max(logp_err)), "worst_err_over_bound": float(np.max(logp_err / logp_bound)),
        "max_logit_shift_from_hidden": float(np.max(dz)),
    })

    figures = {
        "model_dir": model_dir, "batch": batch, "length": length, "seed": seed,
        "fixture": {"prompt_len": prompt_len, "tokens": sample_tokens, "temperature": temperature},
        "break": break_how,
        "row_scale_rms": float(np.sqrt(np.mean(oracle_hidden**2))),
        "oracle_vs_numpy64_in_u": row_error(oracle_hidden, qwen2_numpy.NumpyQwen2(model_dir).hidden_states(token_ids))
        / U32,
        "chain_N": chain,
    }
    return {"checks": checks, "figures": figures}


# The real prompts of the GGUF check: a plain-text completion and a chat-formatted task.
GGUF_PROMPTS = (
    "The capital of France is Paris. The capital of Germany is",
    None,  # the first task of fixtures/tasks/math.json through the chat template
)
# Tensors compared bit for bit between transformers' GGUF loader and ours: one of each quantisation.
GGUF_TENSORS = ("lm_head.weight", "model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                "model.layers.0.mlp.down_proj.weight", "model.layers.27.input_layernorm.weight")


def check_gguf(model_key, tasks_file):
    """transformers loading the GGUF file itself (the field's way) against our conversion and our JAX forward.

    - dequantised: transformers' float32 weights == gguf.quants.dequantize's (ours before the bf16
      rounding), bit for bit, for one tensor of each quantisation (GGUF_TENSORS).
    - forward: our JAX forward (f32 activations) on our bf16 checkpoint against transformers' float32
      forward on the GGUF weights, on real prompts: the largest hidden difference relative to its
      row's largest entry, and the share of positions whose top-1 token agrees. The two networks
      differ by the weights' bf16 rounding (2^-8 of each weight at most): a sanity bound of 5% of a
      row's scale and 95% top-1 agreement catches a wrong mapping (a layer, a transpose, a missing
      bias moves rows by their whole scale), not the rounding.
    """
    import torch
    import transformers

    from grpo_fixtures import gguf_model, make, qwen2

    model = gguf_model.model_by_key(model_key)
    gguf_path = gguf_model.fetch(model)
    model_dir = gguf_model.ensure_checkpoint(model)
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    document, _, tasks = make.read_tasks(tasks_file, None)
    _, texts, chat_ids = make.chat_prompts(model_dir, document, tasks[:1])
    prompts = [tokenizer(GGUF_PROMPTS[0], add_special_tokens=False)["input_ids"], chat_ids[0]]
    started = time.perf_counter()
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path), dtype=torch.float32
    ).eval()
    loaded = time.perf_counter() - started
    import gguf

    reader = gguf.GGUFReader(gguf_path)
    by_hf_name = {gguf_model.hf_name(t.name): t for t in reader.tensors}
    state = hf.state_dict()
    dequantised = []
    for name in GGUF_TENSORS:
        ours = gguf_model.dequantised(reader, by_hf_name[name])
        theirs = state[name].detach().numpy()
        dequantised.append({
            "tensor": name, "gguf_type": by_hf_name[name].tensor_type.name,
            "bit_equal": bool(ours.shape == theirs.shape and np.array_equal(ours, theirs)),
        })
    theirs_out = []
    with torch.no_grad():
        for ids in prompts:
            out = hf(torch.as_tensor([ids]), output_hidden_states=True)
            theirs_out.append((out.hidden_states[-1][0].double().numpy(), out.logits[0].double().numpy()))
    del hf, state
    gc.collect()
    ours_model = qwen2.load_model(model_dir, "float32")
    head = np.asarray(ours_model.lm_head, np.float32)
    forward = []
    for text, ids, (hidden_t, logits_t) in zip((GGUF_PROMPTS[0], texts[0]), prompts, theirs_out):
        hidden_o = np.asarray(qwen2.hidden_states(ours_model, np.asarray([ids], np.int32)), np.float64)[0]
        logits_o = hidden_o.astype(np.float32) @ head
        top_o, top_t = logits_o.argmax(-1), logits_t.argmax(-1)
        last_o, last_t = logits_o[-1].astype(np.float64), logits_t[-1]
        forward.append({
            "prompt": text if len(text) < 80 else text[:77] + "...",
            "tokens": len(ids),
            "hidden_rel_diff": row_error(hidden_o, hidden_t),
            "top1_agreement": float(np.mean(top_o == top_t)),
            "last_top1": {"ours": tokenizer.decode([int(top_o[-1])]), "transformers": tokenizer.decode([int(top_t[-1])])},
            "last_logits_cosine": float(last_o @ last_t / np.linalg.norm(last_o) / np.linalg.norm(last_t)),
            "last_p_max_ours": float(np.max(np.exp(last_o - last_o.max()) / np.exp(last_o - last_o.max()).sum())),
        })
    checks = [{
        "check": "gguf_dequantised", "pass": all(d["bit_equal"] for d in dequantised),
        "what": "transformers' GGUF loader (float32) == gguf.quants.dequantize, bit for bit", "tensors": dequantised,
    }, {
        "check": "gguf_forward",
        "pass": all(f["hidden_rel_diff"] <= 0.05 and f["top1_agreement"] >= 0.95 for f in forward),
        "what": "our JAX forward (bf16 weights, f32 activations) vs transformers' float32 forward of the GGUF file",
        "prompts": forward,
    }]
    figures = {"model": model.name, "gguf": gguf_path, "checkpoint": model_dir,
               "transformers_gguf_load_seconds": round(loaded, 1)}
    return {"checks": checks, "figures": figures}


def _failure_line(c):
    if "bound" in c:
        return (
            f"FAIL {c['check']} ({c['what']}): our forward is off transformers' float64 by {c['err_in_u']:.4g} u "
            f"of the row scale ({c['err']:.3g}); the bound is {c['bound_in_u']:.4g} u = 2 x transformers' own "
            f"{c['transformers_err_in_u']:.4g} u + 16 u (transformers' cap {c['transformers_cap_in_u']:.4g} u)"
        )
    detail = {k: v for k, v in c.items() if k not in ("check", "what", "pass")}
    return f"FAIL {c['check']} ({c['what']}): {json.dumps(detail)}"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m grpo_fixtures.transformers_check", description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", help="a Qwen2 checkpoint (HF layout); default: a tiny random one from --seed")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--length", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prompt-len", type=int, default=8)
    parser.add_argument("--sample-tokens", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--gguf", metavar="MODEL", default=None,
                        help="check a registry model (e.g. qwen2.5-coder-1.5b-instruct-q4_k_m) as transformers loads "
                             "its GGUF file, against our conversion and forward (check_gguf)")
    parser.add_argument("--tasks", default="fixtures/tasks/math.json", help="with --gguf: the chat prompt's tasks file")
    parser.add_argument("--break", dest="break_how", choices=BREAKS,
                        help="break our forward on purpose (to see the check fail): swap the two first "
                             "layers' weights, or drop the rotary embedding")
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as error:
        print(f"transformers_check needs torch and transformers (python/requirements-torch.txt): {error}",
              file=sys.stderr)
        return 3
    started = time.perf_counter()
    if args.gguf:
        from grpo_fixtures.gguf_model import FetchError

        try:
            result = check_gguf(args.gguf, args.tasks)
        except (ValueError, FetchError) as error:
            print(f"--gguf {args.gguf}: {error}", file=sys.stderr)
            return 2
        return _emit(result, started)
    with tempfile.TemporaryDirectory(prefix="grpo-transformers-check-") as scratch:
        model_dir = args.model_dir
        if model_dir is None:
            from grpo_fixtures import tiny_checkpoint

            model_dir = tiny_checkpoint.write_tiny_checkpoint(os.path.join(scratch, "tiny-qwen2"), seed=args.seed)
        elif not os.path.isfile(os.path.join(model_dir, "config.json")):
            print(f"--model-dir {model_dir}: no config.json there; expected a Hugging Face Qwen2 checkpoint",
                  file=sys.stderr)
            return 2
        try:
            result = check(model_dir, args.batch, args.length, args.seed, args.prompt_len, args.sample_tokens,
                           args.temperature, args.break_how)
        except ValueError as error:
            print(f"{model_dir}: {error}", file=sys.stderr)
            return 2
    if args.model_dir is None:
        result["figures"]["model_dir"] = f"tiny-checkpoint --seed {args.seed}"
    return _emit(result, started)


def _emit(result, started):
    """Prints the result (JSON on stdout, a line per failed check on stderr); the exit code."""
    result["figures"]["seconds"] = round(time.perf_counter() - started, 2)
    print(json.dumps(result, indent=2))
    failed = [c for c in result["checks"] if not c["pass"]]
    for c in failed:
        print(_failure_line(c), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
