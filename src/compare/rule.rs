//! The tolerance rule of docs/spec.md, "What correct means", as constants and a
//! verdict: err_impl <= 2 * min(err_baseline, analytic) + floor per quantity,
//! with the baseline held to `analytic`; the measured errors it judges
//! ([`Errors`]) and how one quantity's worst error is kept ([`QuantityError`]).

use serde::Serialize;

/// f32 unit roundoff.
pub const U32: f64 = 1.0 / 16_777_216.0;
/// bf16 unit roundoff.
pub const BF16_U: f64 = 1.0 / 256.0;
/// How far an implementation's ratio may sit from the one its returned logp
/// gives, in f32 units of |logp| + |old|: exp(logp - old) formed in f32 is a
/// subtraction and an exp, a few units; 16 leaves room for a kernel that
/// forms logp once more in another order.
pub const RATIO_MARGIN_U32: f64 = 16.0;
/// How far rounding an f32 result to bf16 can have moved it, given the bf16
/// value `g` it was rounded to: half the spacing of bf16 values at `g`
/// (8 significant bits; subnormals spaced as at the smallest normal).
pub fn bf16_half_ulp(g: f32) -> f64 {
    let exponent = ((g.to_bits() >> 23) & 0xff) as i32 - 127;
    // 2^(e - 8) written as f64 exponent bits (e - 8 >= -134: a normal f64).
    f64::from_bits(((exponent.max(-126) - 8 + 1023) as u64) << 52)
}

/// |got - want|, less the bf16 output rounding when the gradient came back
/// in bf16 (non-finite differences pass through).
pub fn gradient_diff(got: f32, want: f64, bf16: bool) -> f64 {
    let diff = (got as f64 - want).abs();
    if bf16 && diff.is_finite() {
        (diff - bf16_half_ulp(got)).max(0.0)
    } else {
        diff
    }
}

/// A difference less an allowance (a declared convention's, a rounding's
/// that the rule admits), never below 0; non-finite differences pass
/// through, unless the allowance is unbounded (infinite or NaN: a
/// convention that lets the element overflow f32) and admits anything.
pub fn beyond(diff: f64, allowance: f64) -> f64 {
    if !(allowance < f64::INFINITY) {
        0.0
    } else if diff.is_finite() {
        (diff - allowance).max(0.0)
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
        // Calibration (docs/figures.md): over 5000 generated cases the
        // reference's worst normalised error is 22 u (entropy); its bf16
        // gradients, up to 662 u under the former least-squares kink fit,
        // are within 0.2 u over 1000 bf16 cases with the minimax fit
        // (`kink_fitted_row`). A bf16 log-softmax errs by ~65536 u.
        Tolerance { floor_units: 16.0, analytic_units: 1024.0 }
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
    /// The oracle's value there.
    pub want: f64,
    /// Some element was NaN or infinite where the oracle's is finite.
    pub nonfinite: bool,
    /// Where a declared convention gave an element an allowance: the largest
    /// share of it the element's difference used, |impl - oracle| /
    /// allowance, among differences past f32 noise (how tight the allowance
    /// is: docs/conventions.md, "How tight the allowances are"); 0: none
    /// was past it. None: no element had an allowance.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowance_used: Option<f64>,
}

impl QuantityError {
    pub(super) fn consider(&mut self, diff: f64, scale: f64, want: f64, at: impl FnOnce() -> String) {
        let e = if diff.is_finite() { diff / scale } else { f64::INFINITY };
        if !diff.is_finite() {
            self.nonfinite = true;
        }
        if e > self.err || (self.at.is_empty() && e.is_nan()) {
            self.err = e;
            self.abs_err = diff;
            self.want = want;
            self.at = at();
        }
    }
    /// [`QuantityError::consider`] of `diff` less a declared convention's
    /// `allowance` ([`beyond`]), noting how much of the allowance it used.
    /// Only a difference past f32 noise (the rule's floor, 16 u of the
    /// scale) measures the allowance: below it the element says nothing of
    /// the convention's rounding. Elements with an allowance and only noise
    /// count as 0 used.
    pub(super) fn consider_allowed(&mut self, diff: f64, allowance: f64, scale: f64, want: f64, at: impl FnOnce() -> String) {
        if allowance > 0.0 && allowance.is_finite() && diff.is_finite() {
            let measured = if diff > Tolerance::default().floor_units * U32 * scale { diff / allowance } else { 0.0 };
            self.allowance_used = Some(self.allowance_used.unwrap_or(0.0).max(measured));
        }
        self.consider(beyond(diff, allowance), scale, want, at);
    }
    pub(super) fn merge(mut self, other: QuantityError) -> QuantityError {
        self.nonfinite |= other.nonfinite;
        let used = match (self.allowance_used, other.allowance_used) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        let mut kept = if other.err > self.err { QuantityError { nonfinite: self.nonfinite, ..other } } else { self };
        kept.allowance_used = used;
        kept
    }
}

/// Every quantity's error for one implementation's outputs.
#[derive(Clone, Debug, Serialize)]
pub struct Errors {
    /// The loss's error.
    pub loss: QuantityError,
    /// aux["logp"]'s error (None when not returned).
    pub logp: Option<QuantityError>,
    /// aux["per_token_loss"]'s error (None when not returned).
    pub per_token_loss: Option<QuantityError>,
    /// aux["entropy"]'s error (None when not returned).
    pub entropy: Option<QuantityError>,
    /// d logits (logits kind) or d hidden (fused kind).
    pub grad: QuantityError,
    /// d lm_head (fused kind).
    pub grad_lm_head: Option<QuantityError>,
    /// Rows whose exact gradient is zero (masked, or clipped without KL and entropy).
    pub grad_zero_rows: QuantityError,
    /// Per row of B*T, max |got - want| over the row's gradient (d logits,
    /// or d hidden) over max |want| (the absolute error where want is 0;
    /// 0 at masked rows): the per-token diagnostics.
    #[serde(skip)]
    pub grad_row_errors: Vec<f64>,
}

/// What a verdict judges: the loss, an aux output or a gradient (its wire
/// and report name in snake case: `grad_lm_head`, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Quantity {
    /// The scalar loss.
    Loss,
    /// aux["logp"], the chosen tokens' log-probabilities.
    Logp,
    /// aux["per_token_loss"].
    PerTokenLoss,
    /// aux["entropy"].
    Entropy,
    /// d logits (logits kind).
    Grad,
    /// d hidden (fused kind).
    GradHidden,
    /// d lm_head (fused kind).
    GradLmHead,
    /// The gradient rows that must be exactly zero (masked or padded).
    GradZeroRows,
}

impl Quantity {
    /// Its name in reports and on the wire (`grad_lm_head`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Quantity::Loss => "loss",
            Quantity::Logp => "logp",
            Quantity::PerTokenLoss => "per_token_loss",
            Quantity::Entropy => "entropy",
            Quantity::Grad => "grad",
            Quantity::GradHidden => "grad_hidden",
            Quantity::GradLmHead => "grad_lm_head",
            Quantity::GradZeroRows => "grad_zero_rows",
        }
    }

    /// Returned in the implementation's gradient dtype, and a sum over rows
    /// or the vocabulary.
    pub fn is_gradient(self) -> bool {
        matches!(self, Quantity::Grad | Quantity::GradHidden | Quantity::GradLmHead | Quantity::GradZeroRows)
    }

    /// How a person says it: `d logits`, `d hidden`, `loss`, ...
    pub fn spoken(self) -> &'static str {
        match self {
            Quantity::Grad => "d logits",
            Quantity::GradHidden => "d hidden",
            Quantity::GradLmHead => "d lm_head",
            Quantity::GradZeroRows => "d zero_rows",
            other => other.name(),
        }
    }

    /// The loss itself or its per-token terms.
    pub fn is_loss_level(self) -> bool {
        matches!(self, Quantity::Loss | Quantity::PerTokenLoss)
    }
}

impl std::fmt::Display for Quantity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What kind of wrong a failing quantity is (`classify`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// Far above what rounding can do: a wrong formula, term, index, mask or cotangent.
    Math,
    /// Within what a precision choice (bf16, TF32, f32 accuracy lost) can do.
    Precision,
}

impl Category {
    /// Its name in reports (`math`, `precision`).
    pub fn name(self) -> &'static str {
        match self {
            Category::Math => "math",
            Category::Precision => "precision",
        }
    }
}

/// The rounding a precision class names, each only where the case's shape
/// and platform allow it and the error is within what it can move there
/// (`classify`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Hypothesis {
    /// f32 accuracy lost: well below a bf16 unit of the value.
    F32Accuracy,
    /// bf16 rounding of the logits, the softmax or d logits (any shape).
    Bf16Terms,
    /// d hidden summed across vocabulary blocks in bf16: the case spans
    /// more than one block.
    Bf16AccumulationOverColumns,
    /// d lm_head summed across rows or token blocks in bf16: the case spans
    /// more than one.
    Bf16AccumulationOverRows,
    /// TF32 products: a GPU backend.
    Tf32,
}

/// A failing verdict's class: its category, the rounding it names (None:
/// none, math or a size no hypothesis was asked of) and one phrase a kernel
/// author can act on. Written `category: phrase`; report.json keeps the
/// parts (`category`, `hypothesis`, `phrase`) and that sentence (`text`).
#[derive(Clone, Debug, PartialEq)]
pub struct Class {
    /// Math or precision.
    pub category: Category,
    /// The rounding it names, when one was asked and fits.
    pub hypothesis: Option<Hypothesis>,
    /// What a kernel author can act on, in one phrase.
    pub phrase: String,
}

impl std::fmt::Display for Class {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.category.name(), self.phrase)
    }
}

/// report.json's form of a class: its parts as data, and the sentence the
/// console prints.
impl Serialize for Class {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut out = serializer.serialize_struct("Class", 4)?;
        out.serialize_field("category", &self.category)?;
        out.serialize_field("hypothesis", &self.hypothesis)?;
        out.serialize_field("phrase", &self.phrase)?;
        out.serialize_field("text", &self.to_string())?;
        out.end()
    }
}

/// The verdict on one quantity of one case.
#[derive(Clone, Debug, Serialize)]
pub struct Verdict {
    /// The quantity judged.
    pub quantity: Quantity,
    /// Its error in units of its scale (docs/tolerance.md: |impl - oracle| / scale, worst element).
    pub err: f64,
    /// The same element's |impl - oracle|, unscaled.
    pub abs_err: f64,
    /// Where the worst element is: "b=1 t=7 v=151935".
    pub at: String,
    /// The oracle's value at `at`.
    pub want: f64,
    /// The baseline's error on the same quantity and case (0 when it was not run).
    pub baseline_err: f64,
    /// The rule's floor, in the same units (f32's own noise).
    pub floor: f64,
    /// The analytic bound, in the same units.
    pub analytic: f64,
    /// 2 * min(baseline_err, analytic) + floor.
    pub bound: f64,
    /// err <= bound.
    pub pass: bool,
    /// The baseline is within its analytic bound.
    pub baseline_pass: bool,
    /// The implementation does not return this quantity.
    pub not_covered: bool,
    /// What kind of wrong a failure is (`classify`): precision or math.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub class: Option<Class>,
    /// The largest share of a declared convention's allowance an element
    /// used ([`QuantityError::allowance_used`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowance_used: Option<f64>,
}

/// Applies the rule to every quantity.
pub fn judge(implementation: &Errors, baseline: &Errors, tol: &Tolerance) -> Vec<Verdict> {
    let floor = tol.floor_units * U32;
    let analytic = tol.analytic_units * U32;
    let rule = |quantity: Quantity, got: Option<&QuantityError>, base: Option<&QuantityError>, floor: f64, analytic: f64| {
        let base_err = base.map_or(analytic, |b| b.err);
        let bound = 2.0 * base_err.min(analytic) + floor;
        let (err, abs_err, at, want, nonfinite) =
            got.map_or((0.0, 0.0, String::new(), 0.0, false), |g| (g.err, g.abs_err, g.at.clone(), g.want, g.nonfinite));
        let allowance_used = got.and_then(|g| g.allowance_used);
        Verdict {
            quantity,
            err,
            abs_err,
            at,
            want,
            baseline_err: base_err,
            floor,
            analytic,
            bound,
            pass: !nonfinite && err <= bound,
            baseline_pass: base_err <= analytic,
            not_covered: got.is_none(),
            class: None,
            allowance_used,
        }
    };
    let mut verdicts = vec![
        rule(Quantity::Loss, Some(&implementation.loss), Some(&baseline.loss), floor, analytic),
        rule(Quantity::Logp, implementation.logp.as_ref(), baseline.logp.as_ref(), floor, analytic),
        rule(Quantity::PerTokenLoss, implementation.per_token_loss.as_ref(), baseline.per_token_loss.as_ref(), floor, analytic),
        rule(Quantity::Entropy, implementation.entropy.as_ref(), baseline.entropy.as_ref(), floor, analytic),
        rule(
            if implementation.grad_lm_head.is_some() { Quantity::GradHidden } else { Quantity::Grad },
            Some(&implementation.grad),
            Some(&baseline.grad),
            floor,
            analytic,
        ),
    ];
    if let Some(dw) = &implementation.grad_lm_head {
        verdicts.push(rule(Quantity::GradLmHead, Some(dw), baseline.grad_lm_head.as_ref(), floor, analytic));
    }
    verdicts.extend([
        // Exactly zero in the oracle: zero to the floor, whatever the baseline does.
        rule(Quantity::GradZeroRows, Some(&implementation.grad_zero_rows), None, floor, 0.0),
    ]);
    verdicts
}
