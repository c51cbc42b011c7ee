//! The tolerance rule of SPEC.md, "What correct means":
//!
//!   pass  iff  err_impl <= 2 * min(err_baseline, analytic) + floor
//!
//! and the baseline itself must stay within `analytic`. Errors are measured
//! element by element against the oracle and divided by that element's
//! *scale*: the magnitude through which f32 rounding can move it (the terms
//! it is computed from, the log-sum-exp it subtracts, the length of the sums
//! behind it). So one ill-conditioned row cannot loosen the gate elsewhere,
//! and a low-weight row is held to its own size. `floor` and `analytic` are
//! then plain multiples of the f32 unit roundoff u = 2^-24. A gradient
//! returned in bf16 is first allowed its own output rounding, element by
//! element (half a bf16 ulp at the returned value); only what lies beyond
//! is measured. docs/tolerance.md derives the scales.
//!
//! Gradients are compared kink-aware: a token whose ratio lies within its
//! rounding distance of a clip edge accepts any ppo coefficient in its Clarke
//! interval; the coefficient that fits the implementation best is used.

use grpo_oracle::{kink_interval, vector, Forward, FusedProblem, KinkInterval, TemperatureMode};
use rayon::prelude::*;
use serde::Serialize;

use crate::case::{Case, CaseProblem, Dtype};
use crate::outputs::Outputs;

/// f32 unit roundoff.
pub const U32: f64 = 1.0 / 16_777_216.0;
/// How far rounding an f32 result to bf16 can have moved it, given the bf16
/// value `g` it was rounded to: half the spacing of bf16 values at `g`
/// (8 significant bits; subnormals spaced as at the smallest normal).
pub fn bf16_half_ulp(g: f32) -> f64 {
    let exponent = ((g.to_bits() >> 23) & 0xff) as i32 - 127;
    // 2^(e - 8) written as f64 exponent bits (e - 8 >= -134: a normal f64).
    f64::from_bits(((exponent.max(-126) - 8 + 1023) as u64) << 52)
}

/// Large zeroed f64 buffers, recycled across comparisons: the fused
/// comparison needs two [H, V] buffers (3.7 GB at Qwen2.5-1.5B's head), and
/// first-touching fresh pages (kernel zeroing, TLB shootdowns) cost more
/// than the arithmetic on a VM.
static BUFFERS: std::sync::Mutex<Vec<Vec<f64>>> = std::sync::Mutex::new(Vec::new());
const RECYCLED_MIN: usize = 1 << 20;

fn zeroed_buffer(len: usize) -> Vec<f64> {
    let reused = {
        let mut pool = BUFFERS.lock().unwrap_or_else(|e| e.into_inner());
        pool.iter().position(|b| b.capacity() >= len).map(|i| pool.swap_remove(i))
    };
    match reused {
        Some(mut b) => {
            b.clear();
            b.resize(len, 0.0);
            b
        }
        None => vec![0.0; len],
    }
}

fn recycle(buffer: Vec<f64>) {
    if buffer.capacity() >= RECYCLED_MIN {
        let mut pool = BUFFERS.lock().unwrap_or_else(|e| e.into_inner());
        if pool.len() < 4 {
            pool.push(buffer);
        }
    }
}

/// |got - want|, less the bf16 output rounding when the gradient came back
/// in bf16 (non-finite differences pass through).
fn gradient_diff(got: f32, want: f64, bf16: bool) -> f64 {
    let diff = (got as f64 - want).abs();
    if bf16 && diff.is_finite() {
        (diff - bf16_half_ulp(got)).max(0.0)
    } else {
        diff
    }
}

/// The constants of the rule, in units of u.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Tolerance {
    /// Rounding noise any correct f32 implementation may show where the baseline happens to be exact.
    pub floor_units: f64,
    /// How far the f32 baseline may be from the oracle at all.
    pub analytic_units: f64,
}

impl Default for Tolerance {
    fn default() -> Self {
        // Calibration (README, "Figures"): over 5000 generated cases the
        // reference's worst normalised error is 22 u (entropy) and, for one
        // bf16 gradient, 507 u, below `analytic`; a bf16 log-softmax errs
        // by ~65536 u.
        Tolerance { floor_units: 16.0, analytic_units: 1024.0 }
    }
}

/// Per-token scales and kink intervals, computed once per case.
pub struct Scales {
    logp: Vec<f64>,
    entropy: Vec<f64>,
    per_token_loss: Vec<f64>,
    loss: f64,
    grad_row: Vec<f64>,
    /// The largest row scale: exact-zero rows are measured against it.
    grad_global: f64,
    intervals: Vec<KinkInterval>,
}

const TINY: f64 = 1e-30;

impl Scales {
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
        let delta = h.effective_delta(&fwd.config);
        let beta = h.effective_beta(&fwd.config);
        let ec = h.effective_entropy_coef(&fwd.config);
        let es = fwd.entropy_scale();
        let cot = case.cotangent.abs();
        let n = fwd.tokens.len();
        let (mut logp, mut entropy, mut ptl, mut grad_row) = (vec![0.0; n], vec![0.0; n], vec![0.0; n], vec![0.0; n]);
        let mut intervals = vec![KinkInterval::default(); n];
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
            let iv = kink_interval(st.log_ratio, st.advantage, h.eps_low, h.eps_high, delta, slack);
            let c_max = iv.max_abs();
            // d(ppo coefficient)/d logp and d(kl coefficient)/d logp bounds.
            let sensitivity = st.advantage.abs() * (st.log_ratio + slack).exp() + beta * st.kl_exp * slack.exp();
            // The terms each loss_t is summed from (a KL of exp(d) - d - 1 is
            // formed from O(1) terms even when it is tiny).
            let terms = st.advantage.abs() * (st.log_ratio + slack).exp().max(1.0)
                + if beta > 0.0 { beta * (st.kl_exp + st.kl_exp.ln().abs() + 1.0) } else { 0.0 };
            let s_ptl = (c_max + st.kl_coef.abs()) * s_logp + ec * (s_ent + st.entropy) + terms;
            let w = cot * st.weight;
            let natural = w * ((c_max + st.kl_coef.abs()) / tau + ec * es * (sm.max_p_abs_log_p + st.entropy));
            let cond_p = 1.0 + sm.max_p_abs_x + sm.lse.abs() + sum_v;
            let s_row = natural * cond_p
                + w / tau * sensitivity * s_logp
                + w * ec * es * (1.0 + sm.max_p_abs_log_p + st.entropy) * (s_ent + cond_p);
            logp[i] = s_logp.max(TINY);
            entropy[i] = s_ent;
            ptl[i] = s_ptl.max(TINY);
            grad_row[i] = s_row;
            intervals[i] = iv;
            loss_terms += st.weight * s_ptl;
            loss_values += st.weight * st.per_token_loss.abs();
        }
        let loss = (loss_terms + loss_values * ((n + 1) as f64).sqrt() + fwd.loss.abs()).max(TINY);
        let grad_global = grad_row.iter().copied().fold(0.0, f64::max).max(TINY);
        for s in grad_row.iter_mut() {
            *s = s.max(TINY);
        }
        Scales { logp, entropy, per_token_loss: ptl, loss, grad_row, grad_global, intervals }
    }
}

/// The worst normalised error of one output quantity.
#[derive(Clone, Debug, Default, Serialize)]
pub struct QuantityError {
    /// max over elements of |impl - oracle| / scale (inf for NaN/Inf).
    pub err: f64,
    /// |impl - oracle| at that element.
    pub abs_err: f64,
    /// Where: "b=1 t=7 v=151935".
    pub at: String,
    pub nonfinite: bool,
}

impl QuantityError {
    fn consider(&mut self, diff: f64, scale: f64, at: impl FnOnce() -> String) {
        let e = if diff.is_finite() { diff / scale } else { f64::INFINITY };
        if !diff.is_finite() {
            self.nonfinite = true;
        }
        if e > self.err || (self.at.is_empty() && e.is_nan()) {
            self.err = e;
            self.abs_err = diff;
            self.at = at();
        }
    }
    fn merge(mut self, other: QuantityError) -> QuantityError {
        self.nonfinite |= other.nonfinite;
        if other.err > self.err {
            QuantityError { nonfinite: self.nonfinite, ..other }
        } else {
            self
        }
    }
}

/// Every quantity's error for one implementation's outputs.
#[derive(Clone, Debug, Serialize)]
pub struct Errors {
    pub loss: QuantityError,
    pub logp: Option<QuantityError>,
    pub per_token_loss: Option<QuantityError>,
    pub entropy: Option<QuantityError>,
    /// d logits (logits kind) or d hidden (fused kind).
    pub grad: QuantityError,
    /// d lm_head (fused kind).
    pub grad_lm_head: Option<QuantityError>,
    /// Rows whose exact gradient is zero (masked, or clipped without KL and entropy).
    pub grad_zero_rows: QuantityError,
}

/// Measures `out` against the oracle.
pub fn errors(fwd: &Forward<'_>, scales: &Scales, case: &Case, out: &Outputs) -> Errors {
    let s = case.shape;
    let loc = |i: usize| format!("b={} t={}", i / s.time, i % s.time);
    let mut loss = QuantityError::default();
    loss.consider((out.loss - fwd.loss).abs(), scales.loss, String::new);
    let per_token = |values: &Option<Vec<f32>>, oracle: &dyn Fn(usize) -> f64, scale: &[f64]| {
        values.as_ref().map(|v| {
            let mut q = QuantityError::default();
            for (i, st) in fwd.tokens.iter().enumerate() {
                if !st.masked {
                    q.consider((v[i] as f64 - oracle(i)).abs(), scale[i], || loc(i));
                }
            }
            q
        })
    };
    let logp = per_token(&out.logp, &|i| fwd.tokens[i].logp, &scales.logp);
    let per_token_loss = per_token(&out.per_token_loss, &|i| fwd.tokens[i].per_token_loss, &scales.per_token_loss);
    let entropy = per_token(&out.entropy, &|i| fwd.tokens[i].entropy, &scales.entropy);
    let (grad, grad_lm_head, grad_zero_rows) = match case.problem() {
        CaseProblem::Logits(_) => {
            let (grad, zero) = grad_errors(fwd, scales, case, out);
            (grad, None, zero)
        }
        CaseProblem::Fused(problem) => {
            let (dh, dw, zero) = fused_grad_errors(fwd, &problem, scales, case, out);
            (dh, Some(dw), zero)
        }
    };
    Errors { loss, logp, per_token_loss, entropy, grad, grad_lm_head, grad_zero_rows }
}

fn grad_errors(fwd: &Forward<'_>, scales: &Scales, case: &Case, out: &Outputs) -> (QuantityError, QuantityError) {
    let s = case.shape;
    let v_ = s.vocab;
    let bf16 = out.grad_dtype == Dtype::Bf16;
    (0..s.batch * s.time)
        .into_par_iter()
        .map_init(
            || (vec![0.0f64; v_], vec![0.0f64; v_]),
            |(oracle_row, direction), i| {
                let got = &out.grad[i * v_..(i + 1) * v_];
                let at = |v: usize| format!("b={} t={} v={v}", i / s.time, i % s.time);
                let (mut nonzero, mut zero) = (QuantityError::default(), QuantityError::default());
                if exact_zero_row(fwd, scales, i) {
                    for (v, &g) in got.iter().enumerate() {
                        zero.consider((g as f64).abs(), scales.grad_global, || at(v));
                    }
                    return (nonzero, zero);
                }
                kink_fitted_row(fwd, scales, i, case.cotangent, oracle_row, direction, |row, direction| {
                    let (mut num, mut den) = (0.0, 0.0);
                    for ((&g, &o), &d) in got.iter().zip(row.iter()).zip(direction.iter()) {
                        num += (g as f64 - o) * d;
                        den += d * d;
                    }
                    (num, den)
                });
                for (v, (&g, &o)) in got.iter().zip(oracle_row.iter()).enumerate() {
                    nonzero.consider(gradient_diff(g, o, bf16), scales.grad_row[i], || at(v));
                }
                (nonzero, zero)
            },
        )
        .reduce(
            || (QuantityError::default(), QuantityError::default()),
            |(a, b), (c, d)| (a.merge(c), b.merge(d)),
        )
}

/// Is row `i`'s exact gradient zero (masked, zero weight, or clipped with no
/// KL and entropy terms)?
fn exact_zero_row(fwd: &Forward<'_>, scales: &Scales, i: usize) -> bool {
    let st = &fwd.tokens[i];
    let iv = scales.intervals[i];
    let ec = fwd.hparams.effective_entropy_coef(&fwd.config);
    st.masked || st.weight == 0.0 || (iv.lo == 0.0 && iv.hi == 0.0 && st.kl_coef == 0.0 && ec == 0.0)
}

/// The oracle's gradient row with the admissible ppo coefficient that best
/// fits the implementation: `fit(direction)` returns (numerator, denominator)
/// of the least-squares step along the direction the coefficient moves the
/// compared quantity; `row` ends as the oracle's row at the chosen coefficient.
fn kink_fitted_row(
    fwd: &Forward<'_>,
    scales: &Scales,
    i: usize,
    cot: f64,
    row: &mut [f64],
    direction: &mut [f64],
    fit: impl FnOnce(&[f64], &[f64]) -> (f64, f64),
) {
    let st = &fwd.tokens[i];
    let iv = scales.intervals[i];
    let c0 = iv.clamp(st.ppo_interval.midpoint());
    fwd.grad_row(i, cot, Some(c0), row);
    if iv.is_point() {
        return;
    }
    fwd.dlogp_dlogits_row(i, direction);
    let k = cot * st.weight;
    direction.iter_mut().for_each(|d| *d *= k);
    let (num, den) = fit(row, direction);
    if den > 0.0 && num.is_finite() {
        let c = iv.clamp(c0 + num / den);
        for (o, &d) in row.iter_mut().zip(direction.iter()) {
            *o += (c - c0) * d;
        }
    }
}

/// A row at a kink, in the fused comparison: its gradient moves along
/// `direction` (logits) and `along_hidden` = lm_head @ direction as its ppo
/// coefficient moves within [lo, hi] (relative to the midpoint used).
struct KinkRow {
    row: usize,
    direction: Vec<f64>,
    along_hidden: Vec<f64>,
    d_hidden_mid: Vec<f64>,
    lo: f64,
    hi: f64,
}

/// d hidden and d lm_head of the fused kind. Each logits-gradient element
/// carries the rounding scale s_row (p_v + [v = y]) (errors follow the
/// softmax's mass, plus the chosen column); through lm_head that gives
///   scale(dh[i, h]) = sum_v |W_hv| e_iv + sqrt(V) sum_v |W_hv g_iv|
///   scale(dW[h, v]) = sum_i |x_ih| e_iv + sqrt(BT) sum_i |x_ih g_iv|.
/// Rows at a kink get their admissible coefficients jointly: d lm_head sums
/// over rows, so one least-squares problem over d hidden and d lm_head
/// (box-constrained, by coordinate descent) picks them.
fn fused_grad_errors(
    fwd: &Forward<'_>,
    problem: &FusedProblem<'_, f32>,
    scales: &Scales,
    case: &Case,
    out: &Outputs,
) -> (QuantityError, QuantityError, QuantityError) {
    let s = case.shape;
    let (h_, v_, rows) = (problem.hidden_dim, s.vocab, s.batch * s.time);
    let cot = case.cotangent;
    let bf16 = out.grad_dtype == Dtype::Bf16;
    let d_lm_head_impl = out.grad_lm_head.as_deref().unwrap_or(&[]);
    let x = |i: usize, h: usize| problem.hidden[i * h_ + h] as f64;
    let lm_head_row = |h: usize| &problem.lm_head[h * v_..(h + 1) * v_];
    let lm_head_times = |vector: &[f64], out: &mut [f64]| {
        for (h, o) in out.iter_mut().enumerate() {
            *o = vector::dot_f32(lm_head_row(h), vector);
        }
    };
    let w_abs_row_sum =
        (0..h_).into_par_iter().map(|h| lm_head_row(h).iter().map(|w| (*w as f64).abs()).sum::<f64>()).reduce(|| 0.0, f64::max);
    let zero_scale = scales.grad_global * w_abs_row_sum.max(TINY);
    let (sqrt_v, sqrt_rows) = ((v_ as f64).sqrt(), (rows as f64).sqrt());
    let at_row = |i: usize, h: usize| format!("b={} t={} h={h}", i / s.time, i % s.time);
    // Pass 1a, over token rows: each live row's logits gradient g at its
    // midpoint coefficient and its rounding scales e; kink rows also get the
    // direction their coefficient moves them in.
    struct Live {
        row: usize,
        g: Vec<f64>,
        e: Vec<f64>,
        kink: Option<(Vec<f64>, Vec<f64>, f64, f64)>,
    }
    let live: Vec<Live> = (0..rows)
        .into_par_iter()
        .filter(|&i| !exact_zero_row(fwd, scales, i))
        .map(|i| {
            let st = &fwd.tokens[i];
            let iv = scales.intervals[i];
            let c0 = iv.clamp(st.ppo_interval.midpoint());
            let (mut g, mut e) = (vec![0.0; v_], vec![0.0; v_]);
            fwd.grad_row(i, cot, Some(c0), &mut g);
            fwd.softmax_row(i, &mut e);
            e[st.chosen] += 1.0;
            e.iter_mut().for_each(|ev| *ev *= scales.grad_row[i]);
            let kink = (!iv.is_point()).then(|| {
                let mut direction = vec![0.0; v_];
                fwd.dlogp_dlogits_row(i, &mut direction);
                direction.iter_mut().for_each(|d| *d *= cot * st.weight);
                let mut along_hidden = vec![0.0; h_];
                lm_head_times(&direction, &mut along_hidden);
                (direction, along_hidden, iv.lo - c0, iv.hi - c0)
            });
            Live { row: i, g, e, kink }
        })
        .collect();
    // Pass 1b, over lm_head rows h (each owns d lm_head[h, :], so no
    // per-thread [H, V] buffers): d hidden[i, h] = lm_head[h] . g_i and its
    // scale, d lm_head[h, :] = sum_i x_ih g_i and its scale.
    let (mut d_lm_head, mut s_lm_head) = (zeroed_buffer(h_ * v_), zeroed_buffer(h_ * v_));
    let per_h: Vec<Vec<(f64, f64)>> = d_lm_head
        .par_chunks_mut(v_)
        .zip(s_lm_head.par_chunks_mut(v_))
        .enumerate()
        .map(|(h, (dw, sw))| {
            let w_row = &problem.lm_head[h * v_..(h + 1) * v_];
            live.iter()
                .map(|l| {
                    let pass = vector::fused_row_pass(w_row, &l.g, &l.e, x(l.row, h), sqrt_rows, dw, sw);
                    (pass.dot, (pass.abs_dot_e + sqrt_v * pass.abs_dot_g).max(TINY))
                })
                .collect()
        })
        .collect();
    let (mut dh_err, mut zero) = (QuantityError::default(), QuantityError::default());
    for i in (0..rows).filter(|&i| exact_zero_row(fwd, scales, i)) {
        for (h, &gh) in out.grad[i * h_..(i + 1) * h_].iter().enumerate() {
            zero.consider((gh as f64).abs(), zero_scale, || at_row(i, h));
        }
    }
    let mut kinks = Vec::new();
    for (k, l) in live.into_iter().enumerate() {
        let got = &out.grad[l.row * h_..(l.row + 1) * h_];
        let dh: Vec<f64> = (0..h_).map(|h| per_h[h][k].0).collect();
        let dh_scale: Vec<f64> = (0..h_).map(|h| per_h[h][k].1).collect();
        match l.kink {
            None => {
                for h in 0..h_ {
                    dh_err.consider(gradient_diff(got[h], dh[h], bf16), dh_scale[h], || at_row(l.row, h));
                }
            }
            Some((direction, along_hidden, lo, hi)) => {
                kinks.push((KinkRow { row: l.row, direction, along_hidden, d_hidden_mid: dh, lo, hi }, dh_scale));
            }
        }
    }
    // Pass 2: the kink rows' coefficients, jointly. With delta_k the move of
    // row k's coefficient, d hidden_k moves by delta_k a_k and d lm_head by
    // sum_k delta_k x_k d_k^T; minimise both residuals over the box.
    let n = kinks.len();
    if n > 0 {
        // Residuals are weighted by their scales, as the errors are measured:
        // d hidden and d lm_head can differ in size by orders of magnitude.
        let inv2 = |s: f64| 1.0 / (s * s);
        let xs: Vec<Vec<f64>> = kinks.iter().map(|(k, _)| (0..h_).map(|h| x(k.row, h)).collect()).collect();
        // The d lm_head block, over lm_head rows h in parallel and V in
        // chunks: with F_a[v] = x_a[h] d_a[v] / s[h, v] (row a of the weighted
        // design matrix at h), gram += F F^T and rhs += F (residual / s).
        // The residual (implementation - oracle at the midpoints) is read
        // from both arrays chunk by chunk, never stored whole.
        const CHUNK: usize = 2048;
        let directions: Vec<&[f64]> = kinks.iter().map(|(k, _)| k.direction.as_slice()).collect();
        let with_residual = !d_lm_head_impl.is_empty();
        let (mut gram, mut rhs) = (0..h_)
            .into_par_iter()
            .fold(
                || (vec![0.0; n * n], vec![0.0; n], vec![0.0; n * CHUNK], vec![0.0; CHUNK], vec![0.0; CHUNK]),
                |(mut gram, mut rhs, mut f, mut r, mut inv_s), h| {
                    let active: Vec<usize> = (0..n).filter(|&a| xs[a][h] != 0.0).collect();
                    for start in (0..v_).step_by(CHUNK) {
                        let cols = h * v_ + start..h * v_ + (start + CHUNK).min(v_);
                        let c = cols.len();
                        for (is, &sv) in inv_s[..c].iter_mut().zip(&s_lm_head[cols.clone()]) {
                            *is = 1.0 / sv.max(TINY);
                        }
                        for (slot, &a) in active.iter().enumerate() {
                            let xa = xs[a][h];
                            let row = &mut f[slot * CHUNK..slot * CHUNK + c];
                            for ((fv, &dv), &is) in row.iter_mut().zip(&directions[a][start..start + c]).zip(&inv_s[..c]) {
                                *fv = xa * dv * is;
                            }
                        }
                        if with_residual {
                            let (got, want) = (&d_lm_head_impl[cols.clone()], &d_lm_head[cols.clone()]);
                            for (((rv, &g), &w), &is) in r[..c].iter_mut().zip(got).zip(want).zip(&inv_s[..c]) {
                                *rv = (g as f64 - w) * is;
                            }
                        }
                        for (i, &a) in active.iter().enumerate() {
                            let fa = &f[i * CHUNK..i * CHUNK + c];
                            for (j, &b) in active.iter().enumerate().skip(i) {
                                gram[a * n + b] += vector::dot(fa, &f[j * CHUNK..j * CHUNK + c]);
                            }
                            if with_residual {
                                rhs[a] += vector::dot(fa, &r[..c]);
                            }
                        }
                    }
                    (gram, rhs, f, r, inv_s)
                },
            )
            .map(|(gram, rhs, ..)| (gram, rhs))
            .reduce(
                || (vec![0.0; n * n], vec![0.0; n]),
                |(mut g1, mut r1), (g2, r2)| {
                    g1.iter_mut().zip(&g2).for_each(|(a, b)| *a += b);
                    r1.iter_mut().zip(&r2).for_each(|(a, b)| *a += b);
                    (g1, r1)
                },
            );
        for a in 0..n {
            for b in 0..a {
                gram[a * n + b] = gram[b * n + a];
            }
        }
        // The d hidden block: row a's own residual along its own direction.
        for a in 0..n {
            let (ka, dh_scale) = &kinks[a];
            let got = &out.grad[ka.row * h_..(ka.row + 1) * h_];
            for h in 0..h_ {
                let w2 = inv2(dh_scale[h]);
                rhs[a] += ka.along_hidden[h] * (got[h] as f64 - ka.d_hidden_mid[h]) * w2;
                gram[a * n + a] += ka.along_hidden[h] * ka.along_hidden[h] * w2;
            }
        }
        let mut delta = vec![0.0; n];
        for _sweep in 0..1000 {
            for a in 0..n {
                if gram[a * n + a] > 0.0 {
                    let others: f64 = (0..n).filter(|&b| b != a).map(|b| gram[a * n + b] * delta[b]).sum();
                    let step = (rhs[a] - others) / gram[a * n + a];
                    if step.is_finite() {
                        delta[a] = step.clamp(kinks[a].0.lo, kinks[a].0.hi);
                    }
                }
            }
        }
        for (a, (k, dh_scale)) in kinks.iter().enumerate() {
            let got = &out.grad[k.row * h_..(k.row + 1) * h_];
            for h in 0..h_ {
                let want = k.d_hidden_mid[h] + delta[a] * k.along_hidden[h];
                dh_err.consider(gradient_diff(got[h], want, bf16), dh_scale[h], || at_row(k.row, h));
            }
        }
        // d lm_head at the fitted coefficients, row h by row h in parallel.
        d_lm_head.par_chunks_mut(v_).enumerate().for_each(|(h, dw)| {
            for (a, d) in directions.iter().enumerate() {
                let step = delta[a] * xs[a][h];
                if step != 0.0 {
                    dw.iter_mut().zip(d.iter()).for_each(|(w, &dv)| *w += step * dv);
                }
            }
        });
    }
    let mut dw_err = QuantityError::default();
    for (k, ((&got, &want), &scale)) in d_lm_head_impl.iter().zip(&d_lm_head).zip(&s_lm_head).enumerate() {
        dw_err.consider(gradient_diff(got, want, bf16), scale.max(TINY), || format!("h={} v={}", k / v_, k % v_));
    }
    recycle(d_lm_head);
    recycle(s_lm_head);
    (dh_err, dw_err, zero)
}

/// The verdict on one quantity of one case.
#[derive(Clone, Debug, Serialize)]
pub struct Verdict {
    pub quantity: &'static str,
    pub err: f64,
    pub abs_err: f64,
    pub at: String,
    pub baseline_err: f64,
    pub floor: f64,
    pub analytic: f64,
    /// 2 * min(baseline_err, analytic) + floor.
    pub bound: f64,
    pub pass: bool,
    /// The baseline is within its analytic bound.
    pub baseline_pass: bool,
    /// The implementation does not return this quantity.
    pub not_covered: bool,
}

/// Applies the rule to every quantity.
pub fn judge(implementation: &Errors, baseline: &Errors, tol: &Tolerance) -> Vec<Verdict> {
    let floor = tol.floor_units * U32;
    let analytic = tol.analytic_units * U32;
    let rule = |quantity: &'static str, got: Option<&QuantityError>, base: Option<&QuantityError>, floor: f64, analytic: f64| {
        let base_err = base.map_or(analytic, |b| b.err);
        let bound = 2.0 * base_err.min(analytic) + floor;
        let (err, abs_err, at, nonfinite) =
            got.map_or((0.0, 0.0, String::new(), false), |g| (g.err, g.abs_err, g.at.clone(), g.nonfinite));
        Verdict {
            quantity,
            err,
            abs_err,
            at,
            baseline_err: base_err,
            floor,
            analytic,
            bound,
            pass: !nonfinite && err <= bound,
            baseline_pass: base_err <= analytic,
            not_covered: got.is_none(),
        }
    };
    let mut verdicts = vec![
        rule("loss", Some(&implementation.loss), Some(&baseline.loss), floor, analytic),
        rule("logp", implementation.logp.as_ref(), baseline.logp.as_ref(), floor, analytic),
        rule("per_token_loss", implementation.per_token_loss.as_ref(), baseline.per_token_loss.as_ref(), floor, analytic),
        rule("entropy", implementation.entropy.as_ref(), baseline.entropy.as_ref(), floor, analytic),
        rule(
            if implementation.grad_lm_head.is_some() { "grad_hidden" } else { "grad" },
            Some(&implementation.grad),
            Some(&baseline.grad),
            floor,
            analytic,
        ),
    ];
    if let Some(dw) = &implementation.grad_lm_head {
        verdicts.push(rule("grad_lm_head", Some(dw), baseline.grad_lm_head.as_ref(), floor, analytic));
    }
    verdicts.extend([
        // Exactly zero in the oracle: zero to the floor, whatever the baseline does.
        rule("grad_zero_rows", Some(&implementation.grad_zero_rows), None, floor, 0.0),
    ]);
    verdicts
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rounding any f32 to bf16 moves it by at most `bf16_half_ulp` of the
    /// result, and that allowance is tight (some value needs all of it).
    #[test]
    fn bf16_half_ulp_bounds_the_rounding_exactly() {
        let mut worst: f64 = 0.0;
        let mut x = 1.0e-38f32;
        while x < 1.0e38 {
            for f in [x, -x, x * 1.003_906_3, x * 1.996] {
                let g = Dtype::Bf16.round(f as f64);
                let moved = (g as f64 - f as f64).abs();
                assert!(moved <= bf16_half_ulp(g), "{f} -> {g}: moved {moved} > {}", bf16_half_ulp(g));
                worst = worst.max(moved / bf16_half_ulp(g));
            }
            x *= 1.37;
        }
        assert!(worst > 0.9, "the allowance is loose: worst use {worst}");
        assert_eq!(bf16_half_ulp(1.0), 1.0 / 256.0);
        assert_eq!(bf16_half_ulp(0.75), 1.0 / 512.0);
    }
}
