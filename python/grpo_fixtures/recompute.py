"""A fixture's hidden states recomputed from the model's weights (`verify --deep --hidden K`).

The sampler recorded hidden[b, t] one token at a time against its KV cache
(qwen2.sample). Here each row is run again as one whole sequence, without
a cache and without padding: its prompt (prompts[b, P - L:], L =
prompt_lengths[b]) followed by its completion tokens, through the
full-sequence forward (qwen2.hidden_states, f32 activations), and the
hidden state at position L + t - 1 is compared with hidden[b, t] for the
first K completion positions of every row (causal attention: the rest of
the row cannot change them, so only L + K tokens are run).

The bound. Both are f32 evaluations of the same network on the same
tokens, in two orders (a cached decode, one whole sequence), so they
differ by roundings of the f32 sums only; the recorded value is then
rounded to bf16. Per element, with x the recomputed f32 value and m its
row's largest |x|:

    |recorded - x| <= 2^-8 |x| (bf16's unit roundoff) + 2^-12 m (the two f32 orders)

2^-12 m is far above the f32 orders' measured difference (fixtures/README.md
gives it) and far below a wrong token, position or layer, which moves
whole rows by a large fraction of m. The report also gives the share of
elements equal to bf16(x) exactly.
"""

import ml_dtypes
import numpy as np

from grpo_fixtures import fixture, qwen2

ORDER_SLACK = 2.0**-12
# bf16 keeps 8 significant bits: rounding moves x by at most 2^-8 |x| (half an ulp, x just above a power of 2).
BF16_UNIT_ROUNDOFF = 2.0**-8


def recompute_hidden(fixture_dir, model_dir, positions=16, dtype="float32"):
    """{"positions", "worst_err_over_bound", "max_abs_err", "equal_to_bf16"} of the first `positions` of every row."""
    manifest, arrays = fixture.load(fixture_dir)
    if "prompts" not in arrays:
        raise fixture.FixtureError(f"{fixture_dir}: no prompts array; only a fixture made from a model can be recomputed")
    prompts = np.asarray(arrays["prompts"])
    tokens, mask = np.asarray(arrays["tokens"]), np.asarray(arrays["mask"])
    recorded = np.asarray(arrays["hidden"], np.float32)  # bf16 values, exactly
    batch, width = prompts.shape
    lengths = manifest["sampling"].get("prompt_lengths") or [width] * batch
    counts = [min(positions, int(mask[b].sum())) for b in range(batch)]
    rows = [b for b in range(batch) if counts[b] > 0]
    if not rows:
        raise fixture.FixtureError(f"{fixture_dir}: no valid position to recompute")
    # Each row alone from position 0: its prompt, then the completion tokens
    # before the last compared one; right-padded (causal: the padding is
    # after everything compared).
    sequences = [list(prompts[b, width - lengths[b]:]) + list(tokens[b, : counts[b] - 1]) for b in rows]
    longest = max(len(s) for s in sequences)
    padded = np.zeros((len(rows), longest), np.int32)
    for i, sequence in enumerate(sequences):
        padded[i, : len(sequence)] = sequence
    model = qwen2.load_model(model_dir, dtype)
    full = np.asarray(qwen2.hidden_states(model, padded), np.float32)
    worst, worst_abs, equal, total = 0.0, 0.0, 0, 0
    for i, b in enumerate(rows):
        start = lengths[b] - 1
        x = full[i, start : start + counts[b]].astype(np.float64)
        got = recorded[b, : counts[b]].astype(np.float64)
        bound = BF16_UNIT_ROUNDOFF * np.abs(x) + ORDER_SLACK * np.max(np.abs(x), axis=-1, keepdims=True)
        worst = max(worst, float(np.max(np.abs(got - x) / bound)))
        worst_abs = max(worst_abs, float(np.max(np.abs(got - x))))
        equal += int(np.sum(got == x.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)))
        total += x.size
    return {
        "rows": len(rows),
        "positions": int(sum(counts)),
        "worst_err_over_bound": worst,
        "max_abs_err": worst_abs,
        "equal_to_bf16": equal / total,
        "bound": "2^-8 |x| + 2^-12 max|x| of the row, x the full-sequence f32 forward",
    }
