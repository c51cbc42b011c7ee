//! `grpo-verify check`: generated cases, every implementation, the tolerance
//! rule, shrinking to a minimal failing case, and a repro file for it.
//!
//! Each implementation gets its own proptest runner seeded with `--seed`, so
//! every implementation sees the same case sequence; the baseline's errors
//! are computed once per case.

use std::cell::{Cell, RefCell};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use indicatif::{ProgressBar, ProgressStyle};
use proptest::test_runner::{
    Config as ProptestConfig, FileFailurePersistence, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner,
};
use serde::Serialize;

use crate::case::{Case, CaseSpec};
use crate::evaluate::{CaseResult, Evaluator, Outcome};
use crate::repro::{slug, Repro, FORMAT};
use crate::strategy::{case_spec, Bounds};

#[derive(Clone, Debug)]
pub struct CheckOptions {
    pub implementations: Vec<String>,
    pub cases: u32,
    pub seed: u64,
    pub bounds: Bounds,
    pub report_dir: PathBuf,
    /// Where proptest persists the seeds of failures, tried first next time.
    pub regressions_dir: Option<PathBuf>,
    pub shrink_time: Duration,
    pub shrink_iters: u32,
}

/// One evaluated case in the report.
#[derive(Clone, Debug, Serialize)]
pub struct CaseRecord {
    pub implementation: String,
    /// Position in the run: generated cases count up; shrink steps follow.
    pub index: usize,
    pub phase: &'static str,
    pub summary: String,
    pub spec: CaseSpec,
    #[serde(flatten)]
    pub result: CaseResult,
}

/// The verdict on one implementation.
#[derive(Clone, Debug, Serialize)]
pub struct ImplSummary {
    pub implementation: String,
    pub kind: String,
    pub passed: bool,
    pub cases: usize,
    pub supported: usize,
    pub unsupported: usize,
    pub shrink_steps: usize,
    pub failure: Option<String>,
    /// Said when fewer cases than requested were checked.
    pub note: Option<String>,
    pub minimal_case: Option<String>,
    pub repro: Option<PathBuf>,
    pub replay: Option<String>,
    pub seconds: f64,
}

/// Draws per requested case before a run settles for fewer checked cases.
const MAX_DRAWS_PER_CASE: u32 = 40;

pub struct CheckRun {
    pub summaries: Vec<ImplSummary>,
    pub records: Vec<CaseRecord>,
}

/// The one-line command that replays a repro file.
pub fn replay_command(path: &std::path::Path) -> String {
    format!("cargo run --release -- replay {}", path.display())
}

/// Resolves `path.py:function` to an absolute path so repro files work from
/// any directory; built-in names and `module:function` pass through.
pub fn canonical_impl(implementation: &str) -> String {
    if let Some((path, func)) = implementation.rsplit_once(':') {
        if path.ends_with(".py") {
            if let Ok(abs) = std::fs::canonicalize(path) {
                return format!("{}:{func}", abs.display());
            }
        }
    }
    implementation.to_string()
}

pub fn run_check(opts: &CheckOptions, eval: &mut Evaluator, kinds: &[String]) -> Result<CheckRun> {
    let strategy = case_spec(&opts.bounds);
    let mut summaries = Vec::new();
    let mut all_records = Vec::new();
    for (implementation, kind) in opts.implementations.iter().zip(kinds) {
        let case_kind = crate::case::Kind::parse(kind).ok_or_else(|| anyhow!("{implementation}: unknown kind {kind}"))?;
        let started = Instant::now();
        let records: RefCell<Vec<CaseRecord>> = RefCell::new(Vec::new());
        let fatal: RefCell<Option<String>> = RefCell::new(None);
        let failing = Cell::new(false);
        let eval_cell = RefCell::new(&mut *eval);
        let progress = ProgressBar::new(opts.cases as u64);
        progress.set_style(
            ProgressStyle::with_template("{prefix:>16} [{bar:30}] {pos}/{len} {elapsed} {msg}")
                .unwrap()
                .progress_chars("=> "),
        );
        progress.set_prefix(slug(implementation));

        let mut config = ProptestConfig {
            cases: opts.cases,
            max_shrink_iters: opts.shrink_iters,
            max_shrink_time: opts.shrink_time.as_millis() as u32,
            failure_persistence: None,
            // Unsupported cases are rejected and another is drawn; an
            // implementation that supports one configuration in 16 (say,
            // one temperature mode, no KL, no entropy bonus, one-sided)
            // needs ~16 draws per checked case.
            max_global_rejects: opts.cases.saturating_mul(MAX_DRAWS_PER_CASE).max(1024),
            ..ProptestConfig::default()
        };
        if let Some(dir) = &opts.regressions_dir {
            std::fs::create_dir_all(dir)?;
            let path = dir.join(format!("{}.txt", slug(implementation)));
            let leaked: &'static str = Box::leak(path.display().to_string().into_boxed_str());
            config.failure_persistence = Some(Box::new(FileFailurePersistence::Direct(leaked)));
        }
        let mut seed = [0u8; 32];
        seed[..8].copy_from_slice(&opts.seed.to_le_bytes());
        let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &seed));

        let outcome = runner.run(&strategy, |spec: CaseSpec| {
            if let Some(reason) = fatal.borrow().as_ref() {
                return Err(TestCaseError::fail(reason.clone()));
            }
            let case = spec.materialize(case_kind);
            let result = match eval_cell.borrow_mut().evaluate(implementation, &case) {
                Ok(r) => r,
                Err(e) => {
                    *fatal.borrow_mut() = Some(e.to_string());
                    return Err(TestCaseError::fail(e.to_string()));
                }
            };
            let mut recs = records.borrow_mut();
            let phase = if failing.get() { "shrink" } else { "generated" };
            if failing.get() {
                progress.set_message(format!("shrinking: step {}, now {}", recs.len(), short(&case)));
            } else if result.outcome != Outcome::Unsupported {
                progress.inc(1);
            }
            let verdict = match result.outcome {
                Outcome::Fail => {
                    failing.set(true);
                    Err(TestCaseError::fail(result.reason.clone()))
                }
                // Not counted: `--cases` is the number of cases checked.
                Outcome::Unsupported => Err(TestCaseError::reject(result.reason.clone())),
                Outcome::Pass => Ok(()),
            };
            let index = recs.len();
            recs.push(CaseRecord {
                implementation: implementation.clone(),
                index,
                phase,
                summary: case.summary(),
                spec,
                result,
            });
            verdict
        });
        progress.finish_and_clear();
        if let Some(reason) = fatal.into_inner() {
            return Err(anyhow!("{reason}"));
        }
        let records = records.into_inner();
        let generated = records.iter().filter(|r| r.phase == "generated").count();
        let unsupported = records.iter().filter(|r| r.result.outcome == Outcome::Unsupported).count();
        let shrink_steps = records.len() - generated;
        let mut summary = ImplSummary {
            implementation: implementation.clone(),
            kind: kind.clone(),
            passed: true,
            cases: generated,
            supported: generated - unsupported,
            unsupported,
            shrink_steps,
            failure: None,
            note: None,
            minimal_case: None,
            repro: None,
            replay: None,
            seconds: 0.0,
        };
        match outcome {
            Ok(()) => {}
            Err(TestError::Fail(_, minimal)) => {
                let case: Case = minimal.materialize(case_kind);
                // The minimal case's own verdict (it was evaluated while shrinking).
                let last = records
                    .iter()
                    .rev()
                    .find(|r| r.spec == minimal && r.result.outcome == Outcome::Fail)
                    .map(|r| r.result.reason.clone())
                    .unwrap_or_default();
                let dir = opts.report_dir.join("repro");
                let mut repro = Repro {
                    format: FORMAT.into(),
                    implementation: canonical_impl(implementation),
                    summary: case.summary(),
                    failure: last.clone(),
                    run_seed: opts.seed,
                    spec: Some(minimal),
                    case,
                    replay: String::new(),
                };
                let path = dir.join(format!("{}.json", slug(&repro.implementation)));
                repro.replay = replay_command(&path);
                let path = repro.write(&dir)?;
                summary.passed = false;
                summary.failure = Some(last);
                summary.minimal_case = Some(repro.summary.clone());
                summary.replay = Some(replay_command(&path));
                summary.repro = Some(path);
            }
            Err(TestError::Abort(reason)) if reason.message().contains("global rejects") => {
                summary.note = Some(format!(
                    "only {} of the {} requested cases were supported ({} draws; the rest raised NotImplementedError)",
                    summary.supported, opts.cases, generated
                ));
            }
            Err(TestError::Abort(reason)) => return Err(anyhow!("proptest aborted the run: {reason}")),
        }
        summary.seconds = started.elapsed().as_secs_f64();
        summaries.push(summary);
        all_records.extend(records);
    }
    Ok(CheckRun { summaries, records: all_records })
}

fn short(case: &Case) -> String {
    format!("B={} T={} V={}", case.shape.batch, case.shape.time, case.shape.vocab)
}
