//! PyTorch implementations (docs/spec.md, "Implementations in PyTorch"):
//! the torch port of the reference passes v1 and v2 cases of both kinds; a
//! custom backward that ignores its cotangent, and a softmax left in bf16, are
//! caught; a torch kernel that kills its process or hangs fails that case and
//! the worker goes on; a non-tensor loss is an implementation error and a
//! detached one a wrong (zero) gradient, neither a crash.

use crate::common;

use std::time::Duration;

use grpo_verify::case::objective::Objective;
use grpo_verify::case::strategy::Bounds;
use grpo_verify::case::{Dtype, Kind};
use grpo_verify::check::{run_check, CheckOptions};
use grpo_verify::evaluate::Outcome;
use grpo_verify::report::CheckRun;
use libtest_mimic::Trial;

/// `examples/torch_reference/adapter.py:<function>`.
fn port(function: &str) -> String {
    format!("{}:{function}", common::repo().join("examples/torch_reference/adapter.py").display())
}

fn check(implementation: &str, kind: Kind, cases: u32, objective: Option<&str>, dtypes: Vec<Dtype>, report: &str) -> Result<CheckRun, String> {
    let mut bounds = Bounds::new(4, 24, 2100, 64, dtypes);
    bounds.objective = Objective::parse(objective, &[], &[]).map_err(|e| format!("{e:#}"))?;
    let report_dir = std::env::temp_dir().join(format!("grpo-verify-torch-{}-{report}", std::process::id()));
    let opts = CheckOptions { seed: 1, shrink_iters: 64, ..CheckOptions::new(vec![implementation.to_string()], common::cases(cases), bounds, report_dir) };
    let mut eval = common::evaluator(600.0);
    run_check(&opts, std::slice::from_mut(&mut eval), &[kind]).map_err(|e| format!("{e:#}"))
}

/// The port passes `cases` checked cases (v1, or `--objective all`), with
/// nothing refused, and the report names torch as its framework.
fn port_passes(function: &'static str, kind: Kind, cases: u32, objective: Option<&'static str>) -> Trial {
    let name = format!("torch::port_{function}_passes_{}", objective.map_or("v1", |_| "v2_objectives"));
    crate::common::trial(name, move || {
        let run = check(&port(function), kind, cases, objective, vec![Dtype::F32, Dtype::Bf16], function)?;
        let s = &run.summaries[0];
        if !s.passed || s.supported < common::cases(cases) as usize || s.unsupported > 0 {
            return Err(format!("the torch port {function}: passed {}, {} checked, {} unsupported: {:?} on {:?}", s.passed, s.supported, s.unsupported, s.failure, s.minimal_case).into());
        }
        if !s.framework.starts_with("torch ") {
            return Err(format!("the report says framework {:?} for a torch implementation", s.framework).into());
        }
        Ok(())
    })
}

/// `check` fails the fixture within `cases`, and its minimal case's reason contains `reason_has`.
fn caught(fixture: &'static str, cases: u32, dtypes: Vec<Dtype>, reason_has: &'static str) -> Trial {
    crate::common::trial(format!("torch::{}_is_caught", fixture.trim_end_matches(".py")), move || {
        let run = check(&common::fixture_impl(&format!("torch/{fixture}")), Kind::Logits, cases, None, dtypes, fixture)?;
        let s = &run.summaries[0];
        let reason = s.failure.clone().unwrap_or_default();
        if s.passed || !reason.contains(reason_has) {
            return Err(format!("{fixture}: passed {} after {} cases; failure {reason:?} (expected one with {reason_has:?})", s.passed, s.supported).into());
        }
        Ok(())
    })
}

/// The fixture's case (B=2 T=3: odd T) gets `outcome`, then the same worker
/// runs the port and the JAX reference on it and both pass.
fn failure_mode(name: &'static str, fixture: &'static str, timeout_s: f64, outcome: Outcome, reason_has: &'static str) -> Trial {
    crate::common::trial(format!("torch::{name}"), move || {
        let mut eval = common::evaluator(timeout_s);
        common::expect(&mut eval, &common::fixture_impl(&format!("torch/{fixture}")), true, outcome.clone(), reason_has)?;
        common::expect(&mut eval, &port("grpo_loss"), true, Outcome::Pass, "")?;
        common::expect(&mut eval, "reference", true, Outcome::Pass, "")
    })
}

/// The libraries' GPU kernels on CPU: Liger's Triton
/// `triton_grpo_loss` under Triton's interpreter passes a few trl:dapo cases
/// (its adapter stays runnable; FINDINGS.md's case counts are the nightly's),
/// and verl's Triton linear cross-entropy still shows finding VT1 (its running
/// max starts at 0: a row of negative logits gives log 0). Liger's
/// `compiled=True` is the nightly's alone: torch.compile's caches make its
/// outcome depend on what ran before (examples/liger/FINDINGS.md, LC1, LC2).
fn the_libraries_gpu_kernels_run_on_cpu() -> Trial {
    crate::common::trial("torch::the_libraries_gpu_kernels_run_on_cpu", || {
        let function = "examples/liger/triton_adapter.py:grpo_loss";
        let run = check(&common::repo().join(function).display().to_string(), Kind::Logits, 4, Some("trl:dapo"), vec![Dtype::F32, Dtype::Bf16], "liger-triton")?;
        let s = &run.summaries[0];
        if !s.passed || s.supported < common::cases(4) as usize {
            return Err(format!("{function}: passed {}, {} checked: {:?} on {:?}", s.passed, s.supported, s.failure, s.minimal_case).into());
        }
        let file = common::repo().join("examples/verl/repros/triton-lce-max-identity-zero-masked-token-nan-grad.json");
        let passed = grpo_verify::repro::replay(&file, None, &[], Duration::from_secs(600)).map_err(|e| format!("{}: {e:#}", file.display()))?;
        if passed {
            return Err(format!("{} passes: verl's Triton linear cross-entropy no longer shows VT1 (FINDINGS.md)", file.display()).into());
        }
        Ok(())
    })
}

/// This suite's trials (suites/main.rs runs them with the others).
pub fn trials() -> Vec<Trial> {
    let both = || vec![Dtype::F32, Dtype::Bf16];
    // The longest first (libtest-mimic starts them in this order on its
    // threads): alone, the Triton interpreter's test took 32 s and the hang
    // (its 20 s timeout) 29 s; started last, they ran on after the others.
    let tests = vec![
        the_libraries_gpu_kernels_run_on_cpu(),
        failure_mode("a_hang_times_out_and_restarts", "hang.py", 20.0, Outcome::Fail, "no reply within"),
        port_passes("grpo_loss", Kind::Logits, 40, None),
        port_passes("grpo_loss", Kind::Logits, 40, Some("all")),
        port_passes("grpo_loss_fused", Kind::Fused, 30, Some("all")),
        caught("cotangent_ignored.py", 60, both(), "cotangent"),
        // bf16 logits only: at f32 the fixture is the correct port.
        caught("bf16_softmax.py", 60, vec![Dtype::Bf16], "precision"),
        failure_mode("a_killed_process_fails_the_case_and_restarts", "crash.py", 120.0, Outcome::Fail, "SIGSEGV"),
        failure_mode("a_detached_loss_has_zero_gradients_and_fails", "detached_loss.py", 120.0, Outcome::Fail, "grad"),
        failure_mode("a_numpy_loss_is_an_impl_error", "wrong_return.py", 120.0, Outcome::Fail, "torch.Tensor"),
    ];
    tests
}
