//! One row's softmax statistics in f64: log-sum-exp, entropy, and the
//! magnitudes an error analysis needs (how far rounding in a lower precision
//! can move each quantity).

use crate::vector;

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
    let max = vector::max(x);
    let max_abs_x = vector::max_abs(mag);
    let sum = vector::exp_shifted_sum(x, max, scratch);
    let lse = max + sum.ln();
    let pass = vector::softmax_pass(x, mag, scratch, sum, lse);
    RowSoftmax {
        lse,
        entropy: pass.entropy,
        max_abs_x,
        sum_p_abs_x: pass.sum_p_mag,
        max_p_abs_x: pass.max_p_mag,
        max_p_abs_log_p: pass.max_p_abs_log_p,
    }
}
