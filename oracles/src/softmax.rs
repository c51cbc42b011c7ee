//! One row's softmax statistics in f64: log-sum-exp, entropy, and the
//! magnitudes an error analysis needs (how far rounding in a lower precision
//! can move each quantity).

use crate::simd::Level;
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
    row_softmax_stats_at(Level::Avx512, x, mag)
}

/// [`row_softmax_stats`] with the kernels at most at `cap`.
pub(crate) fn row_softmax_stats_at(cap: Level, x: &[f64], mag: Option<&[f64]>) -> RowSoftmax {
    match mag {
        None => {
            let (max, max_abs) = vector::extrema_at(cap, x);
            finish(max, max_abs, vector::exp_sums_at(cap, x, max), |c| vector::peak_e_log_e_at(cap, x, max, c))
        }
        Some(mag) => {
            let (max, _) = vector::extrema_at(cap, x);
            let (_, max_abs) = vector::extrema_at(cap, mag);
            let sums = vector::exp_sums_mag_at(cap, x, mag, max);
            finish(max, max_abs, sums, |c| vector::peak_e_log_e_at(cap, x, max, c))
        }
    }
}

/// [`row_softmax_stats`] of x = z / divisor for a stored f32 row z, read
/// straight from it (no f64 copy of the row is made).
pub fn stored_row_softmax_stats_f32(z: &[f32], divisor: f64) -> RowSoftmax {
    stored_row_softmax_stats_f32_at(Level::Avx512, z, divisor)
}

/// [`stored_row_softmax_stats_f32`] with the kernels at most at `cap`.
pub(crate) fn stored_row_softmax_stats_f32_at(cap: Level, z: &[f32], divisor: f64) -> RowSoftmax {
    // Division by a positive number preserves order and rounds monotonically,
    // so the extrema of x are those of z, divided.
    let (max_z, max_abs_z) = vector::extrema_f32_at(cap, z);
    let (max, max_abs) = if divisor == 1.0 { (max_z, max_abs_z) } else { (max_z / divisor, max_abs_z / divisor) };
    let sums = vector::exp_sums_f32_at(cap, z, divisor, max);
    finish(max, max_abs, sums, |c| vector::peak_e_log_e_f32_at(cap, z, divisor, max, c))
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

/// The instruction sets every level-capped test runs at: each narrower path
/// is tested on a CPU that would otherwise run only the widest (the CPU's
/// own features still decide below the cap).
#[cfg(test)]
pub(crate) const TEST_LEVELS: [Level; 3] = [Level::Avx512, Level::Avx2, Level::Scalar];

/// Whether the AVX2 + FMA path (and so fused multiply-adds) is available.
#[cfg(test)]
pub(crate) fn cpu_has_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sum::CompensatedSum;
    use crate::vector::GradRow;

    /// Standard normal draws, deterministic (xorshift64*, Box-Muller).
    struct Normal(u64);

    impl Normal {
        fn uniform(&mut self) -> f64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            ((self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        }
        fn next(&mut self) -> f64 {
            let (u, v) = (self.uniform(), self.uniform());
            (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
        }
    }

    /// RowSoftmax the slow way: std exp, compensated sums, every max over all v.
    fn scalar_softmax(x: &[f64], mag: Option<&[f64]>) -> RowSoftmax {
        let max = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let magnitude = |v: usize| mag.map_or(x[v].abs(), |m| m[v]);
        let e: Vec<f64> = x.iter().map(|v| (v - max).exp()).collect();
        let sum = CompensatedSum::of(e.iter().copied());
        let c = sum.ln();
        // p_v (c + d_v) = p_v |log p_v|, d_v = max - x_v.
        let p_log_p = |v: usize| e[v] / sum * (c + (max - x[v]));
        RowSoftmax {
            lse: max + c,
            entropy: CompensatedSum::of((0..x.len()).map(p_log_p)),
            max_abs_x: (0..x.len()).map(magnitude).fold(0.0, f64::max),
            sum_p_abs_x: CompensatedSum::of((0..x.len()).map(|v| e[v] / sum * magnitude(v))),
            max_p_abs_x: (0..x.len()).map(|v| e[v] / sum * magnitude(v)).fold(0.0, f64::max),
            max_p_abs_log_p: (0..x.len()).map(p_log_p).fold(0.0, f64::max),
        }
    }

    /// The vector row kernels (explicit 8-, 4- or 1-lane code) at every
    /// level, against plain scalar loops with std's exp and compensated
    /// sums: every length around the lane counts (tails), a long row, flat to
    /// very peaked rows (ln S from about 12 down to 0, where max p |log p| is
    /// found by the candidate search), ties at the max, all three row forms
    /// (f64 stored, f64 with magnitudes, f32 stored with a divisor), and the
    /// gradient pass.
    #[test]
    fn vector_kernels_match_scalar_loops() {
        for level in TEST_LEVELS {
            kernels_match_scalar_loops(level);
        }
    }

    fn kernels_match_scalar_loops(level: Level) {
        let mut normal = Normal(11);
        let lengths: Vec<usize> = (1..=40).chain([151_936]).collect();
        for &len in &lengths {
            for (scale, ties) in [(0.01, false), (1.0, false), (8.0, false), (60.0, false), (60.0, true)] {
                let mut z: Vec<f32> = (0..len).map(|_| (scale * normal.next()) as f32).collect();
                if ties && len >= 3 {
                    let top = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    z[len / 2] = top;
                    z[len - 1] = top;
                }
                for divisor in [1.0, 0.7] {
                    let x: Vec<f64> = z.iter().map(|&v| v as f64 / divisor).collect();
                    let mag: Vec<f64> = x.iter().map(|v| v.abs() * 1.5 + 0.25).collect();
                    let what = format!("at {level:?}, len {len} scale {scale} ties {ties} divisor {divisor}");
                    let want_max = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let want_max_abs = x.iter().fold(0.0f64, |m, v| m.max(v.abs()));
                    assert_eq!(vector::extrema_at(level, &x), (want_max, want_max_abs), "{what}: extrema");
                    for (form, got, m) in [
                        ("stored f64", row_softmax_stats_at(level, &x, None), None),
                        ("with magnitudes", row_softmax_stats_at(level, &x, Some(&mag)), Some(&mag)),
                        ("stored f32", stored_row_softmax_stats_f32_at(level, &z, divisor), None),
                    ] {
                        let want = scalar_softmax(&x, m.map(|m| m.as_slice()));
                        let close = |a: f64, b: f64, rel: f64| (a - b).abs() <= rel * b.abs();
                        let eps = f64::EPSILON;
                        let ok = close(got.lse, want.lse, 4.0 * eps)
                            // Every entropy term is >= 0, on both sides: relative accuracy holds however small it is.
                            && close(got.entropy, want.entropy, 16.0 * eps)
                            && got.max_abs_x == want.max_abs_x
                            // A plain (uncompensated) lane sum of positive terms: (n / lanes) eps at worst.
                            && close(got.sum_p_abs_x, want.sum_p_abs_x, 1e-11)
                            && close(got.max_p_abs_x, want.max_p_abs_x, 8.0 * eps)
                            && close(got.max_p_abs_log_p, want.max_p_abs_log_p, 8.0 * eps);
                        assert!(ok, "{what}, {form}: {got:?}\n  scalar loops give {want:?}");
                    }
                }
                // The gradient pass, in place on f64 and from f32.
                let x: Vec<f64> = z.iter().map(|&v| v as f64).collect();
                let lse = scalar_softmax(&x, None).lse;
                let k = GradRow { inv_tau: 0.5, lse, entropy: 1.5, scale: 2.0, c_logp: 0.3, c_ent: 0.7 };
                let mut g = x.clone();
                vector::grad_pass_at(level, &mut g, &k);
                let mut g32 = vec![f64::NAN; len];
                vector::grad_pass_f32_at(level, &z, &mut g32, &k);
                assert!(g == g32, "at {level:?}, len {len} scale {scale}: grad_pass from f32 differs from grad_pass on the widened row");
                // Each element against the formula with std exp, relative to the size of its terms.
                let worst_grad = x.iter().zip(&g).fold(0.0f64, |w, (v, got)| {
                    let log_p = v * 0.5 - lse;
                    let p = log_p.exp();
                    let want = 2.0 * (-0.3 * p + 0.7 * p * (log_p + 1.5));
                    let terms = 2.0 * p * (0.3 + 0.7 * (log_p.abs() + 1.5));
                    if terms == 0.0 { w } else { w.max((got - want).abs() / terms) }
                });
                assert!(
                    worst_grad <= 16.0 * f64::EPSILON,
                    "at {level:?}, len {len} scale {scale}: a gradient element is {worst_grad:e} (relative to its terms) from the scalar formula"
                );
            }
        }
    }
}
