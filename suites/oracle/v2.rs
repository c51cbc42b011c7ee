//! SPEC v2's self-checks (no JAX involved):
//! its gradient against central finite differences away from kinks for
//! every v2 switch, the metamorphic identities the v2 formulas imply, and a
//! fully masked batch. Cases are v1 cases (`case_spec`) with v2 switches and
//! hyperparameters drawn here on top ([`V2`]).
//!
//! Where a switch is a surrogate with a stop-gradient (straight-through KL,
//! GSPO-token, CISPO), central differences of the loss value are not its
//! gradient; the finite differences are then taken of the surrogate with
//! every stop-gradient frozen at the base point (see `finite_differences`).

use crate::common;
use super::helpers::*;


use std::sync::atomic::{AtomicU32, Ordering};

use grpo_oracle::{
    Aggregation, EntropyAggregation, Forward, KlEstimator, KlGradient, LogitsProblem, PolicyLoss, RatioLevel,
};
use grpo_verify::case::prng::Prng;
use grpo_verify::case::strategy::case_spec;
use grpo_verify::case::{Case, CaseSpec, Inputs, Kind};
use libtest_mimic::{Failed, Trial};
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::TestCaseError;

pub(super) const INF: f64 = f64::INFINITY;

/// What a property's case checked: `true` unless every check was skipped.
pub(super) type Outcome = Result<bool, TestCaseError>;

/// Rollout-correction weights to draw: none, [B, T] or [B, 1].
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Weights {
    Absent,
    PerToken(WeightValues),
    PerRow(WeightValues),
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum WeightValues {
    Ones,
    /// Uniform in [0, 2).
    Uniform,
    /// Uniform, about a third of them exactly 0.
    WithZeros,
    /// Up to 1e4 (a TIS cap far away), some 0.
    Large,
}

/// The v2 switches and hyperparameters drawn on top of a v1 case.
#[derive(Clone, Debug)]
pub(super) struct V2 {
    pub(super) ratio_level: RatioLevel,
    pub(super) policy_loss: PolicyLoss,
    pub(super) kl_estimator: KlEstimator,
    pub(super) kl_gradient: KlGradient,
    pub(super) kl_times_ratio: bool,
    pub(super) entropy_aggregation: EntropyAggregation,
    /// aggregation = seq_mean_token_mean_over_constant.
    pub(super) over_constant: bool,
    /// Turn the KL on (ref_logp drawn) whatever the v1 case says.
    pub(super) force_kl: bool,
    pub(super) logit_transform: bool,
    pub(super) logit_scale: f64,
    pub(super) logit_softcap: f64,
    pub(super) log_ratio_min: f64,
    pub(super) log_ratio_max: f64,
    pub(super) kl_log_ratio_clamp: f64,
    pub(super) kl_max: f64,
    pub(super) sapo_tau_pos: f64,
    pub(super) sapo_tau_neg: f64,
    /// CISPO with TRL's absolute cap only (eps_low = +inf).
    pub(super) cispo_cap_only: bool,
    pub(super) weights: Weights,
    pub(super) weights_seed: u64,
}

pub(super) fn v2_strategy() -> impl Strategy<Value = V2> {
    let switches = (
        select(vec![RatioLevel::Token, RatioLevel::Sequence, RatioLevel::SequenceToken]),
        select(vec![PolicyLoss::Ppo, PolicyLoss::Cispo, PolicyLoss::Sapo]),
        select(vec![KlEstimator::K3, KlEstimator::K1, KlEstimator::Abs, KlEstimator::K2]),
        select(vec![KlGradient::Own, KlGradient::K2]),
        any::<bool>(),
        select(vec![EntropyAggregation::Same, EntropyAggregation::TokenMean]),
        prop::bool::weighted(0.3),
        prop::bool::weighted(0.6),
    );
    let transform = (
        any::<bool>(),
        prop_oneof![Just(1.0), Just(0.5), Just(2.0), 0.2f64..3.0],
        prop_oneof![Just(INF), Just(30.0), Just(5.0), 1.0f64..50.0],
    );
    let clamps = (
        prop_oneof![
            2 => Just((-INF, INF)),
            1 => Just((-20.0, 20.0)),
            1 => Just((-INF, 10.0)),
            // Binds on many tokens (Mixed ratios reach |log r| = 12).
            2 => (-1.0f64..0.0, 0.0f64..1.0),
        ],
        prop_oneof![2 => Just(INF), 1 => Just(20.0), 1 => 0.1f64..2.0],
        prop_oneof![2 => Just(INF), 1 => Just(10.0), 1 => 0.01f64..1.0],
    );
    let values = select(vec![WeightValues::Ones, WeightValues::Uniform, WeightValues::WithZeros, WeightValues::Large]);
    let others = (
        prop_oneof![Just((1.0, 1.05f32 as f64)), (0.2f64..5.0, 0.2f64..5.0)],
        prop::bool::weighted(0.3),
        prop_oneof![
            1 => Just(Weights::Absent),
            1 => values.clone().prop_map(Weights::PerToken),
            1 => values.prop_map(Weights::PerRow)
        ],
        any::<u64>().no_shrink(),
    );
    (switches, transform, clamps, others).prop_map(|(s, t, c, o)| V2 {
        ratio_level: s.0,
        policy_loss: s.1,
        kl_estimator: s.2,
        kl_gradient: s.3,
        kl_times_ratio: s.4,
        entropy_aggregation: s.5,
        over_constant: s.6,
        force_kl: s.7,
        logit_transform: t.0,
        logit_scale: t.1,
        logit_softcap: t.2,
        log_ratio_min: c.0 .0,
        log_ratio_max: c.0 .1,
        kl_log_ratio_clamp: c.1,
        kl_max: c.2,
        sapo_tau_pos: o.0 .0,
        sapo_tau_neg: o.0 .1,
        cispo_cap_only: o.1,
        weights: o.2,
        weights_seed: o.3,
    })
}

/// A case's inputs with the logits widened to f64, so they can be perturbed.
#[derive(Clone)]
pub(super) struct Owned {
    pub(super) case: Case,
    pub(super) logits: Vec<f64>,
}

impl Owned {
    /// The v1 case of `spec` with the v2 switches of `v2` laid over it.
    pub(super) fn new(spec: &CaseSpec, v2: &V2) -> Self {
        let mut spec = spec.clone();
        if v2.force_kl {
            spec.config.kl = true; // before materialising: ref_logp is drawn then
        }
        let mut case = spec.materialize(Kind::Logits);
        let c = &mut case.config;
        c.ratio_level = v2.ratio_level;
        c.policy_loss = v2.policy_loss;
        c.kl_estimator = v2.kl_estimator;
        c.kl_gradient = v2.kl_gradient;
        c.kl_times_ratio = v2.kl_times_ratio;
        c.entropy_aggregation = v2.entropy_aggregation;
        if v2.over_constant {
            c.aggregation = Aggregation::SeqMeanTokenMeanOverConstant;
        }
        c.logit_transform = v2.logit_transform;
        let h = &mut case.hparams;
        h.logit_scale = v2.logit_scale;
        h.logit_softcap = v2.logit_softcap;
        h.log_ratio_min = v2.log_ratio_min;
        h.log_ratio_max = v2.log_ratio_max;
        h.kl_log_ratio_clamp = v2.kl_log_ratio_clamp;
        h.kl_max = v2.kl_max;
        h.sapo_tau_pos = v2.sapo_tau_pos;
        h.sapo_tau_neg = v2.sapo_tau_neg;
        if v2.policy_loss == PolicyLoss::Cispo && v2.cispo_cap_only {
            h.eps_low = INF; // after materialising: the ratio draw reads 1 - eps_low
        }
        let logits = match &case.inputs {
            Inputs::Logits { logits } => logits.iter().map(|&z| z as f64).collect(),
            Inputs::Fused { .. } => unreachable!("logits-kind cases only"),
        };
        let mut owned = Owned { case, logits };
        if v2.logit_transform {
            owned.recentre();
        }
        owned.set_weights(v2.weights, v2.weights_seed);
        owned
    }

    /// The v1 case drew old_logp and ref_logp around the untransformed
    /// logp (its log-ratios on the clip edges, etc.); a logit transform
    /// moves logp (by thousands with a softcap on logits of 1e4). Shift
    /// both by the move at each live token, so the drawn log-ratios and d
    /// stay what the generator meant (up to f32 rounding).
    pub(super) fn recentre(&mut self) {
        let (before, after) = (self.logps(false), self.logps(true));
        let mask = self.case.mask.clone();
        for arr in [self.case.old_logp.as_mut(), self.case.ref_logp.as_mut()].into_iter().flatten() {
            for (i, x) in arr.iter_mut().enumerate().filter(|(i, _)| mask[*i] != 0.0) {
                *x = (*x as f64 + after[i] - before[i]) as f32;
            }
        }
    }

    /// Every token's logp (0 at masked ones), with or without the transform.
    pub(super) fn logps(&self, transform: bool) -> Vec<f64> {
        let c = &self.case;
        let config = grpo_oracle::Config {
            temperature_mode: c.config.temperature_mode,
            on_policy: true,
            logit_transform: transform,
            ..grpo_oracle::Config::default()
        };
        let h = grpo_oracle::Hparams {
            temperature: c.hparams.temperature,
            logit_scale: c.hparams.logit_scale,
            logit_softcap: c.hparams.logit_softcap,
            ..grpo_oracle::Hparams::default()
        };
        let p = LogitsProblem {
            shape: c.shape(),
            logits: &self.logits,
            per_token: grpo_oracle::TokenInputs {
                tokens: &c.tokens,
                mask: &c.mask,
                advantages: &c.advantages,
                old_logp: None,
                ref_logp: None,
                is_weights: None,
            },
            config,
            hparams: h,
        };
        let f = p.forward().expect("valid case");
        f.tokens.iter().map(|t| if t.masked { 0.0 } else { t.logp }).collect()
    }

    /// Draws is_weights (and sets rollout_correction accordingly).
    pub(super) fn set_weights(&mut self, weights: Weights, seed: u64) {
        let (b_, t_) = (self.case.shape.batch, self.case.shape.time);
        let (n, values) = match weights {
            Weights::Absent => {
                self.case.is_weights = None;
                self.case.config.rollout_correction = false;
                return;
            }
            Weights::PerToken(v) => (b_ * t_, v),
            Weights::PerRow(v) => (b_, v),
        };
        let mut rng = Prng::new(seed);
        let w = (0..n)
            .map(|_| match values {
                WeightValues::Ones => 1.0,
                WeightValues::Uniform => rng.range(0.0, 2.0) as f32,
                WeightValues::WithZeros => {
                    if rng.below(3) == 0 {
                        0.0
                    } else {
                        rng.range(0.0, 2.0) as f32
                    }
                }
                WeightValues::Large => rng.pick(&[0.0, 1.0, 37.0, 1e3, 1e4]) as f32,
            })
            .collect();
        self.case.is_weights = Some(w);
        self.case.config.rollout_correction = true;
    }

    pub(super) fn problem(&self) -> LogitsProblem<'_, f64> {
        self.case.logits_problem(&self.logits)
    }

    /// Runs `f` on this case's forward pass.
    pub(super) fn with<R>(&self, f: impl FnOnce(&Forward<'_>) -> R) -> Result<R, TestCaseError> {
        let p = self.problem();
        let fwd = p.forward().map_err(|e| TestCaseError::fail(format!("oracle refused the case: {e}")))?;
        Ok(f(&fwd))
    }

    pub(super) fn loss(&self) -> f64 {
        self.problem().forward().expect("valid case").loss
    }

    /// (loss, per-token losses, gradient at the case's cotangent, natural
    /// gradient scale, loss scale).
    pub(super) fn outputs(&self) -> Result<Outputs, TestCaseError> {
        let cot = self.case.cotangent;
        self.with(|f| Outputs {
            loss: f.loss,
            per_token: f.tokens.iter().map(|t| if t.masked { 0.0 } else { t.per_token_loss }).collect(),
            grad: f.grad(cot),
            natural: natural_scale(f, cot),
            loss_scale: loss_scale(f),
        })
    }
}

pub(super) struct Outputs {
    pub(super) loss: f64,
    pub(super) per_token: Vec<f64>,
    pub(super) grad: Vec<f64>,
    pub(super) natural: f64,
    pub(super) loss_scale: f64,
}

/// Loss, per-token losses and gradient of `a` and `b` agree to `rel`
/// (relative to each quantity's natural scale).
pub(super) fn same_outputs(a: &Outputs, b: &Outputs, rel: f64, what: &str) -> Result<(), TestCaseError> {
    same_values(a, b, rel, what)?;
    let scale = a.natural.max(b.natural);
    for (i, (x, y)) in a.grad.iter().zip(&b.grad).enumerate() {
        close(*x, *y, rel, scale, &format!("{what}: grad element {i} (natural scale {scale:e})"))?;
    }
    Ok(())
}

/// Loss and per-token losses of `a` and `b` agree to `rel`.
pub(super) fn same_values(a: &Outputs, b: &Outputs, rel: f64, what: &str) -> Result<(), TestCaseError> {
    close(a.loss, b.loss, rel, a.loss_scale.max(b.loss_scale), &format!("{what}: loss"))?;
    for (i, (x, y)) in a.per_token.iter().zip(&b.per_token).enumerate() {
        close(*x, *y, rel, a.loss_scale.max(b.loss_scale), &format!("{what}: per_token_loss[{i}]"))?;
    }
    Ok(())
}

/// Is any live token within `slack` of a kink? Where two problems differ by
/// a rounding-sized move of logp, a token on a kink may take either side
/// (the oracle's coefficient there is one admissible value, not a
/// continuous one): their gradients are then not compared.
pub(super) fn kinked(o: &Owned, slack: f64) -> Result<bool, TestCaseError> {
    o.with(|f| (0..f.tokens.len()).any(|i| near_kink(f, i, slack).is_some()))
}

/// Runs `property` on generated (v1 case, v2 overlay) pairs; a failure
/// reports the shrunk pair. Fails too when fewer than a fifth of the cases
/// checked anything (every check skipped: the property would be vacuous).
pub(super) fn property(name: &str, default_cases: u32, property: fn(&CaseSpec, &V2) -> Outcome) -> Trial {
    crate::common::trial(name, move || {
        let cases = common::cases(default_cases);
        let checked = AtomicU32::new(0);
        let mut runner = common::runner(cases);
        runner
            .run(&(case_spec(&common::small_bounds()), v2_strategy()), |(spec, v2)| {
                if property(&spec, &v2)? {
                    checked.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            })
            .map_err(|e| Failed::from(format!("{e}")))?;
        let checked = checked.into_inner();
        if checked * 5 < cases {
            return Err(format!("only {checked} of {cases} cases checked anything").into());
        }
        Ok(())
    })
}

/// exp(d) - d - 1 with d clamped to [-c, c] (k3 before its kl_max clamp).
pub(super) fn k3_raw(d: f64, c: f64) -> f64 {
    let dc = d.clamp(-c, c);
    dc.exp_m1() - dc
}

/// Why token i is within `s` (in its kink variable x, and in d = ref - logp)
/// of a point where its coefficient jumps, if it is: the oracle's own
/// interval over the window is not a point, or [`spec_kink`] says so.
pub(super) fn near_kink(fwd: &Forward<'_>, i: usize, s: f64) -> Option<&'static str> {
    let st = &fwd.tokens[i];
    if st.masked {
        return None;
    }
    if !st.policy_interval.is_point() {
        return Some("policy interval not a point");
    }
    if !fwd.coefficient_interval(i, st.log_ratio, s).is_point() {
        return Some("the oracle sees a kink within the window");
    }
    spec_kink(fwd, i, s)
}

/// The SPEC's kinks, computed here (not by the oracle): x within s of a
/// log-ratio clamp edge or (ppo) of a clip or delta edge; or the KL (own
/// gradient) with |d| within s of 0 (abs), of k3's clamp edge, or k3's value
/// crossing kl_max over the window. CISPO and SAPO are smooth in logp, as
/// are k1, k2 and the straight-through gradient.
pub(super) fn spec_kink(fwd: &Forward<'_>, i: usize, s: f64) -> Option<&'static str> {
    let st = &fwd.tokens[i];
    if st.masked {
        return None;
    }
    let (c, h) = (&fwd.config, &fwd.hparams);
    let x = st.log_ratio;
    let near = |e: f64| e.is_finite() && (x - e).abs() <= s;
    if near(h.log_ratio_min) || near(h.log_ratio_max) {
        return Some("log-ratio clamp edge");
    }
    if c.policy_loss == PolicyLoss::Ppo {
        for e in [1.0 - h.eps_low, 1.0 + h.eps_high, h.effective_delta(c)] {
            if e > 0.0 && near(e.ln()) {
                return Some("clip or delta edge");
            }
        }
    }
    if h.effective_beta(c) != 0.0 && c.kl_gradient == KlGradient::Own {
        let d = st.kl_d;
        match c.kl_estimator {
            KlEstimator::Abs if d.abs() <= s => return Some("|d| = 0"),
            KlEstimator::K3 => {
                let clamp = h.kl_log_ratio_clamp;
                if clamp.is_finite() && (d.abs() - clamp).abs() <= s {
                    return Some("k3 log-ratio clamp edge");
                }
                if h.kl_max.is_finite() {
                    let (a, b) = (k3_raw(d - s, clamp), k3_raw(d + s, clamp));
                    let lo = if (d - s) * (d + s) <= 0.0 { 0.0 } else { a.min(b) };
                    if lo <= h.kl_max && h.kl_max <= a.max(b) {
                        return Some("k3 crosses kl_max");
                    }
                }
            }
            _ => {}
        }
    }
    None
}

/// clip(r, 1 - eps_low, 1 + eps_high).
pub(super) fn clip(r: f64, eps_low: f64, eps_high: f64) -> f64 {
    r.max(1.0 - eps_low).min(1.0 + eps_high)
}

/// CISPO's sg(clip(r)) is a constant over the window (x within s) at token
/// i: then the loss value's central difference is the surrogate's gradient.
pub(super) fn cispo_clip_is_locally_constant(fwd: &Forward<'_>, i: usize, s: f64) -> bool {
    let h = &fwd.hparams;
    let x = fwd.tokens[i].log_ratio;
    let at = |x: f64| clip(x.clamp(h.log_ratio_min, h.log_ratio_max).exp(), h.eps_low, h.eps_high);
    at(x - s) == at(x + s)
}

/// The tokens whose terms a perturbation of row `row`'s logits moves: the
/// row alone at the token level, every live token of its sequence at the
/// sequence levels.
pub(super) fn coupled(fwd: &Forward<'_>, row: usize) -> Vec<usize> {
    let t_ = fwd.shape.time;
    match fwd.config.ratio_level {
        RatioLevel::Token => vec![row],
        RatioLevel::Sequence | RatioLevel::SequenceToken => {
            let b = row / t_;
            (b * t_..(b + 1) * t_).filter(|&j| !fwd.tokens[j].masked).collect()
        }
    }
}

/// Property 1: central differences of the loss wrt the logits equal
/// `Forward::grad`, on rows away from kinks, for every v2 switch.
///
/// The differenced function. Off-policy always (on-policy, old =
/// sg(logp) cannot be perturbed). Where a switch has a stop-gradient, the
/// function differenced is the surrogate with the sg frozen at the base
/// point, written as another oracle problem:
/// - kl_gradient k2 (straight-through, value kX + sg(kX - k2)): the frozen
///   surrogate is k2(d) + const, i.e. kl_estimator k2 with its own
///   gradient. With kl_times_ratio, (k2(d) + const_t) r_t is no oracle
///   problem: those draws use the own gradient here (straight-through times
///   the ratio is checked by `straight_through_is_k2_gradient`).
/// - sequence_token (r_t = exp(sg(L_b) + logp_t - sg(logp_t))): the token
///   level with old'_t = logp_t - L_b. old' is f32, so the rewrite sits a
///   rounding of old' away from the base point: the tolerance adds the
///   coefficient's sensitivity times that distance.
/// - cispo (-sg(clip(r)) A logp): only rows where clip(r) is constant over
///   the window (r beyond the band, a clamp binding, or a zero-width band)
///   are differenced; elsewhere the value's derivative has the extra
///   -A logp d clip / d logp.
///
/// The skip rule. A probe of +-step in one logit moves that token's logp,
/// and so its log-ratio x and its d = ref - logp, by at most step * gain /
/// tau (|d logp / dz_v| <= |onehot - p| / tau times the transform's gain);
/// at the sequence levels L_b of its row moves by less. A row is skipped
/// when any token it is coupled to (`coupled`) is within twice that of a
/// kink of the SPEC (`spec_kink`, computed here, on both the original and
/// the differenced problem: a clamp or clip or delta edge, |d| = 0 for abs,
/// k3's clamp edge or its kl_max crossing): then the stencil would straddle
/// a jump of the derivative. The skip does not trust the oracle's
/// intervals: wherever the SPEC has no kink within the window the oracle's
/// interval must be a point, or the case fails (a wrong interval would
/// otherwise hide its row). A smooth piece's truncation error is O(step^2)
/// and the rounding noise is bounded as in suites/oracle.rs.
pub(super) fn finite_differences(spec: &CaseSpec, v2: &V2) -> Outcome {
    let mut spec = spec.clone();
    spec.config.on_policy = false;
    let mut v2 = v2.clone();
    if v2.kl_gradient == KlGradient::K2 && v2.kl_times_ratio {
        v2.kl_gradient = KlGradient::Own;
    }
    let original = Owned::new(&spec, &v2);
    let p_original = original.problem();
    let fwd = p_original.forward().map_err(|e| TestCaseError::fail(format!("refused: {e}")))?;
    let mut target = original.clone();
    if target.case.config.kl_gradient == KlGradient::K2 {
        target.case.config.kl_estimator = KlEstimator::K2;
        target.case.config.kl_gradient = KlGradient::Own;
    }
    // |old'(f32) - old'| per token: how far the rewrite's x sits from L_b.
    let mut rewrite_shift = vec![0.0f64; fwd.tokens.len()];
    if target.case.config.ratio_level == RatioLevel::SequenceToken {
        target.case.config.ratio_level = RatioLevel::Token;
        let old = target.case.old_logp.as_mut().expect("off-policy");
        for (i, st) in fwd.tokens.iter().enumerate().filter(|(_, s)| !s.masked) {
            let exact = st.logp - st.log_ratio;
            old[i] = exact as f32;
            rewrite_shift[i] = (old[i] as f64 - exact).abs();
        }
    }
    let p_target = target.problem();
    let tfwd = p_target.forward().map_err(|e| TestCaseError::fail(format!("rewrite refused: {e}")))?;
    let cot = original.case.cotangent;
    let grad = fwd.grad(cot);
    let (tau, v_) = (original.case.hparams.temperature, original.case.shape.vocab);
    let natural = natural_scale(&fwd, cot).max(natural_scale(&tfwd, cot));
    let step = 1e-5 * tau.min(1.0);
    let window = 2.0 * step * gain(&fwd) / tau;
    let transform = tfwd.logit_transform();
    let max_x = original.logits.iter().map(|&z| transform.map_or(z, |t| t.apply(z))).fold(0.0f64, |m, z| m.max(z.abs())) / tau;
    let noise = 64.0 * f64::EPSILON * (1.0 + max_x) * (loss_scale(&tfwd) + natural) * cot.abs() / step;
    let cispo = fwd.config.policy_loss == PolicyLoss::Cispo;
    // Where the SPEC has no kink within the window, the oracle must report
    // a single coefficient (else a wrong interval would skip the row here).
    for (f, shift) in [(&fwd, 0.0), (&tfwd, 1.0)] {
        for j in (0..f.tokens.len()).filter(|&j| !f.tokens[j].masked) {
            let s = window + shift * rewrite_shift[j];
            let x = f.tokens[j].log_ratio;
            if spec_kink(f, j, s).is_none() && !(f.tokens[j].policy_interval.is_point() && f.coefficient_interval(j, x, 0.5 * s).is_point()) {
                return Err(TestCaseError::fail(format!(
                    "token {j}: no kink within {s:e} of x = {x:e}, d = {:e}, but the oracle's interval is {:?} (over the window {:?})",
                    f.tokens[j].kl_d,
                    f.tokens[j].policy_interval,
                    f.coefficient_interval(j, x, 0.5 * s)
                )));
            }
        }
    }
    let rows: Vec<usize> = (0..fwd.tokens.len())
        .filter(|&row| !fwd.tokens[row].masked)
        .filter(|&row| {
            coupled(&fwd, row).into_iter().chain(coupled(&tfwd, row)).all(|j| {
                spec_kink(&fwd, j, window).is_none()
                    && spec_kink(&tfwd, j, window + rewrite_shift[j]).is_none()
                    && (!cispo || cispo_clip_is_locally_constant(&tfwd, j, window + rewrite_shift[j]))
            })
        })
        .take(6)
        .collect();
    let mut probe = target.clone();
    for &row in &rows {
        let st = &fwd.tokens[row];
        // The rewrite's distance from the base point, through the
        // coefficient's sensitivity, into this row's gradient.
        let shifted = if rewrite_shift[row] > 0.0 {
            let (sensitivity, _) = tfwd.coefficient_sensitivity(row, rewrite_shift[row]);
            4.0 * cot.abs() * st.weight * sensitivity * rewrite_shift[row] * gain(&fwd) / tau
        } else {
            0.0
        };
        for v in [st.chosen, (st.chosen + 1) % v_, (row * 7919) % v_] {
            let i = row * v_ + v;
            // The loss varies on the scale of tau: the step is relative to it.
            let fd = cot
                * common::central_difference(target.logits[i], step, |value| {
                    probe.logits[i] = value;
                    probe.loss()
                });
            let what = format!("d loss / d logits[{row}, {v}] ({:?} {:?})", fwd.config.ratio_level, fwd.config.policy_loss);
            close(grad[i], fd, 1e-5, natural * 1e-4 + (noise + shifted) / 1e-5, &what)?;
        }
    }
    Ok(!rows.is_empty())
}
