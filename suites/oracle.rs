//! Self-verification of the f64 oracle (no JAX involved): its gradient
//! against central finite differences away from kinks, and the metamorphic
//! identities docs/spec.md implies, on generated cases.

use crate::common;

use std::sync::atomic::{AtomicU32, Ordering};

use grpo_oracle::{kink_interval, Aggregation, Forward, FusedProblem, LogitsProblem, TemperatureMode};
use grpo_verify::case::{Case, CaseSpec, Inputs, Kind, MaskPattern};
use grpo_verify::case::strategy::case_spec;
use libtest_mimic::{Failed, Trial};
use proptest::test_runner::TestCaseError;

/// A case's inputs with the logits widened to f64, so they can be perturbed.
#[derive(Clone)]
struct Owned {
    case: Case,
    logits: Vec<f64>,
}

impl Owned {
    fn new(case: Case) -> Self {
        let logits = match &case.inputs {
            Inputs::Logits { logits } => logits.iter().map(|&z| z as f64).collect(),
            Inputs::Fused { .. } => unreachable!("logits-kind cases only"),
        };
        Owned { case, logits }
    }
    fn problem(&self) -> LogitsProblem<'_, f64> {
        self.case.logits_problem(&self.logits)
    }
    fn loss(&self) -> f64 {
        self.problem().forward().expect("valid case").loss
    }
}

/// Runs `property` on generated cases; a failure reports the shrunk case.
/// For a property that checks every case it is given: one that can skip its
/// check takes [`counted_property`].
fn property(name: &str, default_cases: u32, property: fn(&CaseSpec) -> Result<(), TestCaseError>) -> Trial {
    Trial::test(name, move || {
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
type Checked = Result<bool, TestCaseError>;

/// How many of a counted property's cases must reach its check: at least
/// `cases * num / den` (rounded up) of the cases run, for the reason `why`.
/// Stated as a fraction so that it scales with `GRPO_VERIFY_TEST_CASES`.
#[derive(Clone, Copy)]
struct Minimum {
    num: u32,
    den: u32,
    /// What a case that counts has checked.
    check: &'static str,
    why: &'static str,
}

impl Minimum {
    fn of(&self, cases: u32) -> u32 {
        (cases * self.num).div_ceil(self.den)
    }
}

/// Runs `property` like [`property`] and counts the cases that reached its
/// check; fails, saying "checked only N of M cases", when fewer than
/// `minimum` did: a property whose cases all skip their check would pass
/// having checked nothing (as `oracle_v2`'s `property` does for SPEC v2).
fn counted_property(name: &str, default_cases: u32, minimum: Minimum, property: fn(&CaseSpec) -> Checked) -> Trial {
    Trial::test(name, move || {
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
fn live(fwd: &Forward<'_>) -> bool {
    fwd.tokens.iter().any(|t| !t.masked)
}

fn close(a: f64, b: f64, rel: f64, scale: f64, what: &str) -> Result<(), TestCaseError> {
    if (a - b).abs() <= rel * (scale + a.abs().max(b.abs())) {
        Ok(())
    } else {
        Err(TestCaseError::fail(format!("{what}: {a:e} vs {b:e} (diff {:e})", (a - b).abs())))
    }
}

/// The gradient's natural magnitude: max over rows of
/// |cot| w ((|c_ppo| + |c_kl|) / tau + entropy_coef (1 + H) / tau). Elements
/// far below it are cancellation noise (a flat row's entropy gradient is 0
/// only up to rounding), so comparisons are relative to it.
fn natural_scale(fwd: &Forward<'_>, cot: f64) -> f64 {
    let h = &fwd.hparams;
    let ec = h.effective_entropy_coef(&fwd.config);
    fwd.tokens
        .iter()
        .filter(|t| !t.masked)
        .map(|t| cot.abs() * t.weight * ((t.policy_interval.max_abs() + t.kl_coef.abs()) + ec * (1.0 + t.entropy)) / h.temperature)
        .fold(1e-300, f64::max)
}

/// The scale the loss's rounding is relative to: its terms, and how much a
/// rounding of logp (relative to the log-sum-exp it subtracts) moves them.
fn loss_scale(fwd: &Forward<'_>) -> f64 {
    let ec = fwd.hparams.effective_entropy_coef(&fwd.config);
    fwd.tokens
        .iter()
        .filter(|t| !t.masked)
        .map(|t| {
            let sensitivity = t.policy_interval.max_abs() + t.kl_coef.abs() + ec * (1.0 + t.entropy);
            t.weight * (t.per_token_loss.abs() + sensitivity * (1.0 + t.softmax.lse.abs() + t.x_chosen.abs()))
        })
        .sum::<f64>()
        + 1e-300
}

/// `a`'s gradient and `b`'s (through `of_b`) agree to `rel` of `a`'s
/// natural scale; the case counts when some token of `a` is live.
fn same_gradients(a: &Forward<'_>, b: &Forward<'_>, of_b: impl Fn(f64) -> f64, rel: f64) -> Checked {
    let scale = natural_scale(a, 1.0);
    for (x, y) in a.grad(1.0).iter().zip(&b.grad(1.0)) {
        close(*x, of_b(*y), rel, scale, "grad")?;
    }
    Ok(live(a))
}

/// Is any unmasked token within `slack` (log-ratio) of a kink?
fn near_kink(fwd: &Forward<'_>, slack: f64) -> bool {
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
const FINITE_DIFFERENCES_MIN: Minimum = Minimum {
    num: 1,
    den: 5,
    check: "the gradient compared with central differences (no token within 1e-4 of a kink, some token live)",
    why: "about half the cases have a token near a kink; 14 to 32 of 48 over seeds 0..200",
};

/// The oracle's gradient against central differences: a case counts when at
/// least one element was compared (no token within 1e-4 of a kink, and some
/// token live).
fn finite_differences(spec: &CaseSpec) -> Checked {
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
const ON_POLICY_MIN: Minimum = Minimum {
    num: 1,
    den: 4,
    check: "the on- and off-policy gradients compared (r = 1 on no kink, some token live)",
    why: "r = 1 is a kink whenever an eps is drawn 0, about a third of the cases; 18 to 39 of 48 over seeds 0..200",
};

/// The loss is compared on every case; a case counts when the gradients were
/// compared too (r = 1 on no edge, and some token live).
fn on_policy_is_off_policy_at_logp(spec: &CaseSpec) -> Checked {
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
const ROW_SHIFT_MIN: Minimum = Minimum {
    num: 1,
    den: 2,
    check: "the shifted and unshifted gradients compared (no token within 1e-9 of a kink, some token live)",
    why: "only a token exactly on an edge or a fully masked batch skips; 29 to 44 of 48 over seeds 0..200",
};

/// The loss is compared on every case; a case counts when the gradients were
/// compared too (no token within 1e-9 of a kink, and some token live).
fn row_shift_changes_nothing(spec: &CaseSpec) -> Checked {
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
const TEMPERATURE_MIN: Minimum = Minimum {
    num: 1,
    den: 2,
    check: "the gradients at tau and at logits / tau compared (no token within 1e-9 of a kink, some token live)",
    why: "only a token exactly on an edge or a fully masked batch skips; 29 to 44 of 48 over seeds 0..200",
};

/// The loss, logp and entropy are compared on every case; a case counts when
/// the gradients were compared too (no token within 1e-9 of a kink, and
/// some token live).
fn temperature_is_scaling_of_logits(spec: &CaseSpec) -> Checked {
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
const MASKED_INPUTS_MIN: Minimum = Minimum {
    num: 1,
    den: 2,
    check: "a case with a masked token, its inputs junked",
    why: "a case without a masked token has nothing to junk; 29 to 43 of 48 over seeds 0..200",
};

/// Junk under the mask (token -100, logits 1e4, old/ref -1e9) changes
/// neither the loss (bit for bit) nor any gradient. A case counts when it
/// has a masked token: without one there is nothing to junk.
fn masked_inputs_do_not_matter(spec: &CaseSpec) -> Checked {
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

fn seq_mean_equals_token_mean_at_equal_counts(spec: &CaseSpec) -> Result<(), TestCaseError> {
    let mut spec = spec.clone();
    spec.mask = MaskPattern::Full;
    spec.config.aggregation = Aggregation::TokenMean;
    let a = Owned::new(spec.materialize(Kind::Logits));
    let mut b = a.clone();
    b.case.config.aggregation = Aggregation::SeqMeanTokenMean;
    close(a.loss(), b.loss(), 1e-12, 1e-12, "token_mean vs seq_mean_token_mean")
}

fn sum_over_constant_is_linear_in_inverse_normalizer(spec: &CaseSpec) -> Result<(), TestCaseError> {
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
const BATCH_PERMUTATION_MIN: Minimum = Minimum {
    num: 1,
    den: 2,
    check: "a batch of B >= 2 reversed",
    why: "at B = 1 the reversal is the identity; 30 to 43 of 48 over seeds 0..200",
};

/// Reversing the batch reverses the per-token outputs and keeps the loss.
/// A case counts at B >= 2.
fn batch_permutation_permutes_outputs(spec: &CaseSpec) -> Checked {
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
fn single_row(a: &Owned, b: usize) -> Owned {
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
fn aggregations_decompose_over_rows(spec: &CaseSpec) -> Result<(), TestCaseError> {
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

fn fully_masked_batch_is_zero(spec: &CaseSpec) -> Result<(), TestCaseError> {
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

fn kink_intervals() -> Result<(), Failed> {
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

/// A fused-kind case with its inputs widened to f64.
struct OwnedFused {
    case: Case,
    hidden_dim: usize,
    hidden: Vec<f64>,
    lm_head: Vec<f64>,
}

impl OwnedFused {
    fn new(spec: &CaseSpec) -> Self {
        let case = spec.materialize(Kind::Fused);
        let Inputs::Fused { hidden_dim, hidden, lm_head } = &case.inputs else { unreachable!() };
        let widen = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
        OwnedFused { hidden_dim: *hidden_dim, hidden: widen(hidden), lm_head: widen(lm_head), case }
    }
    fn problem(&self) -> FusedProblem<'_, f64> {
        let c = &self.case;
        FusedProblem {
            shape: c.shape(),
            hidden_dim: self.hidden_dim,
            hidden: &self.hidden,
            lm_head: &self.lm_head,
            per_token: grpo_oracle::TokenInputs {
                tokens: &c.tokens,
                mask: &c.mask,
                advantages: &c.advantages,
                old_logp: c.old_logp.as_deref(),
                ref_logp: c.ref_logp.as_deref(),
                is_weights: None,
            },
            config: c.config,
            hparams: c.hparams,
        }
    }
    fn loss(&self) -> f64 {
        self.problem().forward().expect("valid").loss
    }
}

/// At least a sixth of the cases (4 of the default 24). About half skip, as
/// in [`FINITE_DIFFERENCES_MIN`] (a token within 1e-5 of a kink), and 24
/// cases spread wide: measured 4 to 18 of 24 over GRPO_VERIFY_TEST_SEED
/// 0..200 (10 at the default seed 0). The budget stays 24: a sixth of it
/// still fails a property that skips (almost) every case.
const FUSED_FINITE_DIFFERENCES_MIN: Minimum = Minimum {
    num: 1,
    den: 6,
    check: "d lm_head compared with central differences at a live token (no token within 1e-5 of a kink)",
    why: "about half the cases have a token near a kink; 4 to 18 of 24 over seeds 0..200",
};

/// The fused oracle's d hidden and d lm_head against central differences: a
/// case counts when d lm_head was compared at a live token (no token within
/// 1e-5 of a kink; with no live token d hidden is 0 and nothing is tested).
fn fused_finite_differences(spec: &CaseSpec) -> Checked {
    let mut spec = spec.clone();
    spec.config.on_policy = false;
    let owned = OwnedFused::new(&spec);
    let problem = owned.problem();
    let fwd = problem.forward().expect("valid");
    let tau = owned.case.hparams.temperature;
    let max_w = owned.lm_head.iter().fold(0.0f64, |m, w| m.max(w.abs()));
    let max_x = owned.hidden.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    // Each step moves a logit by 1e-6 tau: logp by at most 2e-6.
    let steps = [1e-6 * tau / (1.0 + max_w), 1e-6 * tau / (1.0 + max_x)];
    if near_kink(&fwd, 1e-5) {
        return Ok(false);
    }
    let cot = owned.case.cotangent;
    let (d_hidden, d_lm_head) = problem.grads(&fwd, cot);
    let max_z = max_x * max_w * owned.hidden_dim as f64 / tau;
    let (h_, v_) = (owned.hidden_dim, owned.case.shape.vocab);
    let mut probe = OwnedFused { case: owned.case.clone(), hidden_dim: h_, hidden: owned.hidden.clone(), lm_head: owned.lm_head.clone() };
    let mut check = |which: usize, i: usize, analytic: f64, grads: &[f64]| -> Result<(), TestCaseError> {
        let step = steps[which];
        // Central-difference noise (as in `finite_differences`).
        let noise = 64.0 * f64::EPSILON * (1.0 + max_z) * (loss_scale(&fwd) + natural_scale(&fwd, cot)) * cot.abs() / step;
        let atol = 1e-8 * grads.iter().fold(0.0f64, |m, g| m.max(g.abs())) + 10.0 * noise;
        let at = |probe: &mut OwnedFused, value: f64| {
            if which == 0 { probe.hidden[i] = value } else { probe.lm_head[i] = value }
        };
        let x = if which == 0 { owned.hidden[i] } else { owned.lm_head[i] };
        at(&mut probe, x + step);
        let up = probe.loss();
        at(&mut probe, x - step);
        let down = probe.loss();
        at(&mut probe, x);
        let fd = cot * (up - down) / (2.0 * step);
        if (analytic - fd).abs() <= 1e-4 * analytic.abs().max(fd.abs()) + atol {
            return Ok(());
        }
        Err(TestCaseError::fail(format!("{} element {i}: {analytic:e} vs {fd:e} (atol {atol:e})", ["d hidden", "d lm_head"][which])))
    };
    for i in (0..d_hidden.len()).step_by((d_hidden.len() / 7).max(1)) {
        check(0, i, d_hidden[i], &d_hidden)?;
    }
    let mut compared = 0;
    for st in fwd.tokens.iter().filter(|s| !s.masked).take(3) {
        for h in [0, h_ - 1] {
            let i = h * v_ + st.chosen;
            check(1, i, d_lm_head[i], &d_lm_head)?;
            compared += 1;
        }
    }
    Ok(compared > 0)
}

/// The fused oracle equals the logits oracle on logits = hidden @ lm_head.
fn fused_is_logits_of_the_product(spec: &CaseSpec) -> Result<(), TestCaseError> {
    let owned = OwnedFused::new(spec);
    let problem = owned.problem();
    let fused = problem.forward().expect("valid");
    let (h_, v_) = (owned.hidden_dim, owned.case.shape.vocab);
    let rows = owned.case.shape.batch * owned.case.shape.time;
    let mut logits = vec![0.0f64; rows * v_];
    for i in 0..rows {
        for h in 0..h_ {
            for v in 0..v_ {
                logits[i * v_ + v] += owned.hidden[i * h_ + h] * owned.lm_head[h * v_ + v];
            }
        }
    }
    let mut as_logits = Owned::new(spec.materialize(Kind::Logits));
    as_logits.logits = logits;
    // Compare like for like: the logits-kind case with the fused case's token inputs.
    let mut same = as_logits.clone();
    same.case.tokens = owned.case.tokens.clone();
    same.case.old_logp = owned.case.old_logp.clone();
    same.case.ref_logp = owned.case.ref_logp.clone();
    same.case.mask = owned.case.mask.clone();
    same.case.advantages = owned.case.advantages.clone();
    same.case.hparams = owned.case.hparams;
    close(fused.loss, same.loss(), 1e-12, loss_scale(&fused), "fused vs logits-kind loss")
}

/// The fused kind's blocked passes (matrix products over token blocks and
/// vocabulary chunks) against the same math row by row, at the edges of
/// both: V with a short last chunk and V an exact multiple, one column past
/// a chunk, rows spanning two blocks, chosen tokens at 0, V - 1 and either
/// side of a chunk edge, masked rows, entropy and KL terms on. Forward
/// statistics, d hidden, d lm_head, the rounding magnitudes, the kink
/// directions and lm_head @ direction are each held to their definition.
fn fused_blocks_are_the_rows() -> Result<(), Failed> {
    use grpo_oracle::{Config, Hparams, LogitRows, Magnitudes, Shape, Sweep, VOCAB_CHUNK};
    for (vocab, rows, h_) in [(2 * VOCAB_CHUNK + 5, 600usize, 5), (VOCAB_CHUNK, 3, 7), (VOCAB_CHUNK + 1, 2, 3), (37, 9, 4)] {
        let shape = Shape { batch: 2, time: rows.div_ceil(2), vocab };
        let n = shape.rows();
        let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ vocab as u64;
        let mut uniform = move || {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (state >> 11) as f64 / (1u64 << 53) as f64 - 0.5
        };
        let bf16 = |x: f64| half::bf16::from_f64(x).to_f64();
        let hidden: Vec<f64> = (0..n * h_).map(|_| bf16(4.0 * uniform())).collect();
        let lm_head: Vec<f64> = (0..h_ * vocab).map(|_| bf16(2.0 * uniform())).collect();
        let edges = [0, vocab - 1, (VOCAB_CHUNK - 1).min(vocab - 1), VOCAB_CHUNK.min(vocab - 1)];
        let tokens: Vec<i32> = (0..n).map(|i| edges[i % 4] as i32).collect();
        let mask: Vec<f32> = (0..n).map(|i| if i % 7 == 3 { 0.0 } else { 1.0 }).collect();
        let advantages = vec![1.3f32, -0.7];
        let old_logp: Vec<f32> = (0..n).map(|_| (-9.0 + 3.0 * uniform()) as f32).collect();
        let ref_logp: Vec<f32> = (0..n).map(|_| (-9.0 + 3.0 * uniform()) as f32).collect();
        let config = Config {
            temperature_mode: TemperatureMode::Logits,
            aggregation: Aggregation::TokenMean,
            on_policy: false,
            kl: true,
            entropy_bonus: true,
            two_sided: false,
            ..Config::default()
        };
        let hparams = Hparams { eps_low: 0.2, eps_high: 0.28, temperature: 0.7, beta: 0.04, entropy_coef: 0.01, delta: f64::INFINITY, normalizer: 1.0, ..Hparams::default() };
        let problem = FusedProblem {
            shape,
            hidden_dim: h_,
            hidden: &hidden,
            lm_head: &lm_head,
            per_token: grpo_oracle::TokenInputs {
                tokens: &tokens,
                mask: &mask,
                advantages: &advantages,
                old_logp: Some(&old_logp),
                ref_logp: Some(&ref_logp),
                is_weights: None,
            },
            config,
            hparams,
        };
        let blocked = problem.forward().map_err(|e| e.to_string())?;
        // The same problem through the trait's row-by-row default.
        struct RowByRow<'a>(&'a FusedProblem<'a, f64>);
        impl LogitRows for RowByRow<'_> {
            fn shape(&self) -> Shape {
                self.0.shape
            }
            fn logit_row(&self, row: usize, out: &mut [f64], magnitude: Option<&mut [f64]>) {
                self.0.logit_row(row, out, magnitude)
            }
        }
        let by_row = RowByRow(&problem);
        let rowwise = Forward::new(&by_row, problem.token_inputs(), config, hparams).map_err(|e| e.to_string())?;
        let what = |q: &str, i: usize| format!("V={vocab} rows={n}: {q} at row {i}");
        let near = |a: f64, b: f64, rel: f64, q: &str, i: usize| -> Result<(), Failed> {
            if (a - b).abs() <= rel * (a.abs().max(b.abs()) + 1e-300) {
                Ok(())
            } else {
                Err(format!("{}: blocked {a:e} vs row by row {b:e}", what(q, i)).into())
            }
        };
        near(blocked.loss, rowwise.loss, 1e-12, "loss", 0)?;
        for (i, (a, b)) in blocked.tokens.iter().zip(&rowwise.tokens).enumerate() {
            if a.masked != b.masked {
                return Err(what("masking", i).into());
            }
            if a.masked {
                continue;
            }
            near(a.logp, b.logp, 1e-12, "logp", i)?;
            near(a.entropy, b.entropy, 1e-12, "entropy", i)?;
            near(a.softmax.lse, b.softmax.lse, 1e-13, "lse", i)?;
            // Magnitudes come from an f32 product: a few digits are their job.
            near(a.mag_chosen, b.mag_chosen, 1e-5, "mag_chosen", i)?;
            near(a.softmax.sum_p_abs_x, b.softmax.sum_p_abs_x, 1e-5, "sum_p_abs_x", i)?;
            near(a.softmax.max_p_abs_x, b.softmax.max_p_abs_x, 1e-5, "max_p_abs_x", i)?;
            near(a.softmax.max_abs_x, b.softmax.max_abs_x, 1e-5, "max_abs_x", i)?;
        }
        // The sweep: every live row, half of them with a direction, magnitudes on.
        let cot = -1.7;
        let live: Vec<usize> = (0..n).filter(|&i| mask[i] != 0.0).collect();
        let coef: Vec<f64> = live.iter().enumerate().map(|(k, _)| 0.3 * k as f64 % 1.1 - 0.5).collect();
        let directions: Vec<usize> = (0..live.len()).step_by(2).collect();
        let row_scale: Vec<f64> = (0..live.len()).map(|k| 1.0 + k as f64 / 10.0).collect();
        let (gw_h, gw_w) = (3.0, 5.0);
        let sweep = Sweep {
            rows: &live,
            ppo_coef: &coef,
            directions: &directions,
            magnitudes: Some(Magnitudes { row_scale: &row_scale, g_weight_hidden: gw_h, g_weight_lm_head: gw_w }),
            lm_head: true,
            rounding: None,
        };
        let mut d_lm_head = vec![f64::NAN; h_ * vocab];
        let mut s_lm_head = vec![f64::NAN; h_ * vocab];
        let mut dir_cols = vec![f64::NAN; directions.len() * vocab];
        let result = problem.sweep(&blocked, cot, &sweep, |chunk| {
            let c = chunk.cols.len();
            for h in 0..h_ {
                for (k, v) in chunk.cols.clone().enumerate() {
                    d_lm_head[h * vocab + v] = chunk.d_lm_head[h * c + k];
                    s_lm_head[h * vocab + v] = chunk.s_lm_head[h * c + k];
                }
            }
            for a in 0..directions.len() {
                for (k, v) in chunk.cols.clone().enumerate() {
                    dir_cols[a * vocab + v] = chunk.directions[a * c + k];
                }
            }
        });
        // Row by row: g from Forward::grad_row (stored row path), p from softmax_row.
        let (mut want_dw, mut want_sw) = (vec![0.0; h_ * vocab], vec![0.0; h_ * vocab]);
        let (mut g, mut p, mut z) = (vec![0.0; vocab], vec![0.0; vocab], vec![0.0; vocab]);
        for (k, &i) in live.iter().enumerate() {
            rowwise.grad_row(i, cot, Some(coef[k]), &mut g);
            rowwise.softmax_row(i, &mut p);
            let y = tokens[i] as usize;
            let entropy = config.entropy_bonus && hparams.entropy_coef != 0.0;
            let e = |v: usize| row_scale[k] * (grpo_oracle::rounding_weight(p[v], entropy) + if v == y { 1.0 } else { 0.0 });
            for h in 0..h_ {
                let w = &lm_head[h * vocab..(h + 1) * vocab];
                let dh: f64 = (0..vocab).map(|v| w[v] * g[v]).sum();
                let sh: f64 = (0..vocab).map(|v| w[v].abs() * (e(v) + gw_h * g[v].abs())).sum();
                near(result.d_hidden[k * h_ + h], dh, 1e-11, "d hidden", i)?;
                near(result.s_hidden[k * h_ + h], sh, 1e-5, "s hidden", i)?;
                let x = hidden[i * h_ + h];
                for v in 0..vocab {
                    want_dw[h * vocab + v] += x * g[v];
                    want_sw[h * vocab + v] += x.abs() * (e(v) + gw_w * g[v].abs());
                }
            }
            if let Some(a) = directions.iter().position(|&d| d == k) {
                rowwise.dlogp_dlogits_row(i, &mut z);
                let scale = cot * blocked.tokens[i].weight;
                for v in 0..vocab {
                    near(dir_cols[a * vocab + v], scale * z[v], 1e-12, "direction", i)?;
                }
                for h in 0..h_ {
                    let along: f64 = (0..vocab).map(|v| lm_head[h * vocab + v] * scale * z[v]).sum();
                    near(result.along_hidden[a * h_ + h], along, 1e-11, "lm_head @ direction", i)?;
                }
            }
        }
        for j in 0..h_ * vocab {
            near(d_lm_head[j], want_dw[j], 1e-10, "d lm_head (h, v) = (row/V, row%V)", j)?;
            near(s_lm_head[j], want_sw[j], 1e-5, "s lm_head", j)?;
        }
    }
    Ok(())
}

/// This suite's trials (suites/main.rs runs them with the others).
pub fn trials() -> Vec<Trial> {
    let tests = vec![
        counted_property("oracle::gradient_matches_finite_differences", 48, FINITE_DIFFERENCES_MIN, finite_differences),
        counted_property("oracle::on_policy_is_off_policy_at_old_equal_logp", 48, ON_POLICY_MIN, on_policy_is_off_policy_at_logp),
        counted_property("oracle::row_shift_changes_nothing", 48, ROW_SHIFT_MIN, row_shift_changes_nothing),
        counted_property("oracle::temperature_is_a_scaling_of_the_logits", 48, TEMPERATURE_MIN, temperature_is_scaling_of_logits),
        counted_property("oracle::masked_inputs_do_not_matter", 48, MASKED_INPUTS_MIN, masked_inputs_do_not_matter),
        property("oracle::seq_mean_equals_token_mean_at_equal_counts", 48, seq_mean_equals_token_mean_at_equal_counts),
        property("oracle::sum_over_constant_is_linear_in_1_over_n", 48, sum_over_constant_is_linear_in_inverse_normalizer),
        counted_property("oracle::batch_permutation_permutes_outputs", 48, BATCH_PERMUTATION_MIN, batch_permutation_permutes_outputs),
        property("oracle::fully_masked_batch_is_exactly_zero", 24, fully_masked_batch_is_zero),
        property("oracle::aggregations_decompose_over_rows", 48, aggregations_decompose_over_rows),
        Trial::test("oracle::kink_intervals", kink_intervals),
        counted_property("oracle::fused_gradients_match_finite_differences", 24, FUSED_FINITE_DIFFERENCES_MIN, fused_finite_differences),
        property("oracle::fused_is_the_logits_oracle_on_the_product", 24, fused_is_logits_of_the_product),
        Trial::test("oracle::fused_blocks_are_the_rows", fused_blocks_are_the_rows),
    ];
    tests
}
