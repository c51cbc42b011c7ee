//! The row loops of the oracle, written so that they vectorise: eight f64
//! lanes side by side, an `exp` without library calls or branches, and
//! error-free (TwoSum) lane accumulators in place of a scalar compensated
//! sum. Each public kernel is compiled three times (AVX-512, AVX2 + FMA, and
//! the baseline) and picks the widest the CPU has at run time, so one binary
//! runs everywhere and uses what it finds.
//!
//! Accuracy is the oracle's, not a fast-math approximation of it: `exp` is
//! within 2 ulp of the exact value on the domain used (checked against the
//! standard library in `suites/oracle.rs`), and the lane sums lose no more
//! than `CompensatedSum` does. Nothing here changes with the lane count but
//! the order of additions, which the compensation makes irrelevant at f64.

use crate::sum::CompensatedSum;

const LANES: usize = 8;

/// Below this argument `exp` returns 0: e^-708 = 3.3e-308 is the edge of the
/// normal range, and a probability that small is zero to every f32/bf16
/// implementation and every tolerance here.
pub const EXP_FLUSH_BELOW: f64 = -708.0;

/// e^x for x <= 709 (larger arguments are not used by the oracle: softmax
/// arguments are max-subtracted). Cody-Waite reduction x = k ln2 + r with
/// |r| <= ln2 / 2 and the degree-13 Taylor polynomial of e^r (truncation
/// below 4e-18 relative), then 2^k written into the exponent bits.
/// `FMA`: evaluate the polynomial with fused multiply-adds (only where the
/// CPU has them; elsewhere `mul_add` is a slow library call).
#[inline(always)]
pub fn exp<const FMA: bool>(x: f64) -> f64 {
    const LOG2_E: f64 = std::f64::consts::LOG2_E;
    // ln 2 split so that k * LN2_HI is exact for |k| < 2^11 (fdlibm's constants).
    const LN2_HI: f64 = 6.931_471_803_691_238_164_90e-1;
    const LN2_LO: f64 = 1.908_214_929_270_587_700_02e-10;
    // Adding 1.5 * 2^52 rounds to the nearest integer, which the low mantissa bits then hold.
    const SHIFTER: f64 = 6_755_399_441_055_744.0;
    let clamped = x.max(EXP_FLUSH_BELOW);
    let shifted = clamped * LOG2_E + SHIFTER;
    let k = shifted - SHIFTER;
    let r = (clamped - k * LN2_HI) - k * LN2_LO;
    let mut poly: f64 = 1.0 / 6_227_020_800.0; // 1/13!
    for inv_factorial in [
        1.0 / 479_001_600.0,
        1.0 / 39_916_800.0,
        1.0 / 3_628_800.0,
        1.0 / 362_880.0,
        1.0 / 40_320.0,
        1.0 / 5_040.0,
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        poly = if FMA { poly.mul_add(r, inv_factorial) } else { poly * r + inv_factorial };
    }
    // The low 12 bits of `shifted` hold k mod 4096; k + 1023 in [1, 2046] is the biased exponent.
    let two_to_k = f64::from_bits((shifted.to_bits().wrapping_add(1023)) << 52);
    if x < EXP_FLUSH_BELOW {
        0.0
    } else {
        poly * two_to_k
    }
}

/// Eight running sums, each with the exact rounding error of every addition
/// accumulated beside it (Knuth's TwoSum: branch-free, so it vectorises).
#[derive(Clone, Copy)]
struct LaneSum {
    sum: [f64; LANES],
    error: [f64; LANES],
}

impl LaneSum {
    #[inline(always)]
    fn new() -> Self {
        LaneSum { sum: [0.0; LANES], error: [0.0; LANES] }
    }

    #[inline(always)]
    fn add(&mut self, x: &[f64]) {
        let x: &[f64; LANES] = x.try_into().expect("a chunk of LANES values");
        for l in 0..LANES {
            let s = self.sum[l];
            let t = s + x[l];
            let back = t - s;
            self.error[l] += (s - (t - back)) + (x[l] - back);
            self.sum[l] = t;
        }
    }

    /// The lanes and their errors combined, plus a scalar tail.
    #[inline(always)]
    fn value(&self, tail: CompensatedSum) -> f64 {
        let mut total = tail;
        for l in 0..LANES {
            total.add(self.sum[l]);
        }
        for l in 0..LANES {
            total.add(self.error[l]);
        }
        total.value()
    }
}

/// Defines `pub fn $name` that runs `$body` compiled for the widest vector
/// unit the CPU has (checked once per call; the check is a cached load).
/// Inside `$body`, the const `FMA` says whether fused multiply-adds are fast.
macro_rules! dispatched {
    ($(#[$doc:meta])* pub fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty $body:block) => {
        $(#[$doc])*
        pub fn $name($($arg: $ty),*) -> $ret {
            #[inline(always)]
            fn portable<const FMA: bool>($($arg: $ty),*) -> $ret $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512dq,avx512vl")]
                unsafe fn avx512($($arg: $ty),*) -> $ret { portable::<true>($($arg),*) }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($arg: $ty),*) -> $ret { portable::<true>($($arg),*) }
                if std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512dq")
                    && std::arch::is_x86_feature_detected!("avx512vl")
                {
                    // SAFETY: the features this function was compiled for are present.
                    return unsafe { avx512($($arg),*) };
                }
                if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                    // SAFETY: as above.
                    return unsafe { avx2($($arg),*) };
                }
            }
            portable::<false>($($arg),*)
        }
    };
}

dispatched! {
    /// max_v x_v (x finite).
    pub fn max(x: &[f64]) -> f64 {
        let mut lanes = [f64::NEG_INFINITY; LANES];
        let chunks = x.chunks_exact(LANES);
        let tail = chunks.remainder();
        for c in chunks {
            for l in 0..LANES {
                lanes[l] = if c[l] > lanes[l] { c[l] } else { lanes[l] };
            }
        }
        let mut m = tail.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        for v in lanes {
            m = m.max(v);
        }
        m
    }
}

dispatched! {
    /// max_v |x_v|.
    pub fn max_abs(x: &[f64]) -> f64 {
        let mut lanes = [0.0f64; LANES];
        let chunks = x.chunks_exact(LANES);
        let tail = chunks.remainder();
        for c in chunks {
            for l in 0..LANES {
                let a = c[l].abs();
                lanes[l] = if a > lanes[l] { a } else { lanes[l] };
            }
        }
        let mut m = tail.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        for v in lanes {
            m = m.max(v);
        }
        m
    }
}

dispatched! {
    /// Writes out_v = exp(x_v - shift) and returns sum_v out_v (compensated).
    pub fn exp_shifted_sum(x: &[f64], shift: f64, out: &mut [f64]) -> f64 {
        assert_eq!(x.len(), out.len());
        // Two loops, not one: the exp loop alone is what the vectoriser takes.
        for (o, &v) in out.iter_mut().zip(x) {
            *o = exp::<FMA>(v - shift);
        }
        let mut sum = LaneSum::new();
        let chunks = out.chunks_exact(LANES);
        let mut tail = CompensatedSum::new();
        chunks.remainder().iter().for_each(|&v| tail.add(v));
        for c in chunks {
            sum.add(c);
        }
        sum.value(tail)
    }
}

/// What one pass over p = e / sum gathers (see [`crate::RowSoftmax`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct SoftmaxPass {
    /// sum_v p_v (lse - x_v) = the entropy.
    pub entropy: f64,
    /// sum_v p_v mag_v.
    pub sum_p_mag: f64,
    /// max_v p_v mag_v.
    pub max_p_mag: f64,
    /// max_v p_v |lse - x_v|.
    pub max_p_abs_log_p: f64,
}

dispatched! {
    /// The entropy and the rounding-magnitude statistics of one row, from
    /// e_v = exp(x_v - max), its sum, and lse = max + ln(sum).
    pub fn softmax_pass(x: &[f64], mag: &[f64], e: &[f64], sum: f64, lse: f64) -> SoftmaxPass {
        assert!(x.len() == mag.len() && x.len() == e.len());
        let (mut entropy, mut sum_p_mag) = (LaneSum::new(), LaneSum::new());
        let (mut max_p_mag, mut max_p_log) = ([0.0f64; LANES], [0.0f64; LANES]);
        // p = e * (1 / sum): within 1 ulp of e / sum, and a multiply, not a divide, per element.
        let inv_sum = 1.0 / sum;
        let split = x.len() - x.len() % LANES;
        let chunks = x[..split].chunks_exact(LANES).zip(mag[..split].chunks_exact(LANES)).zip(e[..split].chunks_exact(LANES));
        for ((xc, mc), ec) in chunks {
            let (mut ent, mut pm) = ([0.0; LANES], [0.0; LANES]);
            for l in 0..LANES {
                let p = ec[l] * inv_sum;
                // -log p_v = lse - x_v >= 0: every entropy term is non-negative.
                let neg_log_p = lse - xc[l];
                ent[l] = p * neg_log_p;
                pm[l] = p * mc[l];
                max_p_mag[l] = if pm[l] > max_p_mag[l] { pm[l] } else { max_p_mag[l] };
                let pl = p * neg_log_p.abs();
                max_p_log[l] = if pl > max_p_log[l] { pl } else { max_p_log[l] };
            }
            entropy.add(&ent);
            sum_p_mag.add(&pm);
        }
        let (mut ent_tail, mut pm_tail) = (CompensatedSum::new(), CompensatedSum::new());
        let (mut max_pm, mut max_pl) = (0.0f64, 0.0f64);
        for ((&xv, &m), &ev) in x[split..].iter().zip(&mag[split..]).zip(&e[split..]) {
            let p = ev * inv_sum;
            let neg_log_p = lse - xv;
            ent_tail.add(p * neg_log_p);
            pm_tail.add(p * m);
            max_pm = max_pm.max(p * m);
            max_pl = max_pl.max(p * neg_log_p.abs());
        }
        for l in 0..LANES {
            max_pm = max_pm.max(max_p_mag[l]);
            max_pl = max_pl.max(max_p_log[l]);
        }
        SoftmaxPass {
            entropy: entropy.value(ent_tail),
            sum_p_mag: sum_p_mag.value(pm_tail),
            max_p_mag: max_pm,
            max_p_abs_log_p: max_pl,
        }
    }
}

dispatched! {
    /// The gradient row in place: on entry g_v = z_v, on return
    ///   g_v = scale * p_v * (-c_logp + c_ent * (log p_v + ent)),
    ///   log p_v = z_v * inv_tau - lse   (the one-hot term is the caller's).
    pub fn grad_pass(g: &mut [f64], inv_tau: f64, lse: f64, ent: f64, scale: f64, c_logp: f64, c_ent: f64) -> () {
        let split = g.len() - g.len() % LANES;
        for c in g[..split].chunks_exact_mut(LANES) {
            for l in 0..LANES {
                let log_p = c[l] * inv_tau - lse;
                let p = exp::<FMA>(log_p);
                c[l] = scale * (-c_logp * p + c_ent * p * (log_p + ent));
            }
        }
        for v in &mut g[split..] {
            let log_p = *v * inv_tau - lse;
            let p = exp::<FMA>(log_p);
            *v = scale * (-c_logp * p + c_ent * p * (log_p + ent));
        }
    }
}

dispatched! {
    /// v_i /= divisor for every element (a true division: exact where the scalar one is).
    pub fn divide(v: &mut [f64], divisor: f64) -> () {
        for x in v.iter_mut() {
            *x /= divisor;
        }
    }
}

dispatched! {
    /// out_i = x_i widened to f64 (exact).
    pub fn widen_f32(x: &[f32], out: &mut [f64]) -> () {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = v as f64;
        }
    }
}

dispatched! {
    /// out_i = |x_i|.
    pub fn abs(x: &[f64], out: &mut [f64]) -> () {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = v.abs();
        }
    }
}

dispatched! {
    /// out_v += a * w_v for an f32 row w (the fused kind's logits, h by h).
    pub fn axpy_f32(out: &mut [f64], a: f64, w: &[f32]) -> () {
        for (o, &wv) in out.iter_mut().zip(w) {
            *o += a * wv as f64;
        }
    }
}

dispatched! {
    /// out_v += |a * w_v| for an f32 row w (the fused logits' rounding magnitudes).
    pub fn abs_axpy_f32(out: &mut [f64], a: f64, w: &[f32]) -> () {
        for (o, &wv) in out.iter_mut().zip(w) {
            *o += (a * wv as f64).abs();
        }
    }
}

/// What one pass over a row w = lm_head[h, :] gathers for the fused
/// comparison (see `fused_row_pass`).
#[derive(Clone, Copy, Debug, Default)]
pub struct FusedRowPass {
    /// sum_v w_v g_v: d hidden[h].
    pub dot: f64,
    /// sum_v |w_v| e_v.
    pub abs_dot_e: f64,
    /// sum_v |w_v g_v|.
    pub abs_dot_g: f64,
}

dispatched! {
    /// One pass over lm_head row h for one token row: d hidden[h] and its
    /// scale terms, and (when x_h != 0) d lm_head[h, :] += x_h g and
    /// its scale s_lm_head[h, :] += |x_h| (e + sqrt_rows |g|).
    pub fn fused_row_pass(
        w: &[f32],
        g: &[f64],
        e: &[f64],
        x_h: f64,
        sqrt_rows: f64,
        d_lm_head: &mut [f64],
        s_lm_head: &mut [f64],
    ) -> FusedRowPass {
        let (mut dot, mut abs_e, mut abs_g) = ([0.0f64; LANES], [0.0f64; LANES], [0.0f64; LANES]);
        let split = w.len() - w.len() % LANES;
        for ((wc, gc), ec) in w[..split].chunks_exact(LANES).zip(g[..split].chunks_exact(LANES)).zip(e[..split].chunks_exact(LANES)) {
            for l in 0..LANES {
                let wv = wc[l] as f64;
                dot[l] += wv * gc[l];
                abs_e[l] += wv.abs() * ec[l];
                abs_g[l] += (wv * gc[l]).abs();
            }
        }
        let mut pass = FusedRowPass::default();
        for v in split..w.len() {
            let wv = w[v] as f64;
            pass.dot += wv * g[v];
            pass.abs_dot_e += wv.abs() * e[v];
            pass.abs_dot_g += (wv * g[v]).abs();
        }
        for l in 0..LANES {
            pass.dot += dot[l];
            pass.abs_dot_e += abs_e[l];
            pass.abs_dot_g += abs_g[l];
        }
        if x_h != 0.0 {
            let ax = x_h.abs();
            for (((d, s), &gv), &ev) in d_lm_head.iter_mut().zip(s_lm_head.iter_mut()).zip(g).zip(e) {
                *d += x_h * gv;
                *s += ax * (ev + sqrt_rows * gv.abs());
            }
        }
        pass
    }
}

dispatched! {
    /// sum_v w_v g_v for an f32 row w (eight lane sums).
    pub fn dot_f32(w: &[f32], g: &[f64]) -> f64 {
        let mut lanes = [0.0f64; LANES];
        let split = w.len() - w.len() % LANES;
        for (wc, gc) in w[..split].chunks_exact(LANES).zip(g[..split].chunks_exact(LANES)) {
            for l in 0..LANES {
                lanes[l] += wc[l] as f64 * gc[l];
            }
        }
        let tail: f64 = w[split..].iter().zip(&g[split..]).map(|(&wv, gv)| wv as f64 * gv).sum();
        lanes.iter().sum::<f64>() + tail
    }
}
