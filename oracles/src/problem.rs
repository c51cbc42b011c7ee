//! What the forward pass (`forward.rs`) reads: input elements that widen
//! to f64 exactly ([`Real`]), row sources ([`LogitRows`]: a stored logits
//! array in `logits.rs`, computed rows in `fused.rs`, transformed rows in
//! `transform.rs`) and the per-token inputs both kinds share, validated.

use rayon::prelude::*;

use crate::config::Config;
use crate::error::{input_error, InputError};
use crate::softmax::{row_softmax_stats, stored_row_softmax_stats_f32, RowSoftmax};
use crate::vector::{self, GradRow};

/// A floating-point input element that widens to f64 exactly.
pub trait Real: Copy + Send + Sync {
    /// The element's value in f64, exactly (f32, bf16 and f64 all widen without rounding).
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

/// The problem's sizes (docs/spec.md, "Shapes and inputs"); each >= 1 in a
/// valid problem.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Shape {
    /// B, sequences (one advantage each).
    pub batch: usize,
    /// T, tokens per sequence.
    pub time: usize,
    /// V, the vocabulary: a logit row's length.
    pub vocab: usize,
}

impl Shape {
    /// B * T, the token rows; row b * T + t is token (b, t).
    pub fn rows(&self) -> usize {
        self.batch * self.time
    }
}

/// A source of logit rows z[b, t, :] in f64, row index b * T + t. The logits
/// kind reads them from an array; the fused kind computes hidden @ lm_head.
pub trait LogitRows: Sync {
    /// B, T, V of the rows (B * T rows of V logits).
    fn shape(&self) -> Shape;
    /// Writes z[row, :] into `out`, and into `magnitude` (when asked) the size
    /// of the terms each z_v is made of: |z_v| for a stored logit,
    /// sqrt(H) sum_h |hidden_h lm_head_hv| + |z_v| for a computed one. It
    /// scales how far an implementation's rounding can move z_v.
    fn logit_row(&self, row: usize, out: &mut [f64], magnitude: Option<&mut [f64]>);
    /// Writes sum_h |hidden_h lm_head_hv| of row `row` into `out`: the size
    /// of the products a computed logit is summed from (0 for stored logits).
    fn abs_product_row(&self, row: usize, out: &mut [f64]) {
        let _ = row;
        out.iter_mut().for_each(|m| *m = 0.0);
    }
    /// For stored logits (rounding magnitudes |z_v|): the softmax statistics
    /// of x = z[row, :] / divisor and x at `at`, read from storage without
    /// building magnitudes. `None` (the default) for computed rows.
    /// `scratch` is grown if an f64 copy of the row is needed.
    fn stored_stats(&self, row: usize, at: usize, divisor: f64, scratch: &mut Vec<f64>) -> Option<(RowSoftmax, f64)> {
        let _ = (row, at, divisor, scratch);
        None
    }
    /// Writes row `row`'s gradient into `out`: [`vector::grad_pass`] of
    /// the row plus the one-hot term scale * c_logp at column `chosen`.
    fn grad_row_pass(&self, row: usize, chosen: usize, out: &mut [f64], k: &GradRow) {
        self.logit_row(row, out, None);
        vector::grad_pass(out, k);
        out[chosen] += k.scale * k.c_logp;
    }
    /// Multiplies row `row`'s d/d(softmax input) by the input's derivative
    /// in the raw logits, elementwise (the logit transform's; 1 without one).
    fn chain_to_raw(&self, row: usize, out: &mut [f64]) {
        let _ = (row, out);
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
    /// The statistics of p = softmax(x).
    pub softmax: RowSoftmax,
    /// x_y, the softmax's argument at the chosen token.
    pub x_chosen: f64,
    /// x_y's rounding magnitude: |x_y| for a stored logit, more for a
    /// computed one (see [`LogitRows::logit_row`]).
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

/// The per-token inputs shared by both kinds (docs/spec.md, "Shapes and
/// inputs"), row-major; checked against the shape and switches before a
/// forward pass.
#[derive(Clone, Copy)]
pub struct TokenInputs<'a> {
    /// [B, T]: the chosen token ids, 0 <= y < V where mask = 1, anything (-100) where mask = 0.
    pub tokens: &'a [i32],
    /// [B, T], each 0 or 1: 0 marks padding and prompt.
    pub mask: &'a [f32],
    /// One finite advantage A per sequence (B of them).
    pub advantages: &'a [f32],
    /// [B, T]: the behaviour policy's log-probs (finite where mask = 1);
    /// None exactly when on_policy (old = stop_gradient(logp)).
    pub old_logp: Option<&'a [f32]>,
    /// [B, T]: the reference policy's log-probs (finite where mask = 1);
    /// Some exactly when `kl` is on.
    pub ref_logp: Option<&'a [f32]>,
    /// [B, T] or [B, 1] (v2, `rollout_correction`).
    pub is_weights: Option<&'a [f32]>,
}

impl TokenInputs<'_> {
    /// Token i's rollout-correction weight (1 without weights).
    pub fn is_weight(&self, i: usize, time: usize) -> f64 {
        match self.is_weights {
            None => 1.0,
            Some(w) if w.len() * time == self.mask.len() && time != 1 => w[i / time] as f64,
            Some(w) => w[i] as f64,
        }
    }

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
        match (config.rollout_correction, self.is_weights) {
            (true, None) => return Err(input_error!("is_weights is absent but rollout_correction is true")),
            (false, Some(_)) => return Err(input_error!("is_weights is given but rollout_correction is false")),
            (true, Some(w)) if w.len() != n && w.len() != b_ => {
                return Err(input_error!("is_weights has {} elements, expected [B, T] = {n} or [B, 1] = {b_}", w.len()))
            }
            _ => {}
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
            let w = self.is_weight(i, t_);
            if !(w.is_finite() && w >= 0.0) {
                return Err(input_error!("is_weights at [{b}, {t}] = {w} must be finite and >= 0"));
            }
        }
        Ok(())
    }
}

