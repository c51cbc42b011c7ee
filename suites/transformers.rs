//! The fixture generator's Qwen2 forward (`python/grpo_fixtures/qwen2.py`)
//! against transformers' `Qwen2ForCausalLM` on a tiny random checkpoint:
//! the final-norm hidden states fixtures store (f32 and bf16 activations),
//! the logits through the LM head fixtures hash, and a sampled fixture's
//! recorded hidden states and old_logp, each within the bound that
//! `python -m grpo_fixtures.transformers_check` derives (its module doc).
//! The same check with our forward broken on purpose (two layers swapped,
//! the rotary embedding dropped) must fail, naming what is off.
//!
//! transformers and torch come from `python/requirements-torch.txt`, which
//! `common::with_torch` installs into the repository's `.venv` (as CI does
//! with `setup --torch`). Whether they are there is decided before the trials
//! are built (`precondition`): missing from the `.venv`, the lock did not
//! install, and every trial fails saying so; missing from an interpreter
//! the user chose (`GRPO_VERIFY_PYTHON`, which `setup` never installs into),
//! the trials are marked ignored ("skipped: ..." before the name, the reason
//! printed), never reported as passed.

use crate::common;

use std::process::Output;

use libtest_mimic::{Failed, Trial};
use serde_json::Value;

fn transformers_check(args: &[&str]) -> Result<Output, Failed> {
    let env = grpo_verify::worker::pyenv::resolve()?;
    Ok(env
        .command()
        .args(["-m", "grpo_fixtures.transformers_check"])
        .args(args)
        .env("JAX_PLATFORMS", "cpu")
        .current_dir(common::repo())
        .output()?)
}

/// The check's exit code, stdout and stderr. Exit 3 (it could not import
/// torch or transformers) is a failure: the trials only run once
/// `precondition` found both installed, or when asked to run ignored ones.
fn run(args: &[&str]) -> Result<(Option<i32>, String, String), Failed> {
    let out = transformers_check(args)?;
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    if out.status.code() == Some(3) {
        return Err(format!("transformers_check could not import torch or transformers (exit 3): {}", stderr.trim()).into());
    }
    Ok((out.status.code(), stdout, stderr))
}

/// Whether the checks can run here, decided before the trials are built.
enum Precondition {
    /// torch and transformers are installed in the worker's Python.
    Met,
    /// Missing from an interpreter the user chose: the trials are ignored.
    Skip(String),
    /// Missing where they must be (the repository's `.venv`, which
    /// `common::with_torch` just installed the torch lock into; CI's
    /// environment), or the interpreter could not be asked: the trials fail.
    Fail(String),
}

/// Are torch and transformers installed (found by `importlib.util.find_spec`,
/// without the seconds importing them takes) in the worker's Python?
fn precondition() -> Precondition {
    let env = match grpo_verify::worker::pyenv::resolve() {
        Ok(env) => env,
        Err(e) => return Precondition::Fail(format!("no Python environment: {e:#}")),
    };
    let probe = "import importlib.util as u; print(', '.join(m for m in ('torch', 'transformers') if u.find_spec(m) is None))";
    let out = match env.command().args(["-c", probe]).output() {
        Ok(out) if out.status.success() => out,
        Ok(out) => return Precondition::Fail(format!("{} -c <find_spec probe> exited {:?}: {}", env.python.display(), out.status.code(), String::from_utf8_lossy(&out.stderr).trim())),
        Err(e) => return Precondition::Fail(format!("{} could not be run: {e}", env.python.display())),
    };
    let missing = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if missing.is_empty() {
        return Precondition::Met;
    }
    let python = env.python.display();
    if std::env::var_os("GRPO_VERIFY_PYTHON").is_some() {
        Precondition::Skip(format!(
            "{python} (GRPO_VERIFY_PYTHON) has no {missing}; install python/requirements-torch.txt there to run these checks"
        ))
    } else {
        Precondition::Fail(format!(
            "{python} has no {missing} although common::with_torch installed the torch lock (python/requirements-torch.txt) \
             into it: CI installs that lock, so this is a broken environment, not a skip"
        ))
    }
}

/// Every check holds on the tiny checkpoint; its figures are printed.
fn forward_matches_transformers() -> Result<(), Failed> {
    let (code, stdout, stderr) = run(&[])?;
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
        let (code, _, stderr) = run(&["--break", how])?;
        if code != Some(1) || !stderr.contains("FAIL hidden_f32") || !stderr.contains("FAIL fixture_hidden") {
            return Err(format!("--break {how}: expected exit 1 failing hidden_f32 and fixture_hidden; got {code:?}:\n{stderr}").into());
        }
        Ok(())
    }
}

/// `make --tasks` end to end (the real-model rollout path) on a tiny random
/// checkpoint with a byte-level tokenizer and a chat template: two tasks of
/// different prompt lengths (left padding), G = 2 completions each, judged
/// by their verifiers; the fixture verifies deep with its first hidden
/// states recomputed from the weights, and the manifest says what made it.
/// The verifiers themselves on completions written to pass and to fail.
fn a_rollout_on_tasks_end_to_end() -> Result<(), Failed> {
    let dir = std::env::temp_dir().join(format!("grpo-verify-rollout-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let (ckpt, fixture, tasks) = (dir.join("ckpt"), dir.join("fixture"), dir.join("tasks.json"));
    let s = |p: &std::path::Path| p.to_str().unwrap().to_string();
    let run = |args: &[&str]| -> Result<String, Failed> {
        let out = common::python_with(args, &[("JAX_PLATFORMS", "cpu")])?;
        if !out.status.success() {
            return Err(format!("{args:?} failed ({:?}):\n{}", out.status.code(), String::from_utf8_lossy(&out.stderr)).into());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    run(&["-m", "grpo_fixtures", "tiny-checkpoint", "--out", &s(&ckpt), "--seed", "2", "--tokenizer"])?;
    std::fs::write(&tasks, serde_json::to_string(&serde_json::json!({
        "instruction": "Answer in \\boxed{}.",
        "tasks": [
            {"id": "sum", "verifier": "boxed-number", "answer": "7", "prompt": "3 + 4?"},
            {"id": "code", "verifier": "python-tests", "prompt": "Write f() returning 1, a longer prompt than the first.", "tests": "assert f() == 1"}
        ]
    }))?)?;
    run(&["-m", "grpo_fixtures", "make", "--model-dir", &s(&ckpt), "--out", &s(&fixture), "--tasks", &s(&tasks), "--group", "2",
          "--time", "12", "--temperature", "1.0", "--seed", "0", "--eos", "none"])?;
    let verified = run(&["-m", "grpo_fixtures", "verify", "--fixture", &s(&fixture), "--deep", "--hidden", "6"])?;
    if !verified.contains("deep: LM head sha256 matches") || !verified.contains("\"worst_err_over_bound\"") {
        return Err(format!("verify --deep --hidden 6 said:\n{verified}").into());
    }
    let manifest: Value = serde_json::from_str(&std::fs::read_to_string(fixture.join("manifest.json"))?)?;
    let lengths: Vec<u64> = manifest["sampling"]["prompt_lengths"].as_array().ok_or("no prompt_lengths")?.iter().filter_map(Value::as_u64).collect();
    if lengths.len() != 4 || lengths[0] != lengths[1] || lengths[2] != lengths[3] || lengths[0] >= lengths[2] {
        return Err(format!("two groups of two rows with the second's prompt longer: {lengths:?}").into());
    }
    let rollouts = manifest["rollouts"].as_array().ok_or("no rollouts")?;
    let verdicts: Vec<&str> = rollouts.iter().filter_map(|r| r["verdict"].as_str()).collect();
    if rollouts.len() != 4 || verdicts.len() != 4 || manifest["prompts"]["row_tasks"] != serde_json::json!(["sum", "sum", "code", "code"]) {
        return Err(format!("four judged rollouts, two per task: {}", manifest["rollouts"]).into());
    }
    // The verifiers on completions made to pass and to fail.
    let probe = r#"
from grpo_fixtures import verifier as v
boxed = {"id": "b", "verifier": "boxed-number", "answer": "1998"}
code = {"id": "c", "verifier": "python-tests", "tests": "assert f(2) == 4"}
cases = [
    (boxed, r"so the sum is \boxed{1,998}.", 1.0), (boxed, r"\boxed{1998} then \boxed{12}", 0.0),
    (boxed, "the answer is 1998", 0.0), (boxed, r"\boxed{\frac{3996}{2}}", 1.0),
    (code, "```python\ndef f(x):\n    return 2 * x\n```", 1.0), (code, "```python\ndef f(x):\n    return x\n```", 0.0),
    (code, "no code here", 0.0), (code, "```python\ndef f(x) return\n```", 0.0),
]
for task, text, want in cases:
    got, detail = v.judge(task, text)
    assert got == want, (text, got, detail)
print("verifiers ok")
"#;
    if !run(&["-c", probe])?.contains("verifiers ok") {
        return Err("the verifier probe did not finish".into());
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// This suite's trials (suites/main.rs runs them with the others, through
/// [`gated`] once the torch lock is in place).
pub fn trials() -> Vec<Trial> {
    vec![
        crate::common::trial("transformers::qwen2_forward_matches_transformers", forward_matches_transformers),
        crate::common::trial("transformers::swapped_layers_are_caught", broken_forward_is_caught("swap-layers")),
        crate::common::trial("transformers::dropped_rotary_is_caught", broken_forward_is_caught("no-rotary")),
        crate::common::trial("transformers::a_rollout_on_tasks_end_to_end", a_rollout_on_tasks_end_to_end),
    ]
}

/// `tests` as they run in this environment: skipped (ignored) where the
/// user's own interpreter lacks torch or Transformers, failing where the
/// repository's .venv does.
pub fn gated(tests: Vec<Trial>) -> Vec<Trial> {
    match precondition() {
        Precondition::Met => tests,
        Precondition::Skip(reason) => {
            eprintln!("transformers: skipped (ignored): {reason}");
            tests.into_iter().map(|t| t.with_kind("skipped: no torch/transformers").with_ignored_flag(true)).collect()
        }
        Precondition::Fail(reason) => tests
            .iter()
            .map(|t| {
                let reason = reason.clone();
                crate::common::trial(t.name(), move || Err(reason.into()))
            })
            .collect(),
    }
}
