//! Self-verification of the f64 oracle's SPEC version 2 (no JAX involved):
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

use std::sync::atomic::{AtomicU32, Ordering};

use grpo_oracle::{
    Aggregation, EntropyAggregation, Forward, KlEstimator, KlGradient, LogitsProblem, PolicyLoss, RatioLevel,
    TemperatureMode,
};
use grpo_verify::case::prng::Prng;
use grpo_verify::case::strategy::case_spec;
use grpo_verify::case::{Case, CaseSpec, Inputs, Kind, MaskPattern};
use libtest_mimic::{Failed, Trial};
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::TestCaseError;

const INF: f64 = f64::INFINITY;

/// What a property's case checked: `true` unless every check was skipped.
type Outcome = Result<bool, TestCaseError>;

/// Rollout-correction weights to draw: none, [B, T] or [B, 1].
#[derive(Clone, Copy, Debug, PartialEq)]
enum Weights {
    Absent,
    PerToken(WeightValues),
    PerRow(WeightValues),
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum WeightValues {
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
struct V2 {
    ratio_level: RatioLevel,
    policy_loss: PolicyLoss,
    kl_estimator: KlEstimator,
    kl_gradient: KlGradient,
    kl_times_ratio: bool,
    entropy_aggregation: EntropyAggregation,
    /// aggregation = seq_mean_token_mean_over_constant.
    over_constant: bool,
    /// Turn the KL on (ref_logp drawn) whatever the v1 case says.
    force_kl: bool,
    logit_transform: bool,
    logit_scale: f64,
    logit_softcap: f64,
    log_ratio_min: f64,
    log_ratio_max: f64,
    kl_log_ratio_clamp: f64,
    kl_max: f64,
    sapo_tau_pos: f64,
    sapo_tau_neg: f64,
    /// CISPO with TRL's absolute cap only (eps_low = +inf).
    cispo_cap_only: bool,
    weights: Weights,
    weights_seed: u64,
}

fn v2_strategy() -> impl Strategy<Value = V2> {
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
struct Owned {
    case: Case,
    logits: Vec<f64>,
}

impl Owned {
    /// The v1 case of `spec` with the v2 switches of `v2` laid over it.
    fn new(spec: &CaseSpec, v2: &V2) -> Self {
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
    fn recentre(&mut self) {
        let (before, after) = (self.logps(false), self.logps(true));
        let mask = self.case.mask.clone();
        for arr in [self.case.old_logp.as_mut(), self.case.ref_logp.as_mut()].into_iter().flatten() {
            for (i, x) in arr.iter_mut().enumerate().filter(|(i, _)| mask[*i] != 0.0) {
                *x = (*x as f64 + after[i] - before[i]) as f32;
            }
        }
    }

    /// Every token's logp (0 at masked ones), with or without the transform.
    fn logps(&self, transform: bool) -> Vec<f64> {
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
    fn set_weights(&mut self, weights: Weights, seed: u64) {
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

    fn problem(&self) -> LogitsProblem<'_, f64> {
        self.case.logits_problem(&self.logits)
    }

    /// Runs `f` on this case's forward pass.
    fn with<R>(&self, f: impl FnOnce(&Forward<'_>) -> R) -> Result<R, TestCaseError> {
        let p = self.problem();
        let fwd = p.forward().map_err(|e| TestCaseError::fail(format!("oracle refused the case: {e}")))?;
        Ok(f(&fwd))
    }

    fn loss(&self) -> f64 {
        self.problem().forward().expect("valid case").loss
    }

    /// (loss, per-token losses, gradient at the case's cotangent, natural
    /// gradient scale, loss scale).
    fn outputs(&self) -> Result<Outputs, TestCaseError> {
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

struct Outputs {
    loss: f64,
    per_token: Vec<f64>,
    grad: Vec<f64>,
    natural: f64,
    loss_scale: f64,
}

/// Loss, per-token losses and gradient of `a` and `b` agree to `rel`
/// (relative to each quantity's natural scale).
fn same_outputs(a: &Outputs, b: &Outputs, rel: f64, what: &str) -> Result<(), TestCaseError> {
    same_values(a, b, rel, what)?;
    let scale = a.natural.max(b.natural);
    for (i, (x, y)) in a.grad.iter().zip(&b.grad).enumerate() {
        close(*x, *y, rel, scale, &format!("{what}: grad element {i} (natural scale {scale:e})"))?;
    }
    Ok(())
}

/// Loss and per-token losses of `a` and `b` agree to `rel`.
fn same_values(a: &Outputs, b: &Outputs, rel: f64, what: &str) -> Result<(), TestCaseError> {
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
fn kinked(o: &Owned, slack: f64) -> Result<bool, TestCaseError> {
    o.with(|f| (0..f.tokens.len()).any(|i| near_kink(f, i, slack).is_some()))
}

/// Runs `property` on generated (v1 case, v2 overlay) pairs; a failure
/// reports the shrunk pair. Fails too when fewer than a fifth of the cases
/// checked anything (every check skipped: the property would be vacuous).
fn property(name: &str, default_cases: u32, property: fn(&CaseSpec, &V2) -> Outcome) -> Trial {
    Trial::test(name, move || {
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

fn close(a: f64, b: f64, rel: f64, scale: f64, what: &str) -> Result<(), TestCaseError> {
    if scale.is_nan() {
        return Err(TestCaseError::fail(format!("{what}: {a:e} vs {b:e} with a NaN scale (a NaN coefficient)")));
    }
    if (a - b).abs() <= rel * (scale + a.abs().max(b.abs())) {
        Ok(())
    } else {
        Err(TestCaseError::fail(format!("{what}: {a:e} vs {b:e} (diff {:e})", (a - b).abs())))
    }
}

/// The largest |dz''/dz| of the logit transform (1 without one).
fn gain(fwd: &Forward<'_>) -> f64 {
    fwd.transform_gain()
}

/// The gradient's natural magnitude: max over rows of |cot| gain (w
/// (|c_policy| + |c_kl| + terms) / tau + entropy_coef w_ent (1 + H) s),
/// with `terms` the size of what the coefficients are summed from (the
/// oracle's bound: |A| r, beta r (|kl| + |d| + ...)): they can cancel, as
/// straight-through |d| times the ratio does for d > 0. Elements far below
/// it are cancellation noise, so comparisons are relative to it.
fn natural_scale(fwd: &Forward<'_>, cot: f64) -> f64 {
    let h = &fwd.hparams;
    let ec = h.effective_entropy_coef(&fwd.config);
    fwd.tokens
        .iter()
        .enumerate()
        .filter(|(_, t)| !t.masked)
        .map(|(i, t)| {
            let terms = fwd.coefficient_sensitivity(i, 0.0).1;
            let logp = t.weight * (t.policy_interval.max_abs() + t.kl_coef.abs() + terms) / h.temperature;
            let entropy = ec * t.entropy_weight * (1.0 + t.entropy) * fwd.entropy_scale();
            cot.abs() * gain(fwd) * (logp + entropy)
        })
        .fold(1e-300, f64::max)
}

/// The scale the loss's rounding is relative to: its terms, and how much a
/// rounding of logp (relative to the log-sum-exp it subtracts) moves them.
fn loss_scale(fwd: &Forward<'_>) -> f64 {
    let h = &fwd.hparams;
    let ec = h.effective_entropy_coef(&fwd.config);
    let logp_mode = if fwd.config.temperature_mode == TemperatureMode::Logp { 1.0 / h.temperature } else { 1.0 };
    fwd.tokens
        .iter()
        .filter(|t| !t.masked)
        .map(|t| {
            let sensitivity = t.weight * (t.policy_interval.max_abs() + t.kl_coef.abs()) + ec * t.entropy_weight * (1.0 + t.entropy);
            let terms = t.weight * t.per_token_loss.abs() + ec * t.entropy_weight * t.entropy;
            terms + sensitivity * (1.0 + (t.softmax.lse.abs() + t.x_chosen.abs()) * logp_mode)
        })
        .sum::<f64>()
        + 1e-300
}

/// exp(d) - d - 1 with d clamped to [-c, c] (k3 before its kl_max clamp).
fn k3_raw(d: f64, c: f64) -> f64 {
    let dc = d.clamp(-c, c);
    dc.exp_m1() - dc
}

/// Why token i is within `s` (in its kink variable x, and in d = ref - logp)
/// of a point where its coefficient jumps, if it is: the oracle's own
/// interval over the window is not a point, or [`spec_kink`] says so.
fn near_kink(fwd: &Forward<'_>, i: usize, s: f64) -> Option<&'static str> {
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
fn spec_kink(fwd: &Forward<'_>, i: usize, s: f64) -> Option<&'static str> {
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
fn clip(r: f64, eps_low: f64, eps_high: f64) -> f64 {
    r.max(1.0 - eps_low).min(1.0 + eps_high)
}

/// CISPO's sg(clip(r)) is a constant over the window (x within s) at token
/// i: then the loss value's central difference is the surrogate's gradient.
fn cispo_clip_is_locally_constant(fwd: &Forward<'_>, i: usize, s: f64) -> bool {
    let h = &fwd.hparams;
    let x = fwd.tokens[i].log_ratio;
    let at = |x: f64| clip(x.clamp(h.log_ratio_min, h.log_ratio_max).exp(), h.eps_low, h.eps_high);
    at(x - s) == at(x + s)
}

/// The tokens whose terms a perturbation of row `row`'s logits moves: the
/// row alone at the token level, every live token of its sequence at the
/// sequence levels.
fn coupled(fwd: &Forward<'_>, row: usize) -> Vec<usize> {
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
fn finite_differences(spec: &CaseSpec, v2: &V2) -> Outcome {
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

/// Keeps exactly one valid token per row (mask Full first, so every
/// position holds a real token).
fn one_token_per_row(spec: &CaseSpec, v2: &V2) -> Owned {
    let mut spec = spec.clone();
    spec.mask = MaskPattern::Full;
    let mut a = Owned::new(&spec, v2);
    let t_ = a.case.shape.time;
    for (b, row) in a.case.mask.chunks_mut(t_).enumerate() {
        let keep = (b * 5 + spec.seed as usize % 7) % t_;
        row.iter_mut().enumerate().for_each(|(t, m)| *m = if t == keep { 1.0 } else { 0.0 });
    }
    a
}

/// ratio_level sequence (and sequence_token) equals token, loss and
/// gradient, when every row has exactly one valid token: L_b is then that
/// token's log-ratio, and s_b's coupling is the token itself.
fn sequence_is_token_with_one_token_per_row(spec: &CaseSpec, v2: &V2) -> Outcome {
    let mut token = one_token_per_row(spec, v2);
    token.case.config.ratio_level = RatioLevel::Token;
    let want = token.outputs()?;
    for level in [RatioLevel::Sequence, RatioLevel::SequenceToken] {
        let mut other = token.clone();
        other.case.config.ratio_level = level;
        same_outputs(&want, &other.outputs()?, 1e-12, &format!("{level:?} vs Token"))?;
    }
    Ok(true)
}

/// sequence_token has the loss value (and per-token losses and ratios) of
/// sequence.
fn sequence_token_has_the_value_of_sequence(spec: &CaseSpec, v2: &V2) -> Outcome {
    let mut seq = Owned::new(spec, v2);
    seq.case.config.ratio_level = RatioLevel::Sequence;
    let mut st = seq.clone();
    st.case.config.ratio_level = RatioLevel::SequenceToken;
    let (a, b) = (seq.outputs()?, st.outputs()?);
    close(a.loss, b.loss, 1e-14, a.loss_scale, "loss")?;
    for (i, (x, y)) in a.per_token.iter().zip(&b.per_token).enumerate() {
        close(*x, *y, 1e-14, a.loss_scale, &format!("per_token_loss[{i}]"))?;
    }
    let ratios = |o: &Owned| o.with(|f| f.tokens.iter().map(|t| if t.masked { 0.0 } else { t.ratio }).collect::<Vec<_>>());
    for (i, (x, y)) in ratios(&seq)?.iter().zip(&ratios(&st)?).enumerate() {
        close(*x, *y, 1e-14, 0.0, &format!("ratio[{i}]"))?;
    }
    Ok(true)
}

/// kl_gradient k2 (straight-through): the loss value of the chosen
/// estimator, the gradient of kl_estimator k2, each against a separate
/// forward. With kl_times_ratio, kl_t r_t's gradient is r_t dk2 + kX dr_t,
/// so row by row (r_t the row's ratio):
///   g(X, st, times) = g(X, own, times) + r_t (g(k2, own) - g(X, own)),
/// the last two without the ratio factor (policy and entropy parts cancel).
fn straight_through_is_k2_gradient(spec: &CaseSpec, v2: &V2) -> Outcome {
    let mut spec = spec.clone();
    spec.config.kl = true;
    let mut st = Owned::new(&spec, v2);
    st.case.config.kl_gradient = KlGradient::K2;
    let with = |estimator: KlEstimator, gradient: KlGradient, times: bool| {
        let mut o = st.clone();
        o.case.config.kl_estimator = estimator;
        o.case.config.kl_gradient = gradient;
        o.case.config.kl_times_ratio = times;
        o.outputs()
    };
    let (x, times) = (st.case.config.kl_estimator, st.case.config.kl_times_ratio);
    let a = st.outputs()?;
    let own = with(x, KlGradient::Own, times)?;
    close(a.loss, own.loss, 1e-14, a.loss_scale, "loss vs the estimator's own")?;
    for (i, (p, q)) in a.per_token.iter().zip(&own.per_token).enumerate() {
        close(*p, *q, 1e-14, a.loss_scale, &format!("per_token_loss[{i}]"))?;
    }
    let k2 = with(KlEstimator::K2, KlGradient::Own, false)?;
    if !times {
        for (i, (p, q)) in a.grad.iter().zip(&k2.grad).enumerate() {
            close(*p, *q, 1e-12, a.natural.max(k2.natural), &format!("grad element {i} vs kl_estimator k2"))?;
        }
        return Ok(true);
    }
    let plain = with(x, KlGradient::Own, false)?;
    let ratios = st.with(|f| f.tokens.iter().map(|t| if t.masked { 0.0 } else { t.ratio }).collect::<Vec<_>>())?;
    let v_ = st.case.shape.vocab;
    for (row, &r) in ratios.iter().enumerate() {
        let scale = a.natural.max(own.natural) + r * k2.natural.max(plain.natural);
        for i in row * v_..(row + 1) * v_ {
            let want = own.grad[i] + r * (k2.grad[i] - plain.grad[i]);
            close(a.grad[i], want, 1e-11, scale, &format!("grad element {i} (row {row}, r = {r:e})"))?;
        }
    }
    Ok(true)
}

/// verl's dual-clip policy loss (core_algos.compute_policy_loss), verbatim.
fn verl_dual_clip(r: f64, a: f64, eps_low: f64, eps_high: f64, c: f64) -> f64 {
    let pg_losses1 = -a * r;
    let pg_losses2 = -a * r.max(1.0 - eps_low).min(1.0 + eps_high);
    let clip_pg_losses1 = pg_losses1.max(pg_losses2);
    let pg_losses3 = -a * c;
    let clip_pg_losses2 = pg_losses3.min(clip_pg_losses1);
    if a < 0.0 {
        clip_pg_losses2
    } else {
        clip_pg_losses1
    }
}

/// ppo with two_sided and delta = c is verl's dual-clip (with its token
/// log-ratio clamp [-20, 20]): per-token losses on every row (for A < 0 the
/// dual clip binds; for A >= 0 delta never does), and each token's
/// coefficient is the derivative of verl's formula in x = log r (a central
/// difference of the scalar formula) where x is off its edges.
fn two_sided_is_verl_dual_clip(spec: &CaseSpec, v2: &V2) -> Outcome {
    let mut spec = spec.clone();
    spec.config.kl = false;
    spec.config.entropy_bonus = false;
    spec.config.two_sided = true;
    let mut v2 = v2.clone();
    v2.policy_loss = PolicyLoss::Ppo;
    v2.force_kl = false;
    v2.ratio_level = RatioLevel::Token;
    v2.weights = Weights::Absent;
    v2.log_ratio_min = -20.0;
    v2.log_ratio_max = 20.0;
    let a = Owned::new(&spec, &v2);
    let h = a.case.hparams;
    let c = h.delta;
    let (el, eh) = (h.eps_low, h.eps_high);
    let verl = |x: f64, adv: f64| verl_dual_clip(x.clamp(-20.0, 20.0).exp(), adv, el, eh, c);
    a.with(|f| {
        let mut negative = false;
        for (i, t) in f.tokens.iter().enumerate().filter(|(_, t)| !t.masked) {
            let want = verl(t.log_ratio, t.advantage);
            let scale = t.advantage.abs() * (1.0 + t.ratio.min(c));
            close(t.per_token_loss, want, 1e-13, scale, &format!("per-token loss {i} (A = {}, r = {:e})", t.advantage, t.ratio))?;
            negative |= t.advantage < 0.0;
            let x = t.log_ratio;
            let edges = [(1.0 - el).ln(), (1.0 + eh).ln(), c.ln(), -20.0, 20.0];
            if edges.iter().all(|&e| !((x - e).abs() < 1e-4)) {
                let dx = 1e-7;
                let slope = (verl(x + dx, t.advantage) - verl(x - dx, t.advantage)) / (2.0 * dx);
                if !t.policy_interval.is_point() {
                    return Err(TestCaseError::fail(format!("token {i} off the edges has interval {:?}", t.policy_interval)));
                }
                close(t.policy_interval.lo, slope, 1e-6, scale, &format!("d loss / d logp at token {i}"))?;
            }
        }
        Ok(negative)
    })?
}

/// is_weights all 1 ([B, T] or [B, 1]) equals no weights.
fn unit_weights_are_no_weights(spec: &CaseSpec, v2: &V2) -> Outcome {
    let mut none = Owned::new(spec, v2);
    none.set_weights(Weights::Absent, 0);
    let want = none.outputs()?;
    for w in [Weights::PerToken(WeightValues::Ones), Weights::PerRow(WeightValues::Ones)] {
        let mut ones = none.clone();
        ones.set_weights(w, 0);
        same_outputs(&want, &ones.outputs()?, 1e-14, &format!("{w:?} vs none"))?;
    }
    Ok(true)
}

/// In logits mode, logit_scale s with temperature tau is scale 1 with
/// temperature tau / s: softmax(s z / tau) either way, so loss, logp and
/// entropy agree, and so does d/dz (the chain rule's s from the scale is
/// the 1/(tau/s) = s/tau of the other: the factor between them is 1).
fn logit_scale_is_a_temperature(spec: &CaseSpec, v2: &V2) -> Outcome {
    let mut spec = spec.clone();
    spec.config.temperature_mode = TemperatureMode::Logits;
    let mut v2 = v2.clone();
    v2.logit_transform = true;
    v2.logit_softcap = INF;
    if v2.logit_scale == 1.0 {
        v2.logit_scale = 2.5;
    }
    let scaled = Owned::new(&spec, &v2);
    let s = v2.logit_scale;
    let mut plain = scaled.clone();
    plain.case.config.logit_transform = false;
    plain.case.hparams.temperature = scaled.case.hparams.temperature / s;
    let (a, b) = (scaled.outputs()?, plain.outputs()?);
    // s z / tau and z / (tau / s) differ by roundings of x: relative ones of
    // up to 3e5 (logits 3e4 at tau = 0.1), which move p (and the gradient) by
    // a few eps |x| relative.
    let max_x = scaled.logits.iter().fold(0.0f64, |m, z| m.max((s * z).abs())) / scaled.case.hparams.temperature;
    let rel = 1e-12 + 16.0 * f64::EPSILON * max_x;
    if kinked(&scaled, 1e-9)? || kinked(&plain, 1e-9)? {
        same_values(&a, &b, rel, "scale s, tau vs scale 1, tau / s")?;
    } else {
        same_outputs(&a, &b, rel, "scale s, tau vs scale 1, tau / s")?;
    }
    let stats = |o: &Owned| o.with(|f| f.tokens.iter().filter(|t| !t.masked).map(|t| (t.logp, t.entropy, t.softmax.lse.abs() + t.x_chosen.abs())).collect::<Vec<_>>());
    for ((lp_a, ent_a, size), (lp_b, ent_b, _)) in stats(&scaled)?.into_iter().zip(stats(&plain)?) {
        close(lp_a, lp_b, 1e-12, 1.0 + size, "logp")?;
        close(ent_a, ent_b, 1e-10, 1.0 + size, "entropy")?;
    }
    Ok(true)
}

/// A softcap far above every scaled logit changes nothing, to 1e-9
/// relative: c tanh(z / c) = z (1 - (z/c)^2 / 3 + ...) moves the softmax's
/// argument x = z / tau by |x| (z/c)^2 / 3, and logits up to 3e4 at tau =
/// 0.1 make |x| 3e5: c = 1e6 max|z| sqrt(max(1, max|x|)) keeps that move
/// below 1e-12 absolute, and the slope sech^2 within 1e-12 of 1.
fn far_softcap_changes_nothing(spec: &CaseSpec, v2: &V2) -> Outcome {
    let mut v2 = v2.clone();
    v2.logit_transform = true;
    v2.logit_softcap = INF;
    let off = Owned::new(spec, &v2);
    let max_z = off.logits.iter().fold(0.0f64, |m, z| m.max((v2.logit_scale * z).abs())).max(1.0);
    let max_x = max_z / off.case.hparams.temperature;
    let mut capped = off.clone();
    capped.case.hparams.logit_softcap = 1e6 * max_z * max_x.max(1.0).sqrt();
    let (a, b) = (off.outputs()?, capped.outputs()?);
    if kinked(&off, 1e-9)? || kinked(&capped, 1e-9)? {
        same_values(&a, &b, 1e-9, "far softcap vs none")?;
        return Ok(false);
    }
    same_outputs(&a, &b, 1e-9, "far softcap vs none")?;
    Ok(true)
}

/// log_ratio_min/max that bind nowhere (finite, beyond every kink
/// variable) equal the ±inf defaults; a clamp that binds everywhere makes
/// the ratio the constant exp(edge): the policy term then has no gradient
/// (the gradient is that of the same case with every advantage 0, which
/// keeps the KL and entropy, and the KL's ratio factor) and its value is
/// is_t * policy(exp(edge)) by the SPEC's formula. CISPO draws use SAPO
/// here (its gradient does not go through r; see `cispo_coefficient`).
fn log_ratio_clamps(spec: &CaseSpec, v2: &V2) -> Outcome {
    let mut v2 = v2.clone();
    v2.log_ratio_min = -INF;
    v2.log_ratio_max = INF;
    if v2.policy_loss == PolicyLoss::Cispo {
        v2.policy_loss = PolicyLoss::Sapo;
    }
    let free = Owned::new(spec, &v2);
    let xs = free.with(|f| f.tokens.iter().filter(|t| !t.masked).map(|t| t.log_ratio).collect::<Vec<_>>())?;
    let (min_x, max_x) = xs.iter().fold((0.0f64, 0.0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
    let want = free.outputs()?;
    let mut wide = free.clone();
    wide.case.hparams.log_ratio_min = min_x - 1.5;
    wide.case.hparams.log_ratio_max = max_x + 0.5;
    same_outputs(&want, &wide.outputs()?, 1e-14, "a clamp beyond every log-ratio vs none")?;
    // Binding everywhere: above every x or below it, by the seed.
    let mut bound = free.clone();
    let (lo, hi) = if spec.seed % 2 == 0 { (max_x + 0.5, max_x + 1.0) } else { (min_x - 1.0, min_x - 0.5) };
    bound.case.hparams.log_ratio_min = lo;
    bound.case.hparams.log_ratio_max = hi;
    let edge = if spec.seed % 2 == 0 { lo } else { hi };
    let mut no_advantage = bound.clone();
    no_advantage.case.advantages.iter_mut().for_each(|a| *a = 0.0);
    let (b, z) = (bound.outputs()?, no_advantage.outputs()?);
    let scale = b.natural.max(z.natural);
    for (i, (x, y)) in b.grad.iter().zip(&z.grad).enumerate() {
        close(*x, *y, 1e-13, scale, &format!("grad element {i}: binding clamp vs A = 0"))?;
    }
    let h = bound.case.hparams;
    let r = edge.exp();
    let per_token = bound.with(|f| f.tokens.iter().map(|t| (t.masked, t.ratio, t.is_weight, t.advantage)).collect::<Vec<_>>())?;
    for (i, &(masked, ratio, is_weight, adv)) in per_token.iter().enumerate().filter(|(_, t)| !t.0) {
        let _ = masked;
        close(ratio, r, 1e-15, 0.0, &format!("ratio of token {i}"))?;
        let policy = match v2.policy_loss {
            PolicyLoss::Sapo => {
                let k = if adv > 0.0 { h.sapo_tau_pos } else { h.sapo_tau_neg };
                -(4.0 / k) * adv / (1.0 + (-k * (r - 1.0)).exp())
            }
            _ => {
                let delta = if bound.case.config.two_sided { h.delta } else { INF };
                -(r.min(delta) * adv).min(clip(r, h.eps_low, h.eps_high) * adv)
            }
        };
        let got = b.per_token[i] - z.per_token[i];
        close(got, is_weight * policy, 1e-12, b.loss_scale, &format!("policy term of token {i} at r = exp(edge)"))?;
    }
    Ok(true)
}

/// seq_mean_token_mean_over_constant with normalizer = B equals
/// seq_mean_token_mean.
fn over_constant_b_is_seq_mean(spec: &CaseSpec, v2: &V2) -> Outcome {
    let mut a = Owned::new(spec, v2);
    a.case.config.aggregation = Aggregation::SeqMeanTokenMean;
    let mut b = a.clone();
    b.case.config.aggregation = Aggregation::SeqMeanTokenMeanOverConstant;
    b.case.hparams.normalizer = a.case.shape.batch as f64;
    same_outputs(&a.outputs()?, &b.outputs()?, 1e-13, "over constant B vs seq_mean_token_mean")?;
    Ok(true)
}

/// entropy_aggregation token_mean equals same when the aggregation is token_mean.
fn entropy_token_mean_is_same_under_token_mean(spec: &CaseSpec, v2: &V2) -> Outcome {
    let mut spec = spec.clone();
    spec.config.entropy_bonus = true;
    let mut a = Owned::new(&spec, v2);
    a.case.config.aggregation = Aggregation::TokenMean;
    a.case.config.entropy_aggregation = EntropyAggregation::Same;
    let mut b = a.clone();
    b.case.config.entropy_aggregation = EntropyAggregation::TokenMean;
    same_outputs(&a.outputs()?, &b.outputs()?, 1e-13, "entropy token_mean vs same")?;
    Ok(true)
}

/// CISPO's coefficient d loss_t / d logp_t is -is_t clip(r_t) A per token
/// (r_t recomputed here from logp and old_logp, per ratio level and clamp),
/// and the gradient row is cot w_t times it times d logp / d logits.
fn cispo_coefficient(spec: &CaseSpec, v2: &V2) -> Outcome {
    let mut spec = spec.clone();
    spec.config.kl = false;
    spec.config.entropy_bonus = false;
    let mut v2 = v2.clone();
    v2.policy_loss = PolicyLoss::Cispo;
    v2.force_kl = false;
    let a = Owned::new(&spec, &v2);
    let (t_, v_) = (a.case.shape.time, a.case.shape.vocab);
    let h = a.case.hparams;
    let cot = a.case.cotangent;
    let mask = &a.case.mask;
    a.with(|f| {
        let x_token = |i: usize| a.case.old_logp.as_ref().map_or(0.0, |old| f.tokens[i].logp - old[i] as f64);
        let natural = natural_scale(f, cot);
        let (mut g, mut dir) = (f.grad(cot), vec![0.0; v_]);
        for i in (0..f.tokens.len()).filter(|&i| mask[i] != 0.0) {
            let b = i / t_;
            let x = match f.config.ratio_level {
                RatioLevel::Token => x_token(i),
                _ => {
                    let live: Vec<usize> = (b * t_..(b + 1) * t_).filter(|&j| mask[j] != 0.0).collect();
                    live.iter().map(|&j| x_token(j)).sum::<f64>() / live.len() as f64
                }
            };
            let r = x.clamp(h.log_ratio_min, h.log_ratio_max).exp();
            let st = &f.tokens[i];
            let want = -st.is_weight * clip(r, h.eps_low, h.eps_high) * st.advantage;
            let iv = st.policy_interval;
            let scale = st.is_weight * st.advantage.abs() * (1.0 + r.min(1.0 + h.eps_high));
            if !iv.is_point() {
                return Err(TestCaseError::fail(format!("token {i}: CISPO is smooth in logp, interval {iv:?}")));
            }
            close(iv.lo, want, 1e-9, scale, &format!("CISPO coefficient of token {i} (r = {r:e})"))?;
            f.dlogp_dlogits_row(i, &mut dir);
            for (k, d) in dir.iter().enumerate() {
                let want = cot * st.weight * iv.lo * d;
                close(g[i * v_ + k], want, 1e-12, natural, &format!("grad[{i}, {k}]"))?;
                g[i * v_ + k] = 0.0;
            }
        }
        if let Some(k) = g.iter().position(|&x| x != 0.0) {
            return Err(TestCaseError::fail(format!("masked row element {k} has gradient {}", g[k])));
        }
        Ok(true)
    })?
}

/// SAPO's term -sigmoid(k (r - 1)) (4 / k) A is odd in A once k is fixed;
/// k depends on sign(A) alone. So negating every advantage and swapping
/// the two temperatures negates the policy part of everything:
///   L(A; tau_pos, tau_neg) + L(-A; tau_neg, tau_pos) = 2 L(0)
/// for the loss, the per-token losses and the gradient (L(0) keeps the KL,
/// its ratio factor and the entropy; the policy term is 0 at A = 0).
fn sapo_is_odd_in_a_through_k(spec: &CaseSpec, v2: &V2) -> Outcome {
    let mut v2 = v2.clone();
    v2.policy_loss = PolicyLoss::Sapo;
    let a = Owned::new(spec, &v2);
    let mut neg = a.clone();
    neg.case.advantages.iter_mut().for_each(|x| *x = -*x);
    neg.case.hparams.sapo_tau_pos = a.case.hparams.sapo_tau_neg;
    neg.case.hparams.sapo_tau_neg = a.case.hparams.sapo_tau_pos;
    let mut zero = a.clone();
    zero.case.advantages.iter_mut().for_each(|x| *x = 0.0);
    let (pa, pn, pz) = (a.outputs()?, neg.outputs()?, zero.outputs()?);
    let sum = Outputs {
        loss: pa.loss + pn.loss,
        per_token: pa.per_token.iter().zip(&pn.per_token).map(|(x, y)| x + y).collect(),
        grad: pa.grad.iter().zip(&pn.grad).map(|(x, y)| x + y).collect(),
        natural: pa.natural.max(pn.natural),
        loss_scale: pa.loss_scale.max(pn.loss_scale),
    };
    let twice = Outputs {
        loss: 2.0 * pz.loss,
        per_token: pz.per_token.iter().map(|x| 2.0 * x).collect(),
        grad: pz.grad.iter().map(|x| 2.0 * x).collect(),
        natural: pz.natural,
        loss_scale: pz.loss_scale,
    };
    same_outputs(&sum, &twice, 1e-12, "L(A; a, b) + L(-A; b, a) vs 2 L(0)")?;
    Ok(true)
}

/// Property 3: a fully masked batch gives loss 0 and an all-zero gradient
/// for every v2 switch, whatever the masked positions hold (the materialised
/// garbage, and is_weights up to f32::MAX there).
fn fully_masked_batch_is_zero(spec: &CaseSpec, v2: &V2) -> Outcome {
    let mut spec = spec.clone();
    spec.mask = MaskPattern::FullyMaskedBatch;
    let mut a = Owned::new(&spec, v2);
    if let Some(w) = a.case.is_weights.as_mut() {
        for (k, x) in w.iter_mut().enumerate() {
            *x = [f32::MAX, 0.0, 1e30, -5.0][k % 4];
        }
    }
    a.with(|f| {
        if f.loss != 0.0 || f.grad(a.case.cotangent).iter().any(|&g| g != 0.0) {
            return Err(TestCaseError::fail(format!("loss {} or a gradient is not exactly 0", f.loss)));
        }
        Ok(true)
    })?
}

/// The per-token loss's extra value slope (`Forward::value_slope_excess`)
/// is added only where the value moves faster than the coefficient says: a
/// KL times the ratio off policy has a coefficient equal to its value's
/// slope (beta r (kl - kl'(d))) and gets none, on policy (r exactly 1) the
/// KL's own slope. Red when the excess is not gated on `on_policy` (it
/// loosened the per-token loss by beta r |kl'| off policy).
fn kl_times_ratio_excess_only_on_policy(spec: &CaseSpec, v2: &V2) -> Outcome {
    // The excess's other sources off: a straight-through KL, CISPO, the sequence levels.
    let v2 = V2 {
        kl_gradient: KlGradient::Own,
        ratio_level: RatioLevel::Token,
        policy_loss: if v2.policy_loss == PolicyLoss::Cispo { PolicyLoss::Ppo } else { v2.policy_loss },
        ..v2.clone()
    };
    let mut spec = spec.clone();
    (spec.config.kl, spec.config.on_policy) = (true, false); // before materialising: old_logp and ref_logp are drawn then
    let mut o = Owned::new(&spec, &v2);
    o.case.config.kl_times_ratio = true;
    let live = |f: &Forward<'_>| (0..f.tokens.len()).filter(|&i| !f.tokens[i].masked).collect::<Vec<_>>();
    let beta = o.case.hparams.beta;
    if beta == 0.0 {
        return Ok(false);
    }
    for (i, e) in o.with(|f| live(f).into_iter().map(|i| (i, f.value_slope_excess(i, 1e-3))).collect::<Vec<_>>())? {
        prop_assert!(e == 0.0, "off policy, token {i}: excess {e} where the coefficient is the value's slope");
    }
    // On policy some token's KL has a slope (not every d is 0 or past a
    // clamp); a case where none has checks nothing.
    (o.case.config.on_policy, o.case.old_logp) = (true, None);
    let on = o.with(|f| live(f).into_iter().filter(|&i| f.value_slope_excess(i, 1e-3) > 0.0).count())?;
    Ok(on > 0)
}

/// A window across a log-ratio clamp edge admits the slope at every point
/// of its unclamped part (where an implementation's rounded x may lie) and
/// 0 (beyond the edge), not just the slope at the part's middle. Found by
/// verl's GSPO-token at log_ratio_max = 10 (examples/verl/repros/
/// harness-gspo-clamp-edge-false-alarm.json): its slope at x = 9.999 lay
/// outside the interval [0, e^9.93] the middle gave.
fn clamp_window_admits_every_unclamped_slope() -> Trial {
    Trial::test("oracle_v2::clamp_window_admits_every_unclamped_slope", || {
        let mut runner = common::runner(common::cases(512));
        let edge = prop_oneof![Just(f64::INFINITY), -5.0..20.0f64];
        runner
            .run(&(-30.0..30.0f64, 0.0..0.5f64, edge, 0.0..1.0f64), |(x, slack, hi, at)| {
                let lo = hi - 10.0;
                let iv = grpo_oracle::clamped_interval(x, slack, lo, hi, |x, _| grpo_oracle::KinkInterval { lo: x.exp(), hi: x.exp() });
                let (a, b) = ((x - slack).max(lo), (x + slack).min(hi));
                if a <= b && hi.is_finite() && (x - slack < lo || x + slack > hi) {
                    let xp = a + at * (b - a);
                    let slope = xp.exp();
                    prop_assert!(iv.lo <= slope * (1.0 + 1e-12) && slope <= iv.hi * (1.0 + 1e-12), "x {x} slack {slack} [{lo}, {hi}]: e^{xp} = {slope} outside [{}, {}]", iv.lo, iv.hi);
                    prop_assert!(iv.lo <= 0.0, "a window across an edge admits 0: [{}, {}]", iv.lo, iv.hi);
                }
                Ok(())
            })
            .map_err(|e| Failed::from(format!("{e}")))
    })
}

/// A switch pinned on is exercised: with `--switch
/// logit_transform=true` every generated case, preset draws included (the
/// presets know no transform and set the identity), carries a scale other
/// than 1 or a finite softcap, and the softcap is not always the fallback's.
/// Red without `Objective::constrain_hparams`'s activation: most preset
/// draws ran the transform as the identity.
fn a_pinned_switch_is_exercised() -> Trial {
    Trial::test("oracle_v2::a_pinned_switch_is_exercised", || {
        use grpo_verify::case::objective::Objective;
        for objective in ["all"] {
            let mut bounds = common::small_bounds();
            bounds.objective = Objective::parse(Some(objective), &["logit_transform=true".to_string()], &[]).map_err(|e| format!("{e:#}"))?;
            let (cases, presets, drawn_transforms) = (AtomicU32::new(0), AtomicU32::new(0), AtomicU32::new(0));
            let mut runner = common::runner(300);
            runner
                .run(&case_spec(&bounds), |spec| {
                    let h = &spec.hparams;
                    prop_assert!(spec.config.logit_transform, "--objective {objective}: the pin did not hold");
                    prop_assert!(
                        h.logit_scale != 1.0 || h.logit_softcap.is_finite(),
                        "--objective {objective}: an identity transform under the pin ({:?}, preset {:?})",
                        (h.logit_scale, h.logit_softcap),
                        spec.preset
                    );
                    cases.fetch_add(1, Ordering::Relaxed);
                    presets.fetch_add(u32::from(spec.preset.is_some()), Ordering::Relaxed);
                    drawn_transforms.fetch_add(u32::from(h.logit_softcap != 30.0 || h.logit_scale != 1.0), Ordering::Relaxed);
                    Ok(())
                })
                .map_err(|e| Failed::from(format!("{e}")))?;
            let (cases, presets, drawn_transforms) = (cases.into_inner(), presets.into_inner(), drawn_transforms.into_inner());
            if presets * 5 < cases || drawn_transforms * 2 < cases {
                return Err(format!("--objective {objective}: {cases} cases, {presets} preset draws, {drawn_transforms} with a drawn transform").into());
            }
        }
        Ok(())
    })
}

/// This suite's trials (suites/main.rs runs them with the others).
pub fn trials() -> Vec<Trial> {
    let tests = vec![
        property("oracle_v2::gradient_matches_finite_differences", 256, finite_differences),
        property("oracle_v2::sequence_is_token_with_one_token_per_row", 128, sequence_is_token_with_one_token_per_row),
        property("oracle_v2::sequence_token_has_the_value_of_sequence", 128, sequence_token_has_the_value_of_sequence),
        property("oracle_v2::straight_through_is_k2_gradient", 128, straight_through_is_k2_gradient),
        property("oracle_v2::two_sided_is_verl_dual_clip", 128, two_sided_is_verl_dual_clip),
        property("oracle_v2::unit_is_weights_are_no_weights", 128, unit_weights_are_no_weights),
        property("oracle_v2::logit_scale_is_a_temperature", 128, logit_scale_is_a_temperature),
        property("oracle_v2::far_softcap_changes_nothing", 128, far_softcap_changes_nothing),
        property("oracle_v2::log_ratio_clamps", 128, log_ratio_clamps),
        property("oracle_v2::over_constant_b_is_seq_mean_token_mean", 128, over_constant_b_is_seq_mean),
        property("oracle_v2::entropy_token_mean_is_same_under_token_mean", 128, entropy_token_mean_is_same_under_token_mean),
        property("oracle_v2::cispo_coefficient_is_minus_clip_r_a", 128, cispo_coefficient),
        property("oracle_v2::sapo_is_odd_in_a_through_k", 128, sapo_is_odd_in_a_through_k),
        property("oracle_v2::fully_masked_batch_is_exactly_zero", 64, fully_masked_batch_is_zero),
        property("oracle_v2::kl_times_ratio_excess_only_on_policy", 128, kl_times_ratio_excess_only_on_policy),
        clamp_window_admits_every_unclamped_slope(),
        a_pinned_switch_is_exercised(),
    ];
    tests
}
