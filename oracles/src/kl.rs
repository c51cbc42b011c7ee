//! SPEC v2's KL estimators of d = ref - logp (k1, abs, k2, k3 with verl's
//! clamps) and their admissible d/d logp: |d| at 0, k3's clamp edges and
//! its kl_max edge are kinks (docs/spec.md, "KL estimators").

use crate::config::{Config, Hparams, KlEstimator, KlGradient};
use crate::objective::KinkInterval;
use crate::policy::{hull_over, min_slack};

/// The estimator of one configuration (before beta and the ratio factor).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KlTerm {
    /// Which estimator of d = ref - logp: k1, abs, k2 or k3.
    pub estimator: KlEstimator,
    /// Its own gradient, or straight-through (k2's on the unclamped d).
    pub gradient: KlGradient,
    /// k3's clamp of d (+inf = none).
    pub clamp: f64,
    /// k3's clamp of its value (+inf = none).
    pub max: f64,
}

impl KlTerm {
    /// The term of a configuration: its estimator switches and k3's clamps
    /// (kl_log_ratio_clamp, kl_max).
    pub fn of(config: &Config, h: &Hparams) -> Self {
        KlTerm { estimator: config.kl_estimator, gradient: config.kl_gradient, clamp: h.kl_log_ratio_clamp, max: h.kl_max }
    }

    /// True for v1's k3: no clamp, own gradient (its value and slope are v1's formulas).
    pub fn is_v1(&self) -> bool {
        self.estimator == KlEstimator::K3 && self.gradient == KlGradient::Own && self.clamp == f64::INFINITY && self.max == f64::INFINITY
    }

    /// The estimator's value at d (straight-through changes only the gradient).
    pub fn value(&self, d: f64) -> f64 {
        match self.estimator {
            KlEstimator::K1 => -d,
            KlEstimator::Abs => d.abs(),
            KlEstimator::K2 => 0.5 * d * d,
            KlEstimator::K3 => {
                let dc = d.clamp(-self.clamp, self.clamp);
                // exp(dc) - dc - 1, exact near 0.
                (dc.exp_m1() - dc).min(self.max)
            }
        }
    }

    /// d value / d logp off the kinks (d = ref - logp, so -d value / d d).
    fn slope(&self, d: f64) -> f64 {
        if self.gradient == KlGradient::K2 {
            // d (d^2 / 2) / d logp on the unclamped d.
            return -d;
        }
        match self.estimator {
            KlEstimator::K1 => 1.0,
            KlEstimator::Abs => -d.signum(),
            KlEstimator::K2 => -d,
            KlEstimator::K3 => {
                if d.abs() >= self.clamp || self.value(d) >= self.max {
                    0.0
                } else {
                    -d.exp_m1()
                }
            }
        }
    }

    /// Where the slope jumps: the kink pieces ([`KlTerm::pieces`]): |d| at
    /// 0; k3's clamp edges and the two d at which exp(d) - d - 1 = kl_max
    /// (inside the clamp); none with a k2 gradient.
    fn kinks(&self) -> Vec<f64> {
        self.pieces().iter().filter(|p| p.kink).map(|p| p.at).collect()
    }

    /// The admissible d value / d logp over d within `slack` of `d`; a
    /// point off the kinks.
    pub fn interval(&self, d: f64, slack: f64) -> KinkInterval {
        let s = slack.max(min_slack(d));
        let kinks = self.kinks();
        if !kinks.iter().any(|&k| (k - d).abs() <= s) {
            let c = self.slope(d);
            return KinkInterval { lo: c, hi: c };
        }
        hull_over(d - s, d + s, &kinks, |x| self.slope(x))
    }

    /// A bound on |d slope / d logp| near d: what a rounding of logp moves
    /// the coefficient by, per unit.
    pub fn slope_sensitivity(&self, d: f64, slack: f64) -> f64 {
        if self.gradient == KlGradient::K2 {
            return 1.0;
        }
        match self.estimator {
            KlEstimator::K1 | KlEstimator::Abs => 0.0,
            KlEstimator::K2 => 1.0,
            KlEstimator::K3 => (d.min(self.clamp) + slack).exp(),
        }
    }
}

/// The two d with exp(d) - d - 1 = level (level > 0), by bisection.
pub(crate) fn k3_level_crossings(level: f64) -> [f64; 2] {
    let f = |d: f64| d.exp_m1() - d - level;
    let root = |mut a: f64, mut b: f64| {
        for _ in 0..200 {
            let m = 0.5 * (a + b);
            if (f(m) > 0.0) == (f(a) > 0.0) {
                a = m;
            } else {
                b = m;
            }
        }
        0.5 * (a + b)
    };
    // exp(d) - d - 1 >= d^2/2 for d >= 0, and ~ -d - 1 for d << 0.
    [root(-(level + 2.0), 0.0), root(0.0, (2.0 * level).sqrt().max(1.0) + 1.0)]
}
