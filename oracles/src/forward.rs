//! The forward pass of docs/spec.md (v1 and v2) over any row source, and the
//! gradient row by row.
//!
//! `Forward::new` makes one parallel pass over the rows and keeps O(B*T)
//! statistics; the gradient is then produced row by row from the same
//! statistics (`grad_row`), so a caller that compares rows as they come never
//! holds a [B*T, V] f64 array at all.
//!
//! Every row's gradient has the form
//!
//! ```text
//! g_v = cot * w * [ (c_policy + c_kl) (onehot_v - p_v) / tau
//!                   + entropy_coef * (w_ent / w) * s * p_v (log p_v + ent) ]
//! ```
//!
//! (times dz''/dz with a logit transform), where c is the loss's d/d logp_t
//! per unit of the token's aggregation weight w. v2's couplings fit it: at
//! the sequence level, d loss / d logp_t holds the whole row's
//! d loss / d s_b times ds_b / d logp_t = s_b m_t / n_b.

use crate::config::{Aggregation, Config, EntropyAggregation, Hparams, KlGradient, PolicyLoss, RatioLevel, TemperatureMode};
use crate::error::InputError;
use crate::kl::KlTerm;
use crate::objective::{aggregation_weights, kl_per_token, KinkInterval};
use crate::policy::{clamped_interval, scaled, sum, PolicyTerm};
use crate::problem::{LogitRows, RowStats, Shape, TokenInputs};
use crate::softmax::RowSoftmax;
use crate::sum::CompensatedSum;
use crate::transform::{LogitTransform, TransformedRows};
use crate::vector::GradRow;
use rayon::prelude::*;

/// Per-token results of the forward pass. At masked positions only `masked`
/// and `weight` (= 0) are meaningful.
#[derive(Clone, Copy, Debug, Default)]
pub struct TokenStats {
    /// mask[b, t] = 0: no influence on the loss, zero gradient.
    pub masked: bool,
    /// The token id the row is read at.
    pub chosen: usize,
    /// log p_y (docs/spec.md, "Per-token quantities"): z_y/tau - LSE(z/tau)
    /// in logits mode, (z_y - LSE(z)) / tau in logp mode (z'' with a transform).
    pub logp: f64,
    /// -sum_v p_v log p_v of the row's softmax p, in nats.
    pub entropy: f64,
    /// loss_t = policy + kl - entropy_coef * ent: the policy term times the
    /// rollout-correction weight, beta times the KL estimator (times r with
    /// kl_times_ratio).
    pub per_token_loss: f64,
    /// Aggregation weight: loss = sum(weight * (policy + kl)) - entropy terms.
    pub weight: f64,
    /// The entropy bonus's weight (`weight` unless entropy_aggregation = token_mean).
    pub entropy_weight: f64,
    /// A = `advantages[b]`, the advantage of the token's sequence.
    pub advantage: f64,
    /// The log-ratio the policy's kinks are in: logp - old at the token
    /// level (0 on-policy), the row's mean L_b at the sequence levels.
    pub log_ratio: f64,
    /// The ratio r_t the policy term saw (exp of the clamped log ratio).
    pub ratio: f64,
    /// The rollout-correction weight (1 without).
    pub is_weight: f64,
    /// d loss / d logp per unit weight of the policy term (and of the KL
    /// term where it has kinks or couples to the ratio), at the exact point.
    pub policy_interval: KinkInterval,
    /// d kl / d logp per unit weight where it is smooth and uncoupled (v1's k3); else 0.
    pub kl_coef: f64,
    /// exp(ref - logp) (0 without KL): the sensitivity of kl_coef to logp.
    pub kl_exp: f64,
    /// d = ref - logp (0 without KL).
    pub kl_d: f64,
    /// The KL estimator's value at d, before beta and any ratio factor (0 without KL).
    pub kl_value: f64,
    /// The softmax's argument at the chosen token: z_y / tau or z_y (z'' with a transform).
    pub x_chosen: f64,
    /// Its rounding magnitude (see [`LogitRows::logit_row`]), in the same units.
    pub mag_chosen: f64,
    /// The statistics of the row's softmax (LSE, entropy, rounding magnitudes).
    pub softmax: RowSoftmax,
}

/// What a sequence-level ratio couples across row b.
#[derive(Clone, Copy, Debug, Default)]
struct RowCoupling {
    /// max(sum_t m, 1).
    count: f64,
    /// sum_t w_t is_t: d loss / d policy(s_b).
    policy_weight: f64,
    /// sum_t w_t beta kl_t (kl_times_ratio): d loss / d s_b of the KL.
    kl_weight: f64,
}

enum Rows<'a> {
    Plain(&'a dyn LogitRows),
    Transformed(TransformedRows<'a>),
}

impl Rows<'_> {
    fn get(&self) -> &dyn LogitRows {
        match self {
            Rows::Plain(r) => *r,
            Rows::Transformed(t) => t,
        }
    }
}

/// The forward pass of one problem, and the gradient on demand.
pub struct Forward<'a> {
    rows: Rows<'a>,
    /// B, T, V of the problem.
    pub shape: Shape,
    /// The static switches it was run under.
    pub config: Config,
    /// The hyperparameters it was run under, validated.
    pub hparams: Hparams,
    /// The loss (docs/spec.md, "Aggregation"), from compensated sums.
    pub loss: f64,
    /// One per token, row b * T + t (B*T of them).
    pub tokens: Vec<TokenStats>,
    rows_coupling: Vec<RowCoupling>,
}

impl<'a> Forward<'a> {
    /// Validates the hyperparameters and per-token inputs against `config`
    /// and runs the forward pass over `raw_rows` (through the logit
    /// transform when it is on): one parallel pass, O(B*T) memory.
    pub fn new(
        raw_rows: &'a dyn LogitRows,
        inputs: TokenInputs<'_>,
        config: Config,
        hparams: Hparams,
    ) -> Result<Self, InputError> {
        let shape = raw_rows.shape();
        hparams.validate(&config)?;
        inputs.validate(shape, &config)?;
        let rows = if config.logit_transform {
            let transform = LogitTransform { scale: hparams.logit_scale, softcap: hparams.logit_softcap };
            Rows::Transformed(TransformedRows { inner: raw_rows, transform })
        } else {
            Rows::Plain(raw_rows)
        };
        let (b_, t_) = (shape.batch, shape.time);
        let weights = aggregation_weights(inputs.mask, b_, t_, config.aggregation, hparams.normalizer);
        let entropy_weights = match config.entropy_aggregation {
            EntropyAggregation::Same => None,
            EntropyAggregation::TokenMean => Some(aggregation_weights(inputs.mask, b_, t_, Aggregation::TokenMean, 1.0)),
        };
        let tau = hparams.temperature;
        let beta = hparams.effective_beta(&config);
        let entropy_coef = hparams.effective_entropy_coef(&config);
        let divisor = match config.temperature_mode {
            TemperatureMode::Logits => tau,
            TemperatureMode::Logp => 1.0,
        };
        let live: Vec<usize> = (0..shape.rows()).filter(|&i| inputs.mask[i] != 0.0).collect();
        let chosen: Vec<usize> = live.iter().map(|&i| inputs.tokens[i] as usize).collect();
        let row_stats = rows.get().row_stats(&live, &chosen, divisor);
        let mut tokens = vec![TokenStats { masked: true, ..TokenStats::default() }; shape.rows()];
        // Pass 1: logp, entropy and the token log-ratio of every live token.
        for (&i, RowStats { softmax, x_chosen, mag_chosen }) in live.iter().zip(row_stats) {
            let logp = match config.temperature_mode {
                TemperatureMode::Logits => x_chosen - softmax.lse,
                TemperatureMode::Logp => (x_chosen - softmax.lse) / tau,
            };
            tokens[i] = TokenStats {
                masked: false,
                chosen: inputs.tokens[i] as usize,
                logp,
                entropy: softmax.entropy,
                weight: weights[i],
                entropy_weight: entropy_weights.as_ref().map_or(weights[i], |w| w[i]),
                advantage: inputs.advantages[i / t_] as f64,
                log_ratio: inputs.old_logp.map_or(0.0, |old| logp - old[i] as f64),
                is_weight: inputs.is_weight(i, t_),
                x_chosen,
                mag_chosen,
                softmax,
                ..TokenStats::default()
            };
        }
        // The sequence levels' kink variable: L_b, the row's mean log ratio.
        let mut rows_coupling = vec![RowCoupling::default(); b_];
        for (b, rc) in rows_coupling.iter_mut().enumerate() {
            let row = &tokens[b * t_..(b + 1) * t_];
            rc.count = CompensatedSum::of(row.iter().map(|s| if s.masked { 0.0 } else { 1.0 })).max(1.0);
            if config.ratio_level != RatioLevel::Token {
                let mean = CompensatedSum::of(row.iter().filter(|s| !s.masked).map(|s| s.log_ratio)) / rc.count;
                for st in tokens[b * t_..(b + 1) * t_].iter_mut().filter(|s| !s.masked) {
                    st.log_ratio = mean;
                }
            }
        }
        let kl = KlTerm::of(&config, &hparams);
        let (lo, hi) = (hparams.log_ratio_min, hparams.log_ratio_max);
        // Pass 2: the terms and their values.
        for (i, st) in tokens.iter_mut().enumerate().filter(|(_, s)| !s.masked) {
            let term = PolicyTerm::of(&config, &hparams, st.advantage);
            st.ratio = st.log_ratio.clamp(lo, hi).exp();
            let policy = st.is_weight * term.value(st.ratio, st.logp);
            let kl_value = match inputs.ref_logp {
                Some(r) if beta != 0.0 => {
                    st.kl_d = r[i] as f64 - st.logp;
                    st.kl_exp = st.kl_d.exp();
                    if kl.is_v1() && !config.kl_times_ratio {
                        let (value, coef) = kl_per_token(st.logp, r[i] as f64, beta);
                        st.kl_coef = coef;
                        st.kl_value = kl.value(st.kl_d);
                        value
                    } else {
                        st.kl_value = kl.value(st.kl_d);
                        let times = if config.kl_times_ratio { st.ratio } else { 1.0 };
                        beta * st.kl_value * times
                    }
                }
                _ => 0.0,
            };
            st.per_token_loss = policy + kl_value - entropy_coef * st.entropy;
            let rc = &mut rows_coupling[i / t_];
            rc.policy_weight += st.weight * st.is_weight;
            if config.kl_times_ratio {
                rc.kl_weight += st.weight * beta * st.kl_value;
            }
        }
        let loss = match entropy_weights {
            None => CompensatedSum::of(tokens.iter().map(|s| s.weight * s.per_token_loss)),
            Some(_) => CompensatedSum::of(tokens.iter().flat_map(|s| {
                let entropy_term = entropy_coef * s.entropy;
                [s.weight * (s.per_token_loss + entropy_term), -s.entropy_weight * entropy_term]
            })),
        };
        let mut fwd = Forward { rows, shape, config, hparams, loss, tokens, rows_coupling };
        let intervals: Vec<KinkInterval> =
            (0..fwd.tokens.len()).into_par_iter().map(|i| fwd.coefficient_interval(i, fwd.tokens[i].log_ratio, 0.0)).collect();
        for (st, iv) in fwd.tokens.iter_mut().zip(intervals) {
            st.policy_interval = iv;
        }
        Ok(fwd)
    }

    /// Is the KL term part of [`TokenStats::policy_interval`] (kinked or
    /// coupled to the ratio) rather than the point `kl_coef`?
    fn kl_in_interval(&self) -> bool {
        self.hparams.effective_beta(&self.config) != 0.0
            && (!KlTerm::of(&self.config, &self.hparams).is_v1() || self.config.kl_times_ratio)
    }

    /// Token i's admissible d loss / d logp per unit weight (the part in
    /// [`TokenStats::policy_interval`]), with its kink variable (see
    /// [`TokenStats::log_ratio`]) anywhere in [x - slack, x + slack] and d =
    /// ref - logp within slack of its value. With every v2 switch off this
    /// is v1's [`crate::kink_interval`] of the ppo term.
    pub fn coefficient_interval(&self, i: usize, x: f64, slack: f64) -> KinkInterval {
        self.coefficient_parts(i, x, slack).into_iter().fold(KinkInterval::default(), sum)
    }

    /// The largest |d value / d logp| of token i's policy and KL terms per
    /// unit weight, over the window of [`Forward::coefficient_interval`]:
    /// the parts' slopes taken apart, since a value can move where the sum
    /// of the coefficients cancels (on-policy, ppo's value is constant while
    /// its coefficient -A offsets the KL's).
    pub fn value_slope_bound(&self, i: usize, x: f64, slack: f64) -> f64 {
        self.coefficient_parts(i, x, slack).iter().map(KinkInterval::max_abs).sum::<f64>() + self.tokens[i].kl_coef.abs()
    }

    /// The parts [`Forward::coefficient_interval`] sums: the policy term's
    /// slope through the ratio, CISPO's own coefficient, the KL's and the
    /// KL times the ratio's.
    fn coefficient_parts(&self, i: usize, x: f64, slack: f64) -> [KinkInterval; 4] {
        let st = &self.tokens[i];
        let mut parts = [KinkInterval::default(); 4];
        if st.masked {
            return parts;
        }
        let (c, h) = (&self.config, &self.hparams);
        let term = PolicyTerm::of(c, h, st.advantage);
        let (lo, hi) = (h.log_ratio_min, h.log_ratio_max);
        let policy_slope = clamped_interval(x, slack, lo, hi, |x, s| term.ratio_interval(x, s));
        // d r / d x through the clamp (the KL's ratio factor).
        let ratio_slope = || clamped_interval(x, slack, lo, hi, |x, _| KinkInterval { lo: x.exp(), hi: x.exp() });
        let rc = &self.rows_coupling[i / self.shape.time];
        parts[0] = match c.ratio_level {
            RatioLevel::Token | RatioLevel::SequenceToken => scaled(policy_slope, st.is_weight),
            // ds_b / d logp_t = s_b / n_b: the row's d loss / d s_b, per unit of this token's weight.
            RatioLevel::Sequence => scaled(policy_slope, rc.policy_weight / (st.weight * rc.count)),
        };
        if c.policy_loss == PolicyLoss::Cispo {
            let own = st.is_weight * term.logp_coef(st.ratio);
            parts[1] = KinkInterval { lo: own, hi: own };
        }
        if self.kl_in_interval() {
            let beta = h.effective_beta(c);
            let kl = KlTerm::of(c, h);
            let times = if c.kl_times_ratio { st.ratio } else { 1.0 };
            parts[2] = scaled(kl.interval(st.kl_d, slack), beta * times);
            if c.kl_times_ratio {
                let k = match c.ratio_level {
                    RatioLevel::Token | RatioLevel::SequenceToken => beta * st.kl_value,
                    RatioLevel::Sequence => rc.kl_weight / (st.weight * rc.count),
                };
                parts[3] = scaled(ratio_slope(), k);
            }
        }
        parts
    }

    /// Bounds near token i (its kink variable within `slack`) on how fast
    /// its coefficients move with logp, and on the terms its loss_t is
    /// summed from (the tolerance's sensitivity and cancellation scales).
    pub fn coefficient_sensitivity(&self, i: usize, slack: f64) -> (f64, f64) {
        let st = &self.tokens[i];
        let (c, h) = (&self.config, &self.hparams);
        let beta = h.effective_beta(c);
        let r = (st.log_ratio + slack).min(h.log_ratio_max).exp();
        if c.v2_switch().is_none() && h.log_ratio_max == f64::INFINITY && h.log_ratio_min == f64::NEG_INFINITY {
            // v1's bounds, as they were.
            let sensitivity = st.advantage.abs() * r + beta * st.kl_exp * slack.exp();
            let terms = st.advantage.abs() * r.max(1.0)
                + if beta > 0.0 { beta * (st.kl_exp + st.kl_exp.ln().abs() + 1.0) } else { 0.0 };
            return (sensitivity, terms);
        }
        let term = PolicyTerm::of(c, h, st.advantage);
        let rc = &self.rows_coupling[i / self.shape.time];
        let factor = match c.ratio_level {
            RatioLevel::Sequence => (rc.policy_weight / (st.weight * rc.count)).abs().max(st.is_weight.abs()),
            _ => st.is_weight.abs(),
        };
        let mut sensitivity = factor * term.slope_sensitivity(r);
        let logp_factor = if c.policy_loss == PolicyLoss::Cispo { 1.0 + st.logp.abs() } else { 1.0 };
        let mut terms = st.is_weight.abs() * st.advantage.abs() * r.max(1.0) * logp_factor;
        if beta > 0.0 {
            let kl = KlTerm::of(c, h);
            let times = if c.kl_times_ratio { r.max(1.0) } else { 1.0 };
            let d = st.kl_d.abs() + slack;
            // The straight-through value k2 + sg(kX - k2) is summed from d^2 / 2
            // (far above kX where k3 is clamped or d << 0).
            let straight_through = if c.kl_gradient == KlGradient::K2 { 0.5 * d * d } else { 0.0 };
            let kl_size = st.kl_value.abs() + d + 1.0 + (st.kl_d.min(h.kl_log_ratio_clamp) + slack).exp() + straight_through;
            sensitivity += beta * times * (kl.slope_sensitivity(st.kl_d, slack) + if c.kl_times_ratio { 2.0 * kl_size } else { 0.0 });
            if c.kl_times_ratio && c.ratio_level == RatioLevel::Sequence {
                sensitivity += (rc.kl_weight / (st.weight * rc.count)).abs() * r;
            }
            terms += beta * times * kl_size;
        }
        (sensitivity, terms)
    }

    /// How much faster token i's loss_t *value* moves with logp (a rounding
    /// of it, within `slack`) than its gradient coefficient says, where the
    /// two differ (0 with every v2 switch off):
    /// - a straight-through KL has the estimator's value (k3's slope is
    ///   exp(d)) but k2's gradient;
    /// - a KL times the ratio has a coefficient in which the KL's slope and
    ///   the ratio's cancel (beta (r kl - r kl'(d)) = -beta r d for k3), which
    ///   off policy is its value's slope too, while on policy its value moves
    ///   with the KL alone: r = exp(logp - sg(logp)) is exactly 1 whatever
    ///   logp's rounding, so beta kl'(d) is the slope (off policy: nothing);
    /// - CISPO's value -sg(clip(r)) A logp moves with r, its gradient does not;
    /// - at the sequence levels the token's value moves with the row's L_b
    ///   by its own weight, while its coefficient is the row's mean.
    pub fn value_slope_excess(&self, i: usize, slack: f64) -> f64 {
        let st = &self.tokens[i];
        if st.masked {
            return 0.0;
        }
        let (c, h) = (&self.config, &self.hparams);
        let beta = h.effective_beta(c);
        let r = (st.log_ratio + slack).min(h.log_ratio_max).exp();
        let mut excess = 0.0;
        // Off policy a KL times the ratio has a coefficient equal to its
        // value's slope (beta r (kl - kl'(d))): nothing to add there.
        if beta != 0.0 && (c.kl_gradient == KlGradient::K2 || (c.kl_times_ratio && c.on_policy)) {
            let own = KlTerm { gradient: KlGradient::Own, ..KlTerm::of(c, h) };
            let times = if c.kl_times_ratio { r.max(1.0) } else { 1.0 };
            excess += beta * times * own.interval(st.kl_d, slack).max_abs().max(own.slope_sensitivity(st.kl_d, slack));
        }
        if c.policy_loss == PolicyLoss::Cispo {
            excess += st.is_weight.abs() * st.advantage.abs() * r.min(1.0 + h.eps_high) * st.logp.abs();
        }
        if c.ratio_level != RatioLevel::Token {
            let term = PolicyTerm::of(c, h, st.advantage);
            let (lo, hi) = (h.log_ratio_min, h.log_ratio_max);
            let slope = clamped_interval(st.log_ratio, slack, lo, hi, |x, s| term.ratio_interval(x, s));
            excess += st.is_weight.abs() * slope.max_abs();
            // A KL times the sequence's ratio: the token's value beta s_b kl_t
            // moves with L_b at s_b's full slope (the coefficient's share of
            // it is 1 / n_b), and with kl_t up to its largest within d +- slack.
            if c.kl_times_ratio && beta != 0.0 {
                let kl = KlTerm::of(c, h);
                let largest = [st.kl_d - slack, st.kl_d, st.kl_d + slack].map(|d| kl.value(d).abs()).into_iter().fold(0.0, f64::max);
                let ratio_slope = if st.log_ratio - slack < hi && st.log_ratio + slack > lo { (st.log_ratio + slack).min(hi).exp() } else { 0.0 };
                excess += beta * largest * ratio_slope;
            }
        }
        excess
    }

    /// Writes row i's raw logits z (before any logit transform) into `out`,
    /// and into `products` (when asked) sum_h |hidden_h lm_head_hv| (0 for
    /// stored logits): what the declared conventions perturb.
    pub fn raw_logit_row(&self, i: usize, out: &mut [f64], products: Option<&mut [f64]>) {
        let raw = match &self.rows {
            Rows::Plain(r) => *r,
            Rows::Transformed(t) => t.inner,
        };
        raw.logit_row(i, out, None);
        if let Some(p) = products {
            raw.abs_product_row(i, p);
        }
    }

    /// x = z'' / divisor, the softmax's argument, from raw logits z; a
    /// product magnitude is chained through the transform in place.
    pub(crate) fn softmax_argument(&self, raw: &[f64], x: &mut [f64], product: &mut [f64]) {
        let inv = self.inv_tau();
        match self.logit_transform() {
            Some(t) => {
                for ((xv, &z), pv) in x.iter_mut().zip(raw).zip(product.iter_mut()) {
                    *xv = t.apply(z) * inv;
                    *pv *= t.derivative(z).abs();
                }
            }
            None => {
                for (xv, &z) in x.iter_mut().zip(raw) {
                    *xv = z * inv;
                }
            }
        }
    }

    /// 1/tau in logits mode, 1 in logp mode: the factor between d/dx and d/dz
    /// for the entropy.
    pub fn entropy_scale(&self) -> f64 {
        match self.config.temperature_mode {
            TemperatureMode::Logits => 1.0 / self.hparams.temperature,
            TemperatureMode::Logp => 1.0,
        }
    }

    /// The logit transform, when `logit_transform` is on.
    pub fn logit_transform(&self) -> Option<LogitTransform> {
        match &self.rows {
            Rows::Transformed(t) => Some(t.transform),
            Rows::Plain(_) => None,
        }
    }

    /// The largest |dz''/dz| of the logit transform (1 without one): how
    /// much larger a gradient in the raw logits can be than in z''.
    pub fn transform_gain(&self) -> f64 {
        if self.config.logit_transform {
            self.hparams.logit_scale
        } else {
            1.0
        }
    }

    /// Writes row `row` of cotangent * d loss / d logits into `out` (length V),
    /// with `ppo_coef` as the token's policy coefficient (the midpoint of its
    /// exact-point interval when `None`). Masked rows are exactly zero.
    pub fn grad_row(&self, row: usize, cotangent: f64, ppo_coef: Option<f64>, out: &mut [f64]) {
        let Some(k) = self.grad_constants(row, cotangent, ppo_coef) else {
            out.iter_mut().for_each(|g| *g = 0.0);
            return;
        };
        self.rows.get().grad_row_pass(row, self.tokens[row].chosen, out, &k);
    }

    /// The constants of row `row`'s gradient (see the module doc): the
    /// gradient in the softmax's input is `grad_pass` of it with them, plus
    /// scale * c_logp at the chosen column. None for a row whose gradient
    /// is exactly zero (masked, zero weight).
    pub fn grad_constants(&self, row: usize, cotangent: f64, ppo_coef: Option<f64>) -> Option<GradRow> {
        let st = &self.tokens[row];
        if st.masked || st.weight == 0.0 {
            return None;
        }
        let tau = self.hparams.temperature;
        let c_logp = (ppo_coef.unwrap_or(st.policy_interval.midpoint()) + st.kl_coef) / tau;
        let mut c_ent = self.hparams.effective_entropy_coef(&self.config) * self.entropy_scale();
        if self.config.entropy_aggregation != EntropyAggregation::Same {
            c_ent *= st.entropy_weight / st.weight;
        }
        Some(GradRow { inv_tau: self.inv_tau(), lse: st.softmax.lse, entropy: st.entropy, scale: cotangent * st.weight, c_logp, c_ent })
    }

    /// What multiplies z in the softmax's argument: 1/tau in logits mode, 1 in logp mode.
    pub fn inv_tau(&self) -> f64 {
        self.entropy_scale()
    }

    /// Writes d logp / d logits of row `row` ((onehot - p) / tau, times
    /// dz''/dz with a logit transform): the direction in which the policy
    /// coefficient moves the gradient row.
    pub fn dlogp_dlogits_row(&self, row: usize, out: &mut [f64]) {
        let st = &self.tokens[row];
        let tau = self.hparams.temperature;
        let rows = self.rows.get();
        rows.logit_row(row, out, None);
        let inv_tau = self.inv_tau();
        for g in out.iter_mut() {
            *g = -(*g * inv_tau - st.softmax.lse).exp() / tau;
        }
        if !st.masked {
            out[st.chosen] += 1.0 / tau;
        }
        rows.chain_to_raw(row, out);
    }

    /// Writes p = softmax(x) of row `row` into `out`.
    pub fn softmax_row(&self, row: usize, out: &mut [f64]) {
        let st = &self.tokens[row];
        self.rows.get().logit_row(row, out, None);
        let inv_tau = self.inv_tau();
        for p in out.iter_mut() {
            *p = (*p * inv_tau - st.softmax.lse).exp();
        }
    }

    /// The whole gradient, cotangent * d loss / d logits, [B*T*V], rows in parallel.
    pub fn grad(&self, cotangent: f64) -> Vec<f64> {
        let mut g = vec![0.0; self.shape.rows() * self.shape.vocab];
        self.grad_into(cotangent, &mut g);
        g
    }

    /// [`Forward::grad`] into a caller's buffer of B*T*V elements.
    pub fn grad_into(&self, cotangent: f64, out: &mut [f64]) {
        let v = self.shape.vocab;
        assert_eq!(out.len(), self.shape.rows() * v, "gradient buffer length");
        out.par_chunks_mut(v).enumerate().for_each(|(row, g)| self.grad_row(row, cotangent, None, g));
    }
}
