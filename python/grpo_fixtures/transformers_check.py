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
    """transformers' Qwen2ForCausalLM on a checkpoint, in float64 (the oracle), float32 and bfloat16."""

    def __init__(self, model_dir):
        import torch
        import transformers

        transformers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity_error()
        self.torch = torch
        self.models = {
            name: transformers.Qwen2ForCausalLM.from_pretrained(
                model_dir, dtype=dtype, attn_implementation="eager"
            ).eval()
            for name, dtype in (("float64", torch.float64), ("float32", torch.float32), ("bfloat16", torch.bfloat16))
        }

    def run(self, dtype, token_ids):
        """(final-norm hidden [B, S, H], logits [B, S, V]) as float64 NumPy arrays."""
        model = self.models[dtype]
        with self.torch.no_grad():
            out = model(self.torch.as_tensor(np.asarray(token_ids), dtype=self.torch.long), output_hidden_states=True)
        hidden = out.hidden_states[-1]
        return hidden.double().numpy(), out.logits.double().numpy()

    def lm_head(self):
        """The bf16 model's LM head, [H, V] (transposed from its [V, H] weight), and whether it is the embedding."""
        model = self.models["bfloat16"]
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
    """Every check of the module doc on model_dir: {"checks": [...], "figures": {...}}."""
    import jax
    import ml_dtypes

    from grpo_fixtures import qwen2, qwen2_numpy

    config = qwen2.load_config(model_dir)
    hf = Transformers(model_dir)
    rng = np.random.Generator(np.random.PCG64(seed))
    low_special = min(config.special_token_ids) if config.special_token_ids else config.vocab_size
    token_ids = rng.integers(0, low_special, size=(batch, length), dtype=np.int32)

    chain = config.num_hidden_layers * (
        3 * config.hidden_size + config.head_dim + max(length, prompt_len + sample_tokens)
        + config.hidden_size + config.intermediate_size
    )
    cap = chain * U32
    checks = []

    # The LM head fixtures hash and multiply by.
    ours = qwen2.checkpoint_lm_head(model_dir, config)
    theirs, tied = hf.lm_head()
    same = ours.array.shape == theirs.shape and bool(np.array_equal(ours.array.astype(np.float32), theirs))
    checks.append({
        "check": "lm_head", "pass": same and tied == config.tie_word_embeddings,
        "what": f"qwen2.checkpoint_lm_head ({ours.tensor}^T, {ours.dtype} {list(ours.array.shape)}) == "
                f"transformers lm_head.weight^T bit for bit; tied to the embedding: {tied}",
    })
    head = ours.array.astype(np.float64)

    # f32: the full-sequence forward.
    model = _break_forward(qwen2, qwen2.load_model(model_dir, dtype="float32"), break_how)
    oracle_hidden, oracle_logits = hf.run("float64", token_ids)
    hf_hidden, hf_logits = hf.run("float32", token_ids)
    ours_hidden = np.asarray(qwen2.hidden_states(model, token_ids), np.float64)
    ours_logits = np.asarray(jax.numpy.matmul(
        ours_hidden.astype(np.float32), ours.array.astype(np.float32), precision=jax.lax.Precision.HIGHEST,
    ), np.float64)
    hidden_base = row_error(hf_hidden, oracle_hidden)
    checks.append(_verdict("hidden_f32", row_error(ours_hidden, oracle_hidden), hidden_base, cap,
                           "final-norm hidden states, float32 activations"))
    checks.append(_verdict("logits_f32", row_error(ours_logits, oracle_logits), row_error(hf_logits, oracle_logits),
                           cap + config.hidden_size * U32, "hidden_f32 @ lm_head in float32"))

    # bf16 activations (make --dtype bfloat16), against transformers in bf16.
    model_bf16 = _break_forward(qwen2, qwen2.load_model(model_dir, dtype="bfloat16"), break_how)
    ours_bf16 = np.asarray(qwen2.hidden_states(model_bf16, token_ids).astype(np.float32), np.float64)
    hf_bf16, _ = hf.run("bfloat16", token_ids)
    checks.append(_verdict("hidden_bf16", row_error(ours_bf16, oracle_hidden), row_error(hf_bf16, oracle_hidden),
                           chain * U_BF16, "final-norm hidden states, bfloat16 activations"))

    # The fixture path: the sampler (KV cache, one token at a time, f32 activations), recorded in bf16.
    prompts = rng.integers(0, low_special, size=(batch, prompt_len), dtype=np.int32)
    samples = qwen2.sample(model, prompts, sample_tokens, temperature, eos_token_ids=(), seed=seed)
    sequence = np.concatenate([prompts, samples.tokens], axis=1)
    full_hidden, full_logits = hf.run("float64", sequence)
    # Completion position t is predicted from position P + t - 1.
    aligned = slice(prompt_len - 1, prompt_len - 1 + sample_tokens)
    oracle_fixture = full_hidden[:, aligned]
    hf32_fixture, _ = hf.run("float32", sequence)
    delta = (2 * row_error(hf32_fixture[:, aligned], oracle_fixture) + FLOOR) * np.max(
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
    result["figures"]["seconds"] = round(time.perf_counter() - started, 2)
    print(json.dumps(result, indent=2))
    failed = [c for c in result["checks"] if not c["pass"]]
    for c in failed:
        print(_failure_line(c), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
