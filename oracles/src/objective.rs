//! Per-token terms of the objective, their derivatives, kink intervals and
//! aggregation weights (docs/spec.md, "Per-token quantities", "Aggregation",
//! "Gradient conventions").

use crate::config::Aggregation;
use crate::sum::CompensatedSum;

/// ppo = -min( min(r, delta) * A, clip(r, 1 - eps_low, 1 + eps_high) * A ).
pub fn ppo_per_token(ratio: f64, advantage: f64, eps_low: f64, eps_high: f64, delta: f64) -> f64 {
    let unclipped = ratio.min(delta) * advantage;
    let clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * advantage;
    -unclipped.min(clipped)
}

/// kl = beta * (exp(ref - logp) - (ref - logp) - 1), and its derivative
/// d kl / d logp = beta * (1 - exp(ref - logp)). expm1 keeps it exact near 0.
pub fn kl_per_token(logp: f64, ref_logp: f64, beta: f64) -> (f64, f64) {
    if beta == 0.0 {
        return (0.0, 0.0);
    }
    let d = ref_logp - logp;
    (beta * (d.exp_m1() - d), -beta * d.exp_m1())
}

/// The admissible values of d ppo / d logp at one token: any coefficient in
/// [lo, hi] is a correct derivative (docs/spec.md, "Kinks").
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct KinkInterval {
    /// The smallest admissible coefficient (lo <= hi).
    pub lo: f64,
    /// The largest admissible coefficient (= lo off a kink).
    pub hi: f64,
}

impl KinkInterval {
    /// One admissible coefficient: the token is off every kink (lo == hi).
    pub fn is_point(&self) -> bool {
        self.lo == self.hi
    }
    /// (lo + hi) / 2: the coefficient the oracle's gradient takes at a kink
    /// unless the caller gives one.
    pub fn midpoint(&self) -> f64 {
        0.5 * (self.lo + self.hi)
    }
    /// max(|lo|, |hi|): the largest coefficient's size, for error scales.
    pub fn max_abs(&self) -> f64 {
        self.lo.abs().max(self.hi.abs())
    }
    /// The admissible coefficient nearest c.
    pub fn clamp(&self, c: f64) -> f64 {
        c.clamp(self.lo, self.hi)
    }
}

/// The slopes in r of the two branches of the min, u = min(r, delta) * A
/// and c = clip(r, 1 - eps_low, 1 + eps_high) * A, on an open piece.
fn branch_slopes(ratio: f64, advantage: f64, eps_low: f64, eps_high: f64, delta: f64) -> (f64, f64) {
    let d_unclipped = if ratio < delta { advantage } else { 0.0 };
    let d_clipped = if ratio > 1.0 - eps_low && ratio < 1.0 + eps_high { advantage } else { 0.0 };
    (d_unclipped, d_clipped)
}

fn branch_values(ratio: f64, advantage: f64, eps_low: f64, eps_high: f64, delta: f64) -> (f64, f64) {
    (ratio.min(delta) * advantage, ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * advantage)
}

/// The admissible interval of d ppo / d logp over log-ratios within `slack`
/// of `log_ratio` = logp - old. On each open piece of the (piecewise-smooth)
/// ppo term the slope is -d * r with d the slope of the smaller branch; at
/// an edge (1 - eps_low, 1 + eps_high, delta) inside the neighbourhood, every
/// one-sided slope of every branch that attains the min there is admissible
/// too: clip and min(r, delta) are themselves not differentiable at their
/// edges, and autodiff may combine the tied branches' slopes (JAX splits a
/// tie in half). The interval is the hull of all of them. With a slack of
/// the implementation's own rounding distance, a token near an edge accepts
/// either branch. A minimum slack always applies, so a ratio exactly on an
/// edge is treated as on it.
pub fn kink_interval(
    log_ratio: f64,
    advantage: f64,
    eps_low: f64,
    eps_high: f64,
    delta: f64,
    slack: f64,
) -> KinkInterval {
    let slack = slack.max(4.0 * f64::EPSILON * (1.0 + log_ratio.abs()));
    let (a, b) = (log_ratio - slack, log_ratio + slack);
    let mut cuts = vec![a, b];
    let mut edges = Vec::new();
    for edge in [1.0 - eps_low, 1.0 + eps_high, delta] {
        if edge > 0.0 && edge.is_finite() {
            let e = edge.ln();
            if e > a && e < b {
                cuts.push(e);
                edges.push(edge);
            }
        }
    }
    if edges.is_empty() {
        // One smooth piece: the derivative at the point itself. (How far the
        // implementation's own r may sit from the oracle's is a smooth
        // effect, accounted for in the tolerance, not here.)
        let r = log_ratio.exp();
        let (du, dc) = branch_slopes(r, advantage, eps_low, eps_high, delta);
        let (u, c) = branch_values(r, advantage, eps_low, eps_high, delta);
        let slope = times_ratio(-(if c < u { dc } else { du }), r);
        return KinkInterval { lo: slope, hi: slope };
    }
    cuts.sort_by(f64::total_cmp);
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    let mut admit = |c: f64| {
        lo = lo.min(c);
        hi = hi.max(c);
    };
    for w in cuts.windows(2) {
        let mid = (0.5 * (w[0] + w[1])).exp();
        let (du, dc) = branch_slopes(mid, advantage, eps_low, eps_high, delta);
        let (u, c) = branch_values(mid, advantage, eps_low, eps_high, delta);
        let d = if c < u { dc } else { du };
        // d ppo / d logp = -d * r, monotone in r on a piece: its ends bound it.
        admit(times_ratio(-d, w[0].exp()));
        admit(times_ratio(-d, w[1].exp()));
    }
    for r in edges {
        let (u, c) = branch_values(r, advantage, eps_low, eps_high, delta);
        let tie = (u - c).abs() <= 1e-12 * (u.abs() + c.abs());
        for side in [r * (1.0 - 1e-9), r * (1.0 + 1e-9)] {
            let (du, dc) = branch_slopes(side, advantage, eps_low, eps_high, delta);
            if u <= c || tie {
                admit(-du * r);
            }
            if c <= u || tie {
                admit(-dc * r);
            }
        }
    }
    KinkInterval { lo, hi }
}

/// slope * r, where a flat branch (slope 0) stays 0 even where r overflows
/// to inf (0 * inf would be NaN): the derivative of a constant is 0.
pub(crate) fn times_ratio(slope: f64, r: f64) -> f64 {
    if slope == 0.0 {
        0.0
    } else {
        slope * r
    }
}

/// The weights w[b, t] with loss = sum(w * loss_t) for each aggregation.
pub fn aggregation_weights(
    mask: &[f32],
    batch: usize,
    time: usize,
    aggregation: Aggregation,
    normalizer: f64,
) -> Vec<f64> {
    let m = |i: usize| mask[i] as f64;
    match aggregation {
        Aggregation::TokenMean => {
            let count = CompensatedSum::of((0..batch * time).map(m)).max(1.0);
            (0..batch * time).map(|i| m(i) / count).collect()
        }
        Aggregation::SeqMeanTokenMean => {
            let mut w = Vec::with_capacity(batch * time);
            for b in 0..batch {
                let count = CompensatedSum::of((0..time).map(|t| m(b * time + t))).max(1.0);
                w.extend((0..time).map(|t| m(b * time + t) / (batch as f64 * count)));
            }
            w
        }
        Aggregation::SumOverConstant => (0..batch * time).map(|i| m(i) / normalizer).collect(),
        Aggregation::SeqMeanTokenMeanOverConstant => {
            let mut w = Vec::with_capacity(batch * time);
            for b in 0..batch {
                let count = CompensatedSum::of((0..time).map(|t| m(b * time + t))).max(1.0);
                w.extend((0..time).map(|t| m(b * time + t) / (count * normalizer)));
            }
            w
        }
    }
}
