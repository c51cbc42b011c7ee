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
/// (how large the terms each x_v is computed from: the sum of |products|
/// for a computed logit), or `None` for a stored row, whose magnitudes are
/// |x_v|.
///
/// Two reads of the row and one exp per element: the extrema, then
/// S = sum e_v and sum e_v d_v with e_v = exp(-d_v), d_v = max - x_v >= 0,
/// so lse = max + ln S and the entropy, sum p_v (lse - x_v), is
/// ln S + (sum e_v d_v) / S: a sum of non-negative terms, as the direct
/// form is. max p_v |log p_v| needs a third, exp-free read only when
/// ln S < 1 (see [`vector::peak_e_log_e`]).
pub fn row_softmax_stats(x: &[f64], mag: Option<&[f64]>) -> RowSoftmax {
    match mag {
        None => {
            let (max, max_abs) = vector::extrema(x);
            finish(max, max_abs, vector::exp_sums(x, max), |c| vector::peak_e_log_e(x, max, c))
        }
        Some(mag) => {
            let (max, _) = vector::extrema(x);
            let (_, max_abs) = vector::extrema(mag);
            let sums = vector::exp_sums_mag(x, mag, max);
            finish(max, max_abs, sums, |c| vector::peak_e_log_e(x, max, c))
        }
    }
}

/// [`row_softmax_stats`] of x = z / divisor for a stored f32 row z, read
/// straight from it (no f64 copy of the row is made).
pub fn stored_row_softmax_stats_f32(z: &[f32], divisor: f64) -> RowSoftmax {
    // Division by a positive number preserves order and rounds monotonically,
    // so the extrema of x are those of z, divided.
    let (max_z, max_abs_z) = vector::extrema_f32(z);
    let (max, max_abs) = if divisor == 1.0 { (max_z, max_abs_z) } else { (max_z / divisor, max_abs_z / divisor) };
    let sums = vector::exp_sums_f32(z, divisor, max);
    finish(max, max_abs, sums, |c| vector::peak_e_log_e_f32(z, divisor, max, c))
}

fn finish(max: f64, max_abs_x: f64, sums: vector::ExpSums, peak: impl FnOnce(f64) -> f64) -> RowSoftmax {
    let c = sums.sum.ln();
    // The largest p_v |log p_v| = e_v (c + d_v) / S: at the max (d = 0) when c >= 1.
    let peak = if c >= 1.0 { c } else { peak(c) };
    RowSoftmax {
        lse: max + c,
        entropy: c + sums.sum_e_d / sums.sum,
        max_abs_x,
        sum_p_abs_x: sums.sum_e_mag / sums.sum,
        max_p_abs_x: sums.max_e_mag / sums.sum,
        max_p_abs_log_p: peak / sums.sum,
    }
}
