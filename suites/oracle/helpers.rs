//! What the oracle's self-checks share: comparing two values relative to a
//! case's scales, and those scales (the gradient's natural magnitude, the
//! loss's terms), one definition each for SPEC v1 and v2 cases.

use grpo_oracle::{Forward, TemperatureMode};
use proptest::test_runner::TestCaseError;

pub(super) fn close(a: f64, b: f64, rel: f64, scale: f64, what: &str) -> Result<(), TestCaseError> {
    if scale.is_nan() {
        return Err(TestCaseError::fail(format!("{what}: {a:e} vs {b:e} with a NaN scale (a NaN coefficient)")));
    }
    if (a - b).abs() <= rel * (scale + a.abs().max(b.abs())) {
        Ok(())
    } else {
        Err(TestCaseError::fail(format!("{what}: {a:e} vs {b:e} (diff {:e})", (a - b).abs())))
    }
}

/// The largest |dz''/dz| of the logit transform (1 without one).
pub(super) fn gain(fwd: &Forward<'_>) -> f64 {
    fwd.transform_gain()
}

/// The gradient's natural magnitude: max over rows of |cot| gain (w
/// (|c_policy| + |c_kl| + terms) / tau + entropy_coef w_ent (1 + H) s),
/// with `terms` the size of what the coefficients are summed from (the
/// oracle's bound: |A| r, beta r (|kl| + |d| + ...)): they can cancel, as
/// straight-through |d| times the ratio does for d > 0. Elements far below
/// it are cancellation noise, so comparisons are relative to it.
pub(super) fn natural_scale(fwd: &Forward<'_>, cot: f64) -> f64 {
    let h = &fwd.hparams;
    let ec = h.effective_entropy_coef(&fwd.config);
    fwd.tokens
        .iter()
        .enumerate()
        .filter(|(_, t)| !t.masked)
        .map(|(i, t)| {
            let terms = fwd.coefficient_sensitivity(i, 0.0).1;
            let logp = t.weight * (t.policy_interval.max_abs() + t.kl_coef.abs() + terms) / h.temperature;
            let entropy = ec * t.entropy_weight * (1.0 + t.entropy) * fwd.entropy_scale();
            cot.abs() * gain(fwd) * (logp + entropy)
        })
        .fold(1e-300, f64::max)
}

/// The scale the loss's rounding is relative to: its terms, and how much a
/// rounding of logp (relative to the log-sum-exp it subtracts) moves them.
pub(super) fn loss_scale(fwd: &Forward<'_>) -> f64 {
    let h = &fwd.hparams;
    let ec = h.effective_entropy_coef(&fwd.config);
    let logp_mode = if fwd.config.temperature_mode == TemperatureMode::Logp { 1.0 / h.temperature } else { 1.0 };
    fwd.tokens
        .iter()
        .filter(|t| !t.masked)
        .map(|t| {
            let sensitivity = t.weight * (t.policy_interval.max_abs() + t.kl_coef.abs()) + ec * t.entropy_weight * (1.0 + t.entropy);
            let terms = t.weight * t.per_token_loss.abs() + ec * t.entropy_weight * t.entropy;
            terms + sensitivity * (1.0 + (t.softmax.lse.abs() + t.x_chosen.abs()) * logp_mode)
        })
        .sum::<f64>()
        + 1e-300
}
