//! The kink-aware row fit: a token within its rounding distance of a clip
//! edge accepts any ppo coefficient in its Clarke interval; the coefficient
//! that fits the implementation's row best is used (shared by both kinds).

use grpo_oracle::{Forward, KinkInterval};

use crate::case::{Case, Dtype};
use crate::compare::Outputs;
use crate::compare::rule::{U32, bf16_half_ulp};
use crate::compare::scales::Scales;

/// Is row `i`'s exact gradient zero (masked, zero weight, or clipped with no
/// KL and entropy terms)?
pub fn exact_zero_row(fwd: &Forward<'_>, scales: &Scales, i: usize) -> bool {
    let st = &fwd.tokens[i];
    let iv = scales.intervals[i];
    let ec = fwd.hparams.effective_entropy_coef(&fwd.config);
    if st.masked || st.weight == 0.0 {
        return true;
    }
    let zero = |iv: KinkInterval| iv.lo == 0.0 && iv.hi == 0.0;
    if !(zero(iv) && st.kl_coef == 0.0 && ec == 0.0) {
        return false;
    }
    // Under a declared convention the row's logp moves: a KL coefficient
    // zero at the exact d is not zero at the moved one, a smooth slope zero
    // at the exact ratio may not be at the window's ends (SAPO's sigma
    // saturated to 1 in f64 at a huge ratio), and where the move may
    // overflow the ratio in f32 (0 * inf) nothing is constrained.
    match scales.rounding().map(|r| &r.tokens[i]).filter(|t| t.window > 0.0) {
        None => true,
        Some(t) => {
            let w = scales.slack[i];
            t.coef_drift.is_finite()
                && fwd.hparams.effective_beta(&fwd.config) == 0.0
                && zero(fwd.coefficient_interval(i, st.log_ratio - w, 0.0))
                && zero(fwd.coefficient_interval(i, st.log_ratio + w, 0.0))
        }
    }
}

/// Row `i` of the oracle's gradient with the admissible ppo coefficient that
/// fits the implementation's row (`out`) best in the comparison's own
/// measure; `row` ends as the oracle's row at that coefficient.
///
/// A row is measured by max_v diff_v / s with one scale s per row, diff_v =
/// max(0, |got_v - o_v| - h_v) and h_v the bf16 output allowance (0 for f32)
/// plus a declared convention's (`convention_allowance`, empty for none).
/// The coefficient moves the oracle's row along d = cot w (onehot - p) / tau:
/// o(c0 + t) = o(c0) + t d. So the row's distance to the admissible set is
///
///   min over t in [lo - c0, hi - c0] of  max_v max(0, |r_v - t d_v| - h_v),
///   r = got - o(c0),
///
/// a one-dimensional convex piecewise-linear problem, solved here by bisection
/// on its value e: the t with max_v (|r_v - t d_v| - h_v) <= e form an
/// interval (one per element, intersected), nonempty iff e >= the minimum.
/// A least-squares fit (this function's former rule) minimises sum_v
/// (r_v - t d_v)^2 instead: in bf16 the large elements' rounding (up to 2^-8
/// of them) pulls t away from the implementation's own coefficient, and the
/// small elements, whose half-ulp allowance is smaller, carry the misfit: a
/// correct reference measured up to 825 u, mostly at small V (docs/tolerance.md).
pub fn kink_fitted_row(
    fwd: &Forward<'_>,
    scales: &Scales,
    case: &Case,
    out: &Outputs,
    i: usize,
    iv: KinkInterval,
    row: &mut [f64],
    direction: &mut [f64],
    convention_allowance: &[f64],
) {
    let (v_, cot) = (case.shape.vocab, case.cotangent);
    let got = &out.grad[i * v_..(i + 1) * v_];
    let bf16 = out.grad_dtype == Dtype::Bf16;
    let st = &fwd.tokens[i];
    let c0 = iv.clamp(st.policy_interval.midpoint());
    fwd.grad_row(i, cot, Some(c0), row);
    // A non-finite element fails the row whatever the coefficient.
    if iv.is_point() || got.iter().any(|g| !g.is_finite()) {
        return;
    }
    fwd.dlogp_dlogits_row(i, direction);
    let k = cot * st.weight;
    direction.iter_mut().for_each(|d| *d *= k);
    let residual: Vec<f64> = got.iter().zip(row.iter()).map(|(&g, &o)| g as f64 - o).collect();
    let allowance: Vec<f64> = got
        .iter()
        .enumerate()
        .map(|(v, &g)| if bf16 { bf16_half_ulp(g) } else { 0.0 } + convention_allowance.get(v).copied().unwrap_or(0.0))
        .collect();
    let step = minimax_step(&residual, direction, &allowance, &|_| 1.0, (iv.lo - c0, iv.hi - c0), scales.grad_row[i] * U32 / 1024.0).step;
    for (o, &d) in row.iter_mut().zip(direction.iter()) {
        *o += step * d;
    }
}

/// The minimising step of [`minimax_step`], and every step within the
/// same (bisected) excess: how far the row pins the step down.
#[derive(Clone, Copy, Debug)]
pub struct Step {
    /// The step that minimises the row's largest excess.
    pub step: f64,
    /// The smallest step with the same (bisected) excess.
    pub from: f64,
    /// The largest step with the same excess.
    pub to: f64,
}

/// The step t in `steps` = [lo, hi] (which holds 0) minimising
///
///   max_k max(0, |r_k - t d_k| - allowance_k) / scale(k)
///
/// a one-dimensional convex piecewise-linear problem, solved by bisection on
/// its value e: the t with |r_k - t d_k| <= allowance_k + e scale(k) for
/// every k form an interval (one per element, intersected), nonempty iff e
/// is at least the minimum; bisected to `resolution`. That interval at the
/// end is [`Step::from`, `Step::to`]: with large allowances (a declared
/// convention's) it is wide, and the step within it is no better than any
/// other of it.
pub fn minimax_step(r: &[f64], d: &[f64], allowance: &[f64], scale: &dyn Fn(usize) -> f64, steps: (f64, f64), resolution: f64) -> Step {
    let (lo, hi) = steps;
    // (from, to), empty when from > to (also when an element the step does
    // not move, d_k = 0, is off by more than its allowance).
    let steps_within = |e: f64| {
        let (mut from, mut to) = (lo, hi);
        for (k, ((&r, &d), &a)) in r.iter().zip(d).zip(allowance).enumerate() {
            let w = a + e * scale(k);
            if d > 0.0 {
                from = from.max((r - w) / d);
                to = to.min((r + w) / d);
            } else if d < 0.0 {
                from = from.max((r + w) / d);
                to = to.min((r - w) / d);
            } else if r.abs() > w {
                return (1.0, 0.0);
            }
        }
        (from, to)
    };
    // t = 0 is admissible: its worst excess bounds the minimum from above.
    let mut e_hi = r.iter().zip(allowance).enumerate().map(|(k, (&r, &a))| (r.abs() - a).max(0.0) / scale(k)).fold(0.0, f64::max);
    if !e_hi.is_finite() {
        return Step { step: 0.0, from: 0.0, to: 0.0 };
    }
    let (from, to) = steps_within(e_hi);
    let mut best = Step { step: 0.0, from: from.min(0.0), to: to.max(0.0) };
    let mut e_lo = 0.0;
    for _ in 0..200 {
        if e_hi - e_lo <= resolution {
            break;
        }
        let e = 0.5 * (e_lo + e_hi);
        let (from, to) = steps_within(e);
        if from <= to {
            e_hi = e;
            best = Step { step: 0.5 * (from + to), from, to };
        } else {
            e_lo = e;
        }
    }
    best
}

/// Row i's relative gradient error for the diagnostics: max |got - want|
/// over the row, over max |want| (the absolute error where want is zero).
pub fn row_relative_error(got: &[f32], want: impl Iterator<Item = f64>) -> f64 {
    let (mut err, mut size) = (0.0f64, 0.0f64);
    for (&g, w) in got.iter().zip(want) {
        err = err.max((g as f64 - w).abs());
        size = size.max(w.abs());
    }
    if size > 0.0 {
        err / size
    } else {
        err
    }
}
