//! What kind of wrong a failing quantity is, in one phrase a kernel author
//! can act on: a precision choice (the error is a few units in the last
//! place of the dtype it came back in, or of bf16 inside an f32 result) or
//! a math bug (far above any rounding). At production scale most findings
//! are precision findings; a user reading a failure should know at once
//! which one they face.

use crate::case::Dtype;
use crate::compare::{Category, Class, Hypothesis, Quantity, Verdict};

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

/// Up to this fraction of the terms it is formed from (its scale) an error
/// is consistent with bf16 rounding of them: a few bf16 units (2^-8 each).
const WITHIN_BF16_OF_TERMS: f64 = FEW_ULPS / 256.0;

/// Below this fraction of its terms an error is f32's own (the tolerance's
/// analytic bound, 1024 u).
const WITHIN_F32_OF_TERMS: f64 = 1024.0 / 16_777_216.0;

/// How far the bf16 roundings of docs/conventions.md reach a failing
/// quantity on its case: within those of its terms (the logits, the
/// softmax, d logits), only with a bf16 sum across the chunk boundaries the
/// case's shape spans (a fused gradient across vocabulary blocks or rows),
/// or beyond both.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Bf16Reach {
    /// Within the terms' roundings; the undeclared conventions that account
    /// for it alone (empty: only together).
    Terms(Vec<String>),
    /// Only with a bf16 sum across the chunk boundaries the case spans.
    Accumulation,
    /// Beyond both: not a bf16 rounding's doing.
    Beyond,
}

/// The class of a failing verdict on a quantity returned in `returned`
/// (gradients: the implementation's gradient dtype; loss and aux: f32), on
/// a case whose inputs are `inputs`; `logp_exact`: the implementation
/// returned its logp and it passed; `reach`: how far the bf16 roundings
/// reach the quantity on this case (None where that was not asked).
///
/// Precision or math is decided by what bf16 rounding could do to the
/// quantity on this case: the conventions' allowances, computed from the
/// exact values (bf16 logits at an offset of -1000 move a log-prob of
/// -0.35 by all of it, and that is rounding; a dropped vocabulary tile
/// takes all of a d lm_head column whose softmax mass is small, and no
/// rounding of the logits can: for a gradient, whose allowance adds
/// absolute values over a sum, being within it is not enough, and the
/// error must also be a few bf16 ulps of the value). A rounding is named
/// only where the case allows it: accumulation across vocabulary blocks
/// or rows only where the case spans two of them and the error needs the
/// sum (one token in one block has nothing to accumulate). Without that
/// judgement (a shrink step), by the error against the element's scale.
/// On f32 inputs a bf16 intermediate shows in the logits or the
/// log-softmax, so a loss or per-token loss off by more than f32 rounding
/// while the implementation's own logp is exact is a formula or a term,
/// however small (Unsloth's KL clamped after the ratio where SPEC clamps
/// before; a KL added with the wrong sign at a small beta), and is math.
/// What size alone cannot tell: on bf16 inputs, a wrong term within what
/// bf16 rounding can move reads as precision.
pub fn classify(v: &Verdict, returned: Dtype, inputs: Dtype, logp_exact: bool, reach: Option<Bf16Reach>) -> Class {
    let precision = |hypothesis: Option<Hypothesis>, phrase: String| Class { category: Category::Precision, hypothesis, phrase };
    if v.err.is_infinite() || v.abs_err.is_nan() {
        return Class {
            category: Category::Math,
            hypothesis: None,
            phrase: "not finite where the oracle is (an overflow, 0/0, a -inf identity or a masked value leaking)".into(),
        };
    }
    if v.want == 0.0 {
        return Class {
            category: Category::Math,
            hypothesis: None,
            phrase: "nonzero where the exact value is zero (a masked, clipped or padded element that should carry nothing)".into(),
        };
    }
    let gradient = v.quantity.is_gradient();
    // A bf16 gradient's error is measured beyond its own output rounding:
    // put that back to speak of the whole error in ulps.
    let raw = if gradient && returned == Dtype::Bf16 { v.abs_err + 0.5 * ulp(Dtype::Bf16, v.want) } else { v.abs_err };
    let what = v.quantity.spoken();
    let in_returned = raw / ulp(returned, v.want);
    let in_bf16 = raw / ulp(Dtype::Bf16, v.want);
    let relative = raw / v.want.abs();
    // |impl - oracle| over the element's scale: a fraction of its terms.
    let of_terms = v.err;
    let loss_level = v.quantity.is_loss_level();
    let math = |why: &str| Class {
        category: Category::Math,
        hypothesis: None,
        phrase: format!(
            "{what} off by {in_returned:.3e} {} ulps (relative {relative:.1e}, {of_terms:.1e} of its terms), {why}: \
             a wrong formula, term, index, mask or cotangent",
            returned.name()
        ),
    };
    if reach == Some(Bf16Reach::Beyond) {
        return math("beyond what any bf16 rounding of its terms or sums can move it on this case (docs/conventions.md)");
    }
    // A gradient element is a sum over rows or the vocabulary: its
    // allowances add absolute values where the terms cancel, so for the
    // gradients "within bf16's reach" is necessary, not sufficient, and
    // precision also asks for an error of a few bf16 ulps of the value (a
    // dropped vocabulary tile takes all of a column's d lm_head: math).
    if (gradient && in_bf16 > FEW_ULPS) || (reach.is_none() && of_terms > WITHIN_BF16_OF_TERMS) {
        return math("far above rounding");
    }
    // On bf16 inputs an error one undeclared bf16 rounding alone accounts
    // for is named as that rounding, however small: it is the likelier cause.
    let one_bf16_rounding = inputs == Dtype::Bf16 && matches!(&reach, Some(Bf16Reach::Terms(alone)) if !alone.is_empty());
    if in_bf16 < BELOW_BF16 && of_terms <= WITHIN_F32_OF_TERMS && !one_bf16_rounding {
        return precision(
            Some(Hypothesis::F32Accuracy),
            format!(
                "{what} off by {in_returned:.0} {} ulps ({of_terms:.1e} of its terms), well below one bf16 unit: \
                 f32 accuracy lost, e.g. cancellation, an online log-sum-exp differentiated through its recurrence \
                 (its rescales in the backward: declare online_lse:columns=C if the kernel does that on purpose), \
                 or a long sum in a poor order",
                returned.name()
            ),
        );
    }
    if inputs == Dtype::F32 && logp_exact && loss_level {
        return math("more than f32 rounding on f32 inputs while its own logp is exact");
    }
    let size = match returned {
        Dtype::Bf16 => format!("{in_bf16:.1} bf16 ulps"),
        // Two significant digits below a tenth ("0.015", not "0.0").
        Dtype::F32 if in_bf16 < 0.1 => format!("{in_returned:.3e} f32 ulps = {in_bf16:.1e} bf16 ulps of its value"),
        Dtype::F32 => format!("{in_returned:.3e} f32 ulps = {in_bf16:.1} bf16 ulps of its value"),
    };
    match (&reach, v.quantity) {
        (Some(Bf16Reach::Accumulation), Quantity::GradHidden) => precision(
            Some(Hypothesis::Bf16AccumulationOverColumns),
            format!(
                "{what} off by {size}, beyond bf16 rounding of its terms and within a bf16 sum \
                 across this case's vocabulary blocks: d hidden carried in bf16 from block to block \
                 (declare bf16_accumulation:d_hidden:columns=C if intended)"
            ),
        ),
        (Some(Bf16Reach::Accumulation), Quantity::GradLmHead) => precision(
            Some(Hypothesis::Bf16AccumulationOverRows),
            format!(
                "{what} off by {size}, beyond bf16 rounding of its terms and within a bf16 sum \
                 across this case's rows: d lm_head carried in bf16 from row to row or token block to token block \
                 (declare bf16_accumulation:d_lm_head:sequences=C or tokens=C if intended)"
            ),
        ),
        (Some(Bf16Reach::Terms(alone)), _) if !alone.is_empty() => precision(
            Some(Hypothesis::Bf16Terms),
            format!(
                "{what} off by {size} ({of_terms:.1e} of its terms), within what {} alone would move it on this case, \
                 undeclared: declare it if the kernel rounds so, else a formula or a term this small",
                alone.join(" or ")
            ),
        ),
        (Some(_), _) => precision(
            Some(Hypothesis::Bf16Terms),
            format!(
                "{what} off by {size} ({of_terms:.1e} of its terms), within what bf16 roundings of its terms together \
                 (logits twice, the temperature, the softmax, d logits twice) move it on this case and beyond any one \
                 of them: more than one undeclared bf16 stage, or a formula or a term this small"
            ),
        ),
        (None, _) => precision(
            None,
            format!(
                "{what} off by {size} ({of_terms:.1e} of its terms): a few bf16 units (not judged against the \
                 roundings' allowances)"
            ),
        ),
    }
}

/// The class of a failing quantity that TF32 products account for (f32
/// fused inputs; docs/conventions.md, `tf32_matmul`): JAX's default f32
/// matmul and Triton's `tl.dot` on NVIDIA GPUs. None for a gradient off by
/// more than a few TF32 ulps of its value: its allowance adds absolute
/// values where terms cancel, so being within it is not enough (as for bf16
/// in `classify`).
pub fn tf32(v: &Verdict) -> Option<Class> {
    let gradient = v.quantity.is_gradient();
    let tf32_ulp = ulp(Dtype::F32, v.want) * 8192.0; // 10 explicit mantissa bits, not 23
    if gradient && v.abs_err / tf32_ulp > FEW_ULPS {
        return None;
    }
    let what = v.quantity.spoken();
    Some(Class {
        category: Category::Precision,
        hypothesis: Some(Hypothesis::Tf32),
        phrase: format!(
        "{what} off by {:.0} f32 ulps ({:.1e} of its terms), consistent with TF32 matmuls (operands rounded to \
         11 significant bits: JAX's default f32 precision and Triton's tl.dot on NVIDIA GPUs): declare tf32_matmul if \
         intended, or compute the products in full f32 (precision=HIGHEST, allow_tf32=False)",
        v.abs_err / ulp(Dtype::F32, v.want),
        v.err
    ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::Quantity;

    fn verdict(quantity: Quantity, want: f64, abs_err: f64) -> Verdict {
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
            allowance_used: None,
        }
    }

    #[test]
    fn ulps_of_each_dtype() {
        assert_eq!(ulp(Dtype::Bf16, 1.0), 1.0 / 128.0);
        assert_eq!(ulp(Dtype::Bf16, -3.0), 2.0 / 128.0);
        assert_eq!(ulp(Dtype::F32, 1.0), f32::EPSILON as f64);
    }

    /// A failing verdict of `quantity` whose value is `want`, off by
    /// `abs_err`, which is `of_terms` of the terms it is formed from.
    fn off(quantity: Quantity, want: f64, abs_err: f64, of_terms: f64) -> Verdict {
        Verdict { err: of_terms, ..verdict(quantity, want, abs_err) }
    }

    #[test]
    fn classes_follow_the_size_against_the_terms() {
        let f32_u = f32::EPSILON as f64 / 2.0;
        // d hidden back in bf16, 3 bf16 ulps off at 0.5 (beyond the half ulp allowed).
        let c = classify(&off(Quantity::GradHidden, 0.5, 2.5 / 256.0, 0.01), Dtype::Bf16, Dtype::Bf16, false, None).to_string();
        assert!(c.starts_with("precision: d hidden off by 3.0 bf16 ulps"), "{c}");
        // An f32 logp 2 bf16 ulps off: bf16 inside.
        let c = classify(&off(Quantity::Logp, -4.0, 2.0 * 4.0 / 128.0, 0.004), Dtype::F32, Dtype::F32, false, None).to_string();
        assert!(c.starts_with("precision: logp off by 1.311e5 f32 ulps = 2.0 bf16 ulps"), "{c}");
        // A loss a sliver of a bf16 unit off says how small a sliver.
        let c = classify(&off(Quantity::Loss, 4.0, 1011.0 * 4.0 * f32::EPSILON as f64 / 2.0, 1e-5), Dtype::F32, Dtype::Bf16, false, Some(Bf16Reach::Terms(vec!["bf16_logits".into()]))).to_string();
        assert!(c.contains("5.055e2 f32 ulps = 7.7e-3 bf16 ulps"), "{c}");
        // The same sizes judged against the roundings on their case.
        let hypothesis = |q, reach: Bf16Reach| classify(&off(q, 0.5, 2.5 / 256.0, 0.01), Dtype::Bf16, Dtype::Bf16, false, Some(reach)).hypothesis;
        assert_eq!(hypothesis(Quantity::GradHidden, Bf16Reach::Terms(vec![])), Some(Hypothesis::Bf16Terms));
        assert_eq!(hypothesis(Quantity::GradHidden, Bf16Reach::Accumulation), Some(Hypothesis::Bf16AccumulationOverColumns));
        assert_eq!(hypothesis(Quantity::GradLmHead, Bf16Reach::Accumulation), Some(Hypothesis::Bf16AccumulationOverRows));
        assert_eq!(hypothesis(Quantity::GradHidden, Bf16Reach::Beyond), None);
        // An f32 entropy 216 f32 ulps off (a chunked kernel's online entropy, seed 9): f32 accuracy, not bf16.
        let c = classify(&off(Quantity::Entropy, 8.0, 216.0 * 8.0 * f32::EPSILON as f64, 100.0 * f32_u), Dtype::F32, Dtype::F32, false, None).to_string();
        assert!(c.starts_with("precision: entropy off by 216 f32 ulps"), "{c}");
        // 10% of its terms: math.
        let c = classify(&off(Quantity::Grad, 2.0, 0.2, 0.1), Dtype::F32, Dtype::F32, false, None).to_string();
        assert!(c.starts_with("math: d logits off by"), "{c}");
        let c = classify(&verdict(Quantity::GradZeroRows, 0.0, 1e-3), Dtype::F32, Dtype::F32, false, None).to_string();
        assert!(c.starts_with("math: nonzero where the exact value is zero"), "{c}");
    }

    /// The two labels that checking Unsloth found wrong
    /// (examples/unsloth/repros/): bf16 logits at an offset of -1000 move a
    /// log-prob by all of its value and a sliver of its terms (precision),
    /// and a KL clamped after the ratio moves an f32 loss by 0.3 bf16 ulps
    /// while the logp is exact (math).
    #[test]
    fn offset_bf16_logits_are_precision_and_a_clamp_order_is_math() {
        let c = classify(&off(Quantity::Logp, -0.3476, 0.3476, 3.361e-5), Dtype::F32, Dtype::Bf16, false, None).to_string();
        assert!(c.starts_with("precision: logp off by"), "{c}");
        let c = classify(&off(Quantity::Loss, 1434.0, 0.5081, 3.555e-4), Dtype::F32, Dtype::F32, true, None).to_string();
        assert!(c.starts_with("math: loss off by"), "{c}");
        // A d lm_head element dropped whole, 1e-4 of its scale: no bf16
        // rounding moves it so far (gradcheck's tail-block kernel at V = 151936).
        let c = classify(&off(Quantity::GradLmHead, 1.012e-4, 1.012e-4, 9.8e-5), Dtype::Bf16, Dtype::Bf16, false, Some(Bf16Reach::Beyond)).to_string();
        assert!(c.starts_with("math: d lm_head off by"), "{c}");
        let c = classify(&off(Quantity::GradLmHead, 1.012e-4, 1.012e-4, 9.8e-5), Dtype::Bf16, Dtype::Bf16, false, Some(Bf16Reach::Terms(vec![]))).to_string();
        assert!(c.starts_with("math: d lm_head off by"), "a gradient needs its value's ulps too: {c}");
        // Without a returned logp the same numbers cannot rule rounding out.
        let c = classify(&off(Quantity::Loss, 1434.0, 0.5081, 3.555e-4), Dtype::F32, Dtype::F32, false, None).to_string();
        assert!(c.starts_with("precision: loss off by"), "{c}");
    }
}
