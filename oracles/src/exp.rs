//! The oracle's scalar e^x: Cody-Waite reduction and a degree-13 Taylor
//! polynomial, within 2 ulp of the exact value on the domain the oracle
//! uses. The vector kernels (`simd::exp`) run the same operations lane by
//! lane, so each lane is bit-identical to this function.

/// Below this argument `exp` returns 0: e^-708 = 3.3e-308 is the edge of the
/// normal range, and a probability that small is zero to every f32/bf16
/// implementation and every tolerance here.
pub const EXP_FLUSH_BELOW: f64 = -708.0;

/// 1/12!, 1/11!, ..., 1/1!, 1/0!: the Taylor coefficients of e^r after
/// the leading 1/13!, in Horner order.
pub const EXP_TAYLOR: [f64; 13] = [
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
];

/// e^x for x <= 709 (larger arguments are not used by the oracle: softmax
/// arguments are max-subtracted). Cody-Waite reduction x = k ln2 + r with
/// |r| <= ln2 / 2 and the degree-13 Taylor polynomial of e^r (truncation
/// below 4e-18 relative), then 2^k written into the exponent bits.
/// `FMA`: evaluate the polynomial with fused multiply-adds (only where the
/// CPU has them; elsewhere `mul_add` is a slow library call).
// The scalar reference the vector exp is tested against, lane for lane.
#[cfg_attr(not(test), allow(dead_code))]
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
    for inv_factorial in EXP_TAYLOR {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `exp` against the standard library's (correctly rounded to within 1
    /// ulp) on a dense grid of the domain the oracle uses, both code paths
    /// (with and without fused multiply-adds): within 2 ulp, and exactly 0
    /// below the flush point.
    #[test]
    fn exp_is_within_2_ulp() {
        let ulp = f64::EPSILON;
        let mut worst = (0.0f64, 0.0f64);
        let mut check = |x: f64, got: f64| {
            let want = x.exp();
            let rel = (got - want).abs() / want;
            if rel > worst.0 {
                worst = (rel, x);
            }
            assert!(rel <= 2.0 * ulp, "exp({x:e}) = {got:e}, std gives {want:e}: {:.2} ulp apart", rel / ulp);
        };
        let steps = 400_000;
        for i in 0..=steps {
            let x = EXP_FLUSH_BELOW + (709.0 - EXP_FLUSH_BELOW) * i as f64 / steps as f64;
            check(x, exp::<true>(x));
            check(x, exp::<false>(x));
        }
        for x in [0.0, -0.0, 1e-300, -1e-300, 0.5 * std::f64::consts::LN_2, -0.5 * std::f64::consts::LN_2, 1e-8, -1e-8] {
            check(x, exp::<true>(x));
        }
        for x in [-708.5, -1000.0, -1e300, f64::NEG_INFINITY] {
            assert!(exp::<true>(x) == 0.0 && exp::<false>(x) == 0.0, "exp({x}) should flush to 0");
        }
        eprintln!("exp worst {:.3} ulp at x = {:e}", worst.0 / ulp, worst.1);
    }
}
