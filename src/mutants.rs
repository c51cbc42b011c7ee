//! `grpo-verify mutants`: the suite measured by the bugs it catches.
//!
//! A catalog is a directory of Python files, each an implementation with one
//! deliberate bug (`grpo_loss`, adapter signature; the first paragraph of
//! its docstring says what the bug is). Files whose name starts with `_` are
//! shared helpers, not mutants. Each mutant is checked like any
//! implementation, on the same generated cases (one seed); it is *caught*
//! when the check fails on a number, and its shrunk repro is written as
//! usual. A mutant that only raises is not caught: it is a broken fixture
//! (say, patching a helper whose signature has changed), and a test that
//! passes on it guards nothing.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::case::objective::{Objective, Scope};
use crate::case::{Dtype, Kind};
use crate::check::{run_check, CheckOptions};
use crate::report::{write_atomic, ImplSummary};
use crate::evaluate::{Evaluator, Unjudged};
use crate::worker::outputs::FailedRun;
use crate::repro::Repro;
use crate::case::strategy::Bounds;

/// The categories a mutant file declares (`MUTANT_CATEGORY = "..."`,
/// suites/fixtures/mutants/README.md), and what the two that change the
/// draws mean: `v2` is a SPEC v2 bug, checked on `--objective all` draws
/// (the others on v1's); `conv` declares a precision convention
/// (docs/conventions.md) and carries a bug it must not hide, checked on
/// bf16 draws alone, where its declaration applies (an f32 case is held to
/// SPEC's contract and would catch it without it).
pub const CATEGORIES: [&str; 9] = ["fwd", "agg", "batch", "bwd", "fused", "prec", "pallas", "conv", "v2"];

/// The declaration's line: `MUTANT_CATEGORY = "<category>"`, at the start
/// of a line, a comment after it allowed.
const CATEGORY_DECLARATION: &str = "MUTANT_CATEGORY = \"";

/// The category `text` (a mutant file) declares: Ok(None) when it declares
/// none, an error naming `file` for an unknown one or two declarations.
fn declared_category(text: &str, file: &Path) -> Result<Option<String>> {
    let mut found = text.lines().filter_map(|l| l.strip_prefix(CATEGORY_DECLARATION)).map(|rest| rest.split('"').next().unwrap_or(""));
    let Some(category) = found.next() else { return Ok(None) };
    if found.next().is_some() {
        bail!("{}: MUTANT_CATEGORY is declared twice", file.display());
    }
    if !CATEGORIES.contains(&category) {
        bail!("{}: MUTANT_CATEGORY = {category:?} is not one of {}", file.display(), CATEGORIES.join(", "));
    }
    Ok(Some(category.to_string()))
}

/// The built-in catalog: the suite's fixtures, not part of the shipped package.
pub fn builtin_catalog() -> PathBuf {
    crate::worker::pyenv::repo_root()
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
        .join("suites/fixtures/mutants")
}

/// What a `mutants` run checks each mutant with (docs/cli.md, `mutants`).
#[derive(Clone, Debug)]
pub struct MutantOptions {
    /// Generated cases per mutant (`--cases`).
    pub cases: u32,
    /// The run's seed (the same cases for every mutant of a kind).
    pub seed: u64,
    /// Shapes and dtypes drawn.
    pub bounds: Bounds,
    /// Where report.json, report.md and the repro files go.
    pub report_dir: PathBuf,
    /// Wall time the shrinker may spend on one mutant.
    pub shrink_time: Duration,
    /// Shrink steps allowed for one mutant.
    pub shrink_iters: u32,
    /// Cases per compiled signature.
    pub draws_per_signature: usize,
    /// The first groups follow the covering array (`check`'s default).
    pub plan: bool,
    /// The part of the catalog this run checks (`--partition K/N`).
    pub partition: crate::partition::Partition,
}

impl MutantOptions {
    /// The CI budget: what `cargo test --release` gates on and what
    /// `grpo-verify mutants` runs by default. Shapes stay small enough that
    /// a logits case compiles and runs in well under a second (a fused one
    /// in a few), and large enough for several vocabulary chunks of the
    /// fused mutants, a remainder, and the multi-tile Pallas paths.
    pub fn ci(report_dir: PathBuf) -> Self {
        MutantOptions {
            cases: 60,
            seed: 1,
            bounds: Bounds::new(4, 24, 2100, 64, vec![Dtype::F32, Dtype::Bf16]),
            report_dir,
            // The 64 shrink steps bound the gate; the time is a safety net. At
            // 60 s a loaded machine (CI beside other work) cut a fused
            // mutant's shrink short at 6570 logits, a false alarm of the
            // gate's minimal-size check (suites/mutants.rs).
            shrink_time: Duration::from_secs(300),
            shrink_iters: 64,
            draws_per_signature: crate::check::DRAWS_PER_SIGNATURE,
            partition: crate::partition::Partition::WHOLE,
            plan: true,
        }
    }
}

/// One file of a catalog.
#[derive(Clone, Debug, Serialize)]
pub struct Mutant {
    /// The file stem, e.g. `fwd_clip_band_swapped`.
    pub name: String,
    /// What the file declares (`MUTANT_CATEGORY`, one of [`CATEGORIES`]).
    pub category: String,
    /// The module docstring's first paragraph, without a leading "Bug: ".
    pub bug: String,
    /// The mutant's file.
    pub file: PathBuf,
}

impl Mutant {
    /// The `--impl` name of the mutant.
    pub fn implementation(&self) -> String {
        format!("{}:grpo_loss", self.file.display())
    }
}

/// (stem, canonical path, text) of every `*.py` in `dir` not starting with
/// `_` (the shared helpers), in the directory's order: a catalog's files,
/// GRPO's and the head losses' alike.
pub(crate) fn catalog_files(dir: &Path) -> Result<Vec<(String, PathBuf, String)>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("--catalog {}: cannot read the directory", dir.display()))? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else { continue };
        if !name.ends_with(".py") || name.starts_with('_') {
            continue;
        }
        let file = std::fs::canonicalize(&path)?;
        let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
        files.push((name.trim_end_matches(".py").to_string(), file, text));
    }
    Ok(files)
}

/// Every `*.py` in `dir` not starting with `_`, sorted by name.
pub fn catalog(dir: &Path) -> Result<Vec<Mutant>> {
    let mut mutants = Vec::new();
    for (stem, file, text) in catalog_files(dir)? {
        let category = declared_category(&text, &file)?.with_context(|| {
            format!("{}: no MUTANT_CATEGORY = \"...\" line (one of {}; suites/fixtures/mutants/README.md)", file.display(), CATEGORIES.join(", "))
        })?;
        mutants.push(Mutant {
            category,
            bug: docstring_line(&text).unwrap_or_else(|| "(no docstring)".into()),
            name: stem,
            file,
        });
    }
    if mutants.is_empty() {
        bail!("--catalog {}: no mutant files (*.py not starting with `_`, each defining grpo_loss)", dir.display());
    }
    mutants.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(mutants)
}

/// The first paragraph of a Python module docstring, "Bug: " stripped.
pub(crate) fn docstring_line(text: &str) -> Option<String> {
    let body = text.trim_start();
    let quote = ["\"\"\"", "'''"].into_iter().find(|q| body.starts_with(q))?;
    let rest = &body[quote.len()..];
    let docstring = &rest[..rest.find(quote)?];
    let paragraph: Vec<&str> = docstring.lines().map(str::trim).take_while(|l| !l.is_empty()).collect();
    let line = paragraph.join(" ");
    Some(line.strip_prefix("Bug:").unwrap_or(&line).trim().to_string())
}

/// What happened to one mutant: its check, and whether that caught it.
#[derive(Clone, Debug, Serialize)]
pub struct MutantResult {
    /// The mutant checked.
    #[serde(flatten)]
    pub mutant: Mutant,
    /// Some case failed on a number (not only by raising).
    pub caught: bool,
    /// B * T * V of the shrunk repro's case.
    pub minimal_elements: Option<usize>,
    /// Worker calls that compiled a new step, and their wall time (the cost
    /// of a mutant is mostly these, in shrinking).
    pub compiles: usize,
    /// Wall time of those compiling calls.
    pub compile_seconds: f64,
    /// `check.supported` counts the cases checked: up to and including the
    /// first failing one when caught, the whole budget when not.
    pub check: ImplSummary,
}

/// Checks one mutant. `kind` comes from loading it (`Worker::load`).
pub fn run_mutant(eval: &mut Evaluator, mutant: &Mutant, kind: Kind, opts: &MutantOptions) -> Result<MutantResult> {
    let mut bounds = opts.bounds.clone();
    match mutant.category.as_str() {
        // A SPEC v2 bug: drawn on every v2 switch and preset (`--objective all`).
        "v2" => bounds.objective = Objective { scope: Scope::All, ..bounds.objective },
        "conv" => bounds.dtypes = vec![Dtype::Bf16],
        _ => {}
    }
    // A mutant is measured on fresh generated cases (its first failure:
    // "caught after N cases"): nothing remembered, no conventions tried, no
    // real-model cases (the gate's budget counts generated ones).
    let check = CheckOptions {
        seed: opts.seed,
        shrink_time: opts.shrink_time,
        shrink_iters: opts.shrink_iters,
        draws_per_signature: opts.draws_per_signature,
        plan: opts.plan,
        ..CheckOptions::new(vec![mutant.implementation()], opts.cases, bounds, opts.report_dir.clone())
    };
    let mut run = run_check(&check, std::slice::from_mut(eval), &[kind])?;
    let summary = run.summaries.remove(0);
    let minimal_elements = match &summary.repro {
        Some(path) => {
            let shape = Repro::load(path)?.case.shape;
            Some(shape.batch * shape.time * shape.vocab)
        }
        None => None,
    };
    let raised = summary.unjudged == Some(Unjudged::Run(FailedRun::Raised));
    let compiled: Vec<f64> = run.records.iter().filter(|r| r.result.compiled).map(|r| r.result.seconds).collect();
    Ok(MutantResult {
        mutant: mutant.clone(),
        caught: !summary.passed && !raised,
        minimal_elements,
        compiles: compiled.len(),
        compile_seconds: compiled.iter().sum(),
        check: summary,
    })
}

/// Loads every mutant (a file that does not load is an input error: nothing
/// runs) and checks them, one at a time on each evaluator of `pool`,
/// printing one line per mutant as it finishes; the results are in catalog order.
pub fn run_catalog(pool: &mut [Evaluator], mutants: &[Mutant], opts: &MutantOptions) -> Result<Vec<MutantResult>> {
    let mut kinds = Vec::new();
    for m in mutants {
        kinds.push(pool[0].worker.load(&m.implementation())?);
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: std::sync::Mutex<Vec<(usize, Result<MutantResult>)>> = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for eval in pool.iter_mut() {
            let (next, results, kinds) = (&next, &results, &kinds);
            scope.spawn(move || loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if i >= mutants.len() {
                    return;
                }
                let r = run_mutant(eval, &mutants[i], kinds[i], opts);
                if let Ok(r) = &r {
                    println!("{}", line(r));
                }
                let failed = r.is_err();
                results.lock().unwrap().push((i, r));
                if failed {
                    // Stop taking mutants: the run ends with this error.
                    next.store(mutants.len(), std::sync::atomic::Ordering::SeqCst);
                    return;
                }
            });
        }
    });
    let mut results = results.into_inner().unwrap();
    results.sort_by_key(|(i, _)| *i);
    results.into_iter().map(|(_, r)| r).collect()
}

fn line(r: &MutantResult) -> String {
    if r.caught {
        format!(
            "caught   {:<40} after {:>3} cases, {:>5.1} s ({} compiles, {:.1} s); minimal: {}",
            r.mutant.name,
            r.check.supported,
            r.check.seconds,
            r.compiles,
            r.compile_seconds,
            r.check.minimal_case.as_deref().unwrap_or("")
        )
    } else if let Some(failure) = r.check.failure.as_deref() {
        let first = failure.lines().next().unwrap_or("");
        format!("BROKEN   {:<40} it raises instead of computing: {first}", r.mutant.name)
    } else {
        format!("SURVIVED {:<40} {} cases ({} unsupported)", r.mutant.name, r.check.supported, r.check.unsupported)
    }
}

/// What the mutants report says of its run.
pub struct MutantsInfo<'a> {
    /// The command line, as run.
    pub command: String,
    /// The catalog directory.
    pub catalog: &'a Path,
    /// The run's options.
    pub opts: &'a MutantOptions,
    /// The worker's `hello` (versions, devices).
    pub worker: &'a serde_json::Value,
    /// Wall time of the whole run.
    pub seconds: f64,
}

/// `report.json` and `report.md` in `opts.report_dir`, written whole or not at all.
pub fn write_report(info: &MutantsInfo<'_>, results: &[MutantResult]) -> Result<()> {
    let dir = &info.opts.report_dir;
    std::fs::create_dir_all(dir).with_context(|| format!("creating report directory {}", dir.display()))?;
    let caught = results.iter().filter(|r| r.caught).count();
    let report = serde_json::json!({
        "tool": format!("grpo-verify {}", env!("CARGO_PKG_VERSION")),
        "report": "mutants",
        "command": info.command,
        "partition": info.opts.partition,
        "catalog": info.catalog,
        "seed": info.opts.seed,
        "cases": info.opts.cases,
        "bounds": format!("{:?}", info.opts.bounds),
        "worker": info.worker,
        "seconds": info.seconds,
        "caught": caught,
        "total": results.len(),
        "mutants": results,
    });
    write_atomic(&dir.join("report.json"), &serde_json::to_string_pretty(&report)?)?;
    write_atomic(&dir.join("report.md"), &markdown(info, results, caught))?;
    Ok(())
}

fn markdown(info: &MutantsInfo<'_>, results: &[MutantResult], caught: usize) -> String {
    let mut md = String::new();
    let w = &mut md;
    let _ = writeln!(w, "# grpo-verify mutants: {caught} of {} caught\n", results.len());
    let _ = writeln!(w, "`{}`\n", info.command);
    let _ = writeln!(
        w,
        "catalog `{}`; seed {}, up to {} generated cases per mutant; {:.1} s\n",
        info.catalog.display(),
        info.opts.seed,
        info.opts.cases,
        info.seconds
    );
    let _ = writeln!(w, "| mutant | kind | bug | caught | after cases | seconds (compiling) | minimal case | what failed | replay |");
    let _ = writeln!(w, "|---|---|---|---|---|---|---|---|---|");
    for r in results {
        let failure = r.check.failure.as_deref().unwrap_or("");
        let what = failure.split(" (").next().unwrap_or(failure);
        let _ = writeln!(
            w,
            "| `{}` | {} | {} | {} | {} | {:.1} ({:.1} in {} compiles) | {} | {} | {} |",
            r.mutant.name,
            r.check.kind,
            r.mutant.bug.replace('|', "\\|"),
            if r.caught { "yes" } else { "**SURVIVED**" },
            r.check.supported,
            r.check.seconds,
            r.compile_seconds,
            r.compiles,
            r.check.minimal_case.as_deref().unwrap_or("-"),
            what.replace('|', "\\|"),
            r.check.replay.as_deref().map(|c| format!("`{c}`")).unwrap_or_default(),
        );
    }
    md
}

#[cfg(test)]
mod tests {
    use super::{catalog, declared_category, docstring_line};
    use std::path::Path;

    /// The category is the file's declaration, whatever its name says: a
    /// missing, unknown or doubled one is refused naming the file; every
    /// built-in mutant declares one.
    #[test]
    fn the_category_is_the_files_declaration() {
        let file = Path::new("fwd_x.py");
        let declared = |text: &str| declared_category(text, file);
        assert_eq!(declared("\"\"\"Bug: x.\"\"\"\nMUTANT_CATEGORY = \"v2\"  # why\n").unwrap().as_deref(), Some("v2"));
        assert_eq!(declared("import jax\n").unwrap(), None);
        assert!(declared("MUTANT_CATEGORY = \"sparkle\"\n").unwrap_err().to_string().contains("fwd_x.py: MUTANT_CATEGORY = \"sparkle\" is not one of"));
        assert!(declared("MUTANT_CATEGORY = \"v2\"\nMUTANT_CATEGORY = \"v2\"\n").is_err());
        let builtin = catalog(&super::builtin_catalog()).unwrap();
        assert!(builtin.iter().any(|m| m.category == "v2") && builtin.iter().any(|m| m.category == "conv"));
    }

    #[test]
    fn the_bug_is_the_docstrings_first_paragraph() {
        let text = "\"\"\"Bug: the tail chunk\n    is dropped.\n\nDetails.\n\"\"\"\nimport jax\n";
        assert_eq!(docstring_line(text).as_deref(), Some("the tail chunk is dropped."));
        assert_eq!(docstring_line("'''Bug: one line.'''\n").as_deref(), Some("one line."));
        assert_eq!(docstring_line("import jax\n"), None);
    }
}

/// `grpo-verify mutants`: every mutant of `catalog` (None: the built-in
/// one) checked on `jobs` workers, the report written, one line printed per
/// mutant. `Ok(false)`: some mutant survived or raised.
pub fn command(catalog: Option<PathBuf>, opts: MutantOptions, jobs: usize, timeout: Duration) -> Result<bool> {
    let catalog = match catalog {
        Some(catalog) => catalog,
        None if crate::worker::pyenv::repo_root().is_none() => anyhow::bail!(
            "the built-in mutant catalog (suites/fixtures/mutants) ships with the repository, not the \
             installed package: pass --catalog DIR (a clone's suites/fixtures/mutants, or your own)"
        ),
        None => builtin_catalog(),
    };
    let all = self::catalog(&catalog)?;
    let count = all.len();
    let mutants = opts.partition.keep(all);
    if mutants.is_empty() {
        bail!("--partition {}: the catalog's {count} mutants make at most {count} parts, and this one would hold none", opts.partition);
    }
    let jobs = jobs.min(mutants.len().max(1));
    let started = std::time::Instant::now();
    let mut pool = Evaluator::start_pool(timeout, 1, jobs)?;
    println!("{} mutants from {}, up to {} cases each (seed {}, {jobs} jobs)", mutants.len(), catalog.display(), opts.cases, opts.seed);
    let results = run_catalog(&mut pool, &mutants, &opts)?;
    let info = MutantsInfo {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        catalog: &catalog,
        opts: &opts,
        worker: &pool[0].worker.hello,
        seconds: started.elapsed().as_secs_f64(),
    };
    write_report(&info, &results)?;
    let caught = results.iter().filter(|r| r.caught).count();
    println!("{caught} of {} mutants caught", results.len());
    println!("report: {}", opts.report_dir.join("report.md").display());
    Ok(caught == results.len())
}
