//! One row's softmax statistics in f64: log-sum-exp, entropy, and the
//! magnitudes an error analysis needs (how far rounding in a lower precision
//! can move each quantity).

use crate::sum::CompensatedSum;

/// Statistics of p = softmax(x) for one row x (x = z / tau in logits mode,
/// z in logp mode).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RowSoftmax {
    /// LSE(x), max-subtracted.
    pub lse: f64,
    /// -sum_v p_v log p_v.
    pub entropy: f64,
    /// max_v mag_v (the rounding magnitude of x_v; |x_v| for stored logits).
    pub max_abs_x: f64,
    /// sum_v p_v mag_v.
    pub sum_p_abs_x: f64,
    /// max_v p_v mag_v.
    pub max_p_abs_x: f64,
    /// max_v p_v |log p_v|.
    pub max_p_abs_log_p: f64,
}

/// Computes [`RowSoftmax`] for a row x with rounding magnitudes `mag`
/// (how large the terms each x_v is computed from are: |x_v| for a stored
/// logit, the sum of |products| for a computed one); `scratch` must have the
/// row's length and holds exp(x - max) afterwards.
pub fn row_softmax_stats(x: &[f64], mag: &[f64], scratch: &mut [f64]) -> RowSoftmax {
    debug_assert_eq!(x.len(), scratch.len());
    let max = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let max_abs_x = mag.iter().fold(0.0f64, |m, v| m.max(*v));
    let mut sum = CompensatedSum::new();
    for (e, &xv) in scratch.iter_mut().zip(x) {
        *e = (xv - max).exp();
        sum.add(*e);
    }
    let sum = sum.value();
    let lse = max + sum.ln();
    let mut entropy = CompensatedSum::new();
    let mut sum_p_abs_x = CompensatedSum::new();
    let (mut max_p_abs_x, mut max_p_abs_log_p) = (0.0f64, 0.0f64);
    for ((&e, &xv), &m) in scratch.iter().zip(x).zip(mag) {
        let p = e / sum;
        // -log p_v = lse - x_v >= 0: every entropy term is non-negative.
        let neg_log_p = lse - xv;
        entropy.add(p * neg_log_p);
        sum_p_abs_x.add(p * m);
        max_p_abs_x = max_p_abs_x.max(p * m);
        max_p_abs_log_p = max_p_abs_log_p.max(p * neg_log_p.abs());
    }
    RowSoftmax {
        lse,
        entropy: entropy.value(),
        max_abs_x,
        sum_p_abs_x: sum_p_abs_x.value(),
        max_p_abs_x,
        max_p_abs_log_p,
    }
}
