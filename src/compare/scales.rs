//! Per-element error scales and per-token kink intervals of one case: the
//! magnitude through which f32 rounding can move each output, so errors are
//! measured in units of u (docs/tolerance.md derives them).

use grpo_oracle::{EntropyAggregation, Forward, KinkInterval, RatioLevel, Rounding, RoundingAllowances, TemperatureMode};

use crate::case::{Case, Dtype};
use crate::compare::{Outputs, Quantity};
use crate::compare::rule::{BF16_U, RATIO_MARGIN_U32, Tolerance, U32};

/// Per-token scales and kink intervals, computed once per case, and the
/// allowances of an implementation's declared conventions when it has any.
#[derive(Clone)]
pub struct Scales {
    pub(super) logp: Vec<f64>,
    pub(super) entropy: Vec<f64>,
    pub(super) per_token_loss: Vec<f64>,
    pub(super) loss: f64,
    pub(super) grad_row: Vec<f64>,
    pub(super) grad_terms: Vec<f64>,
    /// The largest row scale: exact-zero rows are measured against it.
    pub(super) grad_global: f64,
    pub(super) intervals: Vec<KinkInterval>,
    /// The log-ratio half-width each interval was taken over.
    pub(super) slack: Vec<f64>,
    /// The analytic bound (normalised): how far a correct result may sit.
    pub(super) analytic: f64,
    /// The declared conventions' allowances (docs/conventions.md): what each
    /// element's error is measured beyond. None: SPEC's contract alone.
    pub(super) rounding: Option<RoundingAllowances>,
}

/// A scale below this is taken as this (no division by zero where a quantity is exactly 0).
pub const TINY: f64 = 1e-30;

/// A scale as the rule divides by it: at least [`TINY`], and NaN (an
/// infinite part times zero, or two infinite parts cancelling: a rounding
/// bound that overflowed) infinite, never TINY. At logits of 3e5 (an offset
/// of 3e4 at tau = 0.1) f32 knows logp only to ~0.03, the analytic bound's
/// log-ratio window is ~55 wide, exp of it overflows a coefficient's bound,
/// and a NaN taken as TINY called our own f32 baseline's d hidden a math
/// error (examples/liger/repros/harness-baseline-over-its-bound-sapo.json).
pub fn floor_scale(s: f64) -> f64 {
    if s.is_nan() { f64::INFINITY } else { s.max(TINY) }
}

impl Scales {
    /// The size of the terms row i's logits gradient is formed from, per
    /// unit of softmax mass: cot w (|c| + |kl coef|) / tau plus the entropy
    /// term's (a gradient that cancels to nearly nothing, onehot - p with p
    /// near 1, is still formed from terms this large).
    pub fn grad_terms(&self, i: usize) -> f64 {
        self.grad_terms[i]
    }

    /// Each token's admissible ppo coefficients for one implementation's
    /// outputs: its kink interval taken over the log ratios between the
    /// oracle's and the implementation's own (from the logp it returned,
    /// give or take [`RATIO_MARGIN_U32`] and, for bf16 inputs, a bf16 ratio's
    /// rounding), within the analytic neighbourhood. The analytic
    /// neighbourhood alone is the bound on any implementation's logp
    /// rounding, which at V = 151936 and H = 1536 is ~0.37 in log ratio:
    /// nearly every token of a real row sat at a "kink" and a clip branch
    /// taken wrongly passed. A token whose returned logp is absent or
    /// non-finite keeps the analytic interval; one whose logp lies outside
    /// the analytic neighbourhood gets that neighbourhood's part on its side
    /// (its logp verdict fails on its own then).
    pub fn intervals_for(&self, fwd: &Forward<'_>, case: &Case, out: &Outputs) -> Vec<KinkInterval> {
        // Under declared conventions the analytic intervals are widened by
        // the conventions' window (`Scales::under`): an implementation's
        // returned logp need not be the one its coefficient used (Liger's
        // adapter recomputes it; a bf16 product rounds differently in
        // another chunking), so it narrows nothing there.
        if self.rounding.is_some() {
            return self.intervals.clone();
        }
        // At the sequence levels the kink variable is the row's mean log
        // ratio, which no single returned logp narrows: the analytic intervals stand.
        if fwd.config.ratio_level != RatioLevel::Token {
            return self.intervals.clone();
        }
        fwd.tokens
            .iter()
            .enumerate()
            .map(|(i, st)| {
                let analytic = self.intervals[i];
                if st.masked || analytic.is_point() {
                    return analytic;
                }
                let Some(returned) = out.logp.as_ref().map(|l| l[i] as f64).filter(|l| l.is_finite()) else {
                    return analytic;
                };
                // On-policy, old is the implementation's own logp: its ratio is 1.
                let own = if fwd.config.on_policy { st.log_ratio } else { st.log_ratio + (returned - st.logp) };
                let margin = Scales::ratio_margin(case, returned, st.logp - st.log_ratio, own);
                let lo = (st.log_ratio.min(own) - margin).max(st.log_ratio - self.slack[i]);
                // Both ranges hold the oracle's own log ratio: lo <= hi.
                let hi = (st.log_ratio.max(own) + margin).min(st.log_ratio + self.slack[i]);
                let iv = fwd.coefficient_interval(i, 0.5 * (lo + hi), 0.5 * (hi - lo));
                // No edge within reach: the slope at the oracle's own ratio.
                if iv.is_point() {
                    st.policy_interval
                } else {
                    iv
                }
            })
            .collect()
    }

    /// How far an implementation's ratio may sit from the one its returned
    /// logp gives ([`RATIO_MARGIN_U32`], and a bf16 ratio's rounding).
    fn ratio_margin(case: &Case, returned: f64, old: f64, own: f64) -> f64 {
        let mut margin = RATIO_MARGIN_U32 * U32 * (1.0 + returned.abs() + old.abs());
        if case.dtype == Dtype::Bf16 {
            margin += 2.0 * BF16_U * (1.0 + own.abs());
        }
        margin
    }

    /// These scales for an implementation that declares conventions whose
    /// model on this case is `rounding`: the same per-element scales (the
    /// rule's units do not move), each token's kink window widened by how
    /// far the conventions can move its kink variable, and the allowances
    /// the comparison subtracts. A rounding that moves nothing (bf16
    /// conventions on an f32 case) leaves SPEC's contract as it is.
    pub fn under(&self, fwd: &Forward<'_>, rounding: Rounding) -> Scales {
        if rounding.is_none() {
            return self.clone();
        }
        let allowances = fwd.rounding_allowances(rounding, &self.slack);
        let mut scales = self.clone();
        for (i, t) in allowances.tokens.iter().enumerate() {
            if fwd.tokens[i].masked || t.window == 0.0 {
                continue;
            }
            scales.slack[i] = self.slack[i] + t.window;
            scales.intervals[i] = fwd.coefficient_interval(i, fwd.tokens[i].log_ratio, scales.slack[i]);
        }
        scales.rounding = Some(allowances);
        scales
    }

    /// The declared conventions' allowances, if any.
    pub fn rounding(&self) -> Option<&RoundingAllowances> {
        self.rounding.as_ref()
    }

    /// Token i's scale of a per-token quantity (logp, entropy,
    /// per_token_loss): the magnitude of the terms it is formed from.
    pub fn of_token(&self, quantity: Quantity, i: usize) -> Option<f64> {
        match quantity {
            Quantity::Logp => self.logp.get(i).copied(),
            Quantity::Entropy => self.entropy.get(i).copied(),
            Quantity::PerTokenLoss => self.per_token_loss.get(i).copied(),
            _ => None,
        }
    }

    /// Token i's gradient row scale: the size of the terms its d logits
    /// are formed from, per unit of softmax mass (0 at masked rows).
    pub fn grad_row(&self, i: usize) -> f64 {
        self.grad_row.get(i).copied().unwrap_or(0.0)
    }

    /// The per-element scales of `case`'s quantities from the oracle's forward pass, under `tol`.
    pub fn new(fwd: &Forward<'_>, case: &Case, tol: &Tolerance) -> Scales {
        let h = &fwd.hparams;
        let tau = h.temperature;
        // A length-n f32 reduction is off by about sqrt(n) u relative (random
        // rounding; tree and vectorised sums do better, naive worst cases worse).
        let sum_v = (case.shape.vocab as f64).sqrt();
        let logp_unit = match fwd.config.temperature_mode {
            TemperatureMode::Logits => 1.0,
            TemperatureMode::Logp => 1.0 / tau,
        };
        let ec = h.effective_entropy_coef(&fwd.config);
        // A logit transform multiplies the raw logits' gradient by up to its scale.
        let gain = fwd.transform_gain();
        let es = fwd.entropy_scale();
        let cot = case.cotangent.abs();
        let n = fwd.tokens.len();
        let (mut logp, mut entropy, mut ptl, mut grad_row) = (vec![0.0; n], vec![0.0; n], vec![0.0; n], vec![0.0; n]);
        let mut grad_terms = vec![0.0; n];
        let mut intervals = vec![KinkInterval::default(); n];
        let mut slacks = vec![0.0; n];
        let mut loss_terms = 0.0;
        let mut loss_values = 0.0;
        for (i, st) in fwd.tokens.iter().enumerate() {
            if st.masked {
                continue;
            }
            let sm = &st.softmax;
            // x_y - lse: the chosen logit's and the log-sum-exp's magnitudes,
            // and the logits' own rounding as the softmax weighs it.
            let s_logp = (1.0 + st.mag_chosen + sm.lse.abs() + sm.sum_p_abs_x + sum_v) * logp_unit;
            let s_ent = 1.0 + sm.lse.abs() + sm.sum_p_abs_x + sum_v;
            // The token's own rounding distance in logp: a ratio this close
            // to a clip edge may take either branch.
            let slack = tol.analytic_units * U32 * s_logp;
            let iv = fwd.coefficient_interval(i, st.log_ratio, slack);
            let c_max = iv.max_abs();
            // d(policy coefficient)/d logp and d(kl coefficient)/d logp
            // bounds, and the terms each loss_t is summed from (a KL of
            // exp(d) - d - 1 is formed from O(1) terms even when it is tiny).
            let (sensitivity, terms) = fwd.coefficient_sensitivity(i, slack);
            let value_slope = c_max + st.kl_coef.abs() + fwd.value_slope_excess(i, slack);
            let s_ptl = value_slope * s_logp + ec * (s_ent + st.entropy) + terms;
            // The entropy term's weight relative to the row's (TRL's separate token mean).
            let ew = st.entropy_weight / st.weight.max(f64::MIN_POSITIVE);
            let ec_row = ec * ew;
            let w = cot * st.weight * gain;
            let natural = w * ((c_max + st.kl_coef.abs()) / tau + ec_row * es * (sm.max_p_abs_log_p + st.entropy));
            let cond_p = 1.0 + sm.max_p_abs_x + sm.lse.abs() + sum_v;
            let s_row = natural * cond_p
                + w / tau * sensitivity * s_logp
                + w * ec_row * es * (1.0 + sm.max_p_abs_log_p + st.entropy) * (s_ent + cond_p);
            logp[i] = floor_scale(s_logp);
            entropy[i] = s_ent;
            ptl[i] = floor_scale(s_ptl);
            grad_row[i] = s_row;
            grad_terms[i] = natural;
            intervals[i] = iv;
            slacks[i] = slack;
            loss_terms += st.weight * s_ptl;
            loss_values += st.weight * st.per_token_loss.abs();
            if fwd.config.entropy_aggregation != EntropyAggregation::Same {
                // The entropy mean is a second sum beside the aggregated loss_t.
                loss_terms += st.entropy_weight * ec * (s_ent + st.entropy);
                loss_values += st.entropy_weight * ec * st.entropy;
            }
        }
        let loss = floor_scale(loss_terms + loss_values * ((n + 1) as f64).sqrt() + fwd.loss.abs());
        for s in grad_row.iter_mut() {
            *s = floor_scale(*s);
        }
        // Exact-zero rows are measured against the largest *finite* row
        // scale: one row whose bound overflowed must not excuse a masked
        // row's leak elsewhere.
        let grad_global = grad_row.iter().copied().filter(|s| s.is_finite()).fold(TINY, f64::max);
        Scales { logp, entropy, per_token_loss: ptl, loss, grad_row, grad_terms, grad_global, intervals, slack: slacks, analytic: tol.analytic_units * U32, rounding: None }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_overflowed_scale_admits_and_a_zero_one_is_floored() {
        assert_eq!(floor_scale(f64::NAN), f64::INFINITY);
        assert_eq!(floor_scale(f64::INFINITY * 0.0), f64::INFINITY);
        assert_eq!(floor_scale(0.0), TINY);
        assert_eq!(floor_scale(2.5), 2.5);
    }
}
