//! What kind of wrong a failing quantity is, in one phrase a kernel author
//! can act on: a precision choice (the error is a few units in the last
//! place of the dtype it came back in, or of bf16 inside an f32 result) or
//! a math bug (far above any rounding). At production scale most findings
//! are precision findings; a user reading a failure should know at once
//! which one they face.

use crate::case::Dtype;
use crate::compare::Verdict;

/// Up to this many ulps of a dtype an error counts as that dtype's rounding
/// (a few roundings of intermediate results; a 74-block bf16 carry shows
/// 2 to 4).
const FEW_ULPS: f64 = 8.0;

/// An f32 error under this fraction of a bf16 ulp (4096 f32 ulps) is f32
/// accuracy lost, not a bf16 intermediate (a value rounded to bf16 inside
/// moves the result by a sizeable part of a bf16 ulp).
const BELOW_BF16: f64 = 1.0 / 16.0;

/// The spacing of `dtype`'s values at |x| (the smallest normal's below it).
pub fn ulp(dtype: Dtype, x: f64) -> f64 {
    let bits = match dtype {
        Dtype::F32 => 23,
        Dtype::Bf16 => 7,
    };
    let exponent = x.abs().max(f32::MIN_POSITIVE as f64).log2().floor();
    2f64.powf(exponent - bits as f64)
}

/// The class of a failing verdict on a quantity returned in `returned`
/// (gradients: the implementation's gradient dtype; loss and aux: f32).
pub fn classify(v: &Verdict, returned: Dtype) -> String {
    if v.err.is_infinite() || v.abs_err.is_nan() {
        return "math: not finite where the oracle is (an overflow, 0/0, a -inf identity or a masked value leaking)".into();
    }
    if v.want == 0.0 {
        return "math: nonzero where the exact value is zero (a masked, clipped or padded element that should carry nothing)".into();
    }
    let gradient = v.quantity.starts_with("grad");
    // A bf16 gradient's error is measured beyond its own output rounding:
    // put that back to speak of the whole error in ulps.
    let raw = if gradient && returned == Dtype::Bf16 { v.abs_err + 0.5 * ulp(Dtype::Bf16, v.want) } else { v.abs_err };
    let what = if gradient { v.quantity.replacen("grad_", "d ", 1).replace("grad", "d logits") } else { v.quantity.to_string() };
    let in_returned = raw / ulp(returned, v.want);
    let in_bf16 = raw / ulp(Dtype::Bf16, v.want);
    let relative = raw / v.want.abs();
    if in_returned <= FEW_ULPS {
        let cause = match returned {
            Dtype::Bf16 => "accumulation in bf16, e.g. a bf16 scan carry across vocabulary blocks or a bf16 reduction",
            Dtype::F32 => "f32 accumulation order or a less accurate f32 formula (e.g. log of a sum instead of log-sum-exp)",
        };
        format!("precision: {what} off by up to {in_returned:.1} {} ulps, consistent with {cause}", returned.name())
    } else if returned == Dtype::F32 && in_bf16 < BELOW_BF16 {
        format!("precision: {what} off by {in_returned:.0} f32 ulps, well below one bf16 ulp: f32 accuracy lost, e.g. cancellation, an online rescale of running sums or a long sum in a poor order")
    } else if returned == Dtype::F32 && in_bf16 <= FEW_ULPS {
        format!("precision: {what} off by {in_returned:.0} f32 ulps = {in_bf16:.1} bf16 ulps, consistent with an intermediate rounded to bf16 (logits, a carry or a product in bf16)")
    } else {
        format!("math: {what} off by {in_returned:.3e} {} ulps (relative {relative:.1e}), far above rounding: a wrong formula, term, index, mask or cotangent", returned.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(quantity: &'static str, want: f64, abs_err: f64) -> Verdict {
        Verdict {
            quantity,
            err: 1.0,
            abs_err,
            at: String::new(),
            want,
            baseline_err: 0.0,
            floor: 0.0,
            analytic: 0.0,
            bound: 0.5,
            pass: false,
            baseline_pass: true,
            not_covered: false,
            class: None,
        }
    }

    #[test]
    fn ulps_of_each_dtype() {
        assert_eq!(ulp(Dtype::Bf16, 1.0), 1.0 / 128.0);
        assert_eq!(ulp(Dtype::Bf16, -3.0), 2.0 / 128.0);
        assert_eq!(ulp(Dtype::F32, 1.0), f32::EPSILON as f64);
    }

    #[test]
    fn classes_follow_the_size_in_ulps() {
        // d hidden back in bf16, 3 bf16 ulps off at 0.5 (beyond the half ulp allowed).
        let c = classify(&verdict("grad_hidden", 0.5, 2.5 / 256.0), Dtype::Bf16);
        assert!(c.starts_with("precision: d hidden off by up to 3.0 bf16 ulps"), "{c}");
        // An f32 logp 2 bf16 ulps off: bf16 inside.
        let c = classify(&verdict("logp", -4.0, 2.0 * 4.0 / 128.0), Dtype::F32);
        assert!(c.starts_with("precision: logp off by 131072 f32 ulps = 2.0 bf16 ulps"), "{c}");
        // An f32 entropy 216 f32 ulps off (a chunked kernel's online entropy, seed 9): f32 accuracy, not bf16.
        let c = classify(&verdict("entropy", 8.0, 216.0 * 8.0 * f32::EPSILON as f64), Dtype::F32);
        assert!(c.starts_with("precision: entropy off by 216 f32 ulps, well below one bf16 ulp"), "{c}");
        // 10% off: math.
        let c = classify(&verdict("grad", 2.0, 0.2), Dtype::F32);
        assert!(c.starts_with("math: d logits off by"), "{c}");
        let c = classify(&verdict("grad_zero_rows", 0.0, 1e-3), Dtype::F32);
        assert!(c.starts_with("math: nonzero where the exact value is zero"), "{c}");
    }
}
