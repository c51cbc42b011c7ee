//! `grpo-verify check`: generated cases, every implementation, the tolerance
//! rule, shrinking to a minimal failing case, and a repro file for it.
//!
//! Cases come in groups that share a signature (shape, dtype, switches,
//! mesh: what the worker compiles), `draws_per_signature` at a time, so one
//! compiled step checks several cases. Group g is drawn by its own proptest
//! runner seeded with (`--seed`, g), the first groups from the rows of the
//! run's covering array (`case::plan`, itself from `--seed`), and every implementation sees the same
//! groups, so the baseline's errors are computed once per case. Groups run
//! in parallel on the evaluators of the pool (`--jobs`); which evaluator runs
//! a group changes nothing in its cases or verdicts, and an implementation's
//! result is its groups up to its first failing one, so a seed gives the same
//! report for any number of jobs. With `--keep-going` its result is its
//! groups up to its `--max-failures`-th failing one, and its failures are
//! put together into distinct discrepancies (`discrepancy`), each with its
//! own repro: the same report for any number of jobs still.

use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use proptest::test_runner::{Config as ProptestConfig, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};

use crate::case::{CaseSpec, Kind};
use crate::discrepancy::{distinct, Discrepancies, Discrepancy, Failure};
use crate::evaluate::{CaseResult, Evaluator, Outcome};
use crate::repro::{replay_command, repro_file, slug, Repro};
use crate::report::{print_summary, write_atomic, CaseRecord, CheckRun, ImplSummary, Phase, RunInfo};
use crate::case::plan::{Row, Space};
use crate::case::strategy::{case_group, Bounds, Planned};
use std::sync::Arc;

#[derive(Clone, Debug)]
pub struct CheckOptions {
    pub implementations: Vec<String>,
    pub cases: u32,
    pub seed: u64,
    pub bounds: Bounds,
    pub report_dir: PathBuf,
    /// Where the minimal cases of past failures are kept, tried first next time.
    pub regressions_dir: Option<PathBuf>,
    pub shrink_time: Duration,
    pub shrink_iters: u32,
    /// Cases drawn per compiled signature (`--draws-per-signature`).
    pub draws_per_signature: usize,
    /// Conventions tried on every implementation under test beside its own
    /// declaration (`--convention`; docs/conventions.md).
    pub conventions: Vec<grpo_oracle::Convention>,
    /// `--keep-going`: an implementation goes on past its failing groups and
    /// shrinks up to this many of them (`--max-failures`), the first in group
    /// order; a remembered failure does not end its run. None: it stops at
    /// its first failure, remembered or generated.
    pub keep_going: Option<usize>,
    /// The first groups follow a covering array of the switches (`plan`);
    /// false (`--no-plan`): every group drawn at random, as before issue 28.
    pub plan: bool,
}

impl CheckOptions {
    /// Signature groups in the run: `cases` drawn `draws_per_signature` at a time.
    fn groups(&self) -> usize {
        (self.cases as usize).div_ceil(self.draws_per_signature.max(1))
    }
}

/// Failing groups shrunk per implementation with `--keep-going` unless told
/// otherwise: each costs a shrink (seconds to minutes), and a library with
/// more distinct bugs than this is rare; the report says when it was reached.
pub const MAX_FAILURES: usize = 8;

/// Cases per signature unless told otherwise: enough that compiling is a
/// small share of a case, few enough that 100 cases still see 25 shapes.
pub const DRAWS_PER_SIGNATURE: usize = 4;

/// Draws of a group's signature before it counts as unsupported: an
/// implementation that supports one configuration in 16 misses 256 draws in
/// a row with probability 7e-8.
const REJECTS_PER_GROUP: u32 = 256;
/// Draws per requested case over a whole run before it settles for fewer
/// checked cases.
const MAX_DRAWS_PER_CASE: usize = 40;

/// `grpo-verify check`: starts `jobs` workers, loads the implementations
/// (none named: the built-ins) and their baselines, keeps those of `kind`,
/// checks them, writes the report and prints the summary. `Ok(false)` is a
/// verification failure.
pub fn command(mut opts: CheckOptions, kind: Option<Kind>, jobs: usize, timeout: Duration) -> Result<bool> {
    let started = Instant::now();
    let mut pool = Evaluator::start_pool(timeout, opts.bounds.devices, jobs)?;
    let worker = &mut pool[0].worker;
    if opts.implementations.is_empty() {
        opts.implementations = worker.builtins().into_iter().map(|b| b.name).collect();
    }
    let kinds = worker.load_all(&opts.implementations)?;
    // --kind keeps the implementations of that kind (with none given: the built-ins).
    let (implementations, kinds): (Vec<String>, Vec<Kind>) =
        opts.implementations.drain(..).zip(kinds).filter(|(_, k)| kind.is_none_or(|want| want == *k)).unzip();
    if implementations.is_empty() {
        bail!("no implementation of the {} kind among those named", kind.map_or("?", |k| k.name()));
    }
    opts.implementations = implementations;
    for &k in &kinds {
        let baseline = worker.baseline(k)?;
        worker.load(&baseline).with_context(|| format!("loading the {} baseline", k.name()))?;
    }
    let run = run_check(&opts, &mut pool, &kinds)?;
    let info = RunInfo {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        seed: opts.seed,
        cases: opts.cases,
        jobs: pool.len(),
        draws_per_signature: opts.draws_per_signature,
        worker: &pool[0].worker.hello,
        tolerance: &pool[0].tolerance,
        seconds: started.elapsed().as_secs_f64(),
    };
    crate::report::write(&opts.report_dir, &info, &run)?;
    print_summary(&run, &opts.report_dir);
    println!(
        "{} cases in {} signatures checked in {:.1} s: {:.2} cases/s ({} jobs)",
        run.checked(),
        run.summaries.iter().map(|s| s.signatures).sum::<usize>(),
        info.seconds,
        run.checked() as f64 / info.seconds,
        info.jobs
    );
    if run.summaries.iter().all(ImplSummary::unchecked) {
        bail!(
            "nothing was checked: every draw was unsupported for {} (raised NotImplementedError); \
             choose an --objective, --switch or --dtype the implementation supports (report: {})",
            run.summaries.iter().map(|s| s.implementation.as_str()).collect::<Vec<_>>().join(", "),
            opts.report_dir.join("report.md").display()
        );
    }
    Ok(run.summaries.iter().all(|s| s.passed))
}

/// What one implementation's run of one group came to.
enum GroupEnd {
    Passed,
    /// The minimal failing case and its result, judged in full.
    Failed { minimal: CaseSpec, result: CaseResult },
    /// No supported signature within REJECTS_PER_GROUP draws.
    Unsupported,
}

struct GroupRun {
    implementation: usize,
    /// None: the remembered regressions.
    group: Option<usize>,
    records: Vec<CaseRecord>,
    end: GroupEnd,
    seconds: f64,
}

/// What the threads of a run share.
struct Shared<'a> {
    opts: &'a CheckOptions,
    kinds: Vec<Kind>,
    groups: usize,
    next_group: AtomicUsize,
    /// Per implementation, where its failures so far are: g + 1 for group g,
    /// 0 for a remembered failure that ends its run (without --keep-going).
    failures: Vec<Mutex<BTreeSet<usize>>>,
    /// Failing groups an implementation may shrink: 1 without --keep-going.
    /// A group with this many failures before it is skipped: it lies past
    /// the implementation's result whichever evaluator finishes first.
    budget: usize,
    /// Per implementation, rejected draws so far.
    rejects: Vec<AtomicUsize>,
    fatal: Mutex<Option<String>>,
    stop: AtomicBool,
    runs: Mutex<Vec<GroupRun>>,
    progress: Vec<ProgressBar>,
    /// The run's switches, and the covering array its first groups follow.
    space: Arc<Space>,
    plan: Vec<Row>,
}

/// Checks every implementation of `opts` on the evaluators of `pool` (one
/// worker each). `kinds[i]` is implementation i's kind, from loading it.
pub fn run_check(opts: &CheckOptions, pool: &mut [Evaluator], kinds: &[Kind]) -> Result<CheckRun> {
    assert!(!pool.is_empty(), "a check needs at least one evaluator");
    assert_eq!(kinds.len(), opts.implementations.len(), "one kind per implementation");
    for eval in pool.iter_mut() {
        eval.tried_conventions = opts.conventions.clone();
    }
    let kinds = kinds.to_vec();
    let bars = MultiProgress::new();
    let progress = opts
        .implementations
        .iter()
        .map(|i| {
            let bar = bars.add(ProgressBar::new(opts.cases as u64));
            bar.set_style(
                ProgressStyle::with_template("{prefix:>16} [{bar:30}] {pos}/{len} {elapsed} {msg}").unwrap().progress_chars("=> "),
            );
            bar.set_prefix(slug(i));
            bar
        })
        .collect();
    let space = Arc::new(Space::new(&opts.bounds.objective, &opts.bounds.dtypes));
    let plan = if opts.plan { space.plan(opts.seed, opts.groups()) } else { Vec::new() };
    let shared = Shared {
        space,
        plan,
        opts,
        kinds,
        groups: opts.groups(),
        next_group: AtomicUsize::new(0),
        failures: opts.implementations.iter().map(|_| Mutex::new(BTreeSet::new())).collect(),
        budget: opts.keep_going.unwrap_or(1),
        rejects: opts.implementations.iter().map(|_| AtomicUsize::new(0)).collect(),
        fatal: Mutex::new(None),
        stop: AtomicBool::new(false),
        runs: Mutex::new(Vec::new()),
        progress,
    };
    // Failures remembered from earlier runs come first, on the first evaluator.
    for i in 0..opts.implementations.len() {
        let runs = regressions(&shared, i, &mut pool[0])?;
        if opts.keep_going.is_none() && runs.iter().any(|r| matches!(r.end, GroupEnd::Failed { .. })) {
            shared.failures[i].lock().unwrap().insert(0);
        }
        shared.runs.lock().unwrap().extend(runs);
    }
    std::thread::scope(|scope| {
        for eval in pool.iter_mut() {
            let shared = &shared;
            scope.spawn(move || work(shared, eval));
        }
    });
    shared.progress.iter().for_each(ProgressBar::finish_and_clear);
    if let Some(reason) = shared.fatal.into_inner().unwrap() {
        return Err(anyhow!("{reason}"));
    }
    let mut runs = shared.runs.into_inner().unwrap();
    runs.sort_by_key(|r| (r.implementation, r.group.map_or(0, |g| g + 1)));
    let mut summaries = Vec::new();
    let mut records = Vec::new();
    for (i, implementation) in opts.implementations.iter().enumerate() {
        let mine: Vec<GroupRun> = runs.iter_mut().filter(|r| r.implementation == i).map(|r| std::mem::replace(r, GroupRun::taken())).collect();
        let (mut summary, recs) = summarise(opts, implementation, shared.kinds[i], mine)?;
        summary.framework = pool[0].worker.framework(implementation)?;
        summary.conventions = pool[0].conventions(implementation)?.iter().map(ToString::to_string).collect();
        summary.cases_under_conventions =
            recs.iter().filter(|r| r.phase != Phase::Shrink && r.result.outcome != Outcome::Unsupported && !r.result.conventions.is_empty()).count();
        let checked: Vec<_> = recs.iter().filter_map(|r| r.edges.as_ref().map(|e| (&r.spec, e))).collect();
        let refused: Vec<_> = recs.iter().filter(|r| r.phase != Phase::Shrink && r.result.outcome == Outcome::Unsupported).map(|r| (&r.spec, r.result.reason.as_str())).collect();
        summary.coverage = Some(crate::coverage::coverage(&shared.space, &checked, &refused));
        summaries.push(summary);
        records.extend(recs);
    }
    Ok(CheckRun { summaries, records })
}

impl GroupRun {
    fn taken() -> GroupRun {
        GroupRun { implementation: usize::MAX, group: None, records: Vec::new(), end: GroupEnd::Passed, seconds: 0.0 }
    }
}

impl Shared<'_> {
    /// Implementation i is done before group g: its budget of failures came earlier.
    fn done_before(&self, i: usize, g: usize) -> bool {
        self.failures[i].lock().unwrap().range(..=g).count() >= self.budget
    }
}

/// One evaluator's loop: take the next group, run every implementation that
/// has not used up its failures on earlier groups.
fn work(shared: &Shared<'_>, eval: &mut Evaluator) {
    let opts = shared.opts;
    loop {
        let g = shared.next_group.fetch_add(1, Ordering::SeqCst);
        if g >= shared.groups || shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let size = (opts.draws_per_signature.max(1)).min(opts.cases as usize - g * opts.draws_per_signature.max(1));
        for (i, implementation) in opts.implementations.iter().enumerate() {
            if shared.done_before(i, g) {
                continue;
            }
            let budget = opts.cases as usize * MAX_DRAWS_PER_CASE;
            if shared.rejects[i].load(Ordering::SeqCst) > budget {
                continue;
            }
            match run_group(shared, i, implementation, g, size, eval) {
                Ok(run) => {
                    if matches!(run.end, GroupEnd::Failed { .. }) {
                        shared.failures[i].lock().unwrap().insert(g + 1);
                    }
                    shared.runs.lock().unwrap().push(run);
                }
                Err(reason) => {
                    shared.fatal.lock().unwrap().get_or_insert(reason);
                    shared.stop.store(true, Ordering::SeqCst);
                    return;
                }
            }
        }
    }
}

/// The 32-byte ChaCha seed of group g of a run.
fn group_seed(seed: u64, group: usize) -> [u8; 32] {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    bytes[8..16].copy_from_slice(&(group as u64).to_le_bytes());
    bytes
}

/// Evaluates one case and records it; the verdict proptest sees.
struct Recorder<'a> {
    implementation: &'a str,
    group: Option<usize>,
    kind: Kind,
    records: RefCell<Vec<CaseRecord>>,
    failing: Cell<bool>,
    fatal: RefCell<Option<String>>,
}

impl<'a> Recorder<'a> {
    fn new(implementation: &'a str, group: Option<usize>, kind: Kind) -> Self {
        Recorder { implementation, group, kind, records: RefCell::new(Vec::new()), failing: Cell::new(false), fatal: RefCell::new(None) }
    }

    fn evaluate(&self, eval: &mut Evaluator, spec: &CaseSpec) -> Result<Outcome, TestCaseError> {
        if let Some(reason) = self.fatal.borrow().as_ref() {
            return Err(TestCaseError::fail(reason.clone()));
        }
        let case = spec.materialize(self.kind);
        // A shrink step asks only pass or fail: the baseline runs when the
        // implementation's errors leave the answer open.
        let shrinking = self.group.is_some() && self.failing.get();
        let evaluated = if shrinking {
            eval.evaluate_shrink_step(self.implementation, &case).map(|(r, _)| r)
        } else {
            eval.evaluate(self.implementation, &case)
        };
        let result = evaluated.map_err(|e| {
            *self.fatal.borrow_mut() = Some(e.to_string());
            TestCaseError::fail(e.to_string())
        })?;
        let outcome = result.outcome.clone();
        // Cases after the group's first failure are shrink steps.
        let phase = match (self.group, self.failing.get()) {
            (None, _) => Phase::Regression,
            (Some(_), true) => Phase::Shrink,
            (Some(_), false) => Phase::Generated,
        };
        if outcome == Outcome::Fail {
            self.failing.set(true);
        }
        let mut records = self.records.borrow_mut();
        let index = records.len();
        records.push(CaseRecord {
            implementation: self.implementation.to_string(),
            index,
            group: self.group,
            phase,
            summary: case.summary(),
            spec: spec.clone(),
            edges: (phase != Phase::Shrink && outcome != Outcome::Unsupported).then(|| crate::coverage::edges(&case)),
            result,
        });
        Ok(outcome)
    }
}

/// Implementation i on group g: draw a supported signature and `size` cases
/// for it, and shrink on failure.
fn run_group(shared: &Shared<'_>, i: usize, implementation: &str, g: usize, size: usize, eval: &mut Evaluator) -> Result<GroupRun, String> {
    let opts = shared.opts;
    let started = Instant::now();
    let config = ProptestConfig {
        cases: 1,
        max_shrink_iters: opts.shrink_iters,
        max_shrink_time: opts.shrink_time.as_millis() as u32,
        failure_persistence: None,
        max_global_rejects: REJECTS_PER_GROUP,
        ..ProptestConfig::default()
    };
    let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &group_seed(opts.seed, g)));
    let recorder = Recorder::new(implementation, Some(g), shared.kinds[i]);
    let eval = RefCell::new(eval);
    let bar = &shared.progress[i];
    let planned = shared.plan.get(g).map(|row| Planned { row: row.clone(), group: g, space: shared.space.clone() });
    let group = case_group(&opts.bounds, size, planned);
    // This group's unsupported draws: proptest aborts at REJECTS_PER_GROUP.
    let rejected = Cell::new(0u32);
    let outcome = runner.run(&group, |specs: Vec<CaseSpec>| {
        let shrinking = recorder.failing.get();
        for (n, spec) in specs.iter().enumerate() {
            match recorder.evaluate(&mut eval.borrow_mut(), spec)? {
                Outcome::Fail => {
                    bar.set_message(format!("shrinking group {g}: now B={} T={} V={}", spec.batch, spec.time, spec.vocab));
                    return Err(TestCaseError::fail("failed"));
                }
                // An unsupported signature: draw another (not counted).
                Outcome::Unsupported if n == 0 => {
                    shared.rejects[i].fetch_add(1, Ordering::SeqCst);
                    rejected.set(rejected.get() + 1);
                    if let Some(r) = recorder.records.borrow().last() {
                        group.refused(&r.result.reason);
                    }
                    return Err(TestCaseError::reject("unsupported"));
                }
                Outcome::Unsupported => {}
                Outcome::Pass if !shrinking => bar.inc(1),
                Outcome::Pass => {}
            }
        }
        Ok(())
    });
    if let Some(reason) = recorder.fatal.into_inner() {
        return Err(reason);
    }
    let mut records = recorder.records.into_inner();
    let end = match outcome {
        Ok(()) => GroupEnd::Passed,
        Err(TestError::Fail(_, minimal)) => {
            // The minimal group's first failing case (it was evaluated last).
            let last = records
                .iter_mut()
                .rev()
                .find(|r| r.result.outcome == Outcome::Fail && minimal.contains(&r.spec))
                .ok_or("the shrunk group has no failing case recorded (a harness bug)")?;
            // Judged in full (with the baseline) for the report and the repro;
            // a shrink step that failed over the loosest bound fails it too.
            // The record keeps its own timing (its step's compile included).
            let full = eval.borrow_mut().evaluate(implementation, &last.spec.materialize(shared.kinds[i])).map_err(|e| e.to_string())?;
            if full.outcome == Outcome::Fail {
                last.result = CaseResult { seconds: last.result.seconds, compiled: last.result.compiled, ..full };
            }
            GroupEnd::Failed { minimal: last.spec.clone(), result: last.result.clone() }
        }
        Err(TestError::Abort(_)) if rejected.get() >= REJECTS_PER_GROUP => GroupEnd::Unsupported,
        Err(TestError::Abort(reason)) => return Err(format!("proptest aborted the run: {reason}")),
    };
    Ok(GroupRun { implementation: i, group: Some(g), records, end, seconds: started.elapsed().as_secs_f64() })
}

/// The file of implementation i's remembered failures.
fn regressions_file(dir: &Path, implementation: &str) -> PathBuf {
    dir.join(format!("{}.json", slug(implementation)))
}

/// Evaluates implementation i's remembered minimal failing cases, each a run
/// of its own: all of them with --keep-going, else up to the first that
/// still fails (none remembered: no runs).
fn regressions(shared: &Shared<'_>, i: usize, eval: &mut Evaluator) -> Result<Vec<GroupRun>> {
    let implementation = &shared.opts.implementations[i];
    let Some(dir) = &shared.opts.regressions_dir else { return Ok(Vec::new()) };
    let specs = read_regressions(&regressions_file(dir, implementation))?;
    // Only what this run could draw: a failure remembered from a bf16 run
    // or another --objective does not end an f32 run or this objective's.
    let bounds = &shared.opts.bounds;
    let drawable = |spec: &&CaseSpec| {
        bounds.dtypes.contains(&spec.dtype) && bounds.objective.admits(spec.config, spec.hparams, spec.preset.as_deref())
    };
    let mut runs = Vec::new();
    for spec in specs.iter().filter(drawable) {
        let started = Instant::now();
        let recorder = Recorder::new(implementation, None, shared.kinds[i]);
        let outcome = recorder.evaluate(eval, spec);
        if let Some(reason) = recorder.fatal.into_inner() {
            anyhow::bail!("{reason}");
        }
        let records = recorder.records.into_inner();
        let end = match (outcome, records.last()) {
            (Ok(Outcome::Fail), Some(last)) => GroupEnd::Failed { minimal: spec.clone(), result: last.result.clone() },
            _ => GroupEnd::Passed,
        };
        let failed = matches!(end, GroupEnd::Failed { .. });
        runs.push(GroupRun { implementation: i, group: None, records, end, seconds: started.elapsed().as_secs_f64() });
        if failed && shared.opts.keep_going.is_none() {
            break;
        }
    }
    Ok(runs)
}

/// The remembered failures in `path`: none when there is no such file. One
/// that cannot be read or parsed is an error naming it, not an empty list:
/// ignored, its failures would go unreplayed and the next failure
/// remembered would overwrite them.
fn read_regressions(path: &Path) -> Result<Vec<CaseSpec>> {
    let why = "move it away, or run with --regressions none";
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => bail!("cannot read the remembered failures {}: {e} ({why})", path.display()),
    };
    serde_json::from_str(&text).with_context(|| {
        format!("the remembered failures {} are not a list of cases this grpo-verify reads (an older format?; {why})", path.display())
    })
}

fn remember(dir: &Path, implementation: &str, minimal: &CaseSpec) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let path = regressions_file(dir, implementation);
    let mut specs = read_regressions(&path)?;
    if !specs.contains(minimal) {
        specs.push(minimal.clone());
        write_atomic(&path, &serde_json::to_string_pretty(&specs)?)?;
    }
    Ok(())
}

/// One implementation's summary and records from its group runs (in group
/// order): everything up to and including its first failing group, or with
/// --keep-going its `--max-failures`-th. Each distinct discrepancy among the
/// failures gets a repro file and is remembered.
fn summarise(opts: &CheckOptions, implementation: &str, kind: Kind, runs: Vec<GroupRun>) -> Result<(ImplSummary, Vec<CaseRecord>)> {
    let mut records: Vec<CaseRecord> = Vec::new();
    let mut seconds = 0.0;
    let mut failures: Vec<Failure> = Vec::new();
    let mut failing_groups = 0;
    let mut budget_reached_at = None;
    let mut unsupported_groups = 0;
    let mut signatures = 0;
    for run in runs {
        seconds += run.seconds;
        let base = records.len();
        let supported = run.records.iter().any(|r| r.phase == Phase::Generated && r.result.outcome != Outcome::Unsupported);
        signatures += usize::from(supported && run.group.is_some());
        records.extend(run.records.into_iter().enumerate().map(|(n, mut r)| {
            r.index = base + n;
            r
        }));
        match run.end {
            GroupEnd::Passed => {}
            GroupEnd::Unsupported => unsupported_groups += 1,
            GroupEnd::Failed { minimal, result } => {
                failing_groups += usize::from(run.group.is_some());
                failures.push(Failure { group: run.group, minimal, result });
                match opts.keep_going {
                    None => break,
                    Some(budget) if failing_groups >= budget => {
                        // Said only when groups after this one went unchecked.
                        budget_reached_at = run.group.filter(|&g| g + 1 < opts.groups());
                        break;
                    }
                    Some(_) => {}
                }
            }
        }
    }
    let generated = records.iter().filter(|r| r.phase != Phase::Shrink).count();
    let unsupported = records.iter().filter(|r| r.phase != Phase::Shrink && r.result.outcome == Outcome::Unsupported).count();
    let mut summary = ImplSummary {
        implementation: implementation.to_string(),
        kind,
        framework: String::new(), // run_check asks the worker
        passed: failures.is_empty(),
        cases: generated,
        supported: generated - unsupported,
        unsupported,
        signatures,
        shrink_steps: records.len() - generated,
        failure: None,
        unjudged: None,
        note: None,
        minimal_case: None,
        repro: None,
        replay: None,
        seconds,
        conventions: Vec::new(),      // run_check asks the evaluator
        cases_under_conventions: 0, // and counts them
        discrepancies: None,
        coverage: None, // run_check measures it
    };
    if failures.is_empty() && summary.supported < opts.cases as usize {
        summary.note = Some(format!(
            "only {} of the {} requested cases were supported ({} draws, {} signature groups with no supported draw; \
             the rest raised NotImplementedError)",
            summary.supported, opts.cases, generated, unsupported_groups
        ));
    }
    // Without --keep-going there is one failure, hence one discrepancy.
    let dir = opts.report_dir.join("repro");
    let mut reported = Vec::new();
    for (n, found) in distinct(&failures, opts.bounds.dtypes[0]).into_iter().enumerate() {
        let smallest = &failures[found.smallest];
        let path = repro_file(&dir, implementation, n + 1);
        let mut repro = Repro::of_failure(implementation, &smallest.minimal, kind, smallest.result.reason.clone(), opts.seed, &path);
        repro.conventions = opts.conventions.iter().map(ToString::to_string).collect();
        repro.write(&path)?;
        if let Some(dir) = &opts.regressions_dir {
            remember(dir, implementation, &smallest.minimal)?;
        }
        let groups: Vec<usize> = found.members.iter().filter_map(|&m| failures[m].group).collect();
        reported.push(Discrepancy {
            label: found.key.label(),
            key: found.key,
            failure: repro.failure,
            unjudged: smallest.result.unjudged,
            count: found.members.len(),
            remembered: found.members.len() - groups.len(),
            groups,
            minimal_case: repro.summary,
            minimal_group: smallest.group,
            replay: replay_command(&path),
            repro: path,
        });
    }
    // The first discrepancy is the implementation's failure, as without --keep-going.
    if let Some(first) = reported.first() {
        summary.failure = Some(first.failure.clone());
        summary.unjudged = first.unjudged;
        summary.minimal_case = Some(first.minimal_case.clone());
        summary.replay = Some(first.replay.clone());
        summary.repro = Some(first.repro.clone());
    }
    summary.discrepancies =
        opts.keep_going.map(|max_failures| Discrepancies { max_failures, failing_groups, budget_reached_at, distinct: reported });
    Ok((summary, records))
}
