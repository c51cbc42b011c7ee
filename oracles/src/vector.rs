//! The row loops of the oracle. The exp-bound ones (the softmax sums, the
//! gradient row) are written against explicit vector registers
//! (`simd.rs`: eight, four or one f64 lanes); the plain elementwise ones
//! are left to the compiler's vectoriser, which takes them whole. Either
//! way each public kernel is compiled for AVX-512, AVX2 + FMA and the
//! baseline, and picks the widest the CPU has at run time, so one binary
//! runs everywhere and uses what it finds.
//!
//! Accuracy is the oracle's, not a fast-math approximation of it: `exp` is
//! within 2 ulp of the exact value on the domain used (checked against the
//! standard library in `exp.rs`'s tests), and the lane sums carry the
//! exact error of every addition (Fast2Sum, see `simd::VecSum`), losing no
//! more than `CompensatedSum` does. Nothing here changes with the lane count but the
//! order of additions, which the compensation makes irrelevant at f64.

use crate::simd::{self, lanes_of, load_padded, simd_dispatched, Elem, Simd, VecSum};

/// What one exp pass over a row x gathers, with d_v = max - x_v >= 0 and
/// e_v = exp(-d_v) (see [`crate::RowSoftmax`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct ExpSums {
    /// sum_v e_v (compensated; every e_v is in [0, 1]): lse = max + ln(sum).
    pub sum: f64,
    /// sum_v e_v d_v (compensated; e^-d d <= 1/e): entropy = ln(sum) + sum_e_d / sum.
    pub sum_e_d: f64,
    /// sum_v e_v mag_v.
    pub sum_e_mag: f64,
    /// max_v e_v mag_v.
    pub max_e_mag: f64,
}

/// The running sums of `exp_sums_body`.
struct ExpAcc<S: Simd> {
    sum: VecSum<S>,
    sum_e_d: VecSum<S>,
    sum_e_mag: S::V,
    max_e_mag: S::V,
}

impl<S: Simd> ExpAcc<S> {
    /// Adds one vector of x (and its magnitudes) to the sums. (A method, not
    /// a closure: a closure would not inherit the caller's target features,
    /// and its vector instructions would become calls.)
    #[inline(always)]
    fn step(&mut self, s: S, vmax: S::V, xv: S::V, mv: S::V) {
        let e = simd::exp(s, s.sub(xv, vmax));
        self.sum.add(s, e);
        self.sum_e_d.add(s, s.mul(e, s.sub(vmax, xv)));
        let em = s.mul(e, mv);
        self.sum_e_mag = s.add(self.sum_e_mag, em);
        self.max_e_mag = s.max(self.max_e_mag, em);
    }
}

/// A stored row `z` read as x = z / divisor (x = z when divisor is 1; the
/// division is then skipped, not approximated).
#[derive(Clone, Copy)]
struct Row<'a, T> {
    z: &'a [T],
    divisor: f64,
}

impl<T: Elem> Row<'_, T> {
    #[inline(always)]
    fn scaled<S: Simd>(&self, s: S, zv: S::V) -> S::V {
        if self.divisor == 1.0 { zv } else { s.div(zv, s.splat(self.divisor)) }
    }
    /// x at i..i + LANES.
    #[inline(always)]
    fn load<S: Simd>(&self, s: S, i: usize) -> S::V {
        self.scaled(s, T::load(s, &self.z[i..]))
    }
    /// x from `i` to the end (fewer than LANES values), padded with `fill` (an x value).
    #[inline(always)]
    fn load_tail<S: Simd>(&self, s: S, i: usize, fill: f64) -> S::V {
        self.scaled(s, load_padded(s, &self.z[i..], fill * self.divisor))
    }
    #[inline(always)]
    fn x(&self, v: usize) -> f64 {
        let z: f64 = self.z[v].into();
        if self.divisor == 1.0 { z } else { z / self.divisor }
    }
}

/// (max_v z_v, max_v |z_v|) in one read.
#[inline(always)]
fn extrema_body<S: Simd, T: Elem>(s: S, z: &[T]) -> (f64, f64) {
    let lanes = S::LANES;
    let (mut hi, mut big) = (s.splat(f64::NEG_INFINITY), s.splat(0.0));
    let split = z.len() - z.len() % lanes;
    let mut i = 0;
    while i < split {
        let v = T::load(s, &z[i..]);
        hi = s.max(hi, v);
        big = s.max(big, s.abs(v));
        i += lanes;
    }
    let (hi, big) = (lanes_of(s, hi), lanes_of(s, big));
    let mut m = hi[..lanes].iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mut a = big[..lanes].iter().copied().fold(0.0f64, f64::max);
    for &v in &z[split..] {
        let v: f64 = v.into();
        m = m.max(v);
        a = a.max(v.abs());
    }
    (m, a)
}

simd_dispatched! {
    /// (max_v x_v, max_v |x_v|) in one read (x finite).
    pub fn extrema / extrema_at(x: &[f64]) -> (f64, f64) |s| {
        extrema_body(s, x)
    }
}

simd_dispatched! {
    /// (max_v z_v, max_v |z_v|) of an f32 row, in f64 (z finite).
    pub fn extrema_f32 / extrema_f32_at(z: &[f32]) -> (f64, f64) |s| {
        extrema_body(s, z)
    }
}

/// The body of the `exp_sums` kernels: `mag` None reads mag_v as |x_v|.
#[inline(always)]
fn exp_sums_body<S: Simd, T: Elem>(s: S, x: Row<'_, T>, mag: Option<&[f64]>, max: f64) -> ExpSums {
    let lanes = S::LANES;
    let mut acc = ExpAcc { sum: VecSum::new(s), sum_e_d: VecSum::new(s), sum_e_mag: s.splat(0.0), max_e_mag: s.splat(0.0) };
    let vmax = s.splat(max);
    let n = x.z.len();
    let split = n - n % lanes;
    let mut i = 0;
    match mag {
        None => {
            while i < split {
                let xv = x.load(s, i);
                acc.step(s, vmax, xv, s.abs(xv));
                i += lanes;
            }
        }
        Some(m) => {
            while i < split {
                acc.step(s, vmax, x.load(s, i), s.load(&m[i..]));
                i += lanes;
            }
        }
    }
    if split < n {
        // Padding at max - 1000: e = 0 there, so it adds nothing to any sum.
        let xv = x.load_tail(s, split, max - 1000.0);
        let mv = mag.map_or_else(|| s.abs(xv), |m| load_padded(s, &m[split..], 0.0));
        acc.step(s, vmax, xv, mv);
    }
    let (se, me) = (lanes_of(s, acc.sum_e_mag), lanes_of(s, acc.max_e_mag));
    ExpSums {
        sum: acc.sum.value(s),
        sum_e_d: acc.sum_e_d.value(s),
        sum_e_mag: se[..lanes].iter().sum(),
        max_e_mag: me[..lanes].iter().copied().fold(0.0, f64::max),
    }
}

simd_dispatched! {
    /// One exp pass over a stored row x (rounding magnitudes |x_v|), given
    /// max = max_v x_v.
    pub fn exp_sums / exp_sums_at(x: &[f64], max: f64) -> ExpSums |s| {
        exp_sums_body(s, Row { z: x, divisor: 1.0 }, None, max)
    }
}

simd_dispatched! {
    /// [`exp_sums`] of x = z / divisor for a stored f32 row z.
    pub fn exp_sums_f32 / exp_sums_f32_at(z: &[f32], divisor: f64, max: f64) -> ExpSums |s| {
        exp_sums_body(s, Row { z, divisor }, None, max)
    }
}

simd_dispatched! {
    /// One exp pass over a computed row x with rounding magnitudes `mag`.
    pub fn exp_sums_mag / exp_sums_mag_at(x: &[f64], mag: &[f64], max: f64) -> ExpSums |s| {
        assert_eq!(x.len(), mag.len());
        exp_sums_body(s, Row { z: x, divisor: 1.0 }, Some(mag), max)
    }
}

/// max_v e_v (c + d_v), e_v = exp(-d_v), d_v = max - x_v: the row's
/// max_v p_v |log p_v| times sum_v e_v, for c = ln(sum_v e_v) < 1.
///
/// Only the elements with d_v <= 1 and the nearest one beyond are
/// evaluated: f(d) = e^-d (c + d) rises up to d = 1 - c and falls after it,
/// so past d = 1 the smallest d has the largest f; and with c < 1 (a sum
/// below e) at most 7 elements have e_v >= 1/e, so the scalar branch is
/// rare. (For c >= 1, f falls from d = 0 and the answer is c, the
/// caller's case.)
#[inline(always)]
fn peak_body<S: Simd, T: Elem>(s: S, x: Row<'_, T>, max: f64, c: f64) -> f64 {
    let lanes = S::LANES;
    let (vmax, one, inf) = (s.splat(max), s.splat(1.0), s.splat(f64::INFINITY));
    let mut far = inf;
    // The d_v <= 1: at most 7 when c < 1 (room is kept for more).
    let mut near = [0.0f64; 16];
    let mut n_near = 0;
    let n = x.z.len();
    let split = n - n % lanes;
    let mut i = 0;
    while i < split {
        let d = s.sub(vmax, x.load(s, i));
        let is_near = s.le(d, one);
        far = s.min(far, s.select(is_near, inf, d));
        if s.any(is_near) {
            for v in i..i + lanes {
                let d = max - x.x(v);
                if d <= 1.0 && n_near < near.len() {
                    near[n_near] = d;
                    n_near += 1;
                }
            }
        }
        i += lanes;
    }
    let mut far_d = lanes_of(s, far)[..lanes].iter().copied().fold(f64::INFINITY, f64::min);
    for v in split..n {
        let d = max - x.x(v);
        if d > 1.0 {
            far_d = far_d.min(d);
        } else if n_near < near.len() {
            near[n_near] = d;
            n_near += 1;
        }
    }
    let candidates = near[..n_near].iter().chain(far_d.is_finite().then_some(&far_d));
    let mut best = 0.0f64;
    for &d in candidates {
        let e = lanes_of(s, simd::exp(s, s.splat(-d)))[0];
        best = best.max(e * (c + d));
    }
    best
}

simd_dispatched! {
    /// See `peak_body`: x a stored or computed f64 row.
    pub fn peak_e_log_e / peak_e_log_e_at(x: &[f64], max: f64, c: f64) -> f64 |s| {
        peak_body(s, Row { z: x, divisor: 1.0 }, max, c)
    }
}

simd_dispatched! {
    /// See `peak_body`: x = z / divisor for a stored f32 row z.
    pub fn peak_e_log_e_f32 / peak_e_log_e_f32_at(z: &[f32], divisor: f64, max: f64, c: f64) -> f64 |s| {
        peak_body(s, Row { z, divisor }, max, c)
    }
}

/// The constants of one gradient row (see [`grad_pass`]).
#[derive(Clone, Copy, Debug)]
pub struct GradRow {
    pub inv_tau: f64,
    pub lse: f64,
    pub entropy: f64,
    pub scale: f64,
    pub c_logp: f64,
    pub c_ent: f64,
}

/// [`GradRow`] broadcast to vectors.
struct GradConstants<S: Simd> {
    inv_tau: S::V,
    lse: S::V,
    ent: S::V,
    scale: S::V,
    neg_c_logp: S::V,
    c_ent: S::V,
}

impl<S: Simd> GradConstants<S> {
    #[inline(always)]
    fn new(s: S, k: &GradRow) -> Self {
        GradConstants {
            inv_tau: s.splat(k.inv_tau),
            lse: s.splat(k.lse),
            ent: s.splat(k.entropy),
            scale: s.splat(k.scale),
            neg_c_logp: s.splat(-k.c_logp),
            c_ent: s.splat(k.c_ent),
        }
    }

    /// scale * p * (-c_logp + c_ent * (log p + ent)) of one vector of z.
    #[inline(always)]
    fn value(&self, s: S, z: S::V) -> S::V {
        let log_p = s.sub(s.mul(z, self.inv_tau), self.lse);
        let p = simd::exp(s, log_p);
        s.mul(self.scale, s.add(s.mul(self.neg_c_logp, p), s.mul(s.mul(self.c_ent, p), s.add(log_p, self.ent))))
    }
}

/// The body of the gradient passes: z from `z`, or (None) from `out` itself.
#[inline(always)]
fn grad_body<S: Simd, T: Elem>(s: S, z: Option<&[T]>, out: &mut [f64], k: &GradRow) {
    let lanes = S::LANES;
    let k = GradConstants::new(s, k);
    let split = out.len() - out.len() % lanes;
    let mut i = 0;
    while i < split {
        let zv = match z {
            Some(z) => T::load(s, &z[i..]),
            None => s.load(&out[i..]),
        };
        s.store(k.value(s, zv), &mut out[i..]);
        i += lanes;
    }
    for v in split..out.len() {
        let zv = z.map_or(out[v], |z| z[v].into());
        out[v] = lanes_of(s, k.value(s, s.splat(zv)))[0];
    }
}

simd_dispatched! {
    /// The gradient row in place: on entry g_v = z_v, on return
    ///   g_v = scale * p_v * (-c_logp + c_ent * (log p_v + entropy)),
    ///   log p_v = z_v * inv_tau - lse   (the one-hot term is the caller's).
    pub fn grad_pass / grad_pass_at(g: &mut [f64], k: &GradRow) -> () |s| {
        grad_body::<S, f64>(s, None, g, k)
    }
}

simd_dispatched! {
    /// [`grad_pass`] reading z from a stored f32 row (one write of `out`).
    pub fn grad_pass_f32 / grad_pass_f32_at(z: &[f32], out: &mut [f64], k: &GradRow) -> () |s| {
        assert_eq!(z.len(), out.len());
        grad_body(s, Some(z), out, k)
    }
}

simd_dispatched! {
    /// v_i /= divisor for every element (a true division: exact where the scalar one is).
    pub fn divide / divide_at(v: &mut [f64], divisor: f64) -> () |_s| {
        for x in v.iter_mut() {
            *x /= divisor;
        }
    }
}

simd_dispatched! {
    /// out_i = x_i widened to f64 (exact).
    pub fn widen_f32 / widen_f32_at(x: &[f32], out: &mut [f64]) -> () |_s| {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = v as f64;
        }
    }
}

simd_dispatched! {
    /// out_i = |x_i|.
    pub fn abs / abs_at(x: &[f64], out: &mut [f64]) -> () |_s| {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = v.abs();
        }
    }
}

simd_dispatched! {
    /// out_v += a * w_v for an f32 row w (the fused kind's logits, h by h).
    pub fn axpy_f32 / axpy_f32_at(out: &mut [f64], a: f64, w: &[f32]) -> () |_s| {
        for (o, &wv) in out.iter_mut().zip(w) {
            *o += a * wv as f64;
        }
    }
}

simd_dispatched! {
    /// out_v += |a * w_v| for an f32 row w (the fused logits' rounding magnitudes).
    pub fn abs_axpy_f32 / abs_axpy_f32_at(out: &mut [f64], a: f64, w: &[f32]) -> () |_s| {
        for (o, &wv) in out.iter_mut().zip(w) {
            *o += (a * wv as f64).abs();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exp::exp;
    use crate::simd::Level;
    use crate::softmax::{cpu_has_fma, TEST_LEVELS};

    /// The vector exp (through `grad_pass` with constants that make it
    /// g = exp(z) exactly) is bit-identical to the scalar `exp` the 2-ulp
    /// test checks, lane by lane and in the tails, at every level.
    #[test]
    fn vector_exp_is_the_scalar_exp() {
        let k = GradRow { inv_tau: 1.0, lse: 0.0, entropy: 0.0, scale: 1.0, c_logp: -1.0, c_ent: 0.0 };
        let steps = 100_003; // not a multiple of any lane count: the tail runs too
        let x: Vec<f64> = (0..steps)
            .map(|i| -720.0 + 729.0 * i as f64 / (steps - 1) as f64)
            .chain([0.0, -0.0, 1e-300, -1e-300, -708.0, -708.5, 0.5 * std::f64::consts::LN_2])
            .collect();
        for level in TEST_LEVELS {
            let mut g = x.clone();
            grad_pass_at(level, &mut g, &k);
            // The one-lane path rounds its multiply-adds twice, the x86 ones fuse them.
            let fused = level != Level::Scalar && cpu_has_fma();
            for (&v, &got) in x.iter().zip(&g) {
                let want = if fused { exp::<true>(v) } else { exp::<false>(v) };
                assert!(got.to_bits() == want.to_bits(), "at {level:?}: vector exp({v:e}) = {got:e}; the scalar exp (fma: {fused}) gives {want:e}");
            }
        }
    }
}
