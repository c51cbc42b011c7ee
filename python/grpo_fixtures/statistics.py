"""How real numbers differ from synthetic and generated ones: one table, one definition of each statistic.

    python -m grpo_fixtures statistics --fixture DIR [--fixture DIR ...] [--generated FILE] [--positions N]

Per source (a fixture: every valid position, or N of them evenly spaced; a
dump of generated fused cases, `cargo run --release --example
generated_cases`), over its positions:

    row norm        ||h||_2 of a final-norm hidden row
    max |h|         its largest entry
    outlier chans   channels whose mean |h| over the positions exceeds 8x the
                    median channel's (the count; the largest few named)
    logit range     max z - min z of a position's logits z = h @ lm_head
    p_max, entropy  of softmax(z) (tau = 1), in nats
    d lm_head       the spread of d lm_head's column norms, p99 / p50, for the
                    on-policy token-mean step (ratio 1, no clipping): dz =
                    -A_b / N (onehot(y) - softmax(z)) at each valid position,
                    d lm_head = h^T dz

Quantiles are p10 / p50 / p90 (max where it says so). A fixture's logits
are the full vocabulary's (f32 products of the bf16 values, blocks of rows
at a time); a generated case's are its own V.
"""

import json

import numpy as np

from grpo_fixtures import fixture, resolve, tensor_files

OUTLIER_FACTOR = 8.0
ROWS = 256


def _quantiles(values):
    values = np.asarray(values, np.float64)
    return {"p10": float(np.percentile(values, 10)), "p50": float(np.percentile(values, 50)),
            "p90": float(np.percentile(values, 90)), "max": float(values.max())}


class Accumulator:
    """The statistics of one source, fed a block of positions at a time."""

    def __init__(self):
        self.row_norm, self.max_abs, self.range, self.p_max, self.entropy = [], [], [], [], []
        self.channel_sum, self.positions = None, 0
        self.column_norms = []

    def add(self, hidden, logits, tokens, coefficient):
        """hidden [n, H], logits [n, V] (f32), tokens [n], coefficient [n] = -A_b / N of each position."""
        hidden = np.asarray(hidden, np.float64)
        self.row_norm.extend(np.linalg.norm(hidden, axis=1))
        self.max_abs.extend(np.max(np.abs(hidden), axis=1))
        channel = np.sum(np.abs(hidden), axis=0)
        self.channel_sum = channel if self.channel_sum is None else self.channel_sum + channel
        self.positions += hidden.shape[0]
        z = np.asarray(logits, np.float64)
        self.range.extend(z.max(axis=1) - z.min(axis=1))
        shifted = z - z.max(axis=1, keepdims=True)
        p = np.exp(shifted)
        p /= p.sum(axis=1, keepdims=True)
        self.p_max.extend(p.max(axis=1))
        self.entropy.extend(0.0 - np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), axis=1))
        dz = -p
        dz[np.arange(len(tokens)), tokens] += 1.0
        dz *= np.asarray(coefficient, np.float64)[:, None]
        return hidden.T @ dz  # this block's d lm_head [H, V]

    def outliers(self):
        """The outlier channels, largest first, and each one's mean |h| over the median channel's."""
        channel_mean = self.channel_sum / max(self.positions, 1)
        median = float(np.median(channel_mean))
        outliers = np.flatnonzero(channel_mean > OUTLIER_FACTOR * median)
        order = outliers[np.argsort(-channel_mean[outliers])]
        return order, channel_mean[order] / median

    def summary(self, d_lm_head_columns):
        order, ratio = self.outliers() if self.channel_sum is not None else (np.zeros(0, int), np.zeros(0))
        norms = np.asarray(d_lm_head_columns, np.float64)
        norms = norms[norms > 0]
        return {
            "positions": self.positions,
            "row_norm": _quantiles(self.row_norm),
            "max_abs_h": _quantiles(self.max_abs),
            "outlier_channels": {"count": int(order.size), "largest": [int(c) for c in order[:5]],
                                 "their_mean_abs_over_median": [round(float(r), 1) for r in ratio[:5]]},
            "logit_range": _quantiles(self.range),
            "p_max": _quantiles(self.p_max),
            "entropy": _quantiles(self.entropy),
            "d_lm_head_column_spread": {
                "p99_over_p50": float(np.percentile(norms, 99) / np.percentile(norms, 50)) if norms.size else None,
                "max_over_p50": float(norms.max() / np.percentile(norms, 50)) if norms.size else None,
            },
        }


def fixture_statistics(fixture_dir, positions=None, model_dir=None):
    """The statistics of a fixture's valid positions (all, or `positions` evenly spaced)."""
    manifest, arrays = fixture.load(fixture_dir)
    head = resolve.lm_head(fixture_dir, manifest, model_dir)
    mask, tokens = np.asarray(arrays["mask"]), np.asarray(arrays["tokens"])
    advantages = np.asarray(arrays["advantages"], np.float64)
    valid = np.argwhere(mask > 0)
    count = len(valid)
    if positions and positions < count:
        valid = valid[np.unique(np.linspace(0, count - 1, positions).round().astype(int))]
    hidden = np.asarray(arrays["hidden"])[valid[:, 0], valid[:, 1]]
    chosen = tokens[valid[:, 0], valid[:, 1]]
    coefficient = -advantages[valid[:, 0]] / count
    acc = Accumulator()
    d_lm_head = np.zeros(head.shape, np.float64)
    for start, logits in fixture.logit_rows(hidden, head, ROWS):
        stop = start + logits.shape[0]
        d_lm_head += acc.add(hidden[start:stop], logits, chosen[start:stop], coefficient[start:stop])
    result = acc.summary(np.linalg.norm(d_lm_head, axis=0))
    result["source"] = f"{manifest['model']['name']}: {fixture_dir}"
    return result


def generated_statistics(path):
    """The statistics of a dump of generated fused cases (examples/generated_cases.rs)."""
    tensors = tensor_files.read(path)
    cases = sorted({name.split(".")[0] for name in tensors})
    per_h = {}
    for case in cases:
        get = lambda name: np.asarray(tensors[f"{case}.{name}"])  # noqa: E731
        hidden, head = get("hidden").astype(np.float64), get("lm_head").astype(np.float64)
        tokens, mask, advantages, time = get("tokens"), get("mask"), get("advantages").astype(np.float64), get("time")
        valid = np.flatnonzero(mask > 0)
        if valid.size == 0:
            continue
        rows = valid // int(time[0])
        acc_key = hidden.shape[1]
        acc = per_h.setdefault(acc_key, Accumulator())
        logits = hidden[valid] @ head
        d = acc.add(hidden[valid], logits, tokens[valid], -advantages[rows] / valid.size)
        acc.column_norms.extend(np.linalg.norm(d, axis=0))
    merged = Accumulator()
    for acc in per_h.values():
        for name in ("row_norm", "max_abs", "range", "p_max", "entropy", "column_norms"):
            getattr(merged, name).extend(getattr(acc, name))
        merged.positions += acc.positions
    result = merged.summary(merged.column_norms)
    # Channels differ between cases of different H: outliers are counted within each H's cases.
    result["outlier_channels"] = {
        "count": sum(acc.outliers()[0].size for acc in per_h.values()),
        "note": f"summed over the {len(per_h)} hidden sizes drawn (channels of different H are not the same channels)",
    }
    result["source"] = f"generated fused cases: {path} ({len(cases)} cases)"
    return result


def markdown(results):
    """One table: a column per source."""
    def q(d, key, fmt="{:.3g}"):
        x = d[key]
        return f"{fmt.format(x['p10'])} / {fmt.format(x['p50'])} / {fmt.format(x['p90'])} (max {fmt.format(x['max'])})"

    def probability(d, key):
        # Near 1, the distance from 1 is what a reader needs (1 - p in f32's last bits).
        near = lambda p: "1" if p >= 1 else f"1-{1 - p:.1e}" if p > 0.99 else f"{p:.3g}"  # noqa: E731
        x = d[key]
        return f"{near(x['p10'])} / {near(x['p50'])} / {near(x['p90'])} (max {near(x['max'])})"

    rows = [
        ("positions", lambda r: str(r["positions"])),
        ("row norm ‖h‖ p10 / p50 / p90", lambda r: q(r, "row_norm")),
        ("max \\|h\\| of a row", lambda r: q(r, "max_abs_h")),
        ("outlier channels (mean \\|h\\| > 8x median)", lambda r: f"{r['outlier_channels']['count']}"
         + (f": {r['outlier_channels']['largest']}" if r["outlier_channels"].get("largest") else "")),
        ("logit range max z - min z", lambda r: q(r, "logit_range")),
        ("p_max (tau = 1)", lambda r: probability(r, "p_max")),
        ("entropy (nats, tau = 1)", lambda r: q(r, "entropy")),
        ("d lm_head column norms p99 / p50", lambda r: f"{r['d_lm_head_column_spread']['p99_over_p50']:.3g}"),
        ("d lm_head column norms max / p50", lambda r: f"{r['d_lm_head_column_spread']['max_over_p50']:.3g}"),
    ]
    lines = ["| statistic | " + " | ".join(r["source"] for r in results) + " |",
             "|---|" + "---|" * len(results)]
    lines += ["| " + name + " | " + " | ".join(fn(r) for r in results) + " |" for name, fn in rows]
    return "\n".join(lines)


def main(fixtures, generated, positions, as_json):
    results = [fixture_statistics(d, positions) for d in fixtures]
    if generated:
        results.append(generated_statistics(generated))
    print(json.dumps(results, indent=2) if as_json else markdown(results))
