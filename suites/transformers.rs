//! The fixture generator's Qwen2 forward (`python/grpo_fixtures/qwen2.py`)
//! against transformers' `Qwen2ForCausalLM` on a tiny random checkpoint:
//! the final-norm hidden states fixtures store (f32 and bf16 activations),
//! the logits through the LM head fixtures hash, and a sampled fixture's
//! recorded hidden states and old_logp, each within the bound that
//! `python -m grpo_fixtures.transformers_check` derives (its module doc).
//! The same check with our forward broken on purpose (two layers swapped,
//! the rotary embedding dropped) must fail, naming what is off.
//!
//! transformers and torch come from `python/requirements-torch.txt`; without
//! them the check exits 3 and these tests are skipped, saying so.

mod common;

use std::process::{Command, Output};

use libtest_mimic::{Arguments, Failed, Trial};
use serde_json::Value;

fn transformers_check(args: &[&str]) -> Result<Output, Failed> {
    let env = grpo_verify::worker::pyenv::resolve()?;
    Ok(Command::new(&env.python)
        .args(["-m", "grpo_fixtures.transformers_check"])
        .args(args)
        .env("PYTHONPATH", env.pythonpath())
        .env("JAX_PLATFORMS", "cpu")
        .current_dir(common::repo())
        .output()?)
}

/// None when transformers is not installed (exit 3): the caller skips.
fn run(args: &[&str]) -> Result<Option<(Option<i32>, String, String)>, Failed> {
    let out = transformers_check(args)?;
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    if out.status.code() == Some(3) {
        eprintln!("skipped: {}", stderr.trim());
        return Ok(None);
    }
    Ok(Some((out.status.code(), stdout, stderr)))
}

/// Every check holds on the tiny checkpoint; its figures are printed.
fn forward_matches_transformers() -> Result<(), Failed> {
    let Some((code, stdout, stderr)) = run(&[])? else { return Ok(()) };
    let failures: Vec<&str> = stderr.lines().filter(|l| l.starts_with("FAIL")).collect();
    if code != Some(0) {
        return Err(format!("transformers_check exited {code:?}:\n{}\n{stderr}", failures.join("\n")).into());
    }
    let result: Value = serde_json::from_str(&stdout).map_err(|e| format!("not JSON ({e}): {stdout}"))?;
    let checks = result["checks"].as_array().ok_or("no checks in the output")?;
    let names: Vec<&str> = checks.iter().filter_map(|c| c["check"].as_str()).collect();
    for wanted in ["lm_head", "hidden_f32", "logits_f32", "hidden_bf16", "fixture_hidden", "fixture_logp"] {
        if !names.contains(&wanted) {
            return Err(format!("check {wanted} did not run: {names:?}").into());
        }
    }
    if let Some(c) = checks.iter().find(|c| c["pass"] != Value::Bool(true)) {
        return Err(format!("exit 0 but a check failed: {c}").into());
    }
    for c in checks.iter().filter(|c| c["err_in_u"].is_number()) {
        eprintln!(
            "{}: {:.1} u (bound {:.1} u; transformers' own f32/bf16 error {:.1} u)",
            c["check"].as_str().unwrap_or("?"),
            c["err_in_u"].as_f64().unwrap_or(f64::NAN),
            c["bound_in_u"].as_f64().unwrap_or(f64::NAN),
            c["transformers_err_in_u"].as_f64().unwrap_or(f64::NAN)
        );
    }
    Ok(())
}

/// Our forward broken on purpose must fail the check (exit 1) on the hidden states.
fn broken_forward_is_caught(how: &'static str) -> impl FnOnce() -> Result<(), Failed> {
    move || {
        let Some((code, _, stderr)) = run(&["--break", how])? else { return Ok(()) };
        if code != Some(1) || !stderr.contains("FAIL hidden_f32") || !stderr.contains("FAIL fixture_hidden") {
            return Err(format!("--break {how}: expected exit 1 failing hidden_f32 and fixture_hidden; got {code:?}:\n{stderr}").into());
        }
        Ok(())
    }
}

fn main() {
    let args = Arguments::from_args();
    common::with_torch();
    let tests = vec![
        Trial::test("transformers::qwen2_forward_matches_transformers", forward_matches_transformers),
        Trial::test("transformers::swapped_layers_are_caught", broken_forward_is_caught("swap-layers")),
        Trial::test("transformers::dropped_rotary_is_caught", broken_forward_is_caught("no-rotary")),
    ];
    libtest_mimic::run(&args, tests).exit();
}
