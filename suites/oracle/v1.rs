//! SPEC v1's self-checks on the logits kind: the gradient against central
//! finite differences away from kinks, and the metamorphic identities
//! docs/spec.md implies, on generated cases.

use crate::common;
use super::helpers::*;


use std::sync::atomic::{AtomicU32, Ordering};

use grpo_oracle::{kink_interval, Aggregation, Forward, LogitsProblem, TemperatureMode};
use grpo_verify::case::{Case, CaseSpec, Inputs, Kind, MaskPattern};
use grpo_verify::case::strategy::case_spec;
use libtest_mimic::{Failed, Trial};
use proptest::test_runner::TestCaseError;

/// A case's inputs with the logits widened to f64, so they can be perturbed.
#[derive(Clone)]
pub(super) struct Owned {
    pub(super) case: Case,
    pub(super) logits: Vec<f64>,
}

impl Owned {
    pub(super) fn new(case: Case) -> Self {
        let logits = match &case.inputs {
            Inputs::Logits { logits } => logits.iter().map(|&z| z as f64).collect(),
            Inputs::Fused { .. } => unreachable!("logits-kind cases only"),
        };
        Owned { case, logits }
    }
    pub(super) fn problem(&self) -> LogitsProblem<'_, f64> {
        self.case.logits_problem(&self.logits)
    }
    pub(super) fn loss(&self) -> f64 {
        self.problem().forward().expect("valid case").loss
    }
}

/// Runs `property` on generated cases; a failure reports the shrunk case.
/// For a property that checks every case it is given: one that can skip its
/// check takes [`counted_property`].
pub(super) fn property(name: &str, default_cases: u32, property: fn(&CaseSpec) -> Result<(), TestCaseError>) -> Trial {
    crate::common::trial(name, move || {
        let mut runner = common::runner(common::cases(default_cases));
        runner
            .run(&case_spec(&common::small_bounds()), |spec| property(&spec))
            .map_err(|e| Failed::from(format!("{e}")))
    })
}

/// What a case of a counted property did: `Ok(true)` when it reached the
/// check the property is named for, `Ok(false)` when it skipped it (a case
/// the check does not hold on, e.g. a token on a kink), `Err` when a check
/// failed.
pub(super) type Checked = Result<bool, TestCaseError>;

/// How many of a counted property's cases must reach its check: at least
/// `cases * num / den` (rounded up) of the cases run, for the reason `why`.
/// Stated as a fraction so that it scales with `GRPO_VERIFY_TEST_CASES`.
#[derive(Clone, Copy)]
pub(super) struct Minimum {
    pub(super) num: u32,
    pub(super) den: u32,
    /// What a case that counts has checked.
    pub(super) check: &'static str,
    pub(super) why: &'static str,
}

impl Minimum {
    pub(super) fn of(&self, cases: u32) -> u32 {
        (cases * self.num).div_ceil(self.den)
    }
}

/// Runs `property` like [`property`] and counts the cases that reached its
/// check; fails, saying "checked only N of M cases", when fewer than
/// `minimum` did: a property whose cases all skip their check would pass
/// having checked nothing (as `oracle_v2`'s `property` does for SPEC v2).
pub(super) fn counted_property(name: &str, default_cases: u32, minimum: Minimum, property: fn(&CaseSpec) -> Checked) -> Trial {
    crate::common::trial(name, move || {
        let cases = common::cases(default_cases);
        let checked = AtomicU32::new(0);
        let mut runner = common::runner(cases);
        runner
            .run(&case_spec(&common::small_bounds()), |spec| {
                if property(&spec)? {
                    checked.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            })
            .map_err(|e| Failed::from(format!("{e}")))?;
        let (checked, need) = (checked.into_inner(), minimum.of(cases));
        if checked < need {
            return Err(format!(
                "checked only {checked} of {cases} cases: {}; the minimum is {need} ({}/{} of the cases: {})",
                minimum.check, minimum.num, minimum.den, minimum.why
            )
            .into());
        }
        Ok(())
    })
}

/// Is any token unmasked? With none, the loss and every gradient are 0 by
/// definition, so comparing them checks nothing.
pub(super) fn live(fwd: &Forward<'_>) -> bool {
    fwd.tokens.iter().any(|t| !t.masked)
}

/// `a`'s gradient and `b`'s (through `of_b`) agree to `rel` of `a`'s
/// natural scale; the case counts when some token of `a` is live.
pub(super) fn same_gradients(a: &Forward<'_>, b: &Forward<'_>, of_b: impl Fn(f64) -> f64, rel: f64) -> Checked {
    let scale = natural_scale(a, 1.0);
    for (x, y) in a.grad(1.0).iter().zip(&b.grad(1.0)) {
        close(*x, of_b(*y), rel, scale, "grad")?;
    }
    Ok(live(a))
}

/// Is any unmasked token within `slack` (log-ratio) of a kink?
pub(super) fn near_kink(fwd: &Forward<'_>, slack: f64) -> bool {
    let h = &fwd.hparams;
    let delta = h.effective_delta(&fwd.config);
    fwd.tokens.iter().any(|t| {
        !t.masked && !kink_interval(t.log_ratio, t.advantage, h.eps_low, h.eps_high, delta, slack).is_point()
    })
}

/// At least a fifth of the cases (10 of the default 48). About half skip:
/// the ratio draws put tokens exactly on a clip edge (Mixed, OnEdges), and
/// up to B T = 48 tokens make one within 1e-4 of a kink likely. Measured 14
/// to 32 of 48 over GRPO_VERIFY_TEST_SEED 0..200 (20 at the default seed 0).
pub(super) const FINITE_DIFFERENCES_MIN: Minimum = Minimum {
    num: 1,
    den: 5,
    check: "the gradient compared with central differences (no token within 1e-4 of a kink, some token live)",
    why: "about half the cases have a token near a kink; 14 to 32 of 48 over seeds 0..200",
};

/// The oracle's gradient against central differences: a case counts when at
/// least one element was compared (no token within 1e-4 of a kink, and some
/// token live).
pub(super) fn finite_differences(spec: &CaseSpec) -> Checked {
    let mut spec = spec.clone();
    // On-policy, old = stop_gradient(logp) cannot be perturbed: see `on_policy_is_off_policy_at_logp`.
    spec.config.on_policy = false;
    let owned = Owned::new(spec.materialize(Kind::Logits));
    let problem = owned.problem();
    let fwd = problem.forward().expect("valid");
    if near_kink(&fwd, 1e-4) {
        return Ok(false);
    }
    let cot = owned.case.cotangent;
    let grad = fwd.grad(cot);
    let v_ = owned.case.shape.vocab;
    let natural = natural_scale(&fwd, cot);
    // f64 rounding noise of a central difference: the loss's rounding (its
    // terms subtract log-sum-exps of size max|x|) divided by the step.
    let step = 1e-5 * owned.case.hparams.temperature.min(1.0);
    let max_x = owned.logits.iter().fold(0.0f64, |m, z| m.max(z.abs())) / owned.case.hparams.temperature;
    let noise = 64.0 * f64::EPSILON * (1.0 + max_x) * (loss_scale(&fwd) + natural) * cot.abs() / step;
    // Each unmasked row: the chosen column and two others.
    let mut probe = owned.clone();
    let mut compared = 0;
    for (row, st) in fwd.tokens.iter().enumerate().filter(|(_, s)| !s.masked).take(6) {
        for v in [st.chosen, (st.chosen + 1) % v_, (row * 7919) % v_] {
            let i = row * v_ + v;
            // The loss varies on the scale of tau: the step is relative to it.
            let fd = cot
                * common::central_difference(owned.logits[i], step, |value| {
                    probe.logits[i] = value;
                    probe.loss()
                });
            close(grad[i], fd, 1e-5, natural * 1e-4 + noise / 1e-5, &format!("d loss / d logits[{row}, {v}]"))?;
            compared += 1;
        }
    }
    Ok(compared > 0)
}

/// At least a quarter of the cases (12 of the default 48). A case skips
/// when r = 1 is a kink: a clip edge at 1 (eps_low or eps_high drawn 0,
/// one of their special values). Measured 18 to 39 of 48 over
/// GRPO_VERIFY_TEST_SEED 0..200 (28 at the default seed 0).
pub(super) const ON_POLICY_MIN: Minimum = Minimum {
    num: 1,
    den: 4,
    check: "the on- and off-policy gradients compared (r = 1 on no kink, some token live)",
    why: "r = 1 is a kink whenever an eps is drawn 0, about a third of the cases; 18 to 39 of 48 over seeds 0..200",
};

/// The loss is compared on every case; a case counts when the gradients were
/// compared too (r = 1 on no edge, and some token live).
pub(super) fn on_policy_is_off_policy_at_logp(spec: &CaseSpec) -> Checked {
    let mut spec = spec.clone();
    spec.config.on_policy = true;
    let on = Owned::new(spec.materialize(Kind::Logits));
    let p_fwd_on = on.problem();
    let fwd_on = p_fwd_on.forward().expect("valid");
    // old = logp exactly where f32 can hold it: the ratio is then 1 up to f32 rounding.
    let mut off = on.clone();
    off.case.config.on_policy = false;
    off.case.old_logp = Some(fwd_on.tokens.iter().map(|t| t.logp as f32).collect());
    let p_fwd_off = off.problem();
    let fwd_off = p_fwd_off.forward().expect("valid");
    // f32 rounding of old moves r by up to |logp| 2^-24.
    let max_logp = fwd_on.tokens.iter().filter(|t| !t.masked).fold(0.0f64, |m, t| m.max(t.logp.abs()));
    let rel = 4.0 * (1.0 + max_logp) / 16_777_216.0;
    close(fwd_on.loss, fwd_off.loss, rel, loss_scale(&fwd_on), "loss")?;
    if near_kink(&fwd_off, 1e-6) || near_kink(&fwd_on, 1e-6) {
        return Ok(false); // r = 1 on an edge (eps = 0): either side is admissible
    }
    same_gradients(&fwd_on, &fwd_off, |g| g, rel)
}

/// At least half the cases (24 of the default 48): only tokens exactly on a
/// kink (1e-9) or a fully masked batch skip the gradient comparison.
/// Measured 29 to 44 of 48 over GRPO_VERIFY_TEST_SEED 0..200 (33 at the
/// default seed 0).
pub(super) const ROW_SHIFT_MIN: Minimum = Minimum {
    num: 1,
    den: 2,
    check: "the shifted and unshifted gradients compared (no token within 1e-9 of a kink, some token live)",
    why: "only a token exactly on an edge or a fully masked batch skips; 29 to 44 of 48 over seeds 0..200",
};

/// The loss is compared on every case; a case counts when the gradients were
/// compared too (no token within 1e-9 of a kink, and some token live).
pub(super) fn row_shift_changes_nothing(spec: &CaseSpec) -> Checked {
    let base = Owned::new(spec.materialize(Kind::Logits));
    let mut shifted = base.clone();
    let v_ = base.case.shape.vocab;
    for (row, chunk) in shifted.logits.chunks_mut(v_).enumerate() {
        // A power of two: the shift is exact in f64 for these magnitudes.
        let c = [0.0, 64.0, -1024.0, 8.0][row % 4];
        chunk.iter_mut().for_each(|z| *z += c);
    }
    let (p_base, p_shifted) = (base.problem(), shifted.problem());
    let (fa, fb) = (p_base.forward().unwrap(), p_shifted.forward().unwrap());
    close(fa.loss, fb.loss, 1e-12, loss_scale(&fa), "loss")?;
    if near_kink(&fa, 1e-9) {
        return Ok(false); // a rounding-sized move may switch the branch on an edge
    }
    same_gradients(&fa, &fb, |g| g, 1e-10)
}

/// At least half the cases (24 of the default 48), as for
/// [`ROW_SHIFT_MIN`]: the same skip. Measured 29 to 44 of 48 over
/// GRPO_VERIFY_TEST_SEED 0..200 (32 at the default seed 0).
pub(super) const TEMPERATURE_MIN: Minimum = Minimum {
    num: 1,
    den: 2,
    check: "the gradients at tau and at logits / tau compared (no token within 1e-9 of a kink, some token live)",
    why: "only a token exactly on an edge or a fully masked batch skips; 29 to 44 of 48 over seeds 0..200",
};

/// The loss, logp and entropy are compared on every case; a case counts when
/// the gradients were compared too (no token within 1e-9 of a kink, and
/// some token live).
pub(super) fn temperature_is_scaling_of_logits(spec: &CaseSpec) -> Checked {
    let mut spec = spec.clone();
    spec.config.temperature_mode = TemperatureMode::Logits;
    let a = Owned::new(spec.materialize(Kind::Logits));
    let tau = a.case.hparams.temperature;
    let mut b = a.clone();
    b.logits.iter_mut().for_each(|z| *z /= tau);
    b.case.hparams.temperature = 1.0;
    let (p_a, p_b) = (a.problem(), b.problem());
    let (fa, fb) = (p_a.forward().unwrap(), p_b.forward().unwrap());
    close(fa.loss, fb.loss, 1e-12, loss_scale(&fa), "loss")?;
    for (ta, tb) in fa.tokens.iter().zip(&fb.tokens).filter(|(t, _)| !t.masked) {
        close(ta.logp, tb.logp, 1e-9, 1e-9, "logp")?;
        close(ta.entropy, tb.entropy, 1e-9, 1e-9, "entropy")?;
    }
    if near_kink(&fa, 1e-9) {
        return Ok(false); // a rounding-sized move may switch the branch on an edge
    }
    // d/dz = (1/tau) d/d(z/tau).
    same_gradients(&fa, &fb, |g| g / tau, 1e-10)
}

/// At least half the cases (24 of the default 48). A case with no masked
/// token (a Full mask, or padding that happens to be empty) leaves nothing
/// to junk, and its comparison holds trivially. Measured 29 to 43 of 48
/// over GRPO_VERIFY_TEST_SEED 0..200 (35 at the default seed 0).
pub(super) const MASKED_INPUTS_MIN: Minimum = Minimum {
    num: 1,
    den: 2,
    check: "a case with a masked token, its inputs junked",
    why: "a case without a masked token has nothing to junk; 29 to 43 of 48 over seeds 0..200",
};

/// Junk under the mask (token -100, logits 1e4, old/ref -1e9) changes
/// neither the loss (bit for bit) nor any gradient. A case counts when it
/// has a masked token: without one there is nothing to junk.
pub(super) fn masked_inputs_do_not_matter(spec: &CaseSpec) -> Checked {
    let base = Owned::new(spec.materialize(Kind::Logits));
    let mut junk = base.clone();
    let v_ = base.case.shape.vocab;
    for i in (0..base.case.mask.len()).filter(|&i| base.case.mask[i] == 0.0) {
        junk.case.tokens[i] = -100;
        junk.logits[i * v_..(i + 1) * v_].iter_mut().for_each(|z| *z = 1e4);
        for arr in [junk.case.old_logp.as_mut(), junk.case.ref_logp.as_mut()].into_iter().flatten() {
            arr[i] = -1e9;
        }
    }
    let (p_base, p_junk) = (base.problem(), junk.problem());
    let (fa, fb) = (p_base.forward().unwrap(), p_junk.forward().unwrap());
    if fa.loss.to_bits() != fb.loss.to_bits() {
        return Err(TestCaseError::fail(format!("loss changed: {} vs {}", fa.loss, fb.loss)));
    }
    let g = fb.grad(base.case.cotangent);
    for i in (0..base.case.mask.len()).filter(|&i| base.case.mask[i] == 0.0) {
        if g[i * v_..(i + 1) * v_].iter().any(|&x| x != 0.0) {
            return Err(TestCaseError::fail(format!("masked row {i} has a non-zero gradient")));
        }
    }
    if !fb.loss.is_finite() || g.iter().any(|x| !x.is_finite()) {
        return Err(TestCaseError::fail("non-finite output"));
    }
    Ok(base.case.mask.iter().any(|&m| m == 0.0))
}

pub(super) fn seq_mean_equals_token_mean_at_equal_counts(spec: &CaseSpec) -> Result<(), TestCaseError> {
    let mut spec = spec.clone();
    spec.mask = MaskPattern::Full;
    spec.config.aggregation = Aggregation::TokenMean;
    let a = Owned::new(spec.materialize(Kind::Logits));
    let mut b = a.clone();
    b.case.config.aggregation = Aggregation::SeqMeanTokenMean;
    close(a.loss(), b.loss(), 1e-12, 1e-12, "token_mean vs seq_mean_token_mean")
}

pub(super) fn sum_over_constant_is_linear_in_inverse_normalizer(spec: &CaseSpec) -> Result<(), TestCaseError> {
    let mut spec = spec.clone();
    spec.config.aggregation = Aggregation::SumOverConstant;
    let a = Owned::new(spec.materialize(Kind::Logits));
    let mut b = a.clone();
    b.case.hparams.normalizer = a.case.hparams.normalizer * 3.0;
    let (la, lb) = (a.loss(), b.loss());
    // Each term's weight m / N is rounded on its own, so the two losses may
    // differ by f64 rounding of the terms, not of their sum: where the terms
    // cancel (a loss of 8.5e-10 from terms of ~1e-7, seeds 11 and 141) the
    // loss alone is not the scale.
    let problem = a.problem();
    let fwd = problem.forward().expect("valid case");
    let terms: f64 = fwd.tokens.iter().map(|t| (t.weight * t.per_token_loss).abs()).sum();
    close(la, 3.0 * lb, 1e-12, 1e-12 + terms, "N * loss(N) vs 3N * loss(3N)")
}

/// At least half the cases (24 of the default 48): at B = 1 reversing the
/// batch is the identity and checks nothing. Measured 30 to 43 of 48 over
/// GRPO_VERIFY_TEST_SEED 0..200 (37 at the default seed 0).
pub(super) const BATCH_PERMUTATION_MIN: Minimum = Minimum {
    num: 1,
    den: 2,
    check: "a batch of B >= 2 reversed",
    why: "at B = 1 the reversal is the identity; 30 to 43 of 48 over seeds 0..200",
};

/// Reversing the batch reverses the per-token outputs and keeps the loss.
/// A case counts at B >= 2.
pub(super) fn batch_permutation_permutes_outputs(spec: &CaseSpec) -> Checked {
    let a = Owned::new(spec.materialize(Kind::Logits));
    let (b_, t_, v_) = (a.case.shape.batch, a.case.shape.time, a.case.shape.vocab);
    // Reverse the batch.
    let mut p = a.clone();
    let perm = |b: usize| b_ - 1 - b;
    for b in 0..b_ {
        let src = perm(b);
        p.case.advantages[b] = a.case.advantages[src];
        for t in 0..t_ {
            let (i, j) = (b * t_ + t, src * t_ + t);
            p.case.tokens[i] = a.case.tokens[j];
            p.case.mask[i] = a.case.mask[j];
            for (dst, from) in [(p.case.old_logp.as_mut(), a.case.old_logp.as_ref()), (p.case.ref_logp.as_mut(), a.case.ref_logp.as_ref())] {
                if let (Some(d), Some(f)) = (dst, from) {
                    d[i] = f[j];
                }
            }
            p.logits[i * v_..(i + 1) * v_].copy_from_slice(&a.logits[j * v_..(j + 1) * v_]);
        }
    }
    let (p_a, p_p) = (a.problem(), p.problem());
    let (fa, fp) = (p_a.forward().unwrap(), p_p.forward().unwrap());
    close(fa.loss, fp.loss, 1e-12, 1e-12, "loss")?;
    for b in 0..b_ {
        for t in 0..t_ {
            let (x, y) = (&fp.tokens[b * t_ + t], &fa.tokens[perm(b) * t_ + t]);
            if x.masked != y.masked || (!x.masked && (x.logp != y.logp || x.per_token_loss != y.per_token_loss)) {
                return Err(TestCaseError::fail(format!("token ({b}, {t}) is not the permuted one")));
            }
        }
    }
    Ok(b_ >= 2)
}

/// Row b of a case as a B = 1 problem of its own.
pub(super) fn single_row(a: &Owned, b: usize) -> Owned {
    let (t_, v_) = (a.case.shape.time, a.case.shape.vocab);
    let mut one = a.clone();
    let rows = b * t_..(b + 1) * t_;
    one.case.shape.batch = 1;
    one.case.advantages = vec![a.case.advantages[b]];
    one.case.tokens = a.case.tokens[rows.clone()].to_vec();
    one.case.mask = a.case.mask[rows.clone()].to_vec();
    one.case.old_logp = a.case.old_logp.as_ref().map(|o| o[rows.clone()].to_vec());
    one.case.ref_logp = a.case.ref_logp.as_ref().map(|r| r[rows.clone()].to_vec());
    one.logits = a.logits[b * t_ * v_..(b + 1) * t_ * v_].to_vec();
    one
}

/// seq_mean_token_mean = (1/B) sum_b token_mean(row b alone), and
/// token_mean = sum_b n_b token_mean(row b) / max(sum_b n_b, 1): the
/// aggregations decompose over rows with their own valid counts.
pub(super) fn aggregations_decompose_over_rows(spec: &CaseSpec) -> Result<(), TestCaseError> {
    let mut spec = spec.clone();
    spec.config.aggregation = Aggregation::TokenMean;
    let a = Owned::new(spec.materialize(Kind::Logits));
    let b_ = a.case.shape.batch;
    let rows: Vec<(f64, f64)> = (0..b_)
        .map(|b| {
            let one = single_row(&a, b);
            (one.loss(), one.case.mask.iter().map(|&m| m as f64).sum())
        })
        .collect();
    let total: f64 = rows.iter().map(|r| r.1).sum();
    let token_mean = rows.iter().map(|(l, n)| l * n).sum::<f64>() / total.max(1.0);
    let pa = a.problem();
    let scale = loss_scale(&pa.forward().unwrap());
    close(a.loss(), token_mean, 1e-12, scale, "token_mean vs its row decomposition")?;
    let mut s = a.clone();
    s.case.config.aggregation = Aggregation::SeqMeanTokenMean;
    let seq_mean = rows.iter().map(|r| r.0).sum::<f64>() / b_ as f64;
    close(s.loss(), seq_mean, 1e-12, scale * b_ as f64, "seq_mean_token_mean vs (1/B) sum of row token means")
}

pub(super) fn fully_masked_batch_is_zero(spec: &CaseSpec) -> Result<(), TestCaseError> {
    let mut spec = spec.clone();
    spec.mask = MaskPattern::FullyMaskedBatch;
    let a = Owned::new(spec.materialize(Kind::Logits));
    let pa = a.problem();
    let f = pa.forward().unwrap();
    if f.loss != 0.0 || f.grad(a.case.cotangent).iter().any(|&g| g != 0.0) {
        return Err(TestCaseError::fail(format!("loss {} or a gradient is not exactly 0", f.loss)));
    }
    Ok(())
}

pub(super) fn kink_intervals() -> Result<(), Failed> {
    let (el, eh, delta) = (0.2, 0.28, 3.0);
    for a in [1.5, -0.7] {
        // Strictly inside the band: one slope, -A r.
        let iv = kink_interval(0.05f64, a, el, eh, delta, 0.0);
        assert!(iv.is_point() && (iv.lo + a * 0.05f64.exp()).abs() < 1e-12, "{iv:?}");
        // On each edge: the hull of 0 and -A r (clip and min are not differentiable there).
        for edge in [1.0 - el, 1.0 + eh] {
            let iv = kink_interval(f64::ln(edge), a, el, eh, delta, 0.0);
            let c = -a * edge;
            assert!(iv.lo <= c.min(0.0) + 1e-12 && iv.hi >= c.max(0.0) - 1e-12, "A={a} edge {edge}: {iv:?}");
        }
    }
    // Clipped side for A > 0 above the band: exactly 0.
    assert_eq!(kink_interval(f64::ln(2.0), 1.0, el, eh, delta, 0.0), grpo_oracle::KinkInterval { lo: 0.0, hi: 0.0 });
    // A < 0 above delta: the unclipped branch is min(r, delta) A, flat: 0.
    assert_eq!(kink_interval(f64::ln(4.0), -1.0, el, eh, delta, 0.0), grpo_oracle::KinkInterval { lo: 0.0, hi: 0.0 });
    // A < 0 below the band: clipped, 0; A < 0 between band and delta: -A r.
    assert_eq!(kink_interval(f64::ln(0.5), -1.0, el, eh, delta, 0.0).hi, 0.0);
    let iv = kink_interval(f64::ln(2.0), -1.0, el, eh, delta, 0.0);
    assert!((iv.lo - 2.0).abs() < 1e-12 && iv.is_point(), "{iv:?}");
    Ok(())
}
