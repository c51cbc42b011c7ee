//! The fused kind's gradients, d hidden and d lm_head, measured through the
//! oracle's vocabulary sweep, with each kink token's coefficient fitted on
//! its own d hidden row and then held for d lm_head.

use grpo_oracle::gemm::{matmul, Layout};
use grpo_oracle::{Forward, FusedProblem, KinkInterval, Magnitudes, Sweep};
use rayon::prelude::*;

use crate::case::{Case, Dtype};
use crate::compare::Outputs;
use crate::compare::kink::{exact_zero_row, minimax_step, row_relative_error};
use crate::compare::rule::{beyond, QuantityError, U32, bf16_half_ulp, gradient_diff};
use crate::compare::scales::{floor_scale, Scales, TINY};

/// One implementation's fused gradient errors.
pub struct FusedErrors {
    pub(super) d_hidden: QuantityError,
    pub(super) d_lm_head: QuantityError,
    pub(super) zero_rows: QuantityError,
    pub(super) row_errors: Vec<f64>,
}

/// d hidden and d lm_head of the fused kind, for several implementations'
/// outputs at once (the oracle's sweep is shared; it is the cost).
///
/// Scales. Each logits-gradient element carries the rounding scale
/// s_row (rounding_weight(p_v) + [v = y]) (errors follow the softmax's mass,
/// p |log p| with the entropy bonus, the chosen column, and what f32
/// underflow may lose); through
/// lm_head that gives
///   scale(dh[i, h]) = sum_v |W_hv| e_iv + sqrt(V) sum_v |W_hv g_iv|
///   scale(dW[h, v]) = sum_i |x_ih| e_iv + sqrt(BT) sum_i |x_ih g_iv|.
///
/// Kinks. A token at a kink may use any coefficient c in its admissible
/// interval, and must use the same c for d hidden and d lm_head. Its c is
/// fitted from its own row of d hidden (which no other token touches):
/// the step along a = lm_head @ direction, within the interval, that
/// minimises the row's error in the rule's measure (`minimax_step`). d lm_head is then judged at those coefficients, so
/// freedom used in one gradient is not free in the other
/// (docs/tolerance.md, "Kinks in the fused kind").
pub fn fused_grad_errors(
    fwd: &Forward<'_>,
    problem: &FusedProblem<'_, f32>,
    scales: &Scales,
    case: &Case,
    outs: &[&Outputs],
) -> Vec<FusedErrors> {
    let s = case.shape;
    let (h_, v_, n_rows) = (problem.hidden_dim, s.vocab, s.batch * s.time);
    let cot = case.cotangent;
    let at_row = |i: usize, h: usize| format!("b={} t={} h={h}", i / s.time, i % s.time);
    let mut results: Vec<FusedErrors> = outs
        .iter()
        .map(|_| FusedErrors {
            d_hidden: QuantityError::default(),
            d_lm_head: QuantityError::default(),
            zero_rows: QuantityError::default(),
            row_errors: vec![0.0; n_rows],
        })
        .collect();
    // Rows whose exact gradient is zero: zero to the floor, measured
    // against the largest row scale carried through lm_head.
    let w_abs_row_sum = problem
        .lm_head
        .par_chunks(v_)
        .map(|w| w.iter().map(|w| (*w as f64).abs()).sum::<f64>())
        .reduce(|| 0.0, f64::max);
    let zero_scale = scales.grad_global * w_abs_row_sum.max(TINY);
    for (r, out) in results.iter_mut().zip(outs) {
        for i in (0..n_rows).filter(|&i| exact_zero_row(fwd, scales, i)) {
            let got = &out.grad[i * h_..(i + 1) * h_];
            for (h, &gh) in got.iter().enumerate() {
                r.zero_rows.consider((gh as f64).abs(), zero_scale, 0.0, || at_row(i, h));
            }
            if !fwd.tokens[i].masked {
                r.row_errors[i] = row_relative_error(got, std::iter::repeat(0.0));
            }
        }
    }
    let live: Vec<usize> = (0..n_rows).filter(|&i| !exact_zero_row(fwd, scales, i)).collect();
    if live.is_empty() {
        return results;
    }
    // Each implementation's own intervals (`Scales::intervals_for`). The
    // sweep forms every row once, at one coefficient: a row where all of
    // them are the same point is swept at it; the others are kink rows,
    // swept at the analytic midpoint and moved per implementation.
    let intervals: Vec<Vec<KinkInterval>> = outs.iter().map(|out| scales.intervals_for(fwd, case, out)).collect();
    let rounding = scales.rounding();
    let same_point = |i: usize| {
        let first = intervals[0][i];
        first.is_point() && intervals.iter().all(|ivs| ivs[i] == first)
    };
    let coef: Vec<f64> = live
        .iter()
        .map(|&i| if same_point(i) { intervals[0][i].lo } else { scales.intervals[i].clamp(fwd.tokens[i].policy_interval.midpoint()) })
        .collect();
    let kinks: Vec<usize> = (0..live.len()).filter(|&k| !same_point(live[k])).collect();
    let row_scale: Vec<f64> = live.iter().map(|&i| scales.grad_row[i]).collect();
    let magnitudes = || Magnitudes {
        row_scale: &row_scale,
        g_weight_hidden: (v_ as f64).sqrt(),
        g_weight_lm_head: (n_rows as f64).sqrt(),
    };
    // Pass 1, kink rows alone: their d hidden at the midpoint, its scale and
    // a = lm_head @ direction; then each implementation's coefficient move
    // delta[j][a] in [lo - c0, hi - c0], and how far it may be off, rho[j][a]:
    // the move that changes d hidden's weighted residual by its analytic
    // bound, sigma = analytic / |a / s|, capped to the interval. d hidden
    // pins c down to sigma and no closer (with H = 1 it is one number), so
    // d lm_head is judged at the fitted c give or take rho.
    let (deltas, rhos): (Vec<Vec<f64>>, Vec<Vec<f64>>) = if kinks.is_empty() {
        (vec![Vec::new(); outs.len()], vec![Vec::new(); outs.len()])
    } else {
        let rows: Vec<usize> = kinks.iter().map(|&k| live[k]).collect();
        let kink_coef: Vec<f64> = kinks.iter().map(|&k| coef[k]).collect();
        let kink_scale: Vec<f64> = kinks.iter().map(|&k| row_scale[k]).collect();
        let all: Vec<usize> = (0..kinks.len()).collect();
        let mags = Magnitudes { row_scale: &kink_scale, ..magnitudes() };
        let sweep = Sweep { rows: &rows, ppo_coef: &kink_coef, directions: &all, magnitudes: Some(mags), lm_head: false, rounding };
        let pass = problem.sweep(fwd, cot, &sweep, |_| {});
        outs.iter()
            .zip(&intervals)
            .map(|(out, ivs)| {
                (0..kinks.len())
                    .map(|a| {
                        let i = rows[a];
                        let iv = ivs[i];
                        let got = &out.grad[i * h_..(i + 1) * h_];
                        let bf16 = out.grad_dtype == Dtype::Bf16;
                        let scale = |h: usize| floor_scale(pass.s_hidden[a * h_ + h]);
                        let along = &pass.along_hidden[a * h_..(a + 1) * h_];
                        let den: f64 = (0..h_).map(|h| (along[h] / scale(h)).powi(2)).sum();
                        // The coefficient at which d hidden is closest in the rule's own
                        // measure (a least-squares fit follows the bf16 rounding of the
                        // largest elements, as in the logits kind: kink_fitted_row).
                        // From this implementation's interval's nearest point to the swept coefficient.
                        let c0 = iv.clamp(kink_coef[a]);
                        let moved = c0 - kink_coef[a];
                        let residual: Vec<f64> = (0..h_).map(|h| got[h] as f64 - pass.d_hidden[a * h_ + h] - moved * along[h]).collect();
                        let convention = |h: usize| pass.a_hidden.get(a * h_ + h).copied().unwrap_or(0.0);
                        let allowance: Vec<f64> =
                            got.iter().enumerate().map(|(h, &g)| if bf16 { bf16_half_ulp(g) } else { 0.0 } + convention(h)).collect();
                        let steps = (iv.lo - c0, iv.hi - c0);
                        let fit = minimax_step(&residual, along, &allowance, &scale, steps, U32 / 1024.0);
                        let fitted = (c0 + fit.step).clamp(iv.lo, iv.hi);
                        // What d hidden leaves open: its analytic bound's move, and
                        // every coefficient it fits as well (a convention's
                        // allowance can leave a wide range).
                        let unpinned = (fit.step - fit.from).max(fit.to - fit.step);
                        let sigma = if den > 0.0 { scales.analytic / den.sqrt() } else { f64::INFINITY } + unpinned;
                        (fitted - kink_coef[a], sigma.min((fitted - iv.lo).max(iv.hi - fitted)))
                    })
                    .unzip()
            })
            .unzip()
    };
    // Pass 2, every live row: d hidden and its scale; d lm_head chunk by
    // chunk, judged per implementation at its fitted coefficients as the
    // chunk completes (nothing [H, V] is held).
    let kink_x: Vec<f64> = kinks.iter().flat_map(|&k| problem.hidden[live[k] * h_..(live[k] + 1) * h_].iter().map(|&x| x as f64)).collect();
    let sweep = Sweep { rows: &live, ppo_coef: &coef, directions: &kinks, magnitudes: Some(magnitudes()), lm_head: true, rounding };
    let pass = problem.sweep(fwd, cot, &sweep, |chunk| {
        let c = chunk.cols.len();
        let n_k = kinks.len();
        // [H, K] x_a[h] * per-kink factor, then @ directions (or |directions|).
        let through_kinks = |factor: &[f64], abs_x: bool, directions: &[f64], out: &mut [f64]| {
            let x = |a: usize, h: usize| if abs_x { kink_x[a * h_ + h].abs() } else { kink_x[a * h_ + h] };
            let scaled_x: Vec<f64> = (0..h_).flat_map(|h| (0..n_k).map(move |a| (a, h))).map(|(a, h)| factor[a] * x(a, h)).collect();
            matmul(out, Layout::dense(h_, c), &scaled_x, Layout::dense(h_, n_k), directions, Layout::dense(n_k, c), true);
        };
        let abs_directions: Vec<f64> = if n_k > 0 { chunk.directions.iter().map(|d| d.abs()).collect() } else { Vec::new() };
        for (((r, out), delta), rho) in results.iter_mut().zip(outs).zip(&deltas).zip(&rhos) {
            let Some(got_all) = out.grad_lm_head.as_deref() else { continue };
            let bf16 = out.grad_dtype == Dtype::Bf16;
            // want = d lm_head at the midpoints + sum_a delta_a x_a direction_a^T,
            // give or take slack = sum_a rho_a |x_a| |direction_a|^T.
            let mut corrected;
            let want: &[f64] = if delta.iter().any(|&d| d != 0.0) {
                corrected = chunk.d_lm_head.to_vec();
                through_kinks(delta, false, chunk.directions, &mut corrected);
                &corrected
            } else {
                chunk.d_lm_head
            };
            let mut slack = Vec::new();
            if rho.iter().any(|&p| p > 0.0) {
                slack = vec![0.0; h_ * c];
                through_kinks(rho, true, &abs_directions, &mut slack);
            }
            let chunk_err = (0..h_)
                .into_par_iter()
                .map(|h| {
                    let mut q = QuantityError::default();
                    let got = &got_all[h * v_ + chunk.cols.start..h * v_ + chunk.cols.end];
                    for (k, (&g, &w)) in got.iter().zip(&want[h * c..(h + 1) * c]).enumerate() {
                        let scale = floor_scale(chunk.s_lm_head[h * c + k]);
                        // The kink fit's slack first (what d hidden leaves of the
                        // coefficient), then the convention's allowance.
                        let beyond_slack = beyond(gradient_diff(g, w, bf16), slack.get(h * c + k).copied().unwrap_or(0.0));
                        let convention = chunk.a_lm_head.get(h * c + k).copied().unwrap_or(0.0);
                        q.consider_allowed(beyond_slack, convention, scale, w, || format!("h={h} v={}", chunk.cols.start + k));
                    }
                    q
                })
                .reduce(QuantityError::default, QuantityError::merge);
            r.d_lm_head = std::mem::take(&mut r.d_lm_head).merge(chunk_err);
        }
    });
    let kink_slot: std::collections::HashMap<usize, usize> = kinks.iter().enumerate().map(|(a, &k)| (k, a)).collect();
    for ((r, out), delta) in results.iter_mut().zip(outs).zip(&deltas) {
        let bf16 = out.grad_dtype == Dtype::Bf16;
        let per_row: Vec<(QuantityError, f64)> = live
            .par_iter()
            .enumerate()
            .map(|(k, &i)| {
                let got = &out.grad[i * h_..(i + 1) * h_];
                let mid = &pass.d_hidden[k * h_..(k + 1) * h_];
                let move_along = kink_slot.get(&k).map(|&a| (delta[a], &pass.along_hidden[a * h_..(a + 1) * h_]));
                let want = |h: usize| mid[h] + move_along.map_or(0.0, |(d, along)| d * along[h]);
                let mut q = QuantityError::default();
                for (h, &g) in got.iter().enumerate() {
                    let convention = pass.a_hidden.get(k * h_ + h).copied().unwrap_or(0.0);
                    q.consider_allowed(gradient_diff(g, want(h), bf16), convention, floor_scale(pass.s_hidden[k * h_ + h]), want(h), || at_row(i, h));
                }
                (q, row_relative_error(got, (0..h_).map(want)))
            })
            .collect();
        for (&i, (q, rel)) in live.iter().zip(per_row) {
            r.d_hidden = std::mem::take(&mut r.d_hidden).merge(q);
            r.row_errors[i] = rel;
        }
    }
    results
}
