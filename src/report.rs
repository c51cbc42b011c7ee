//! `report.json` (every case, implementation and quantity) and `report.md`
//! (what a person reads first: per implementation and quantity, the worst
//! error next to its bound, and every failure with its replay command).
//! Both are written to temporary names and renamed at the end, so a report
//! that exists is complete.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::{json, Value};

use crate::case::{CaseSpec, Kind};
use crate::compare::{Quantity, Tolerance};
use crate::evaluate::{CaseResult, Outcome};

/// Where a case came from in an implementation's run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Drawn for a signature group, before the group's first failure.
    Generated,
    /// A step of shrinking a failing group.
    Shrink,
    /// A remembered failure, replayed first.
    Regression,
}

/// One evaluated case in the report.
#[derive(Clone, Debug, Serialize)]
pub struct CaseRecord {
    /// As `--impl` names it.
    pub implementation: String,
    /// Position in the implementation's run: generated cases count up; shrink steps follow.
    pub index: usize,
    /// The signature group the case belongs to (None: a remembered regression).
    pub group: Option<usize>,
    /// Generated, a shrink step, or a remembered regression.
    pub phase: Phase,
    /// The case in one line: shape, dtype, switches, hyperparameters.
    pub summary: String,
    /// How the case was drawn (its arrays follow from it).
    pub spec: CaseSpec,
    /// What it came to: outcome, verdicts, timings, refusal.
    #[serde(flatten)]
    pub result: CaseResult,
    /// The numeric edges the case can and did reach (not for shrink steps).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub edges: Option<crate::coverage::CaseEdges>,
}

/// The verdict on one implementation.
#[derive(Clone, Debug, Serialize)]
pub struct ImplSummary {
    /// As `--impl` names it.
    pub implementation: String,
    /// Logits or fused.
    pub kind: Kind,
    /// "jax", or "torch 2.14.1" for a PyTorch implementation.
    pub framework: String,
    /// Every checked case passed (and at least one was checked).
    pub passed: bool,
    /// Cases drawn, supported or not.
    pub cases: usize,
    /// Cases checked (the implementation ran them).
    pub supported: usize,
    /// Cases it refused (NotImplementedError).
    pub unsupported: usize,
    /// Supported cases drawn from a real model's numbers (`case::real`).
    pub real_cases: usize,
    /// Distinct compiled signatures among the supported cases.
    pub signatures: usize,
    /// Steps the shrinker took on its failure.
    pub shrink_steps: usize,
    /// What failed on the minimal case (None: passed).
    pub failure: Option<String>,
    /// Why the failure's minimal case has no verdicts (None: the rule judged it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unjudged: Option<crate::evaluate::Unjudged>,
    /// Said when fewer cases than requested were checked.
    pub note: Option<String>,
    /// The minimal failing case in one line.
    pub minimal_case: Option<String>,
    /// Its repro file.
    pub repro: Option<PathBuf>,
    /// The one-line command that replays it.
    pub replay: Option<String>,
    /// Time spent on this implementation's cases (the pool's workers add up).
    pub seconds: f64,
    /// The precision conventions it was judged under: its declaration and
    /// those tried with `--convention` (docs/conventions.md).
    pub conventions: Vec<String>,
    /// Supported cases on which they moved an allowance (the rest were
    /// judged by SPEC's contract alone: f32 inputs for the bf16 ones).
    pub cases_under_conventions: usize,
    /// With `--keep-going`: every distinct discrepancy (the first is the
    /// one `failure`, `repro` and `replay` name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub discrepancies: Option<crate::discrepancy::Discrepancies>,
    /// What its cases exercised of the run's switches, pairs and edges.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub coverage: Option<crate::coverage::Coverage>,
}

impl ImplSummary {
    /// Nothing failed and nothing was compared: every draw was refused.
    pub fn unchecked(&self) -> bool {
        self.passed && self.supported == 0 && self.cases > 0
    }

    /// Which contract the verdict is to: "verified to SPEC's contract" or
    /// "verified under the declared conventions: ...".
    pub fn contract(&self) -> String {
        let verb = if self.passed { "verified" } else { "held" };
        if self.cases_under_conventions == 0 {
            let unused = if self.conventions.is_empty() {
                String::new()
            } else {
                format!(" (its declared conventions {} moved no case of this run)", self.conventions.join(", "))
            };
            format!("{verb} to SPEC's contract{unused}")
        } else {
            format!(
                "{verb} under the declared conventions: {} ({} of {} cases; the rest to SPEC's contract)",
                self.conventions.join(", "),
                self.cases_under_conventions,
                self.supported
            )
        }
    }

    fn verdict(&self) -> &'static str {
        match (self.passed, self.unchecked()) {
            (_, true) => "**unchecked** (every draw unsupported)",
            (true, false) => "pass",
            (false, _) => "**FAIL**",
        }
    }
}

/// One `check` run's result: each implementation's summary and every case evaluated.
pub struct CheckRun {
    /// One per implementation, in the order given.
    pub summaries: Vec<ImplSummary>,
    /// Every case evaluated, in each implementation's order.
    pub records: Vec<CaseRecord>,
}

impl CheckRun {
    /// Supported cases checked, over every implementation.
    pub fn checked(&self) -> usize {
        self.summaries.iter().map(|s| s.supported).sum()
    }
}

/// The worst case of one quantity for one implementation (largest err / bound).
#[derive(Clone, Debug, Serialize)]
pub struct Worst {
    /// The quantity.
    pub quantity: Quantity,
    /// Its error, in units of its scale.
    pub err: f64,
    /// The rule's bound on that case.
    pub bound: f64,
    /// The baseline's error on that case.
    pub baseline_err: f64,
    /// Where the worst element is.
    pub at: String,
    /// The case's index in the implementation's records.
    pub case_index: usize,
    /// The case in one line.
    pub case: String,
    /// Cases the quantity was compared on.
    pub compared_on: usize,
    /// No case compared the quantity (every verdict on it was marked not covered).
    pub not_covered: bool,
}

/// The worst case (largest err / bound) of each quantity among `implementation`'s generated cases.
pub fn worst_per_quantity(records: &[CaseRecord], implementation: &str) -> Vec<Worst> {
    let mut worst: Vec<Worst> = Vec::new();
    for r in records.iter().filter(|r| r.implementation == implementation && r.phase == Phase::Generated) {
        for v in &r.result.verdicts {
            let ratio = |err: f64, bound: f64| if bound > 0.0 { err / bound } else if err > 0.0 { f64::INFINITY } else { 0.0 };
            let entry = match worst.iter_mut().find(|w| w.quantity == v.quantity) {
                Some(w) => w,
                None => {
                    worst.push(Worst {
                        quantity: v.quantity,
                        err: -1.0,
                        bound: 0.0,
                        baseline_err: 0.0,
                        at: String::new(),
                        case_index: 0,
                        case: String::new(),
                        compared_on: 0,
                        not_covered: true,
                    });
                    worst.last_mut().unwrap()
                }
            };
            if v.not_covered {
                continue;
            }
            entry.not_covered = false;
            entry.compared_on += 1;
            if entry.err < 0.0 || ratio(v.err, v.bound) > ratio(entry.err, entry.bound) {
                entry.err = v.err;
                entry.bound = v.bound;
                entry.baseline_err = v.baseline_err;
                entry.at = v.at.clone();
                entry.case_index = r.index;
                entry.case = r.summary.clone();
            }
        }
    }
    worst
}

/// What report.json and report.md say of a `check` run beside its results.
pub struct RunInfo<'a> {
    /// The command line, as run.
    pub command: String,
    /// The run's seed.
    pub seed: u64,
    /// Generated cases asked for per implementation.
    pub cases: u32,
    /// Parallel workers (`--jobs`) and cases per compiled signature.
    pub jobs: usize,
    /// Cases per compiled signature.
    pub draws_per_signature: usize,
    /// The worker's `hello` (versions, devices).
    pub worker: &'a Value,
    /// The tolerance rule's constants.
    pub tolerance: &'a Tolerance,
    /// Wall time of the whole run.
    pub seconds: f64,
    /// Cases asked for from a real model's numbers, and the fixtures they came from.
    pub real_cases: u32,
    /// The real fixtures their banks came from.
    pub real_fixtures: Vec<String>,
    /// Which part of the run's groups this report holds (`--partition`).
    pub partition: crate::partition::Partition,
    /// What the run draws: `merge` rebuilds its coverage from them.
    pub objective: &'a crate::case::objective::Objective,
    /// The dtypes drawn.
    pub dtypes: &'a [crate::case::Dtype],
}

/// Writes report.json and report.md into `dir` (each whole or not at all).
pub fn write(dir: &Path, info: &RunInfo<'_>, run: &CheckRun) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating report directory {}", dir.display()))?;
    let passed = run.summaries.iter().all(|s| s.passed);
    let implementations: Vec<Value> = run
        .summaries
        .iter()
        .map(|s| json!({"summary": s, "worst": worst_per_quantity(&run.records, &s.implementation)}))
        .collect();
    let report = json!({
        "tool": format!("grpo-verify {}", env!("CARGO_PKG_VERSION")),
        "report": "check",
        "command": info.command,
        "partition": info.partition,
        "objective": info.objective,
        "dtypes": info.dtypes,
        "seed": info.seed,
        "cases": info.cases,
        "real_cases": info.real_cases,
        "real_fixtures": info.real_fixtures,
        "passed": passed,
        "seconds": info.seconds,
        "jobs": info.jobs,
        "draws_per_signature": info.draws_per_signature,
        "checked": run.checked(),
        "cases_per_second": run.checked() as f64 / info.seconds,
        "worker": info.worker,
        "tolerance": info.tolerance,
        "implementations": implementations,
        "records": run.records,
    });
    write_atomic(&dir.join("report.json"), &serde_json::to_string_pretty(&report)?)?;
    write_atomic(&dir.join("report.md"), &markdown(info, run, passed))?;
    Ok(())
}

/// Writes `text` to `path` through a temporary name, so a file that exists
/// is complete.
pub fn write_atomic(path: &Path, text: &str) -> Result<()> {
    let tmp = path.with_extension("partial");
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

fn markdown(info: &RunInfo<'_>, run: &CheckRun, passed: bool) -> String {
    let mut md = String::new();
    let w = &mut md;
    let verdict = match (passed, run.summaries.iter().all(ImplSummary::unchecked)) {
        (true, true) => "NOTHING CHECKED (every draw unsupported)",
        (true, false) => "PASS",
        (false, _) => "FAIL",
    };
    let _ = writeln!(w, "# grpo-verify check: {verdict}\n");
    let _ = writeln!(w, "`{}`\n", info.command);
    let _ = writeln!(
        w,
        "seed {}, {} cases per implementation ({} per compiled signature), {} jobs; {} cases checked in {:.1} s wall: {:.2} cases/s; \
         worker: python {}, jax {} (jaxlib {}), numpy {}, backend {}\n",
        info.seed,
        info.cases,
        info.draws_per_signature,
        info.jobs,
        run.checked(),
        info.seconds,
        run.checked() as f64 / info.seconds,
        info.worker["python"].as_str().unwrap_or("?"),
        info.worker["jax"].as_str().unwrap_or("?"),
        info.worker["versions"]["jaxlib"].as_str().unwrap_or("?"),
        info.worker["versions"]["numpy"].as_str().unwrap_or("?"),
        info.worker["backend"].as_str().unwrap_or("?"),
    );
    if info.real_cases > 0 {
        let _ = writeln!(
            w,
            "Real-model cases: {} per implementation after the generated ones, drawn from the rollouts of {} \
             (their hidden states and sampled tokens, the real LM head's columns; fixtures/README.md, \
             \"Real data in every run\"); `--real-cases 0` leaves them out.\n",
            info.real_cases,
            info.real_fixtures.iter().map(|f| format!("`{f}`")).collect::<Vec<_>>().join(", ")
        );
    } else {
        let _ = writeln!(w, "Real-model cases: none in this run (`--real-cases 0`).\n");
    }
    let _ = writeln!(w, "| implementation | kind | framework | verdict | contract | draws | checked | real-model | signatures | unsupported | shrink steps | worker time |");
    let _ = writeln!(w, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    for s in &run.summaries {
        let _ = writeln!(
            w,
            "| `{}` | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} s |",
            s.implementation,
            s.kind,
            s.framework,
            s.verdict(),
            s.contract(),
            s.cases,
            s.supported,
            s.real_cases,
            s.signatures,
            s.unsupported,
            s.shrink_steps,
            s.seconds
        );
    }
    for s in &run.summaries {
        if let Some(note) = &s.note {
            let _ = writeln!(w, "\nNote on `{}`: {note}.", s.implementation);
        }
    }
    for s in run.summaries.iter().filter(|s| !s.passed) {
        let _ = writeln!(w, "\n## FAIL: `{}`\n", s.implementation);
        if let Some(d) = &s.discrepancies {
            d.markdown(w);
            continue;
        }
        let _ = writeln!(w, "- what: {}", s.failure.as_deref().unwrap_or(""));
        let _ = writeln!(w, "- minimal case: {}", s.minimal_case.as_deref().unwrap_or(""));
        if let Some(p) = &s.repro {
            let _ = writeln!(w, "- repro: `{}`", p.display());
        }
        if let Some(r) = &s.replay {
            let _ = writeln!(w, "- replay: `{r}`");
        }
    }
    let _ = writeln!(
        w,
        "\n## Coverage\n\nWhat each implementation's checked cases exercised: every value of every switch and every pair of \
         values of two switches the objective admits (a value counts only where its switch acts: the KL's estimator with the \
         KL on, delta under ppo, ...), and the numeric edges its cases reached on the materialised inputs. A pass proves \
         nothing about what is listed as missing here."
    );
    for s in &run.summaries {
        if let Some(c) = &s.coverage {
            c.markdown(&s.implementation, w);
        }
    }
    let _ = writeln!(
        w,
        "\n## Worst error per quantity\n\nErrors are max |impl - oracle| / scale over the elements, where each \
         element's scale is what f32 rounding can move it by (docs/tolerance.md); bound = 2 x min(baseline error, \
         {} u) + {} u, u = 2^-24 (a gradient returned in bf16 has half a bf16 ulp per element taken off first). `grad_zero_rows` are rows whose exact \
         gradient is 0 (masked, or clipped without KL and entropy): bound = the floor alone.",
        info.tolerance.analytic_units, info.tolerance.floor_units
    );
    for s in &run.summaries {
        let _ = writeln!(w, "\n### `{}`\n", s.implementation);
        let _ = writeln!(w, "| quantity | worst error | in u | its bound | err/bound | baseline error there | cases | where | case |");
        let _ = writeln!(w, "|---|---|---|---|---|---|---|---|---|");
        for q in worst_per_quantity(&run.records, &s.implementation) {
            if q.not_covered {
                let _ = writeln!(w, "| {} | not covered (not returned) | | | | | 0 | | |", q.quantity);
                continue;
            }
            let _ = writeln!(
                w,
                "| {} | {:.3e} | {:.1} | {:.3e} | {:.3} | {:.3e} | {} | {} | #{} {} |",
                q.quantity,
                q.err,
                q.err / crate::compare::U32,
                q.bound,
                if q.bound > 0.0 { q.err / q.bound } else { 0.0 },
                q.baseline_err,
                q.compared_on,
                if q.at.is_empty() { "-" } else { &q.at },
                q.case_index,
                q.case
            );
        }
        let unsupported: Vec<&CaseRecord> = run
            .records
            .iter()
            .filter(|r| r.implementation == s.implementation && r.result.outcome == Outcome::Unsupported)
            .collect();
        if let Some(first) = unsupported.first() {
            let _ = writeln!(
                w,
                "\n{} case(s) unsupported (NotImplementedError while tracing), e.g. #{} {}: {}",
                unsupported.len(),
                first.index,
                first.summary,
                first.result.reason
            );
        }
    }
    md
}

/// What one case of `dtype` is judged under, for `replay`.
pub fn contract_line<C: std::fmt::Display>(conventions: &[C], dtype: crate::case::Dtype) -> String {
    if conventions.is_empty() {
        return "contract: SPEC's".into();
    }
    let names: Vec<String> = conventions.iter().map(ToString::to_string).collect();
    format!("contract: SPEC's, under the declared conventions {} where they apply ({} inputs here)", names.join(", "), dtype.name())
}

/// `target/grpo-verify/<UTC timestamp>`: a new report directory per run.
pub fn default_dir() -> PathBuf {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    PathBuf::from("target/grpo-verify").join(utc_timestamp(secs))
}

/// "20261122T041500Z" (civil-from-days, proleptic Gregorian).
fn utc_timestamp(secs: u64) -> String {
    let days = (secs / 86400) as i64;
    let rem = secs % 86400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// The console summary of a check run: one line per implementation.
pub fn print_summary(run: &CheckRun, dir: &std::path::Path) {
    for s in &run.summaries {
        print_one(s);
    }
    println!("report: {}", dir.join("report.md").display());
}

fn print_one(s: &ImplSummary) {
    if s.unchecked() {
        println!("UNCHECKED {:<19} 0 cases: all {} draws were unsupported (NotImplementedError)", s.implementation, s.unsupported);
        if let Some(note) = &s.note {
            println!("     note: {note}");
        }
    } else if s.passed {
        println!(
            "PASS {:<24} {} cases in {} signatures ({} unsupported), {:.1} s of worker time: {}",
            s.implementation,
            s.supported,
            s.signatures,
            s.unsupported,
            s.seconds,
            s.contract()
        );
        if let Some(c) = &s.coverage {
            println!("     coverage: {} (report.md: what was not)", c.line());
        }
        if let Some(note) = &s.note {
            println!("     note: {note}");
        }
    } else if let Some(d) = &s.discrepancies {
        println!("FAIL {:<24} after {} cases: {}; shrunk in {} steps", s.implementation, s.cases, d.headline(), s.shrink_steps);
        d.print();
    } else {
        println!("FAIL {:<24} after {} cases; shrunk in {} steps; {}", s.implementation, s.cases, s.shrink_steps, s.contract());
        println!("     what: {}", s.failure.as_deref().unwrap_or(""));
        println!("     minimal case: {}", s.minimal_case.as_deref().unwrap_or(""));
        if let Some(r) = &s.replay {
            println!("     replay: {r}");
        }
    }
}
