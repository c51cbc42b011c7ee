//! The head losses end to end (`check --objective cross_entropy|distillation`):
//! every built-in head-loss implementation, and the chunked path in chunks
//! small enough to have several and a ragged tail, passes generated cases of
//! each objective against the f64 oracle; every mutant of the head catalog
//! (`suites/fixtures/head_mutants`) is caught, shrunk to a small case whose
//! repro fails again while the reference passes it; and bad input is exit 2.

use crate::common;

use std::cell::RefCell;
use std::process::Command;

use grpo_verify::head::case::HeadObjective;
use grpo_verify::head::mutants::{builtin_catalog, catalog, ci_options, run_catalog, HeadMutant};
use grpo_verify::head::{recheck, run, HeadOptions, HeadRepro};
use grpo_verify::worker::process::Worker;
use libtest_mimic::{Failed, Trial};

/// A caught mutant's shrunk case holds at most this many logits (N * V);
/// most shrink to a handful.
const MAX_MINIMAL_ELEMENTS: usize = 4096;

thread_local! {
    static WORKER: RefCell<Option<Worker>> = const { RefCell::new(None) };
}

fn with_worker<T>(f: impl FnOnce(&mut Worker) -> T) -> T {
    WORKER.with(|cell| {
        let mut slot = cell.borrow_mut();
        let worker = slot.get_or_insert_with(|| Worker::start(&grpo_verify::worker::pyenv::resolve().expect("python environment")).expect("worker starts"));
        f(worker)
    })
}

fn report_dir(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("grpo-verify-head-{}-{name}", std::process::id()))
}

fn builtins_pass(objective: HeadObjective) -> Trial {
    crate::common::trial(format!("head::builtins_pass_{}", objective.name()), move || {
        let mut opts = ci_options(report_dir(objective.name()));
        opts.objective = objective;
        opts.cases = common::cases(40);
        opts.implementations = vec![
            "head_reference".into(),
            "head_fused_reference".into(),
            "head_fused_chunked".into(),
            format!("{}:head_loss", common::repo().join("suites/fixtures/impls/head/chunked_small.py").display()),
        ];
        let summaries = with_worker(|w| run(&opts, w)).map_err(|e| format!("{e:#}"))?;
        for s in &summaries {
            if !s.passed || s.checked != opts.cases as usize {
                return Err(format!("{} on {}: passed {} on {} of {} cases: {:?}", s.implementation, objective.name(), s.passed, s.checked, opts.cases, s.failure).into());
            }
        }
        Ok(())
    })
}

fn caught(mutant: HeadMutant) -> Trial {
    crate::common::trial(format!("head::catches_{}", mutant.name), move || {
        with_worker(|w| -> Result<(), Failed> {
            let mut opts: HeadOptions = ci_options(report_dir(&mutant.name));
            opts.cases = common::cases(opts.cases);
            let r = run_catalog(w, std::slice::from_ref(&mutant), &opts).map_err(|e| format!("{e:#}"))?.remove(0);
            let Some(failure) = &r.check.failure else {
                return Err(format!("{} survived {} cases: {}", mutant.name, r.check.checked, mutant.bug).into());
            };
            if !r.caught {
                return Err(format!("{} raises instead of computing (a broken fixture): {}", mutant.name, failure.message).into());
            }
            let text = std::fs::read_to_string(&failure.repro)?;
            let repro: HeadRepro = serde_json::from_str(&text)?;
            let elements = repro.case.rows() * repro.case.vocab;
            if elements > MAX_MINIMAL_ELEMENTS {
                return Err(format!("{}: shrunk only to {} ({elements} logits)", mutant.name, repro.case.summary()).into());
            }
            let timeout = opts.timeout;
            if recheck(w, &repro.implementation, &repro.case, timeout)?.is_none() {
                return Err(format!("{}: its repro passes when run again ({})", mutant.name, repro.case.summary()).into());
            }
            let base = match repro.case.kind {
                grpo_verify::case::Kind::Logits => "head_reference",
                grpo_verify::case::Kind::Fused => "head_fused_reference",
            };
            if let Some(why) = recheck(w, base, &repro.case, timeout)? {
                return Err(format!("{}: the reference fails its minimal case too: {why}", mutant.name).into());
            }
            Ok(())
        })
    })
}

/// A library's head adapter (torch, or JAX: tokamax) passes f32 cases of
/// its objective under what it declares it supports, and its bf16
/// finding's repro, where it has one, still fails (examples/*/FINDINGS.md).
fn library_passes_f32(library: &'static str, adapter: &'static str, objective: HeadObjective, finding: Option<&'static str>) -> Trial {
    let (file, function) = adapter.split_once(':').unwrap_or((adapter, "head_loss"));
    let stem = file.trim_end_matches(".py");
    crate::common::trial(format!("libraries::{library}_{stem}_{function}_{}_passes_f32", objective.name()), move || {
        let implementation = format!("{}:{function}", common::repo().join(format!("examples/{library}/{file}")).display());
        let mut opts = ci_options(report_dir(&format!("{library}-{stem}")));
        opts.objective = objective;
        opts.dtypes = vec![grpo_verify::case::Dtype::F32];
        opts.cases = common::cases(60);
        opts.implementations = vec![implementation.clone()];
        with_worker(|w| -> Result<(), Failed> {
            let s = run(&opts, w).map_err(|e| format!("{e:#}"))?.remove(0);
            if !s.passed || s.checked + s.refused != opts.cases as usize || s.checked < opts.cases as usize / 2 {
                return Err(format!("{library}: passed {} on {} of {} f32 cases ({} refused): {:?}", s.passed, s.checked, opts.cases, s.refused, s.failure).into());
            }
            let Some(finding) = finding else { return Ok(()) };
            let repro: HeadRepro = serde_json::from_str(&std::fs::read_to_string(common::repo().join(format!("examples/{library}/repros/{finding}")))?)?;
            let shipped = grpo_verify::repro::canonical_impl(&common::repo().join(&repro.implementation).display().to_string());
            if recheck(w, &shipped, &repro.case, opts.timeout)?.is_none() {
                return Err(format!("{library}: its finding {finding} no longer fails: re-read the library and update FINDINGS.md").into());
            }
            Ok(())
        })
    })
}

fn exit_code(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_grpo-verify")).args(args).current_dir(common::repo()).output().expect("runs");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn bad_input_is_exit_2() -> Trial {
    crate::common::trial("head::bad_input_is_exit_2_naming_it", || {
        let dir = report_dir("bad-input");
        std::fs::create_dir_all(&dir)?;
        let malformed = dir.join("malformed.json");
        std::fs::write(&malformed, r#"{"format": "grpo-verify head-loss repro v1", "implementation": "head_reference", "message": "", "case": {"objective": "cross_entropy"}}"#)?;
        let outside = dir.join("outside.json");
        let mut case = serde_json::json!({
            "objective": "cross_entropy", "kind": "logits", "dtype": "f32", "batch": 1, "time": 1, "vocab": 2,
            "hidden_dim": 0, "teacher_hidden_dim": 0, "reduction": "sum", "divergence": "forward_kl",
            "ignore_index": -100, "label_smoothing": 0.0, "z_loss": 0.0, "softcap": "inf", "temperature": 1.0,
            "beta": 0.5, "num_items": 1.0, "labels": [2], "logits": [0.5, 1.0], "cotangent": 1.0
        });
        std::fs::write(&outside, serde_json::json!({"format": "grpo-verify head-loss repro v1", "implementation": "head_reference", "message": "", "case": case}).to_string())?;
        case["labels"] = serde_json::json!([1]);
        case["temperature"] = serde_json::json!(0.0);
        let tau = dir.join("tau.json");
        std::fs::write(&tau, serde_json::json!({"format": "grpo-verify head-loss repro v1", "implementation": "head_reference", "message": "", "case": case}).to_string())?;
        let refuses_all = format!("{}:head_loss", common::repo().join("suites/fixtures/impls/head/refuses_everything.py").display());
        let refused_report = dir.join("refused").display().to_string();
        let checks: [(&[&str], &str); 7] = [
            (&["check", "--objective", "cross_entropy", "--switch", "kl=true", "--cases", "1"], "--switch kl=true"),
            // An adapter that refuses every case: nothing checked is no pass.
            (&["check", "--objective", "distillation", "--impl", &refuses_all, "--cases", "2", "--report", &refused_report], "nothing was checked"),
            (&["check", "--objective", "distillation", "--partition", "1/2", "--cases", "1"], "--partition"),
            (&["check", "--objective", "cross_entropy", "--impl", "no/such/file.py:head_loss", "--cases", "1"], "no/such/file.py"),
            (&["replay", malformed.to_str().unwrap()], "malformed.json"),
            (&["replay", outside.to_str().unwrap()], "label 2 of row 0 is outside the vocabulary"),
            (&["replay", tau.to_str().unwrap()], "temperature 0"),
        ];
        for (args, named) in checks {
            let (code, stderr) = exit_code(args);
            if code != 2 || !stderr.contains(named) {
                return Err(format!("grpo-verify {}: exit {code} (want 2), stderr not naming {named:?}: {stderr}", args.join(" ")).into());
            }
        }
        Ok(())
    })
}

/// The suite's trials: the built-ins first (the longest), then one per mutant.
pub fn trials() -> Vec<Trial> {
    let mut trials = vec![
        builtins_pass(HeadObjective::CrossEntropy),
        builtins_pass(HeadObjective::Distillation),
        bad_input_is_exit_2(),
        library_passes_f32("trl", "head_adapter.py", HeadObjective::Distillation, Some("head_gkd_bf16_softmax.json")),
        library_passes_f32("liger", "head_adapter.py", HeadObjective::Distillation, Some("head_fused_jsd_bf16_logits.json")),
        library_passes_f32("liger", "head_ce_adapter.py", HeadObjective::CrossEntropy, Some("head_ce_bf16_grad_logits.json")),
        library_passes_f32("liger", "head_ce_adapter.py:fused_head_loss", HeadObjective::CrossEntropy, Some("head_fused_ce_bf16_logits.json")),
        library_passes_f32("liger", "head_kl_adapter.py", HeadObjective::Distillation, Some("head_kl_fused_transposed_weight.json")),
        library_passes_f32("liger", "head_kl_adapter.py:fused_head_loss", HeadObjective::Distillation, Some("head_kl_fused_bf16_logits.json")),
        library_passes_f32("transformers", "head_adapter.py:head_loss_over_count", HeadObjective::CrossEntropy, Some("head_causal_lm_all_ignored_nan.json")),
        library_passes_f32("unsloth", "head_adapter.py:head_loss_untempered", HeadObjective::CrossEntropy, Some("head_scale_before_softcap.json")),
        library_passes_f32("torchtune", "head_adapter.py:head_loss_valid_rows", HeadObjective::CrossEntropy, Some("head_ce_chunked_all_ignored_nan.json")),
        library_passes_f32("torchtune", "head_adapter.py:head_loss_valid_rows", HeadObjective::Distillation, Some("head_reverse_kl_chunked_all_ignored_nan.json")),
        library_passes_f32("tokamax", "head_adapter.py:fused_head_loss", HeadObjective::CrossEntropy, Some("head_fused_ce_bf16_logits.json")),
        library_passes_f32("cut_cross_entropy", "head_adapter.py:head_loss_compiled_past_cc3", HeadObjective::CrossEntropy, Some("head_softcap_padded_vocab.json")),
    ];
    match catalog(&builtin_catalog()) {
        Ok(mutants) => trials.extend(mutants.into_iter().map(caught)),
        Err(e) => trials.push(crate::common::trial("head::catalog_loads", move || Err(format!("{e:#}").into()))),
    }
    trials
}
