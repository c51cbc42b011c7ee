//! The objective's piecewise points, from the terms that compute it: each
//! clamp, min / max and kink where the slope jumps, and each exp whose
//! argument can leave f32's range, with the guards around it (the
//! hyperparameters that bound its variable before or after it, finite or
//! not). The KL's kinks ([`KlTerm::kinks`]) are read off this list, so the
//! list is the oracle's own; a coverage report names an edge by its point
//! and its guards' state (docs/conventions.md, "Edges by their guards"): an
//! exp past f32's range with no clamp before it and a clamp after it is a
//! different edge from the same exp behind a finite clamp.

use crate::config::{Config, Hparams, KlEstimator, KlGradient, PolicyLoss};
use crate::kl::KlTerm;
use crate::policy::PolicyTerm;

/// exp overflows f32 past this argument (ln of f32's largest value).
pub const F32_EXP_MAX: f64 = 88.722_839;

/// The variable a point is a point of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Variable {
    /// The log-ratio before its clamp (token, or the row's mean L_b).
    LogRatio,
    /// The ratio after the clamp.
    Ratio,
    /// The KL's d = ref - logp.
    KlD,
}

impl Variable {
    /// How an edge's name writes it: "log-ratio", "ratio", "kl d".
    pub fn name(self) -> &'static str {
        match self {
            Variable::LogRatio => "log-ratio",
            Variable::Ratio => "ratio",
            Variable::KlD => "kl d",
        }
    }
}

/// A hyperparameter bounding the variable around a point, and whether it is
/// finite on this configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Guard {
    /// The hyperparameter (`kl_max`, `log_ratio_max`; `log_ratio clamp` for
    /// log_ratio_min and log_ratio_max together).
    pub hparam: &'static str,
    /// Finite on this configuration, so it bounds the variable (+-inf is off).
    pub finite: bool,
    /// Before the point (it bounds the variable first) or after it.
    pub before: bool,
}

/// One piecewise point.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Piece {
    /// The variable it lies on.
    pub variable: Variable,
    /// What the point is, e.g. "k3's clamp of d".
    pub what: &'static str,
    /// The variable's value there, in its own units (a log-ratio or d in
    /// nats, a ratio unitless); may be infinite when a hyperparameter is.
    pub at: f64,
    /// The side past the point: above it (true) or below.
    pub past_above: bool,
    /// The slope jumps there (a kink of the f64 objective); false: a point
    /// of f32's range (an exp that overflows past it).
    pub kink: bool,
    /// Up to two guards.
    pub guards: [Option<Guard>; 2],
}

impl Piece {
    /// Is x on the point (within a few f32 roundings, relative 1e-5)?
    pub fn on(&self, x: f64) -> bool {
        self.at.is_finite() && (x - self.at).abs() <= 1e-5 * self.at.abs().max(1.0)
    }

    /// Is x past the point, by more than being on it?
    pub fn past(&self, x: f64) -> bool {
        !self.on(x) && if self.past_above { x > self.at } else { x < self.at }
    }

    /// The edge of being `relation` ("on", "past") the point, under its
    /// guards' state: "kl d: past exp(d)'s f32 overflow at 88.7 (kl_log_ratio_clamp
    /// infinite before, kl_max finite after)".
    pub fn edge(&self, relation: &str) -> String {
        let guards: Vec<String> = self
            .guards
            .iter()
            .flatten()
            .map(|g| format!("{} {} {}", g.hparam, if g.finite { "finite" } else { "infinite" }, if g.before { "before" } else { "after" }))
            .collect();
        let guards = if guards.is_empty() { String::new() } else { format!(" ({})", guards.join(", ")) };
        format!("{}: {relation} {}{guards}", self.variable.name(), self.what)
    }

    /// The edges a case can reach at this point: on it and past it for a
    /// kink; past it for a point of f32's range, and only where a guard is
    /// finite (with none, an f32 value there overflows as the contract's own
    /// arithmetic does).
    pub fn relations(&self) -> &'static [&'static str] {
        if self.kink {
            &["on", "past"]
        } else if self.guards.iter().flatten().any(|g| g.finite) {
            &["past"]
        } else {
            &[]
        }
    }
}

fn guard(hparam: &'static str, value: f64, before: bool) -> Option<Guard> {
    Some(Guard { hparam, finite: value.is_finite(), before })
}

impl KlTerm {
    /// The estimator's piecewise points (none for k1, k2, or a k2
    /// gradient's smooth d): |d| at 0; k3's clamp of d, its kl_max level
    /// (inside the clamp) and exp(d) past f32's range.
    pub fn pieces(&self) -> Vec<Piece> {
        let piece = |what, at, past_above, kink, guards| Piece { variable: Variable::KlD, what, at, past_above, kink, guards };
        match self.estimator {
            KlEstimator::K1 | KlEstimator::K2 => vec![],
            KlEstimator::Abs => vec![piece("|d|'s kink at 0", 0.0, true, self.gradient != KlGradient::K2, [None, None])],
            KlEstimator::K3 => {
                let kink = self.gradient != KlGradient::K2;
                let mut p = Vec::new();
                if self.clamp.is_finite() {
                    // Not a point of the objective where kl_max already holds
                    // the value on both sides of it.
                    let after = [guard("kl_max", self.max, false), None];
                    let below_max = |d: f64| d.exp_m1() - d < self.max;
                    for (what, at, above) in [("k3's clamp of d, below", -self.clamp, false), ("k3's clamp of d, above", self.clamp, true)] {
                        if below_max(at) {
                            p.push(piece(what, at, above, kink, after));
                        }
                    }
                }
                if self.max.is_finite() {
                    let before = [guard("kl_log_ratio_clamp", self.clamp, true), None];
                    let [low, high] = crate::kl::k3_level_crossings(self.max);
                    for (what, at, above) in [("k3 = kl_max, below", low, false), ("k3 = kl_max, above", high, true)] {
                        if at.abs() < self.clamp {
                            p.push(piece(what, at, above, kink, before));
                        }
                    }
                }
                // exp(d): finite in f64, past f32's range above 88.7; what
                // bounds it is a clamp before it and kl_max after.
                p.push(piece(
                    "exp(d)'s f32 overflow at 88.7",
                    F32_EXP_MAX,
                    true,
                    false,
                    [guard("kl_log_ratio_clamp", self.clamp, true), guard("kl_max", self.max, false)],
                ));
                p
            }
        }
    }
}

impl PolicyTerm {
    /// The policy term's points in the ratio: ppo's and CISPO's clip edges
    /// (both, whatever the advantage's sign: at an edge autodiff of clip
    /// and min may take either branch, SPEC's gradient conventions) and
    /// ppo's dual clip delta; none for SAPO (smooth) or A = 0. The log-ratio
    /// clamp is the guard in front.
    pub fn pieces(&self, log_ratio_min: f64, log_ratio_max: f64) -> Vec<Piece> {
        let clamp = if log_ratio_min.is_finite() || log_ratio_max.is_finite() { 1.0 } else { f64::INFINITY };
        let before = [guard("log_ratio clamp", clamp, true), None];
        let piece = |what, at, past_above| Piece { variable: Variable::Ratio, what, at, past_above, kink: true, guards: before };
        let (low, high) = (1.0 - self.eps_low, 1.0 + self.eps_high);
        if self.advantage == 0.0 {
            return vec![];
        }
        match self.loss {
            PolicyLoss::Ppo => {
                let mut p = vec![piece("ppo's clip edge 1 - eps_low", low, false), piece("ppo's clip edge 1 + eps_high", high, true)];
                if self.delta.is_finite() && self.advantage < 0.0 {
                    p.push(piece("ppo's dual clip delta, A < 0", self.delta, true));
                }
                p
            }
            PolicyLoss::Cispo => vec![piece("cispo's clip edge 1 - eps_low", low, false), piece("cispo's clip edge 1 + eps_high", high, true)],
            PolicyLoss::Sapo => vec![],
        }
    }
}

/// The log-ratio's points: its clamp's edges and exp past f32's range
/// (with the clamp above it as its guard).
pub fn log_ratio_pieces(h: &Hparams) -> Vec<Piece> {
    let piece = |what, at, past_above, kink, guards| Piece { variable: Variable::LogRatio, what, at, past_above, kink, guards };
    let mut p = Vec::new();
    if h.log_ratio_min.is_finite() {
        p.push(piece("clamp log_ratio_min", h.log_ratio_min, false, true, [None, None]));
    }
    if h.log_ratio_max.is_finite() {
        p.push(piece("clamp log_ratio_max", h.log_ratio_max, true, true, [None, None]));
    }
    p.push(piece("exp's f32 overflow at 88.7", F32_EXP_MAX, true, false, [guard("log_ratio_max", h.log_ratio_max, true), None]));
    p
}

/// Every piecewise point of a configuration whose variable a case sets per
/// token: the log-ratio's and the policy term's (off-policy; at the
/// sequence levels of the row's mean), the KL's (with a reference).
/// `advantage` picks the policy term's sign-dependent hyperparameters.
pub fn pieces(config: &Config, h: &Hparams, advantage: f64) -> Vec<Piece> {
    let mut p = Vec::new();
    if !config.on_policy {
        p.extend(log_ratio_pieces(h));
        p.extend(PolicyTerm::of(config, h, advantage).pieces(h.log_ratio_min, h.log_ratio_max));
    }
    if config.kl {
        p.extend(KlTerm::of(config, h).pieces());
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::KlGradient;

    /// The oracle's own kink intervals are wide exactly at the pieces that
    /// are kinks: sweeping d, the KL's admissible slope interval is a point
    /// everywhere but within its window of a kink piece.
    #[test]
    fn the_kl_kinks_are_its_kink_pieces() {
        for (estimator, clamp, max) in [
            (KlEstimator::K3, 5.0, 3.0),
            (KlEstimator::K3, f64::INFINITY, 3.0),
            (KlEstimator::K3, 5.0, f64::INFINITY),
            (KlEstimator::Abs, f64::INFINITY, f64::INFINITY),
        ] {
            let kl = KlTerm { estimator, gradient: KlGradient::Own, clamp, max };
            let kinks: Vec<f64> = kl.pieces().iter().filter(|p| p.kink).map(|p| p.at).collect();
            assert!(!kinks.is_empty(), "{estimator:?} {clamp} {max}");
            let slack = 1e-3;
            for i in -8000..8000 {
                let d = i as f64 * 1.3e-3;
                let near = kinks.iter().any(|&k| (k - d).abs() <= slack);
                let iv = kl.interval(d, slack);
                assert_eq!(iv.lo != iv.hi, near, "{estimator:?} clamp {clamp} max {max} at d = {d}: {iv:?}");
            }
        }
    }

    /// ppo's admissible ratio slope is an interval exactly at its pieces:
    /// sweeping x = log r, `ratio_interval` is wide within the window of a
    /// piece and a point away from every one, for both signs of A.
    #[test]
    fn the_ppo_kinks_are_its_pieces() {
        for (advantage, delta) in [(1.3, f64::INFINITY), (-0.7, f64::INFINITY), (-0.7, 3.0), (0.9, 3.0)] {
            let term = PolicyTerm { loss: PolicyLoss::Ppo, advantage, eps_low: 0.2, eps_high: 0.28, delta, sapo_k: 1.0 };
            let at: Vec<f64> = term.pieces(f64::NEG_INFINITY, f64::INFINITY).iter().map(|p| p.at.ln()).collect();
            assert!(!at.is_empty());
            let slack = 1e-3;
            for i in -4000..4000 {
                let x = i as f64 * 4.1e-4;
                let nearest = at.iter().map(|&k| (k - x).abs()).fold(f64::INFINITY, f64::min);
                if (nearest - slack).abs() < 1e-5 {
                    continue;
                }
                let iv = term.ratio_interval(x, slack);
                assert_eq!(iv.lo != iv.hi, nearest < slack, "A {advantage} delta {delta} at x = {x}: {iv:?}");
            }
        }
    }

    /// Every k3 configuration lists exp(d)'s overflow with the guards it
    /// has: the one that mattered (no clamp before, kl_max after) is named
    /// apart from the one behind a finite clamp.
    #[test]
    fn exp_overflow_is_named_by_its_guards() {
        let exp = |clamp: f64, max: f64| {
            let kl = KlTerm { estimator: KlEstimator::K3, gradient: KlGradient::Own, clamp, max };
            kl.pieces().into_iter().find(|p| !p.kink).expect("the exp piece")
        };
        assert_eq!(exp(f64::INFINITY, 10.0).edge("past"), "kl d: past exp(d)'s f32 overflow at 88.7 (kl_log_ratio_clamp infinite before, kl_max finite after)");
        assert_ne!(exp(20.0, 10.0).edge("past"), exp(f64::INFINITY, 10.0).edge("past"));
        // Unguarded, the overflow is f32's own: no edge.
        assert!(exp(f64::INFINITY, f64::INFINITY).relations().is_empty());
        assert_eq!(exp(f64::INFINITY, 10.0).relations(), &["past"]);
    }
}
