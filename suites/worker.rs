//! The worker's failure modes: an implementation that raises, kills its
//! process, hangs, returns NaN or a wrong shape, is unsupported, prints to
//! stdout, or takes static hyperparameters. Each is that case's verdict; the
//! worker restarts where needed and the next case runs.

use crate::common;

use grpo_verify::evaluate::{Decided, Evaluator, Outcome, Unjudged};
use grpo_verify::worker::outputs::FailedRun;
use libtest_mimic::Trial;

/// Runs the fixture (its outcome, a reason containing `reason_has`, and why
/// it has no verdicts: `unjudged`, None where the rule judged it), then
/// checks the worker still serves the reference.
fn failure_mode(name: &'static str, fixture: &'static str, timeout_s: f64, outcome: Outcome, reason_has: &'static str, unjudged: Option<Unjudged>) -> Trial {
    crate::common::trial(format!("worker::{name}"), move || {
        let mut eval = common::evaluator(timeout_s);
        let result = eval.evaluate(&common::fixture_impl(fixture), &common::small_case(true)).map_err(|e| format!("{e}"))?;
        if result.outcome != outcome || !result.reason.contains(reason_has) || result.unjudged != unjudged {
            return Err(format!(
                "{fixture}: expected {outcome:?} with {reason_has:?}, unjudged {unjudged:?}; got {:?}, unjudged {:?}: {}",
                result.outcome, result.unjudged, result.reason
            )
            .into());
        }
        common::expect(&mut eval, "reference", true, Outcome::Pass, "")
    })
}

/// This suite's trials (suites/main.rs runs them with the others).
pub fn trials() -> Vec<Trial> {
    let tests = vec![
        failure_mode("raises_is_a_failure", "worker/raises.py", 120.0, Outcome::Fail, "raised", Some(Unjudged::Run(FailedRun::Raised))),
        failure_mode("killed_process_is_a_failure_and_restarts", "worker/kills_process.py", 120.0, Outcome::Fail, "crashed", Some(Unjudged::Run(FailedRun::Crashed))),
        failure_mode("hang_times_out_and_restarts", "worker/hangs.py", 8.0, Outcome::Fail, "no reply within", Some(Unjudged::Run(FailedRun::TimedOut))),
        failure_mode("nan_is_a_failure", "worker/returns_nan.py", 120.0, Outcome::Fail, "non-finite", None),
        failure_mode("wrong_shape_is_a_failure", "worker/wrong_shape.py", 120.0, Outcome::Fail, "has shape", Some(Unjudged::Run(FailedRun::Malformed))),
        failure_mode("unsupported_is_reported", "worker/unsupported_kl.py", 120.0, Outcome::Unsupported, "", None),
        failure_mode("prints_to_stdout_do_not_corrupt_the_protocol", "worker/prints_to_stdout.py", 120.0, Outcome::Pass, "", None),
        failure_mode("static_hparams_pass", "worker/static_hparams.py", 120.0, Outcome::Pass, "", None),
        crate::common::trial("worker::fast_compile_is_on_by_default_and_turns_off", || {
            // Small steps compile at XLA:CPU -O0 unless --no-fast-compile
            // (PythonEnv::fast_compile); both ways the reference passes.
            let default = grpo_verify::worker::pyenv::resolve().map_err(|e| format!("{e:#}"))?;
            for (fast, want) in [(true, serde_json::json!(1 << 19)), (false, serde_json::Value::Null)] {
                let env = grpo_verify::worker::pyenv::PythonEnv { fast_compile: fast, ..default.clone() };
                let worker = grpo_verify::worker::process::Worker::start(&env).map_err(|e| format!("{e}"))?;
                let got = worker.hello["fast_compile_max_logits"].clone();
                // Accelerator backends compile every step in full.
                let want = if worker.hello["backend"] == "cpu" { want } else { serde_json::Value::Null };
                if got != want {
                    return Err(format!("fast_compile {fast}: hello says fast_compile_max_logits = {got}, want {want}").into());
                }
                // --jobs workers share one device: none preallocates it.
                // Run-to-run determinism on GPU backends (a no-op on CPU): asked for unless the user set it.
                let xla_flags = worker.hello["xla_flags"].as_str().unwrap_or_default();
                let user_set = std::env::var("XLA_FLAGS").is_ok_and(|f| f.contains("xla_gpu_deterministic_ops"));
                if !user_set && !xla_flags.contains("--xla_gpu_deterministic_ops=true") {
                    return Err(format!("hello says XLA_FLAGS = {xla_flags:?}, without --xla_gpu_deterministic_ops=true").into());
                }
                let preallocate = &worker.hello["xla_preallocate"];
                if std::env::var_os("XLA_PYTHON_CLIENT_PREALLOCATE").is_none() && preallocate != "false" {
                    return Err(format!("hello says XLA_PYTHON_CLIENT_PREALLOCATE = {preallocate}, want \"false\"").into());
                }
                let mut eval = Evaluator::new(worker, grpo_verify::compare::Tolerance::default(), std::time::Duration::from_secs(120));
                common::expect(&mut eval, "reference", true, Outcome::Pass, "")?;
            }
            Ok(())
        }),
        crate::common::trial("worker::a_shrink_step_runs_the_baseline_only_when_the_rule_needs_it", || {
            // A cotangent-ignoring backward is off by far more than the loosest
            // bound: a shrink step fails it without running the baseline, as
            // the full rule does with it; a correct kernel (errors < 0.1 u
            // here) passes without it.
            let mut eval = common::evaluator(120.0);
            let case = common::small_case(true);
            let mutant = format!("{}:grpo_loss", common::repo().join("suites/fixtures/mutants/bwd_cotangent_ignored.py").display());
            let (step, decided) = eval.evaluate_shrink_step(&mutant, &case).map_err(|e| format!("{e}"))?;
            if step.outcome != Outcome::Fail || decided != Decided::WithoutBaseline || eval.baseline_runs != 0 {
                return Err(format!("mutant shrink step: {:?} {decided:?} after {} baseline runs: {}", step.outcome, eval.baseline_runs, step.reason).into());
            }
            let full = eval.evaluate(&mutant, &case).map_err(|e| format!("{e}"))?;
            if full.outcome != Outcome::Fail || eval.baseline_runs != 1 {
                return Err(format!("mutant in full: {:?} after {} baseline runs", full.outcome, eval.baseline_runs).into());
            }
            // Off by 1024 ulps: between the floor and the loosest bound, so the
            // baseline runs (on a case it has not seen) and the rule fails it.
            let slightly_off = common::fixture_impl("worker/loss_off_by_1024_ulps.py");
            let (step, decided) = eval.evaluate_shrink_step(&slightly_off, &common::small_case(false)).map_err(|e| format!("{e}"))?;
            if step.outcome != Outcome::Fail || decided != Decided::ByTheRule || eval.baseline_runs != 2 {
                return Err(format!("1024 ulps off: {:?} {decided:?} after {} baseline runs: {}", step.outcome, eval.baseline_runs, step.reason).into());
            }
            for correct in ["pallas_logits", "reference"] {
                let (step, decided) = eval.evaluate_shrink_step(correct, &case).map_err(|e| format!("{e}"))?;
                if step.outcome != Outcome::Pass {
                    return Err(format!("{correct} shrink step ({decided:?}): {:?} {}", step.outcome, step.reason).into());
                }
            }
            Ok(())
        }),
        crate::common::trial("worker::fast_compile_options_are_known_to_the_pinned_jaxlib_and_unknown_ones_dropped", || {
            // runner.FAST_COMPILE_OPTIONS (half of a small step's compile is
            // the fusion emitters it turns off): the pinned jaxlib
            // (python/requirements.txt) must know every one, or it would
            // compile slower without a word; any jaxlib must compile without
            // the ones it does not know (JAX 0.12.0.1 has no
            // xla_cpu_use_fusion_emitters).
            let env = grpo_verify::worker::pyenv::resolve().map_err(|e| format!("{e:#}"))?;
            let probe = "import json, jax\nfrom grpo_verify_worker import runner\n\
                want = tuple(runner.FAST_COMPILE_OPTIONS.items())\n\
                print(json.dumps([jax.__version__, runner._known_options(want) == dict(want), \
                runner._known_options(((\"xla_no_such_option\", True),) + want) == runner._known_options(want)]))";
            let out = env.command().args(["-c", probe]).output()?;
            let stdout = String::from_utf8_lossy(&out.stdout);
            let (version, all_known, unknown_dropped): (String, bool, bool) = serde_json::from_str(stdout.trim())
                .map_err(|e| format!("{e}: {stdout}; stderr: {}", String::from_utf8_lossy(&out.stderr)))?;
            let requirements = std::fs::read_to_string(common::repo().join("python/requirements.txt"))?;
            let pinned = requirements.lines().find_map(|l| l.strip_prefix("jax==")).ok_or("no jax== pin in python/requirements.txt")?;
            if !unknown_dropped {
                return Err("an option this jaxlib does not know was not dropped".into());
            }
            if version == pinned.trim() && !all_known {
                return Err(format!("jax {version} (the pinned one) does not know every FAST_COMPILE_OPTIONS entry").into());
            }
            if !all_known {
                eprintln!("jax {version} (not the pinned {pinned}) does not know every FAST_COMPILE_OPTIONS entry: it compiles without them");
            }
            Ok(())
        }),
        crate::common::trial("worker::unsupported_configuration_only", || {
            let mut eval = common::evaluator(120.0);
            common::expect(&mut eval, &common::fixture_impl("worker/unsupported_kl.py"), false, Outcome::Pass, "")
        }),
    ];
    tests
}
