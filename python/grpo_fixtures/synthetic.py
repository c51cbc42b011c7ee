"""A synthetic fixture made from a seed alone: Qwen2.5-1.5B's dimensions
(H = 1536, V = 151936) by default, any B, T, H and V on request.

No checkpoint is needed: the LM head is regenerated from the seed whenever
it is wanted (`lm_head`; at H = 1536 467 MB bf16, about 2 to 4 s; only its
sha256 is in the manifest), and the committed fixture's arrays are small
enough to commit. The production rows of `PRESETS` (B = 1, T = 8192) are
made at run time, never committed.

LM head (generator version 1). Each entry is one of 65536 bf16 values: the
N(0, WEIGHT_STD^2) quantiles at (k + 1/2) / 65536, k = 0..65535, picked by
16 random bits of a PCG64 stream (SeedSequence([seed, 0])), filled in [H, V]
row-major order. Gaussian-shaped, exactly bf16, and fast: no per-entry
normal draw and no float rounding.

Hidden states, for each unmasked position (stream [seed, 1]):

    g        per-channel gain: lognormal(0, GAIN_LOG_STD), OUTLIER_CHANNELS channels x OUTLIER_GAIN
             (massive-activation channels), scaled to RMS HIDDEN_RMS -- the final norm's weight
    n        N(0, I): background; n . (g * W) gives every logit N(0, (WEIGHT_STD sqrt(H) HIDDEN_RMS)^2)
    c_1..K   candidate tokens (uniform over V): the "plausible next tokens"
    a_1      raw-logit boost of c_1 = tau (L + lo), lo ~ U(LOG_ODDS_RANGE), L the background's
             log-partition at tau: the top candidate's probability is about sigmoid(lo)
    a_k      a_{k-1} - tau * (gap ~ GAP_MIN + Exponential(GAP_MEAN)) for k >= 2: a few runner-ups
    x        = n + sum_k a_k W[:, c_k] / (g |W[:, c_k]|^2)
    hidden   = g * x / rms(x)          (RMSNorm with weight g, as a final norm is), rounded to bf16

So softmax(z / tau) is peaked on a few candidates and long-tailed over the
rest (log-normal background). Tokens are then drawn from softmax(z / tau)
of the actual logits z = hidden_bf16 @ lm_head_bf16 in f32 (stream
[seed, 2]) and old_logp is log softmax(z / tau)[token] of those same logits:
the sampler's own distribution, nothing added. Row 0 is full length, the
others end at lengths drawn from [T/8, T) (stream [seed, 3]); rewards and
advantages as fixture.REWARDS_METHOD.

The logits are formed SAMPLING_ROWS positions at a time (`sample_rows`), so
memory does not grow with T: besides the LM head (bf16, and an f32 copy for
the matmul: 6 bytes per entry) and the [N, H] hidden states, one block's
logits and its float64 work buffer. The f32 sums come from the BLAS NumPy
links (OpenBLAS here), whose kernel and thread count choose their order:
see fixtures/README.md on regenerating the committed fixture byte for byte.
"""

import dataclasses
import statistics
import sys
import time as clock

import ml_dtypes
import numpy as np

from grpo_fixtures import fixture, tensor_files

GENERATOR_VERSION = 1
HIDDEN_SIZE = 1536  # Qwen2.5-1.5B
VOCAB_SIZE = 151936
WEIGHT_STD = 0.02
HIDDEN_RMS = 3.0
GAIN_LOG_STD = 0.5
OUTLIER_CHANNELS = 4
OUTLIER_GAIN = 8.0
CANDIDATES = 4
LOG_ODDS_RANGE = (0.5, 6.5)
GAP_MIN, GAP_MEAN = 0.3, 1.5
# Rows of the LM head generated per step: bounds the temporaries (~60 MB).
LM_HEAD_ROWS_PER_STEP = 128
# Positions whose logits are formed at a time when sampling: [128, V] f32
# logits, centred copy and a float64 work buffer (~310 MB at V = 151936).
SAMPLING_ROWS = 128
STREAM_LM_HEAD, STREAM_HIDDEN, STREAM_SAMPLING, STREAM_LAYOUT = range(4)


def _rng(seed, stream):
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, stream])))


def _quantile_table():
    """The 65536 bf16 values of the LM head: N(0, WEIGHT_STD^2) quantiles at (k + 1/2) / 65536."""
    normal = statistics.NormalDist(0.0, WEIGHT_STD)
    return np.array([normal.inv_cdf((k + 0.5) / 65536) for k in range(65536)]).astype(ml_dtypes.bfloat16)


def lm_head(seed, hidden_size=HIDDEN_SIZE, vocab_size=VOCAB_SIZE, version=None):
    """The synthetic LM head [H, V] bf16 of `seed` (Flax layout: logits = hidden @ lm_head)."""
    if version not in (None, GENERATOR_VERSION):
        raise fixture.FixtureError(
            f"synthetic LM head generator version {version} is not this code's ({GENERATOR_VERSION})"
        )
    table = _quantile_table()
    rng = _rng(seed, STREAM_LM_HEAD)
    out = np.empty((hidden_size, vocab_size), ml_dtypes.bfloat16)
    for start in range(0, hidden_size, LM_HEAD_ROWS_PER_STEP):
        rows = min(LM_HEAD_ROWS_PER_STEP, hidden_size - start)
        picks = np.frombuffer(rng.bytes(2 * rows * vocab_size), dtype="<u2").reshape(rows, vocab_size)
        np.take(table, picks, out=out[start : start + rows])
    return out


def channel_gains(rng, hidden_size):
    """Per-channel scale of the final norm: lognormal, a few outlier channels, RMS = HIDDEN_RMS."""
    gains = np.exp(GAIN_LOG_STD * rng.standard_normal(hidden_size))
    gains[rng.choice(hidden_size, OUTLIER_CHANNELS, replace=False)] *= OUTLIER_GAIN
    return gains * HIDDEN_RMS / np.sqrt(np.mean(gains**2))


def synthetic_hidden(rng, head, gains, count, temperature):
    """[count, H] bf16 final-norm hidden states peaked on a few candidate tokens each (module doc)."""
    hidden_size, vocab_size = head.shape
    background_std = WEIGHT_STD * np.sqrt(hidden_size) * HIDDEN_RMS / temperature
    log_partition = np.log(vocab_size) + background_std**2 / 2  # of a log-normal background at tau
    x = rng.standard_normal((count, hidden_size))
    candidates = rng.integers(0, vocab_size, size=(count, CANDIDATES))
    boost = temperature * (log_partition + rng.uniform(*LOG_ODDS_RANGE, size=count))
    for k in range(CANDIDATES):
        if k:
            boost = boost - temperature * (GAP_MIN + rng.exponential(GAP_MEAN, size=count))
        columns = np.asarray(head[:, candidates[:, k]], np.float64).T  # [count, H]
        x += (boost / np.sum(columns**2, axis=1))[:, None] * columns / gains
    normed = gains * x / np.sqrt(np.mean(x**2, axis=1, keepdims=True))
    return normed.astype(ml_dtypes.bfloat16)


def sample_rows(rng, hidden_rows, head, temperature):
    """(tokens, logp, max_prob, rank), each [N], of tokens drawn from softmax(z / tau).

    z = hidden_rows [N, H] @ head [H, V] in f32 (fixture.logit_rows), formed
    SAMPLING_ROWS positions at a time: [N, V] logits are never held. Each
    token is drawn by inverse CDF in float64 (one uniform per position, in
    order); logp = log softmax(z / tau)[y], max_prob and rank as
    fixture.token_statistics computes them, from the same float64 values:
    the exponentials are formed once and serve both.
    """
    vocab = head.shape[1]
    centred = np.empty((SAMPLING_ROWS, vocab), np.float32)
    work = np.empty((SAMPLING_ROWS, vocab), np.float64)
    parts = []
    for _, logits in fixture.logit_rows(hidden_rows, head, SAMPLING_ROWS):
        n = logits.shape[0]
        rows = np.arange(n)
        c, w = centred[:n], work[:n]
        np.subtract(logits, logits.max(axis=-1, keepdims=True), out=c)  # z - max in f32
        w[...] = c
        np.divide(w, temperature, out=w)  # scaled = (z - max) / tau in float64
        np.exp(w, out=w)
        log_norm = np.log(w.sum(axis=-1))
        cdf = np.cumsum(w, axis=-1, out=w)
        uniforms = rng.random(n)
        tokens = [np.searchsorted(row, u * row[-1], side="right") for row, u in zip(cdf, uniforms)]
        tokens = np.minimum(np.array(tokens), vocab - 1).astype(np.int32)
        chosen = logits[rows, tokens]
        logp = c[rows, tokens].astype(np.float64) / temperature - log_norm
        max_prob = np.exp(-log_norm)  # the max of scaled is 0
        rank = np.sum(logits > chosen[:, None], axis=-1)
        parts.append((tokens, logp.astype(np.float32), max_prob.astype(np.float32), rank.astype(np.int32)))
    return tuple(np.concatenate(column) for column in zip(*parts))


@dataclasses.dataclass(frozen=True)
class SyntheticSpec:
    batch: int = 4
    time: int = 256
    seed: int = 0
    temperature: float = 0.7
    group_size: int | None = None  # None: one group of the whole batch
    hidden_size: int = HIDDEN_SIZE
    vocab_size: int = VOCAB_SIZE

    def __post_init__(self):
        if self.batch < 1 or self.time < 1:
            raise ValueError(f"batch = {self.batch}, time = {self.time}; both must be >= 1")
        if self.hidden_size < OUTLIER_CHANNELS:
            raise ValueError(f"hidden size {self.hidden_size}; must be >= {OUTLIER_CHANNELS} (the outlier channels)")
        if self.vocab_size < 2:
            raise ValueError(f"vocab size {self.vocab_size}; must be >= 2")
        if not self.temperature > 0:
            raise ValueError(f"temperature = {self.temperature}; must be > 0")
        group = self.group_size or self.batch
        if self.batch % group:
            raise ValueError(f"group size {group} does not divide the batch {self.batch}")


def make_synthetic(out_dir, spec=SyntheticSpec(), command=None):
    """Write the synthetic fixture of `spec` to out_dir; returns its manifest. Timings go to stderr."""
    batch, time, tau = spec.batch, spec.time, spec.temperature
    hidden_size, vocab_size = spec.hidden_size, spec.vocab_size
    started = clock.perf_counter()
    head = lm_head(spec.seed, hidden_size, vocab_size)
    made_head = clock.perf_counter()
    layout = _rng(spec.seed, STREAM_LAYOUT)
    shortest = max(1, time // 8)
    lengths = np.concatenate([[time], layout.integers(shortest, max(shortest + 1, time), size=batch - 1)]).astype(int)
    rewards = layout.random(batch)
    mask = (np.arange(time)[None, :] < lengths[:, None]).astype(np.float32)
    where = np.argwhere(mask > 0)

    hidden_rng = _rng(spec.seed, STREAM_HIDDEN)
    gains = channel_gains(hidden_rng, hidden_size)
    rows = synthetic_hidden(hidden_rng, head, gains, len(where), tau)
    made_hidden = clock.perf_counter()
    tokens, logp, max_prob, rank = sample_rows(_rng(spec.seed, STREAM_SAMPLING), rows, head, tau)
    sampled = clock.perf_counter()
    head_sha256 = tensor_files.tensor_sha256(head)
    del head  # 1.2 GB at H = 4096: not needed to write

    def scatter(values, fill, dtype, trailing=()):
        out = np.full((batch, time, *trailing), fill, dtype)
        out[where[:, 0], where[:, 1]] = values
        return out

    group = spec.group_size or batch
    arrays = {
        "hidden": scatter(rows, 0, ml_dtypes.bfloat16, (hidden_size,)),
        "tokens": scatter(tokens, fixture.PAD_TOKEN, np.int32),
        "mask": mask,
        "old_logp": scatter(logp, 0, np.float32),
        "advantages": fixture.group_advantages(rewards, group),
    }
    sampling_stats = fixture.sampling_statistics(
        scatter(max_prob, 0, np.float32), scatter(rank, 0, np.int32), arrays["old_logp"], mask
    )
    manifest = {
        "format": fixture.FORMAT,
        "format_version": fixture.FORMAT_VERSION,
        "synthetic": True,
        "model": {
            "name": (
                "synthetic (Qwen2.5-1.5B dimensions)" if (hidden_size, vocab_size) == (HIDDEN_SIZE, VOCAB_SIZE)
                else f"synthetic (H = {hidden_size}, V = {vocab_size})"
            ),
            "revision": None,
            "architecture": None,
        },
        "shapes": {"B": batch, "T": time, "H": hidden_size, "V": vocab_size},
        "arrays": None,  # filled in by fixture.write
        "lm_head": {
            "layout": fixture.LM_HEAD_LAYOUT,
            "dtype": "BF16",
            "shape": [hidden_size, vocab_size],
            "sha256": head_sha256,
            "source": {
                "kind": "synthetic",
                "seed": spec.seed,
                "generator": "grpo_fixtures.synthetic.lm_head",
                "generator_version": GENERATOR_VERSION,
                "description": (
                    f"synthetic seed {spec.seed}: N(0, {WEIGHT_STD}^2) quantile table picked by PCG64 bits"
                ),
            },
        },
        "sampling": {
            "temperature": tau,
            "temperature_mode": "logits",
            "logits": "hidden (bf16) @ lm_head (bf16), exact products summed in f32",
            "old_logp": "log softmax(z / tau)[token] of those logits (float64, rounded to f32); 0 at padding",
            "eos_token_ids": None,
            "prompt_lengths": None,
            "completion_lengths": [int(n) for n in lengths],
            "group_size": group,
            "padding": {"tokens": fixture.PAD_TOKEN, "mask": 0, "old_logp": 0, "hidden": 0},
        },
        "rewards": {"method": fixture.REWARDS_METHOD, "rewards": [round(float(r), 6) for r in rewards]},
        "generated_by": {
            "command": command or (
                f"python -m grpo_fixtures synthetic --batch {batch} --time {time} --seed {spec.seed} "
                f"--temperature {tau}"
                + (f" --hidden-size {hidden_size}" if hidden_size != HIDDEN_SIZE else "")
                + (f" --vocab-size {vocab_size}" if vocab_size != VOCAB_SIZE else "")
            ),
            "seed": spec.seed,
            "tool": "grpo_fixtures.synthetic",
            "versions": fixture.versions(),
            "construction": {
                "weight_std": WEIGHT_STD, "hidden_rms": HIDDEN_RMS, "gain_log_std": GAIN_LOG_STD,
                "outlier_channels": OUTLIER_CHANNELS, "outlier_gain": OUTLIER_GAIN, "candidates": CANDIDATES,
                "log_odds_range": list(LOG_ODDS_RANGE), "gap_min": GAP_MIN, "gap_mean": GAP_MEAN,
            },
        },
        "statistics": sampling_stats,
    }
    manifest, _ = fixture.write(out_dir, manifest, arrays)
    print(
        f"LM head [{hidden_size}, {vocab_size}] in {made_head - started:.1f} s; hidden states in "
        f"{made_hidden - made_head:.1f} s; {len(where)} tokens sampled in {sampled - made_hidden:.1f} s; "
        f"written in {clock.perf_counter() - sampled:.1f} s",
        file=sys.stderr,
    )
    return manifest


# The production rows `grpo-verify gradcheck --preset` checks (made from a
# seed at run time, never committed; src/gradcheck/fixture.rs PRODUCTION_PRESETS has
# the same shapes): name -> spec, with the seed given at run time.
PRESETS = {
    "qwen-fused-t8192": SyntheticSpec(batch=1, time=8192, hidden_size=HIDDEN_SIZE, vocab_size=VOCAB_SIZE),
    "seed-fused-t8192": SyntheticSpec(batch=1, time=8192, hidden_size=4096, vocab_size=VOCAB_SIZE),
}


def preset_spec(name, seed=0):
    """The SyntheticSpec of preset `name` at `seed`; ValueError naming the presets if there is none."""
    if name not in PRESETS:
        raise ValueError(f"--name {name}: no such preset; the presets are {', '.join(PRESETS)}")
    return dataclasses.replace(PRESETS[name], seed=seed)
