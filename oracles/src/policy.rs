//! SPEC v2's policy terms (ppo, cispo, sapo) as functions of the ratio, and
//! the admissible d/dx of a term of r = exp(clamp(x, lo, hi)) over a window
//! of log-ratios x: the clamp's edges are kinks like the clip edges (docs/spec.md,
//! "Ratio level", "Policy loss", "Gradient conventions (v2)").

use crate::config::{Config, Hparams, PolicyLoss};
use crate::objective::{kink_interval, ppo_per_token, KinkInterval};

/// One token's policy term: its loss, advantage and hyperparameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PolicyTerm {
    /// ppo, cispo or sapo (docs/spec.md, "Policy loss").
    pub loss: PolicyLoss,
    /// A = `advantages[b]`, the advantage of the token's sequence.
    pub advantage: f64,
    /// The clip band's lower edge is 1 - eps_low (+inf: none, TRL's CISPO).
    pub eps_low: f64,
    /// ... and its upper edge 1 + eps_high.
    pub eps_high: f64,
    /// +inf unless two-sided ppo.
    pub delta: f64,
    /// SAPO's k: sapo_tau_pos for A > 0, else sapo_tau_neg.
    pub sapo_k: f64,
}

impl PolicyTerm {
    /// The term of one token with advantage A under a configuration (delta
    /// only where two-sided ppo applies; SAPO's k by the sign of A).
    pub fn of(config: &Config, h: &Hparams, advantage: f64) -> Self {
        PolicyTerm {
            loss: config.policy_loss,
            advantage,
            eps_low: h.eps_low,
            eps_high: h.eps_high,
            delta: h.effective_delta(config),
            sapo_k: if advantage > 0.0 { h.sapo_tau_pos } else { h.sapo_tau_neg },
        }
    }

    /// clip(r, 1 - eps_low, 1 + eps_high).
    pub fn clipped(&self, r: f64) -> f64 {
        r.max(1.0 - self.eps_low).min(1.0 + self.eps_high)
    }

    /// The term's value at ratio r and the token's own logp (CISPO's factor).
    pub fn value(&self, r: f64, logp: f64) -> f64 {
        let a = self.advantage;
        match self.loss {
            PolicyLoss::Ppo => ppo_per_token(r, a, self.eps_low, self.eps_high, self.delta),
            PolicyLoss::Cispo => -self.clipped(r) * a * logp,
            PolicyLoss::Sapo => -sigmoid(self.sapo_k * (r - 1.0)) * (4.0 / self.sapo_k) * a,
        }
    }

    /// d term / d logp through the token's own logp at fixed ratio: CISPO's
    /// -clip(r) A (its ratio is a constant); 0 for the others.
    pub fn logp_coef(&self, r: f64) -> f64 {
        match self.loss {
            PolicyLoss::Cispo => -self.clipped(r) * self.advantage,
            PolicyLoss::Ppo | PolicyLoss::Sapo => 0.0,
        }
    }

    /// The admissible d term / d x with r = exp(x) (no clamp) over
    /// [x - slack, x + slack]: ppo's kink interval; SAPO's smooth slope
    /// -4 A sigma (1 - sigma) r at x; 0 for CISPO (no gradient through r).
    pub fn ratio_interval(&self, x: f64, slack: f64) -> KinkInterval {
        match self.loss {
            PolicyLoss::Ppo => kink_interval(x, self.advantage, self.eps_low, self.eps_high, self.delta, slack),
            PolicyLoss::Sapo => {
                let r = x.exp();
                let s = sigmoid(self.sapo_k * (r - 1.0));
                let slope = crate::objective::times_ratio(-4.0 * self.advantage * s * (1.0 - s), r);
                KinkInterval { lo: slope, hi: slope }
            }
            PolicyLoss::Cispo => KinkInterval::default(),
        }
    }

    /// A bound on |d (ratio slope) / d x| near x = log r (for the
    /// tolerance's sensitivity): ppo |A| r, SAPO |A| (k r^2 + r), CISPO's
    /// direct coefficient |A| r where its clip passes r.
    pub fn slope_sensitivity(&self, r: f64) -> f64 {
        let a = self.advantage.abs();
        match self.loss {
            PolicyLoss::Ppo | PolicyLoss::Cispo => a * r,
            PolicyLoss::Sapo => a * (self.sapo_k * r * r + r),
        }
    }
}

/// 1 / (1 + exp(-x)) without overflow.
pub fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// The smallest window any interval is taken over: a value exactly on an
/// edge counts as on it (as in [`kink_interval`]).
pub fn min_slack(x: f64) -> f64 {
    4.0 * f64::EPSILON * (1.0 + x.abs())
}

/// The admissible d/dx of f(exp(clamp(x, lo, hi))) over [x - slack,
/// x + slack], given `inner(center, half_width)`: the admissible d/dx of
/// f(exp(x)) over a window. Where the window lies beyond a clamp edge the
/// slope is 0; a window across an edge takes the hull of 0 and the inside
/// part's interval (autodiff of a clamp exactly on its edge may pass any
/// share of the inside slope). The inside part [ia, ib] is where an
/// implementation's rounded x may lie unclamped, so its interval covers the
/// slopes at both its ends as well as `inner` over it: a smooth slope (e^x)
/// taken at the part's middle alone would reject an implementation whose x
/// rounded to just inside the edge (verl's GSPO-token at log_ratio_max = 10
/// with a window 0.07 wide: e^9.93 accepted, e^9.999 refused, 7.5% apart;
/// examples/verl/repros/harness-gspo-clamp-edge-false-alarm.json). With no
/// finite edge this is `inner(x, slack)`.
pub fn clamped_interval(x: f64, slack: f64, lo: f64, hi: f64, inner: impl Fn(f64, f64) -> KinkInterval) -> KinkInterval {
    if lo == f64::NEG_INFINITY && hi == f64::INFINITY {
        return inner(x, slack);
    }
    let s = slack.max(min_slack(x));
    let (a, b) = (x - s, x + s);
    let (ia, ib) = (a.max(lo), b.min(hi));
    let zero = KinkInterval::default();
    if ia > ib {
        // Wholly beyond an edge: the ratio is a constant there.
        return zero;
    }
    if ia == a && ib == b {
        return inner(x, slack);
    }
    let over = inner(0.5 * (ia + ib), 0.5 * (ib - ia));
    let ends = hull(inner(ia, min_slack(ia)), inner(ib, min_slack(ib)));
    hull(hull(over, ends), zero)
}

pub fn hull(a: KinkInterval, b: KinkInterval) -> KinkInterval {
    KinkInterval { lo: a.lo.min(b.lo), hi: a.hi.max(b.hi) }
}

/// The interval scaled by a factor of either sign.
pub fn scaled(iv: KinkInterval, k: f64) -> KinkInterval {
    let (p, q) = (iv.lo * k, iv.hi * k);
    KinkInterval { lo: p.min(q), hi: p.max(q) }
}

/// The Minkowski sum: any admissible coefficient of one plus any of the other.
pub fn sum(a: KinkInterval, b: KinkInterval) -> KinkInterval {
    KinkInterval { lo: a.lo + b.lo, hi: a.hi + b.hi }
}

/// The hull of the one-sided slopes of a piecewise-smooth function over
/// [a, b] whose kinks are `kinks` (`slope(x)` is its derivative off the
/// kinks): each piece's slope at both ends, just inside, and at its middle.
pub fn hull_over(a: f64, b: f64, kinks: &[f64], slope: impl Fn(f64) -> f64) -> KinkInterval {
    let mut cuts: Vec<f64> = std::iter::once(a).chain(kinks.iter().copied().filter(|&k| k > a && k < b)).chain(std::iter::once(b)).collect();
    cuts.sort_by(f64::total_cmp);
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for w in cuts.windows(2) {
        let nudge = 1e-9 * (w[1] - w[0]);
        for p in [w[0] + nudge, 0.5 * (w[0] + w[1]), w[1] - nudge] {
            let s = slope(p);
            lo = lo.min(s);
            hi = hi.max(s);
        }
    }
    KinkInterval { lo, hi }
}
