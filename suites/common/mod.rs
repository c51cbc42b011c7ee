//! Shared by the `cargo test` suites: case budgets, the test runner config,
//! and paths to the suite's own fixtures.
#![allow(dead_code)]

use std::path::PathBuf;

use grpo_verify::case::Dtype;
use grpo_verify::case::strategy::Bounds;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

/// Cases per property: `GRPO_VERIFY_TEST_CASES` (the nightly raises it),
/// else `default` (sized for CI).
pub fn cases(default: u32) -> u32 {
    std::env::var("GRPO_VERIFY_TEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A deterministic runner: the same cases on every run unless
/// `GRPO_VERIFY_TEST_SEED` says otherwise.
pub fn runner(cases: u32) -> TestRunner {
    let seed: u64 = std::env::var("GRPO_VERIFY_TEST_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let config = Config { cases, failure_persistence: None, max_shrink_iters: 256, ..Config::default() };
    TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes))
}

pub fn small_bounds() -> Bounds {
    Bounds::new(4, 12, 300, 40, vec![Dtype::F32, Dtype::Bf16])
}

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The repository's Python (the worker's environment) on `args`, from the
/// repository root, with `vars` set.
pub fn python_with(args: &[&str], vars: &[(&str, &str)]) -> Result<std::process::Output, libtest_mimic::Failed> {
    let env = grpo_verify::worker::pyenv::resolve()?;
    let mut cmd = env.command();
    cmd.args(args).current_dir(repo());
    for (name, value) in vars {
        cmd.env(name, value);
    }
    Ok(cmd.output()?)
}

/// `suites/fixtures/impls/<rel>:grpo_loss`.
pub fn fixture_impl(rel: &str) -> String {
    format!("{}:grpo_loss", repo().join("suites/fixtures/impls").join(rel).display())
}

/// `suites/fixtures/mutants/<name>.py:grpo_loss`.
pub fn mutant_impl(name: &str) -> String {
    format!("{}:grpo_loss", grpo_verify::mutants::builtin_catalog().join(format!("{name}.py")).display())
}

/// A fresh evaluator (its own worker) with a short per-case time limit.
pub fn evaluator(timeout_s: f64) -> grpo_verify::evaluate::Evaluator {
    let env = grpo_verify::worker::pyenv::resolve().expect("python environment");
    let worker = grpo_verify::worker::process::Worker::start(&env).expect("worker starts");
    grpo_verify::evaluate::Evaluator::new(
        worker,
        grpo_verify::compare::Tolerance::default(),
        std::time::Duration::from_secs_f64(timeout_s),
    )
}

/// A small fixed case with every switch on (off-policy, KL, entropy, two-sided).
pub fn small_case(kl: bool) -> grpo_verify::case::Case {
    use grpo_verify::case::*;
    // The seed team's step (token mean, clip-higher 0.2 / 0.28) at tau = 0.7, every term on.
    let (step, step_hparams) = training_step(0.7);
    let spec = CaseSpec {
        batch: 2,
        time: 3,
        vocab: 131,
        hidden: 16,
        dtype: Dtype::F32,
        config: grpo_oracle::Config { kl, entropy_bonus: true, two_sided: true, ..step },
        hparams: grpo_oracle::Hparams { beta: 0.04, entropy_coef: 0.01, delta: 3.0, ..step_hparams },
        normalizer: NormalizerChoice::ValidCount,
        logits: LogitPattern::Normal { scale: 3.0 },
        tokens: TokenPattern::Mixed,
        mask: MaskPattern::RightPadded,
        ratios: RatioPattern::Mixed,
        advantages: AdvantagePattern::Mixed,
        masked_garbage: true,
        cotangent: 2.5,
        seed: 7,
        mesh: None,
        preset: None,
        is_weights: None,
        is_weights_per_row: false,
        kl_pattern: grpo_verify::case::KlPattern::Near,
        real: false,
    };
    spec.materialize(grpo_verify::case::Kind::Logits)
}

/// The central difference (f(z + step) - f(z - step)) / (2 step) of a
/// function of one input z, given `at(value)`: the function with that input
/// set to `value`. The input is set back to z afterwards.
pub fn central_difference(z: f64, step: f64, mut at: impl FnMut(f64) -> f64) -> f64 {
    let (zp, zm) = (z + step, z - step);
    let up = at(zp);
    let down = at(zm);
    at(z);
    (up - down) / (zp - zm)
}

/// `small_case(kl)` on `implementation` has `outcome`, with `reason_has` in its reason.
pub fn expect(
    eval: &mut grpo_verify::evaluate::Evaluator,
    implementation: &str,
    kl: bool,
    outcome: grpo_verify::evaluate::Outcome,
    reason_has: &str,
) -> Result<(), libtest_mimic::Failed> {
    let result = eval.evaluate(implementation, &small_case(kl)).map_err(|e| format!("{e}"))?;
    if result.outcome != outcome || !result.reason.contains(reason_has) {
        return Err(format!("{implementation}: expected {outcome:?} with {reason_has:?}, got {:?}: {}", result.outcome, result.reason).into());
    }
    Ok(())
}

/// Fails unless `summary` checked at least `minimum` cases (`why`: the
/// reason for that minimum). `passed` alone says only that nothing failed,
/// which holds too when every draw was refused (raised NotImplementedError).
/// A check draws a refused case again, so an implementation that refuses
/// some configurations still gets most of its cases; it falls short when
/// whole signature groups are refused or the draw budget runs out.
pub fn checked_at_least(summary: &grpo_verify::report::ImplSummary, minimum: usize, why: &str) -> Result<(), libtest_mimic::Failed> {
    if summary.supported < minimum {
        return Err(format!(
            "{}: checked only {} cases ({} of {} draws refused); the minimum is {minimum}: {why}",
            summary.implementation, summary.supported, summary.unsupported, summary.cases
        )
        .into());
    }
    Ok(())
}

/// The repository's environment with the torch lock installed
/// (`grpo-verify setup --torch`): the suites that run PyTorch
/// implementations call it first, so `cargo test --release` on a fresh
/// machine installs it; a JAX-only first run of the binary does not.
pub fn with_torch() {
    grpo_verify::worker::pyenv::setup(true).expect("the repository's .venv with the torch lock");
}

/// A trial, as `Trial::test` makes it, that also appends its wall time and
/// name ("12.3\tname") to the file `GRPO_VERIFY_TRIAL_TIMES` names, where
/// it is set: `.ci/run` sets it and prints the slowest trials, so that the
/// suite's time can be read trial by trial (libtest-mimic reports only the
/// total).
pub fn trial(name: impl Into<String>, runner: impl FnOnce() -> Result<(), libtest_mimic::Failed> + Send + 'static) -> libtest_mimic::Trial {
    let name = name.into();
    let recorded = name.clone();
    libtest_mimic::Trial::test(name, move || {
        let started = std::time::Instant::now();
        let outcome = runner();
        if let Some(path) = std::env::var_os("GRPO_VERIFY_TRIAL_TIMES") {
            use std::io::Write;
            // One short append per trial: the trials' threads do not interleave within a line.
            let line = format!("{:.1}\t{recorded}\n", started.elapsed().as_secs_f64());
            if let Ok(mut file) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
                let _ = file.write_all(line.as_bytes());
            }
        }
        outcome
    })
}
