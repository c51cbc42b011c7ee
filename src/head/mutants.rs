//! The head losses' mutant gate (`grpo-verify mutants --objective head`):
//! a catalog of head-loss adapters, each with one deliberate bug (the first
//! paragraph of its docstring says which, and whose), checked like any
//! head-loss implementation on one seed's cases. A mutant is caught when a
//! case fails on a number; one that only raises is a broken fixture, not caught.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::Serialize;

use super::case::HeadObjective;
use super::{check_one, load, HeadOptions, HeadSummary};
use crate::case::Dtype;
use crate::report::write_atomic;
use crate::worker::process::Worker;

/// One mutant file.
#[derive(Clone, Debug, Serialize)]
pub struct HeadMutant {
    /// The file stem.
    pub name: String,
    /// `MUTANT_OBJECTIVE = "..."`: the loss it is checked on.
    pub objective: HeadObjective,
    /// `MUTANT_DTYPE = "bf16"`: a precision bug only bf16 cases show (else both dtypes).
    pub bf16_only: bool,
    /// The docstring's first paragraph, "Bug: " stripped.
    pub bug: String,
    /// The file.
    pub file: PathBuf,
}

/// One mutant's check and whether it caught the bug.
#[derive(Clone, Debug, Serialize)]
pub struct HeadMutantResult {
    /// The mutant.
    #[serde(flatten)]
    pub mutant: HeadMutant,
    /// A case failed on a number.
    pub caught: bool,
    /// Its check.
    pub check: HeadSummary,
}

/// The built-in head-loss catalog (the suite's fixtures).
pub fn builtin_catalog() -> PathBuf {
    crate::worker::pyenv::repo_root().unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR"))).join("suites/fixtures/head_mutants")
}

/// The value of `NAME = "value"` at the start of a line, if the file declares it.
fn declared<'t>(text: &'t str, name: &str) -> Option<&'t str> {
    let prefix = format!("{name} = \"");
    text.lines().find_map(|l| l.strip_prefix(prefix.as_str())).and_then(|rest| rest.split('"').next())
}

/// Every `*.py` of `dir` not starting with `_`, sorted by name.
pub fn catalog(dir: &Path) -> Result<Vec<HeadMutant>> {
    let mut mutants = Vec::new();
    for (name, file, text) in crate::mutants::catalog_files(dir)? {
        let objective = declared(&text, "MUTANT_OBJECTIVE").and_then(HeadObjective::named).with_context(|| {
            format!("{}: no MUTANT_OBJECTIVE = \"cross_entropy\" or \"distillation\" line", file.display())
        })?;
        let bf16_only = match declared(&text, "MUTANT_DTYPE") {
            None => false,
            Some("bf16") => true,
            Some(other) => bail!("{}: MUTANT_DTYPE = {other:?}; the only one is \"bf16\"", file.display()),
        };
        let bug = crate::mutants::docstring_line(&text).unwrap_or_else(|| "(no docstring)".into());
        mutants.push(HeadMutant { name, objective, bf16_only, bug, file });
    }
    if mutants.is_empty() {
        bail!("--catalog {}: no head-loss mutant files (*.py not starting with `_`, each defining head_loss)", dir.display());
    }
    mutants.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(mutants)
}

/// The gate's budget: small shapes (a case compiles in under a second),
/// several row chunks of the chunked mutants, vocabularies on every side of
/// the tile edges up to 1025.
pub fn ci_options(report_dir: PathBuf) -> HeadOptions {
    HeadOptions {
        implementations: Vec::new(),
        objective: HeadObjective::CrossEntropy,
        cases: 40,
        seed: 1,
        dtypes: vec![Dtype::F32, Dtype::Bf16],
        max_batch: 3,
        max_time: 6,
        max_vocab: 1100,
        max_hidden: 16,
        report_dir,
        timeout: Duration::from_secs(600),
        shrink_iters: 64,
    }
}

/// Checks every mutant of the catalog on one worker, one line each as it finishes.
pub fn run_catalog(worker: &mut Worker, mutants: &[HeadMutant], opts: &HeadOptions) -> Result<Vec<HeadMutantResult>> {
    let mut results = Vec::new();
    for m in mutants {
        let implementation = format!("{}:head_loss", m.file.display());
        let (kind, supports) = load(worker, &implementation, opts.timeout)?;
        let mut o = opts.clone();
        o.objective = m.objective;
        o.report_dir = opts.report_dir.join(&m.name);
        if m.bf16_only {
            o.dtypes = vec![Dtype::Bf16];
        }
        let check = check_one(&o, worker, &implementation, kind, &supports)?;
        let caught = check.failure.as_ref().is_some_and(|f| f.numeric);
        let verdict = match &check.failure {
            Some(_) if caught => "caught",
            Some(_) => "BROKEN",
            None => "SURVIVED",
        };
        println!(
            "{verdict} {:<45} {}",
            m.name,
            check.failure.as_ref().map_or(format!("passed {} cases", check.checked), |f| format!("after {} cases: {}", check.checked, f.case))
        );
        results.push(HeadMutantResult { mutant: m.clone(), caught, check });
    }
    Ok(results)
}

/// `grpo-verify mutants --objective head`: the catalog, report.json and
/// report.md in the report directory; Ok(false) when a mutant was missed.
pub fn command(catalog_dir: Option<PathBuf>, opts: HeadOptions) -> Result<bool> {
    let dir = catalog_dir.unwrap_or_else(builtin_catalog);
    let mutants = catalog(&dir)?;
    let env = crate::worker::pyenv::resolve()?;
    let mut worker = Worker::start(&env).map_err(|e| anyhow::anyhow!("{e}"))?;
    let results = run_catalog(&mut worker, &mutants, &opts)?;
    let caught = results.iter().filter(|r| r.caught).count();
    std::fs::create_dir_all(&opts.report_dir)?;
    let report = serde_json::json!({"report": "head_mutants", "catalog": dir, "seed": opts.seed, "cases": opts.cases, "caught": caught, "mutants": results});
    write_atomic(&opts.report_dir.join("report.json"), &serde_json::to_string_pretty(&report)?)?;
    let mut md = format!("# Head-loss mutants: {caught} of {} caught (seed {}, {} cases each)\n\n| mutant | objective | caught | after | minimal case | bug |\n|---|---|---|---|---|---|\n", results.len(), opts.seed, opts.cases);
    for r in &results {
        md += &format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            r.mutant.name,
            r.mutant.objective.name(),
            if r.caught { "yes" } else if r.check.failure.is_some() { "BROKEN" } else { "SURVIVED" },
            r.check.checked,
            r.check.failure.as_ref().map_or("", |f| f.case.as_str()),
            r.mutant.bug
        );
    }
    write_atomic(&opts.report_dir.join("report.md"), &md)?;
    println!("{caught} of {} head-loss mutants caught; report in {}", results.len(), opts.report_dir.display());
    Ok(caught == results.len())
}
