//! The logits kind: inputs, validation, the forward pass and the gradient.
//!
//! `forward` makes one parallel pass over the rows and keeps O(B*T)
//! statistics; the gradient is then produced row by row from the same
//! statistics (`grad_row`), so a caller that compares rows as they come never
//! holds a [B*T, V] f64 array at all.

use rayon::prelude::*;

use crate::config::{Config, Hparams, TemperatureMode};
use crate::error::{input_error, InputError};
use crate::objective::{aggregation_weights, kink_interval, kl_per_token, ppo_per_token, KinkInterval};
use crate::softmax::{row_softmax_stats, stored_row_softmax_stats_f32, RowSoftmax};
use crate::sum::CompensatedSum;
use crate::vector::{self, GradRow};

/// A floating-point input element that widens to f64 exactly.
pub trait Real: Copy + Send + Sync {
    fn to_f64(self) -> f64;
    /// out_i = values_i in f64 (a loop the common case vectorises).
    fn widen(values: &[Self], out: &mut [f64]) {
        for (o, z) in out.iter_mut().zip(values) {
            *o = z.to_f64();
        }
    }
    /// out_v += a * w_v.
    fn axpy(out: &mut [f64], a: f64, w: &[Self]) {
        for (o, z) in out.iter_mut().zip(w) {
            *o += a * z.to_f64();
        }
    }
    /// out_v += |a * w_v|.
    fn abs_axpy(out: &mut [f64], a: f64, w: &[Self]) {
        for (o, z) in out.iter_mut().zip(w) {
            *o += (a * z.to_f64()).abs();
        }
    }
    /// The softmax statistics of x = values / divisor, a stored row
    /// (rounding magnitudes |x_v|); `scratch` is grown to the row's length
    /// if the type needs an f64 copy of the row.
    fn softmax_stats(values: &[Self], divisor: f64, scratch: &mut Vec<f64>) -> RowSoftmax {
        scratch.resize(values.len(), 0.0);
        Self::widen(values, scratch);
        if divisor != 1.0 {
            vector::divide(scratch, divisor);
        }
        row_softmax_stats(scratch, None)
    }
    /// [`vector::grad_pass`] of the stored row `values` into `out`.
    fn grad_pass(values: &[Self], out: &mut [f64], k: &GradRow) {
        Self::widen(values, out);
        vector::grad_pass(out, k);
    }
}
impl Real for f32 {
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn widen(values: &[Self], out: &mut [f64]) {
        vector::widen_f32(values, out);
    }
    fn axpy(out: &mut [f64], a: f64, w: &[Self]) {
        vector::axpy_f32(out, a, w);
    }
    fn abs_axpy(out: &mut [f64], a: f64, w: &[Self]) {
        vector::abs_axpy_f32(out, a, w);
    }
    fn softmax_stats(values: &[Self], divisor: f64, _scratch: &mut Vec<f64>) -> RowSoftmax {
        stored_row_softmax_stats_f32(values, divisor)
    }
    fn grad_pass(values: &[Self], out: &mut [f64], k: &GradRow) {
        vector::grad_pass_f32(values, out, k);
    }
}
impl Real for f64 {
    fn to_f64(self) -> f64 {
        self
    }
}
impl Real for half::bf16 {
    fn to_f64(self) -> f64 {
        half::bf16::to_f64(self)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Shape {
    pub batch: usize,
    pub time: usize,
    pub vocab: usize,
}

impl Shape {
    pub fn rows(&self) -> usize {
        self.batch * self.time
    }
}

/// A source of logit rows z[b, t, :] in f64, row index b * T + t. The logits
/// kind reads them from an array; the fused kind computes hidden @ lm_head.
pub trait LogitRows: Sync {
    fn shape(&self) -> Shape;
    /// Writes z[row, :] into `out`, and into `magnitude` (when asked) the size
    /// of the terms each z_v is made of: |z_v| for a stored logit,
    /// sqrt(H) sum_h |hidden_h lm_head_hv| + |z_v| for a computed one. It
    /// scales how far an implementation's rounding can move z_v.
    fn logit_row(&self, row: usize, out: &mut [f64], magnitude: Option<&mut [f64]>);
    /// For stored logits (rounding magnitudes |z_v|): the softmax statistics
    /// of x = z[row, :] / divisor and x at `at`, read from storage without
    /// building magnitudes. `None` (the default) for computed rows.
    /// `scratch` is grown if an f64 copy of the row is needed.
    fn stored_stats(&self, row: usize, at: usize, divisor: f64, scratch: &mut Vec<f64>) -> Option<(RowSoftmax, f64)> {
        let _ = (row, at, divisor, scratch);
        None
    }
    /// Writes [`vector::grad_pass`] of row `row` into `out`.
    fn grad_pass(&self, row: usize, out: &mut [f64], k: &GradRow) {
        self.logit_row(row, out, None);
        vector::grad_pass(out, k);
    }
    /// The forward statistics of rows `rows` (x = z / divisor, read at
    /// `chosen[k]` in row `rows[k]`). The default reads row by row, in
    /// parallel; a source that computes its rows (the fused kind) does them
    /// a block at a time with matrix products.
    fn row_stats(&self, rows: &[usize], chosen: &[usize], divisor: f64) -> Vec<RowStats> {
        let v = self.shape().vocab;
        rows.par_iter()
            .zip(chosen)
            .map_init(
                // Grown on first use: stored f32 rows need neither.
                || (Vec::new(), Vec::new()),
                |(x, mag), (&i, &y)| match self.stored_stats(i, y, divisor, x) {
                    Some((softmax, x_y)) => RowStats { softmax, x_chosen: x_y, mag_chosen: x_y.abs() },
                    None => {
                        x.resize(v, 0.0);
                        mag.resize(v, 0.0);
                        self.logit_row(i, x, Some(mag));
                        RowStats::of_row(x, mag, y, divisor)
                    }
                },
            )
            .collect()
    }
}

/// One row's forward statistics: the softmax's, and the chosen column's
/// argument x_y with its rounding magnitude (in the units of x).
#[derive(Clone, Copy, Debug, Default)]
pub struct RowStats {
    pub softmax: RowSoftmax,
    pub x_chosen: f64,
    pub mag_chosen: f64,
}

impl RowStats {
    /// From a computed row z and its magnitudes (both overwritten with
    /// x = z / divisor and mag / divisor).
    pub fn of_row(z: &mut [f64], mag: &mut [f64], chosen: usize, divisor: f64) -> RowStats {
        // x / 1 is x: the division is skipped, not approximated, at tau = 1.
        if divisor != 1.0 {
            vector::divide(z, divisor);
            vector::divide(mag, divisor);
        }
        RowStats { softmax: row_softmax_stats(z, Some(mag)), x_chosen: z[chosen], mag_chosen: mag[chosen] }
    }
}

/// The logits kind's inputs (SPEC.md, "Shapes and inputs").
pub struct LogitsProblem<'a, L: Real> {
    pub shape: Shape,
    pub logits: &'a [L],
    pub tokens: &'a [i32],
    pub mask: &'a [f32],
    pub advantages: &'a [f32],
    pub old_logp: Option<&'a [f32]>,
    pub ref_logp: Option<&'a [f32]>,
    pub config: Config,
    pub hparams: Hparams,
}

impl<L: Real> LogitRows for LogitsProblem<'_, L> {
    fn shape(&self) -> Shape {
        self.shape
    }
    fn logit_row(&self, row: usize, out: &mut [f64], magnitude: Option<&mut [f64]>) {
        let v = self.shape.vocab;
        L::widen(&self.logits[row * v..(row + 1) * v], out);
        if let Some(m) = magnitude {
            vector::abs(out, m);
        }
    }
    fn stored_stats(&self, row: usize, at: usize, divisor: f64, scratch: &mut Vec<f64>) -> Option<(RowSoftmax, f64)> {
        let v = self.shape.vocab;
        let values = &self.logits[row * v..(row + 1) * v];
        let x_at = if divisor == 1.0 { values[at].to_f64() } else { values[at].to_f64() / divisor };
        Some((L::softmax_stats(values, divisor, scratch), x_at))
    }
    fn grad_pass(&self, row: usize, out: &mut [f64], k: &GradRow) {
        let v = self.shape.vocab;
        L::grad_pass(&self.logits[row * v..(row + 1) * v], out, k);
    }
}

impl<'a, L: Real> LogitsProblem<'a, L> {
    pub fn token_inputs(&self) -> TokenInputs<'a> {
        TokenInputs {
            tokens: self.tokens,
            mask: self.mask,
            advantages: self.advantages,
            old_logp: self.old_logp,
            ref_logp: self.ref_logp,
        }
    }

    /// Validates everything and runs the forward pass.
    pub fn forward(&self) -> Result<Forward<'_>, InputError> {
        let s = self.shape;
        if self.logits.len() != s.rows() * s.vocab {
            return Err(input_error!(
                "logits has {} elements, expected B*T*V = {}*{}*{} = {}",
                self.logits.len(),
                s.batch,
                s.time,
                s.vocab,
                s.rows() * s.vocab
            ));
        }
        // Rows in parallel, each in one branch-free (vectorised) read; the
        // first bad element is then looked up in the first bad row.
        let bad_row = self
            .logits
            .par_chunks(s.vocab.max(1))
            .position_first(|row| row.iter().fold(false, |bad, z| bad | !z.to_f64().is_finite()));
        let first_bad = bad_row.and_then(|r| {
            let start = r * s.vocab;
            self.logits[start..].iter().position(|z| !z.to_f64().is_finite()).map(|v| (start + v, self.logits[start + v]))
        });
        if let Some((i, z)) = first_bad {
            let (b, t, v) = (i / (s.time * s.vocab), (i / s.vocab) % s.time, i % s.vocab);
            return Err(input_error!("logits[{b}, {t}, {v}] = {} is not finite", z.to_f64()));
        }
        Forward::new(self, self.token_inputs(), self.config, self.hparams)
    }
}

/// The per-token inputs shared by both kinds.
#[derive(Clone, Copy)]
pub struct TokenInputs<'a> {
    pub tokens: &'a [i32],
    pub mask: &'a [f32],
    pub advantages: &'a [f32],
    pub old_logp: Option<&'a [f32]>,
    pub ref_logp: Option<&'a [f32]>,
}

impl TokenInputs<'_> {
    pub(crate) fn validate(&self, shape: Shape, config: &Config) -> Result<(), InputError> {
        let (b_, t_, v_) = (shape.batch, shape.time, shape.vocab);
        if b_ == 0 || t_ == 0 || v_ == 0 {
            return Err(input_error!("shape B={b_}, T={t_}, V={v_}: every dimension must be >= 1"));
        }
        let n = shape.rows();
        let check_len = |name: &str, len: usize, want: usize, dims: &str| {
            if len == want {
                Ok(())
            } else {
                Err(input_error!("{name} has {len} elements, expected {dims} = {want}"))
            }
        };
        check_len("tokens", self.tokens.len(), n, "B*T")?;
        check_len("mask", self.mask.len(), n, "B*T")?;
        check_len("advantages", self.advantages.len(), b_, "B")?;
        match (config.on_policy, self.old_logp) {
            (true, Some(_)) => return Err(input_error!("old_logp is given but on_policy is true")),
            (false, None) => return Err(input_error!("old_logp is absent but on_policy is false")),
            (false, Some(old)) => check_len("old_logp", old.len(), n, "B*T")?,
            (true, None) => {}
        }
        match (config.kl, self.ref_logp) {
            (true, None) => return Err(input_error!("ref_logp is absent but kl is true")),
            (false, Some(_)) => return Err(input_error!("ref_logp is given but kl is false")),
            (true, Some(r)) => check_len("ref_logp", r.len(), n, "B*T")?,
            (false, None) => {}
        }
        for (b, a) in self.advantages.iter().enumerate() {
            if !a.is_finite() {
                return Err(input_error!("advantages[{b}] = {a} is not finite"));
            }
        }
        for i in 0..n {
            let (b, t) = (i / t_, i % t_);
            let m = self.mask[i];
            if m != 0.0 && m != 1.0 {
                return Err(input_error!("mask[{b}, {t}] = {m} must be 0 or 1"));
            }
            if m == 0.0 {
                continue; // anything finite or not is allowed at masked positions
            }
            let y = self.tokens[i];
            if y < 0 || y as usize >= v_ {
                return Err(input_error!(
                    "tokens[{b}, {t}] = {y} is outside the vocabulary [0, {v_})"
                ));
            }
            for (name, arr) in [("old_logp", self.old_logp), ("ref_logp", self.ref_logp)] {
                if let Some(a) = arr {
                    if !a[i].is_finite() {
                        return Err(input_error!("{name}[{b}, {t}] = {} is not finite", a[i]));
                    }
                }
            }
        }
        Ok(())
    }
}

/// Per-token results of the forward pass. At masked positions only `masked`
/// and `weight` (= 0) are meaningful.
#[derive(Clone, Copy, Debug, Default)]
pub struct TokenStats {
    pub masked: bool,
    /// The token id the row is read at.
    pub chosen: usize,
    pub logp: f64,
    pub entropy: f64,
    pub per_token_loss: f64,
    /// Aggregation weight: loss = sum(weight * per_token_loss).
    pub weight: f64,
    pub advantage: f64,
    /// logp - old (0 on-policy).
    pub log_ratio: f64,
    /// d ppo / d logp with the smallest admissible slack (the exact point).
    pub ppo_interval: KinkInterval,
    /// d kl / d logp.
    pub kl_coef: f64,
    /// exp(ref - logp) (0 without KL): the sensitivity of kl_coef to logp.
    pub kl_exp: f64,
    /// The softmax's argument at the chosen token: z_y / tau or z_y.
    pub x_chosen: f64,
    /// Its rounding magnitude (see [`LogitRows::logit_row`]), in the same units.
    pub mag_chosen: f64,
    pub softmax: RowSoftmax,
}

/// The forward pass of one problem, and the gradient on demand.
pub struct Forward<'a> {
    rows: &'a dyn LogitRows,
    pub shape: Shape,
    pub config: Config,
    pub hparams: Hparams,
    pub loss: f64,
    pub tokens: Vec<TokenStats>,
}

impl<'a> Forward<'a> {
    pub fn new(
        rows: &'a dyn LogitRows,
        inputs: TokenInputs<'_>,
        config: Config,
        hparams: Hparams,
    ) -> Result<Self, InputError> {
        let shape = rows.shape();
        hparams.validate(&config)?;
        inputs.validate(shape, &config)?;
        let weights = aggregation_weights(
            inputs.mask,
            shape.batch,
            shape.time,
            config.aggregation,
            hparams.normalizer,
        );
        let tau = hparams.temperature;
        let delta = hparams.effective_delta(&config);
        let beta = hparams.effective_beta(&config);
        let entropy_coef = hparams.effective_entropy_coef(&config);
        let divisor = match config.temperature_mode {
            TemperatureMode::Logits => tau,
            TemperatureMode::Logp => 1.0,
        };
        let live: Vec<usize> = (0..shape.rows()).filter(|&i| inputs.mask[i] != 0.0).collect();
        let chosen: Vec<usize> = live.iter().map(|&i| inputs.tokens[i] as usize).collect();
        let mut row_stats = rows.row_stats(&live, &chosen, divisor).into_iter();
        let mut tokens = vec![TokenStats { masked: true, ..TokenStats::default() }; shape.rows()];
        for &i in &live {
            let RowStats { softmax, x_chosen, mag_chosen } = row_stats.next().expect("one statistic per live row");
            let y = inputs.tokens[i] as usize;
            let advantage = inputs.advantages[i / shape.time] as f64;
            let logp = match config.temperature_mode {
                TemperatureMode::Logits => x_chosen - softmax.lse,
                TemperatureMode::Logp => (x_chosen - softmax.lse) / tau,
            };
            let log_ratio = inputs.old_logp.map_or(0.0, |old| logp - old[i] as f64);
            let ratio = log_ratio.exp();
            let ppo = ppo_per_token(ratio, advantage, hparams.eps_low, hparams.eps_high, delta);
            let ppo_interval = kink_interval(log_ratio, advantage, hparams.eps_low, hparams.eps_high, delta, 0.0);
            let (kl, kl_coef, kl_exp) = match inputs.ref_logp {
                Some(r) if beta != 0.0 => {
                    let (kl, coef) = kl_per_token(logp, r[i] as f64, beta);
                    (kl, coef, (r[i] as f64 - logp).exp())
                }
                _ => (0.0, 0.0, 0.0),
            };
            tokens[i] = TokenStats {
                masked: false,
                chosen: y,
                logp,
                entropy: softmax.entropy,
                per_token_loss: ppo + kl - entropy_coef * softmax.entropy,
                weight: weights[i],
                advantage,
                log_ratio,
                ppo_interval,
                kl_coef,
                kl_exp,
                x_chosen,
                mag_chosen,
                softmax,
            };
        }
        let loss = CompensatedSum::of(tokens.iter().map(|s| s.weight * s.per_token_loss));
        Ok(Forward { rows, shape, config, hparams, loss, tokens })
    }

    /// 1/tau in logits mode, 1 in logp mode: the factor between d/dx and d/dz
    /// for the entropy.
    pub fn entropy_scale(&self) -> f64 {
        match self.config.temperature_mode {
            TemperatureMode::Logits => 1.0 / self.hparams.temperature,
            TemperatureMode::Logp => 1.0,
        }
    }

    /// Writes row `row` of cotangent * d loss / d logits into `out` (length V),
    /// with `ppo_coef` as the token's d ppo / d logp (the midpoint of its
    /// exact-point interval when `None`). Masked rows are exactly zero.
    ///
    ///   g_v = cot * w * [ (c_ppo + c_kl) (onehot_v - p_v) / tau
    ///                     + entropy_coef * s * p_v (log p_v + ent) ],
    ///   s = 1/tau (logits mode) or 1 (logp mode).
    pub fn grad_row(&self, row: usize, cotangent: f64, ppo_coef: Option<f64>, out: &mut [f64]) {
        let Some(k) = self.grad_constants(row, cotangent, ppo_coef) else {
            out.iter_mut().for_each(|g| *g = 0.0);
            return;
        };
        self.rows.grad_pass(row, out, &k);
        out[self.tokens[row].chosen] += k.scale * k.c_logp;
    }

    /// The constants of row `row`'s gradient (see [`Forward::grad_row`]):
    /// `grad_pass` of z with them, plus scale * c_logp at the chosen column.
    /// None for a row whose gradient is exactly zero (masked, zero weight).
    pub fn grad_constants(&self, row: usize, cotangent: f64, ppo_coef: Option<f64>) -> Option<GradRow> {
        let st = &self.tokens[row];
        if st.masked || st.weight == 0.0 {
            return None;
        }
        let tau = self.hparams.temperature;
        let c_logp = (ppo_coef.unwrap_or(st.ppo_interval.midpoint()) + st.kl_coef) / tau;
        let c_ent = self.hparams.effective_entropy_coef(&self.config) * self.entropy_scale();
        Some(GradRow {
            inv_tau: self.inv_tau(),
            lse: st.softmax.lse,
            entropy: st.entropy,
            scale: cotangent * st.weight,
            c_logp,
            c_ent,
        })
    }

    /// What multiplies z in the softmax's argument: 1/tau in logits mode, 1 in logp mode.
    pub fn inv_tau(&self) -> f64 {
        match self.config.temperature_mode {
            TemperatureMode::Logits => 1.0 / self.hparams.temperature,
            TemperatureMode::Logp => 1.0,
        }
    }

    /// Writes (onehot - p) / tau of row `row` (the direction in which the
    /// ppo coefficient moves the gradient row) into `out`.
    pub fn dlogp_dlogits_row(&self, row: usize, out: &mut [f64]) {
        let st = &self.tokens[row];
        let tau = self.hparams.temperature;
        self.rows.logit_row(row, out, None);
        let inv_tau = match self.config.temperature_mode {
            TemperatureMode::Logits => 1.0 / tau,
            TemperatureMode::Logp => 1.0,
        };
        for g in out.iter_mut() {
            *g = -(*g * inv_tau - st.softmax.lse).exp() / tau;
        }
        if !st.masked {
            out[st.chosen] += 1.0 / tau;
        }
    }

    /// Writes p = softmax(x) of row `row` into `out`.
    pub fn softmax_row(&self, row: usize, out: &mut [f64]) {
        let st = &self.tokens[row];
        self.rows.logit_row(row, out, None);
        let inv_tau = match self.config.temperature_mode {
            TemperatureMode::Logits => 1.0 / self.hparams.temperature,
            TemperatureMode::Logp => 1.0,
        };
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
