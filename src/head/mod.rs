//! `check --objective cross_entropy|distillation`: the other losses trained
//! on the same head (docs/spec.md, "The other losses on the head"), checked
//! like GRPO: proptest-drawn cases (`case`), every head-loss implementation
//! run through the worker's `head_run` op, each returned quantity judged
//! against the f64 oracle `grpo_oracle::losses` (`judge`), a failure shrunk
//! by proptest to a minimal case and written as a repro file that
//! `grpo-verify replay` runs again.

pub mod case;
pub mod judge;
pub mod strategy;
pub mod mutants;
pub mod bench;

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use proptest::test_runner::{TestCaseError, TestError};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::case::{Dtype, Kind};
use crate::report::write_atomic;
use crate::repro::slug;
use crate::worker::process::{ReplyKind, Worker, WorkerError};
use case::{HeadBounds, HeadCase, HeadObjective, Supports};
use judge::{Expected, HeadError, BOUND_UNITS};

/// A head-loss repro file's `format`.
pub const FORMAT: &str = "grpo-verify head-loss repro v1";

/// What one head-loss run draws and checks.
#[derive(Clone, Debug)]
pub struct HeadOptions {
    /// The implementations (empty: the built-in head-loss implementations).
    pub implementations: Vec<String>,
    /// Cross-entropy or distillation.
    pub objective: HeadObjective,
    /// Generated cases per implementation.
    pub cases: u32,
    /// The run's seed.
    pub seed: u64,
    /// The dtypes drawn.
    pub dtypes: Vec<Dtype>,
    /// Largest B, T, V, H.
    pub max_batch: usize,
    /// Largest T.
    pub max_time: usize,
    /// Largest V.
    pub max_vocab: usize,
    /// Largest H.
    pub max_hidden: usize,
    /// Where report.json, report.md and the repro files go.
    pub report_dir: PathBuf,
    /// One request's limit (a hang is a failed case; the worker restarts).
    pub timeout: Duration,
    /// Shrink steps allowed for a failure.
    pub shrink_iters: u32,
}

/// One implementation's result.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HeadSummary {
    /// Its name as given.
    pub implementation: String,
    /// logits or fused.
    pub kind: Kind,
    /// Cases run and judged (shrinking's runs not counted).
    pub checked: usize,
    /// Cases it refused (NotImplementedError).
    pub refused: usize,
    /// No case failed.
    pub passed: bool,
    /// Each quantity's worst error over the judged cases, in f32 units of its scale.
    pub worst: Vec<HeadError>,
    /// How many drawn cases had each switch value and met each edge
    /// (`strategy::coverage_keys`; refused ones included).
    #[serde(default)]
    pub coverage: std::collections::BTreeMap<String, usize>,
    /// The minimal failing case's one line, its errors (or what went wrong), its repro and replay command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<HeadFailure>,
}

impl HeadSummary {
    /// Nothing failed and nothing was judged: every case was refused.
    pub fn unchecked(&self) -> bool {
        self.passed && self.checked == 0 && self.refused > 0
    }

    /// The report's verdict: PASS, FAIL, or NOTHING CHECKED (every case refused).
    pub fn verdict(&self) -> &'static str {
        match (self.passed, self.unchecked()) {
            (true, true) => "NOTHING CHECKED (every case refused)",
            (true, false) => "PASS",
            (false, _) => "FAIL",
        }
    }
}

/// A shrunk failure.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HeadFailure {
    /// What failed on the minimal case.
    pub message: String,
    /// The minimal case, in one line.
    pub case: String,
    /// The repro file.
    pub repro: PathBuf,
    /// The one-line command that replays it.
    pub replay: String,
    /// It failed on a number (not by raising, crashing, hanging or a malformed output).
    pub numeric: bool,
}

/// What a repro file holds.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HeadRepro {
    /// [`FORMAT`].
    pub format: String,
    /// The implementation that failed.
    pub implementation: String,
    /// What failed.
    pub message: String,
    /// The minimal case.
    pub case: HeadCase,
}

/// How a failure that is not a number's starts: the implementation raised,
/// crashed, hung or returned a malformed output.
pub const RUN_FAILED: &str = "run failed: ";

/// How one case went.
enum Verdict {
    Pass(Vec<HeadError>),
    Refused,
    Fail(String),
}

/// Runs `case` on `implementation` and judges it.
fn evaluate(worker: &mut Worker, implementation: &str, case: &HeadCase, timeout: Duration) -> Result<Verdict, String> {
    let expected = Expected::of(case).map_err(|e| format!("bad case (a harness bug): {e}"))?;
    let (header, arrays) = case.request(implementation);
    match worker.request(&header, &arrays, timeout) {
        Ok(reply) => {
            let errors = match expected.judge(case, &reply) {
                Ok(errors) => errors,
                Err(e) => return Ok(Verdict::Fail(format!("{RUN_FAILED}{e}"))),
            };
            if judge::passes(&errors) {
                Ok(Verdict::Pass(errors))
            } else {
                Ok(Verdict::Fail(describe(&errors)))
            }
        }
        Err(WorkerError::Reply { kind: ReplyKind::Unsupported, .. }) => Ok(Verdict::Refused),
        Err(WorkerError::Setup(m)) => Err(m),
        Err(e) => Ok(Verdict::Fail(format!("{RUN_FAILED}{e}"))),
    }
}

/// Runs `case` on `implementation` and judges it again (a repro's case):
/// None when it passes or is refused, else what failed.
pub fn recheck(worker: &mut Worker, implementation: &str, case: &HeadCase, timeout: Duration) -> Result<Option<String>> {
    match evaluate(worker, implementation, case, timeout).map_err(|e| anyhow::anyhow!("{e}"))? {
        Verdict::Fail(message) => Ok(Some(message)),
        _ => Ok(None),
    }
}

/// "grad_hidden 3.1e5 u at row 2 dim 0 (got 0.125, want 0.25); ..." of the errors past the bound.
fn describe(errors: &[HeadError]) -> String {
    errors
        .iter()
        .filter(|e| !(e.units <= BOUND_UNITS))
        .map(|e| match e.quantity.as_str() {
            "grad_dtype" => format!("grad_dtype: {}", e.at),
            _ => format!("{} {:.3e} u{} (got {:e}, want {:e})", e.quantity, e.units, if e.at.is_empty() { String::new() } else { format!(" at {}", e.at) }, e.got, e.want),
        })
        .collect::<Vec<_>>()
        .join("; ")
        + &format!(" (bound {BOUND_UNITS} u)")
}

/// The kind of a head-loss implementation and what it declares it
/// supports (loading it; a bad name exits 2 upstream).
pub fn load(worker: &mut Worker, implementation: &str, timeout: Duration) -> Result<(Kind, Supports)> {
    let header = json!({"op": "head_run", "impl": implementation, "load_only": true});
    let reply = worker.request(&header, &[], timeout).map_err(|e| anyhow::anyhow!("--impl {implementation}: {e}"))?;
    let kind = Kind::parse(reply.header["kind"].as_str().unwrap_or("")).with_context(|| format!("--impl {implementation}: the worker named no kind"))?;
    let supports = match reply.header.get("supports") {
        None | Some(serde_json::Value::Null) => Supports::default(),
        Some(value) => serde_json::from_value(value.clone()).with_context(|| format!("--impl {implementation}: its `supports` attribute {value} is not {{\"reductions\": [...], \"softcap\": bool}}"))?,
    };
    Ok((kind, supports))
}

/// The built-in head-loss implementations, as the worker's hello lists them.
pub fn builtins(worker: &Worker) -> Vec<String> {
    worker.hello["head_builtins"].as_object().map(|m| m.keys().cloned().collect()).unwrap_or_default()
}

/// Checks every implementation of `opts` on one worker.
pub fn run(opts: &HeadOptions, worker: &mut Worker) -> Result<Vec<HeadSummary>> {
    let implementations = if opts.implementations.is_empty() { builtins(worker) } else { opts.implementations.clone() };
    let mut summaries = Vec::new();
    for implementation in &implementations {
        let (kind, supports) = load(worker, implementation, opts.timeout)?;
        summaries.push(check_one(opts, worker, implementation, kind, &supports)?);
    }
    Ok(summaries)
}

/// Checks one implementation of `kind` on `opts.cases` drawn cases, shrinking
/// its first failure to a minimal case and writing its repro.
pub fn check_one(opts: &HeadOptions, worker: &mut Worker, implementation: &str, kind: Kind, supports: &Supports) -> Result<HeadSummary> {
    let bounds = HeadBounds {
        supports: supports.clone(),
        objective: opts.objective,
        kind,
        dtypes: opts.dtypes.clone(),
        max_batch: opts.max_batch,
        max_time: opts.max_time,
        max_vocab: opts.max_vocab,
        max_hidden: opts.max_hidden,
    };
    let plan = strategy::plan(opts.objective);
    let started = Instant::now();
    let (mut checked, mut refused, mut worst) = (0usize, 0usize, Vec::<HeadError>::new());
    let mut coverage = std::collections::BTreeMap::<String, usize>::new();
    let mut outcome = Ok(());
    let mut setup = None;
    // Case k is drawn by its own runner seeded with (seed, kind, k), pinned
    // to the plan's row k (cycling); a failing case is shrunk by it.
    for k in 0..opts.cases as usize {
        let pin = plan[k % plan.len()];
        let mut runner = strategy::case_runner(opts.seed, kind, k, opts.shrink_iters);
        // What the drawn case (not shrinking's) showed: the first call is the draw.
        let first = RefCell::new(None::<Verdict>);
        let drawn = RefCell::new(None::<HeadCase>);
        let state = RefCell::new((&mut *worker, None::<String>));
        let result = runner.run(&strategy::strategy(&bounds, pin), |case| {
            let mut s = state.borrow_mut();
            let verdict = evaluate(s.0, implementation, &case, opts.timeout).map_err(|e| {
                s.1 = Some(e.clone());
                TestCaseError::fail(e)
            })?;
            let failed = match &verdict {
                Verdict::Fail(message) => Some(message.clone()),
                _ => None,
            };
            first.borrow_mut().get_or_insert(verdict);
            drawn.borrow_mut().get_or_insert_with(|| case.clone());
            match failed {
                Some(message) => Err(TestCaseError::fail(message)),
                None => Ok(()),
            }
        });
        setup = state.into_inner().1;
        if let Some(drawn) = drawn.into_inner() {
            for key in strategy::coverage_keys(&drawn) {
                *coverage.entry(key).or_insert(0) += 1;
            }
        }
        match first.into_inner() {
            Some(Verdict::Pass(errors)) => {
                checked += 1;
                merge_worst(&mut worst, errors);
            }
            Some(Verdict::Refused) => refused += 1,
            Some(Verdict::Fail(_)) => checked += 1,
            None => {}
        }
        if setup.is_some() || result.is_err() {
            outcome = result;
            break;
        }
    }
    if let Some(setup) = setup {
        bail!("{implementation}: {setup}");
    }
    let failure = match outcome {
        Ok(()) => None,
        Err(TestError::Abort(why)) => bail!("{implementation}: proptest aborted: {why}"),
        Err(TestError::Fail(message, case)) => {
            let message = message.to_string();
            let path = opts.report_dir.join("repro").join(format!("{}-{}.json", slug(implementation), opts.objective.name()));
            let repro = HeadRepro { format: FORMAT.into(), implementation: crate::repro::canonical_impl(implementation), message: message.clone(), case: case.clone() };
            std::fs::create_dir_all(path.parent().unwrap_or(Path::new("."))).with_context(|| format!("creating {}", path.display()))?;
            write_atomic(&path, &serde_json::to_string_pretty(&repro)?)?;
            let numeric = !message.starts_with(RUN_FAILED);
            Some(HeadFailure { message, case: case.summary(), replay: crate::repro::replay_command(&path), repro: path, numeric })
        }
    };
    eprintln!("{implementation}: {checked} cases checked, {refused} refused in {:.1} s", started.elapsed().as_secs_f64());
    Ok(HeadSummary { implementation: implementation.to_string(), kind, checked, refused, passed: failure.is_none(), worst, coverage, failure })
}

fn merge_worst(worst: &mut Vec<HeadError>, errors: Vec<HeadError>) {
    for e in errors {
        match worst.iter_mut().find(|w| w.quantity == e.quantity) {
            Some(w) if e.units > w.units || e.units.is_nan() => *w = e,
            Some(_) => {}
            None => worst.push(e),
        }
    }
}

/// `check --objective cross_entropy|distillation`: runs, writes report.json
/// and report.md, prints the summary; Ok(false) when an implementation failed.
pub fn command(opts: HeadOptions) -> Result<bool> {
    let env = crate::worker::pyenv::resolve()?;
    let mut worker = Worker::start(&env).map_err(|e| anyhow::anyhow!("{e}"))?;
    let summaries = run(&opts, &mut worker)?;
    write_report(&opts, &summaries)?;
    print!("{}", markdown(&opts, &summaries));
    if summaries.iter().all(HeadSummary::unchecked) {
        bail!(
            "nothing was checked: every case was refused by {} (raised NotImplementedError); \
             choose an --objective or --dtype the implementation supports, or declare its `supports` (report: {})",
            summaries.iter().map(|s| s.implementation.as_str()).collect::<Vec<_>>().join(", "),
            opts.report_dir.join("report.md").display()
        );
    }
    Ok(summaries.iter().all(|s| s.passed))
}

fn write_report(opts: &HeadOptions, summaries: &[HeadSummary]) -> Result<()> {
    std::fs::create_dir_all(&opts.report_dir).with_context(|| format!("creating {}", opts.report_dir.display()))?;
    let report = json!({
        "report": "head_check",
        "objective": opts.objective.name(),
        "seed": opts.seed,
        "cases": opts.cases,
        "bound_units": BOUND_UNITS,
        "implementations": summaries,
    });
    write_atomic(&opts.report_dir.join("report.json"), &serde_json::to_string_pretty(&report)?)?;
    write_atomic(&opts.report_dir.join("report.md"), &markdown(opts, summaries))
}

/// The report a person reads: per implementation, its verdict, its worst
/// error per quantity against the bound, and a failure's repro.
pub fn markdown(opts: &HeadOptions, summaries: &[HeadSummary]) -> String {
    let mut out = format!("# grpo-verify check --objective {} (seed {}, {} cases each; bound {BOUND_UNITS} f32 units of each element's scale)\n\n", opts.objective.name(), opts.seed, opts.cases);
    for s in summaries {
        out += &format!("## {} ({}): {}\n\n{} cases checked, {} refused.\n\n", s.implementation, s.kind.name(), s.verdict(), s.checked, s.refused);
        if !s.worst.is_empty() {
            out += "| quantity | worst error (u) | where | got | want |\n|---|---|---|---|---|\n";
            for e in &s.worst {
                out += &format!("| {} | {:.3} | {} | {:e} | {:e} |\n", e.quantity, e.units, e.at, e.got, e.want);
            }
            out += "\n";
        }
        if !s.coverage.is_empty() {
            let counts: Vec<String> = s.coverage.iter().map(|(k, n)| format!("{k} {n}")).collect();
            out += &format!("Coverage (drawn cases): {}.\n\n", counts.join(", "));
        }
        if let Some(f) = &s.failure {
            out += &format!("Minimal failing case: {}\n\n{}\n\nRepro: {}\n\nReplay: `{}`\n\n", f.case, f.message, f.repro.display(), f.replay);
        }
    }
    out
}

/// Whether the file at `path` is a head-loss repro (its `format`).
pub fn is_repro(path: &Path) -> bool {
    std::fs::read_to_string(path).ok().and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok()).is_some_and(|v| v["format"] == FORMAT)
}

/// `grpo-verify replay FILE` of a head-loss repro: runs its case again and
/// prints each quantity's error. Ok(false): it still fails. A malformed
/// file or case is bad input, named.
pub fn replay(path: &Path, implementation: Option<String>, timeout: Duration) -> Result<bool> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading repro file {}", path.display()))?;
    let repro: HeadRepro = serde_json::from_str(&text).with_context(|| format!("{} is not a head-loss repro file", path.display()))?;
    repro.case.validate().map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let expected = Expected::of(&repro.case).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let implementation = implementation.map(|i| crate::repro::canonical_impl(&i)).unwrap_or(repro.implementation.clone());
    let env = crate::worker::pyenv::resolve()?;
    let mut worker = Worker::start(&env).map_err(|e| anyhow::anyhow!("{e}"))?;
    let (kind, _) = load(&mut worker, &implementation, timeout)?;
    if kind != repro.case.kind {
        bail!("--impl {implementation} is of the {} kind; the repro's case is {}", kind.name(), repro.case.kind.name());
    }
    println!("replaying {} on `{implementation}`\ncase: {}", path.display(), repro.case.summary());
    let (header, arrays) = repro.case.request(&implementation);
    let reply = match worker.request(&header, &arrays, timeout) {
        Ok(reply) => reply,
        Err(e) => {
            println!("FAIL: {e}");
            return Ok(false);
        }
    };
    let errors = match expected.judge(&repro.case, &reply) {
        Ok(errors) => errors,
        Err(e) => {
            println!("FAIL: {e}");
            return Ok(false);
        }
    };
    for e in &errors {
        let verdict = if e.units <= BOUND_UNITS { "ok" } else { "FAIL" };
        if e.quantity == "grad_dtype" {
            println!("  {:<15} {:>14}  {verdict}  {}", e.quantity, "", e.at);
            continue;
        }
        println!("  {:<15} {:>12.3} u  {verdict}  {} (got {:e}, want {:e})", e.quantity, e.units, e.at, e.got, e.want);
    }
    let passed = judge::passes(&errors);
    println!("{}", if passed { "PASS" } else { "FAIL" });
    Ok(passed)
}
