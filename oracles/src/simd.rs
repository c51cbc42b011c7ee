//! Explicit vector registers for the oracle's exp-bound row loops.
//!
//! The compiler's auto-vectoriser takes a plain elementwise loop (an exp
//! written into an array), but not a loop that also carries compensated
//! sums and running maxima: there it fell back to scalar or 2-lane code,
//! and which one changed with unrelated edits. The loops that carry both
//! are therefore written against [`Simd`], one vector of `LANES` f64 at a
//! time, and compiled three times: AVX-512 (8 lanes), AVX2 + FMA (4) and a
//! one-lane baseline that any CPU runs.
//!
//! A [`Simd`] value is a token: it can only be obtained where the CPU has
//! the instructions its methods use (`Avx512::detect`, `Avx2::detect`), so
//! the methods are safe to call. They are `#[inline(always)]` so that they
//! inline into the `#[target_feature]` entry points that run the kernels.

use crate::sum::CompensatedSum;
use crate::exp::{EXP_FLUSH_BELOW, EXP_TAYLOR};

/// An instruction set the kernels may use. Every dispatched kernel has an
/// `_at` form taking the widest level it may use (the CPU's own features
/// still decide below it), so tests run the narrower paths on a CPU that has
/// the wider ones without setting anything process-wide; the plain form
/// allows the widest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// One lane, no vector instructions assumed (what `$at` runs below the
    /// CPU's features; named only by the tests).
    #[cfg_attr(not(test), allow(dead_code))]
    Scalar = 0,
    /// AVX2 with FMA.
    Avx2 = 1,
    /// AVX-512 F, DQ and VL.
    Avx512 = 2,
}

/// The widest level the kernels use unless told otherwise: AVX-512 with
/// the `x86-v4` feature (the default), AVX2 + FMA without it.
pub(crate) const WIDEST: Level = if cfg!(feature = "x86-v4") { Level::Avx512 } else { Level::Avx2 };

/// The widest vector extension the oracle's kernels and GEMMs use on this
/// machine in this build: "AVX-512", "AVX2" or "other".
pub fn isa() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if WIDEST == Level::Avx512 && Avx512::detect(Level::Avx512).is_some() {
            return "AVX-512";
        }
        if Avx2::detect(Level::Avx2).is_some() {
            return "AVX2";
        }
    }
    "other"
}

/// The operations the row kernels need, on vectors of `LANES` f64.
pub(crate) trait Simd: Copy {
    type V: Copy;
    type Mask: Copy;
    const LANES: usize;
    fn splat(self, x: f64) -> Self::V;
    /// The first LANES values of `x` (x.len() >= LANES).
    fn load(self, x: &[f64]) -> Self::V;
    /// The first LANES values of `x` widened (x.len() >= LANES).
    fn load_f32(self, x: &[f32]) -> Self::V;
    /// Into the first LANES places of `out` (out.len() >= LANES).
    fn store(self, v: Self::V, out: &mut [f64]);
    fn add(self, a: Self::V, b: Self::V) -> Self::V;
    fn sub(self, a: Self::V, b: Self::V) -> Self::V;
    fn mul(self, a: Self::V, b: Self::V) -> Self::V;
    fn div(self, a: Self::V, b: Self::V) -> Self::V;
    /// a * b + c, fused where `FMA`, else rounded twice.
    fn mul_add(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// Lane-wise max / min of finite values.
    fn max(self, a: Self::V, b: Self::V) -> Self::V;
    fn min(self, a: Self::V, b: Self::V) -> Self::V;
    fn abs(self, a: Self::V) -> Self::V;
    fn lt(self, a: Self::V, b: Self::V) -> Self::Mask;
    fn le(self, a: Self::V, b: Self::V) -> Self::Mask;
    /// Where `m`: `yes`, else `no`.
    fn select(self, m: Self::Mask, yes: Self::V, no: Self::V) -> Self::V;
    fn any(self, m: Self::Mask) -> bool;
    /// 2^k from `shifted` = k + 1.5 * 2^52 (k an integer in [-1022, 1023]),
    /// whose low mantissa bits hold k: (bits + 1023) << 52 as f64.
    fn pow2_of_shifted(self, shifted: Self::V) -> Self::V;
}

/// A stored element the kernels read as f64 (exactly).
pub(crate) trait Elem: Copy + Into<f64> {
    /// The first LANES values of `x`, widened.
    fn load<S: Simd>(s: S, x: &[Self]) -> S::V;
}

impl Elem for f64 {
    #[inline(always)]
    fn load<S: Simd>(s: S, x: &[f64]) -> S::V {
        s.load(x)
    }
}

impl Elem for f32 {
    #[inline(always)]
    fn load<S: Simd>(s: S, x: &[f32]) -> S::V {
        s.load_f32(x)
    }
}

/// The LANES values of `v`, in order.
#[inline(always)]
pub(crate) fn lanes_of<S: Simd>(s: S, v: S::V) -> [f64; 8] {
    let mut out = [0.0; 8];
    s.store(v, &mut out);
    out
}

/// `x` (fewer than LANES values) widened and padded with `fill`, as one vector.
#[inline(always)]
pub(crate) fn load_padded<S: Simd, T: Elem>(s: S, x: &[T], fill: f64) -> S::V {
    let mut buf = [fill; 8];
    for (b, &v) in buf.iter_mut().zip(x) {
        *b = v.into();
    }
    s.load(&buf)
}

/// e^x lane by lane: the same operations, in the same order, as
/// [`crate::exp::exp`] (with `FMA` true for the x86 tokens, false for
/// `Scalar`), so each lane is bit-identical to the scalar function.
#[inline(always)]
pub(crate) fn exp<S: Simd>(s: S, x: S::V) -> S::V {
    const LOG2_E: f64 = std::f64::consts::LOG2_E;
    const LN2_HI: f64 = 6.931_471_803_691_238_164_90e-1;
    const LN2_LO: f64 = 1.908_214_929_270_587_700_02e-10;
    const SHIFTER: f64 = 6_755_399_441_055_744.0;
    let flush = s.splat(EXP_FLUSH_BELOW);
    let clamped = s.max(x, flush);
    let shifted = s.add(s.mul(clamped, s.splat(LOG2_E)), s.splat(SHIFTER));
    let k = s.sub(shifted, s.splat(SHIFTER));
    let r = s.sub(s.sub(clamped, s.mul(k, s.splat(LN2_HI))), s.mul(k, s.splat(LN2_LO)));
    let mut poly = s.splat(1.0 / 6_227_020_800.0);
    for inv_factorial in EXP_TAYLOR {
        poly = s.mul_add(poly, r, s.splat(inv_factorial));
    }
    let value = s.mul(poly, s.pow2_of_shifted(shifted));
    s.select(s.lt(x, flush), s.splat(0.0), value)
}

/// LANES running sums of terms in [0, 1], each with the exact error of
/// every addition beside it.
///
/// Each lane starts at 1, so it is never smaller than the next term, and
/// Dekker's Fast2Sum (t = s + x, error x - (t - s)) is then exact: three
/// operations where TwoSum needs six. The starting 1s are taken off, with
/// the errors, in a compensated sum at the end.
#[derive(Clone, Copy)]
pub(crate) struct VecSum<S: Simd> {
    sum: S::V,
    error: S::V,
}

impl<S: Simd> VecSum<S> {
    #[inline(always)]
    pub(crate) fn new(s: S) -> Self {
        VecSum { sum: s.splat(1.0), error: s.splat(0.0) }
    }

    /// Adds one vector of terms, each in [0, 1].
    #[inline(always)]
    pub(crate) fn add(&mut self, s: S, x: S::V) {
        let t = s.add(self.sum, x);
        self.error = s.add(self.error, s.sub(x, s.sub(t, self.sum)));
        self.sum = t;
    }

    /// The lanes and their errors combined, less the starting 1s.
    #[inline(always)]
    pub(crate) fn value(&self, s: S) -> f64 {
        let (sums, errors) = (lanes_of(s, self.sum), lanes_of(s, self.error));
        let mut total = CompensatedSum::new();
        for l in 0..S::LANES {
            total.add(sums[l]);
            total.add(-1.0);
            total.add(errors[l]);
        }
        total.value()
    }
}

/// One lane, any CPU: `mul_add` rounds twice (a library fma would be slow).
#[derive(Clone, Copy)]
pub(crate) struct Scalar;

impl Simd for Scalar {
    type V = f64;
    type Mask = bool;
    const LANES: usize = 1;
    #[inline(always)]
    fn splat(self, x: f64) -> f64 {
        x
    }
    #[inline(always)]
    fn load(self, x: &[f64]) -> f64 {
        x[0]
    }
    #[inline(always)]
    fn load_f32(self, x: &[f32]) -> f64 {
        x[0] as f64
    }
    #[inline(always)]
    fn store(self, v: f64, out: &mut [f64]) {
        out[0] = v;
    }
    #[inline(always)]
    fn add(self, a: f64, b: f64) -> f64 {
        a + b
    }
    #[inline(always)]
    fn sub(self, a: f64, b: f64) -> f64 {
        a - b
    }
    #[inline(always)]
    fn mul(self, a: f64, b: f64) -> f64 {
        a * b
    }
    #[inline(always)]
    fn div(self, a: f64, b: f64) -> f64 {
        a / b
    }
    #[inline(always)]
    fn mul_add(self, a: f64, b: f64, c: f64) -> f64 {
        a * b + c
    }
    #[inline(always)]
    fn max(self, a: f64, b: f64) -> f64 {
        if a > b { a } else { b }
    }
    #[inline(always)]
    fn min(self, a: f64, b: f64) -> f64 {
        if a < b { a } else { b }
    }
    #[inline(always)]
    fn abs(self, a: f64) -> f64 {
        a.abs()
    }
    #[inline(always)]
    fn lt(self, a: f64, b: f64) -> bool {
        a < b
    }
    #[inline(always)]
    fn le(self, a: f64, b: f64) -> bool {
        a <= b
    }
    #[inline(always)]
    fn select(self, m: bool, yes: f64, no: f64) -> f64 {
        if m { yes } else { no }
    }
    #[inline(always)]
    fn any(self, m: bool) -> bool {
        m
    }
    #[inline(always)]
    fn pow2_of_shifted(self, shifted: f64) -> f64 {
        f64::from_bits((shifted.to_bits().wrapping_add(1023)) << 52)
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::{Avx2, Avx512};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::Simd;

    /// AVX-512 (F, DQ, VL): eight lanes. Only `detect` makes one.
    #[derive(Clone, Copy)]
    pub(crate) struct Avx512(());

    impl Avx512 {
        /// The token, if `cap` allows AVX-512 and the CPU has it.
        pub(crate) fn detect(cap: super::Level) -> Option<Self> {
            (cap >= super::Level::Avx512
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512dq")
                && is_x86_feature_detected!("avx512vl"))
            .then_some(Avx512(()))
        }
    }

    // SAFETY (every `unsafe` block below): an `Avx512` exists only where
    // `detect` found the features; loads and stores are unaligned and
    // bounds-checked by the assertion on the slice length.
    impl Simd for Avx512 {
        type V = __m512d;
        type Mask = __mmask8;
        const LANES: usize = 8;
        #[inline(always)]
        fn splat(self, x: f64) -> __m512d {
            unsafe { _mm512_set1_pd(x) }
        }
        #[inline(always)]
        fn load(self, x: &[f64]) -> __m512d {
            assert!(x.len() >= 8);
            unsafe { _mm512_loadu_pd(x.as_ptr()) }
        }
        #[inline(always)]
        fn load_f32(self, x: &[f32]) -> __m512d {
            assert!(x.len() >= 8);
            unsafe { _mm512_cvtps_pd(_mm256_loadu_ps(x.as_ptr())) }
        }
        #[inline(always)]
        fn store(self, v: __m512d, out: &mut [f64]) {
            assert!(out.len() >= 8);
            unsafe { _mm512_storeu_pd(out.as_mut_ptr(), v) }
        }
        #[inline(always)]
        fn add(self, a: __m512d, b: __m512d) -> __m512d {
            unsafe { _mm512_add_pd(a, b) }
        }
        #[inline(always)]
        fn sub(self, a: __m512d, b: __m512d) -> __m512d {
            unsafe { _mm512_sub_pd(a, b) }
        }
        #[inline(always)]
        fn mul(self, a: __m512d, b: __m512d) -> __m512d {
            unsafe { _mm512_mul_pd(a, b) }
        }
        #[inline(always)]
        fn div(self, a: __m512d, b: __m512d) -> __m512d {
            unsafe { _mm512_div_pd(a, b) }
        }
        #[inline(always)]
        fn mul_add(self, a: __m512d, b: __m512d, c: __m512d) -> __m512d {
            unsafe { _mm512_fmadd_pd(a, b, c) }
        }
        #[inline(always)]
        fn max(self, a: __m512d, b: __m512d) -> __m512d {
            unsafe { _mm512_max_pd(a, b) }
        }
        #[inline(always)]
        fn min(self, a: __m512d, b: __m512d) -> __m512d {
            unsafe { _mm512_min_pd(a, b) }
        }
        #[inline(always)]
        fn abs(self, a: __m512d) -> __m512d {
            unsafe { _mm512_abs_pd(a) }
        }
        #[inline(always)]
        fn lt(self, a: __m512d, b: __m512d) -> __mmask8 {
            unsafe { _mm512_cmp_pd_mask::<_CMP_LT_OQ>(a, b) }
        }
        #[inline(always)]
        fn le(self, a: __m512d, b: __m512d) -> __mmask8 {
            unsafe { _mm512_cmp_pd_mask::<_CMP_LE_OQ>(a, b) }
        }
        #[inline(always)]
        fn select(self, m: __mmask8, yes: __m512d, no: __m512d) -> __m512d {
            unsafe { _mm512_mask_blend_pd(m, no, yes) }
        }
        #[inline(always)]
        fn any(self, m: __mmask8) -> bool {
            m != 0
        }
        #[inline(always)]
        fn pow2_of_shifted(self, shifted: __m512d) -> __m512d {
            unsafe {
                let biased = _mm512_add_epi64(_mm512_castpd_si512(shifted), _mm512_set1_epi64(1023));
                _mm512_castsi512_pd(_mm512_slli_epi64::<52>(biased))
            }
        }
    }

    /// AVX2 with FMA: four lanes. Only `detect` makes one.
    #[derive(Clone, Copy)]
    pub(crate) struct Avx2(());

    impl Avx2 {
        /// The token, if `cap` allows AVX2 + FMA and the CPU has them.
        pub(crate) fn detect(cap: super::Level) -> Option<Self> {
            (cap >= super::Level::Avx2 && is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"))
                .then_some(Avx2(()))
        }
    }

    // SAFETY: as for `Avx512`.
    impl Simd for Avx2 {
        type V = __m256d;
        type Mask = __m256d;
        const LANES: usize = 4;
        #[inline(always)]
        fn splat(self, x: f64) -> __m256d {
            unsafe { _mm256_set1_pd(x) }
        }
        #[inline(always)]
        fn load(self, x: &[f64]) -> __m256d {
            assert!(x.len() >= 4);
            unsafe { _mm256_loadu_pd(x.as_ptr()) }
        }
        #[inline(always)]
        fn load_f32(self, x: &[f32]) -> __m256d {
            assert!(x.len() >= 4);
            unsafe { _mm256_cvtps_pd(_mm_loadu_ps(x.as_ptr())) }
        }
        #[inline(always)]
        fn store(self, v: __m256d, out: &mut [f64]) {
            assert!(out.len() >= 4);
            unsafe { _mm256_storeu_pd(out.as_mut_ptr(), v) }
        }
        #[inline(always)]
        fn add(self, a: __m256d, b: __m256d) -> __m256d {
            unsafe { _mm256_add_pd(a, b) }
        }
        #[inline(always)]
        fn sub(self, a: __m256d, b: __m256d) -> __m256d {
            unsafe { _mm256_sub_pd(a, b) }
        }
        #[inline(always)]
        fn mul(self, a: __m256d, b: __m256d) -> __m256d {
            unsafe { _mm256_mul_pd(a, b) }
        }
        #[inline(always)]
        fn div(self, a: __m256d, b: __m256d) -> __m256d {
            unsafe { _mm256_div_pd(a, b) }
        }
        #[inline(always)]
        fn mul_add(self, a: __m256d, b: __m256d, c: __m256d) -> __m256d {
            unsafe { _mm256_fmadd_pd(a, b, c) }
        }
        #[inline(always)]
        fn max(self, a: __m256d, b: __m256d) -> __m256d {
            unsafe { _mm256_max_pd(a, b) }
        }
        #[inline(always)]
        fn min(self, a: __m256d, b: __m256d) -> __m256d {
            unsafe { _mm256_min_pd(a, b) }
        }
        #[inline(always)]
        fn abs(self, a: __m256d) -> __m256d {
            unsafe { _mm256_andnot_pd(_mm256_set1_pd(-0.0), a) }
        }
        #[inline(always)]
        fn lt(self, a: __m256d, b: __m256d) -> __m256d {
            unsafe { _mm256_cmp_pd::<_CMP_LT_OQ>(a, b) }
        }
        #[inline(always)]
        fn le(self, a: __m256d, b: __m256d) -> __m256d {
            unsafe { _mm256_cmp_pd::<_CMP_LE_OQ>(a, b) }
        }
        #[inline(always)]
        fn select(self, m: __m256d, yes: __m256d, no: __m256d) -> __m256d {
            unsafe { _mm256_blendv_pd(no, yes, m) }
        }
        #[inline(always)]
        fn any(self, m: __m256d) -> bool {
            unsafe { _mm256_movemask_pd(m) != 0 }
        }
        #[inline(always)]
        fn pow2_of_shifted(self, shifted: __m256d) -> __m256d {
            unsafe {
                let biased = _mm256_add_epi64(_mm256_castpd_si256(shifted), _mm256_set1_epi64x(1023));
                _mm256_castsi256_pd(_mm256_slli_epi64::<52>(biased))
            }
        }
    }
}

/// Defines `pub fn $name` that runs `$body` with `$s` bound to the widest
/// [`Simd`] token the CPU has, and `pub(crate) fn $at` that takes the widest
/// [`Level`] it may use first (`S` is the token's type inside the body). A
/// body that ignores the token (`|_s|`: a plain elementwise loop) is still
/// compiled once per instruction set, so the compiler vectorises it for
/// each. The check is a cached load per call.
macro_rules! simd_dispatched {
    ($(#[$doc:meta])* pub fn $name:ident / $at:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty |$s:ident| $body:block) => {
        $(#[$doc])*
        #[allow(dead_code)] // some kernels are called only at a level (`$at`)
        pub fn $name($($arg: $ty),*) -> $ret {
            $at($crate::simd::WIDEST, $($arg),*)
        }

        $(#[$doc])*
        /// At most `cap`'s instructions.
        #[allow(dead_code)] // most kernels are called only at the widest level
        pub(crate) fn $at(cap: $crate::simd::Level, $($arg: $ty),*) -> $ret {
            #[inline(always)]
            fn generic<S: $crate::simd::Simd>($s: S, $($arg: $ty),*) -> $ret $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512dq,avx512vl")]
                unsafe fn avx512(s: $crate::simd::Avx512, $($arg: $ty),*) -> $ret { generic(s, $($arg),*) }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2(s: $crate::simd::Avx2, $($arg: $ty),*) -> $ret { generic(s, $($arg),*) }
                if let Some(s) = $crate::simd::Avx512::detect(cap) {
                    // SAFETY: the token proves the features are present.
                    return unsafe { avx512(s, $($arg),*) };
                }
                if let Some(s) = $crate::simd::Avx2::detect(cap) {
                    // SAFETY: as above.
                    return unsafe { avx2(s, $($arg),*) };
                }
            }
            let _ = cap;
            generic($crate::simd::Scalar, $($arg),*)
        }
    };
}
pub(crate) use simd_dispatched;
