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
//!
//! Here: the command, the pool of evaluators and its progress bars, and the
//! run's order of groups. `group` drives proptest on one group (drawing,
//! evaluating, shrinking), `persistence` keeps and replays the remembered
//! failures, `summary` turns an implementation's group runs into its result
//! and repro files.

mod group;
mod persistence;
mod summary;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

use crate::case::plan::{Row, Space};
use crate::case::strategy::Bounds;
use crate::case::{CaseSpec, Kind};
use crate::evaluate::{CaseResult, Evaluator, Outcome};
use crate::partition::Partition;
use crate::repro::slug;
use crate::report::{print_summary, CaseRecord, CheckRun, ImplSummary, Phase, RunInfo};
use group::run_group;
use persistence::regressions;
use summary::summarise;

/// What one `check` run draws, runs and reports (docs/cli.md, `check`).
#[derive(Clone, Debug)]
pub struct CheckOptions {
    /// The implementations checked (built-in names, module:function or file.py:function); empty: the built-ins.
    pub implementations: Vec<String>,
    /// Generated cases per implementation (`--cases`).
    pub cases: u32,
    /// The run's seed: every group's cases come from it and the group's number.
    pub seed: u64,
    /// Shapes, dtypes, devices and the objective drawn.
    pub bounds: Bounds,
    /// Where report.json, report.md and the repro files go.
    pub report_dir: PathBuf,
    /// Where the minimal cases of past failures are kept, tried first next time.
    pub regressions_dir: Option<PathBuf>,
    /// Wall time the shrinker may spend on one failure.
    pub shrink_time: Duration,
    /// Shrink steps allowed for one failure.
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
    /// false (`--no-plan`): every group drawn at random, as before planned signatures.
    pub plan: bool,
    /// Cases drawn from a real model's numbers (`case::real`), in groups
    /// after the generated ones (`--real-cases`; 0: none).
    pub real_cases: u32,
    /// The real fixtures their banks come from (`--real-fixture`; default:
    /// the checkout's committed real fixtures).
    pub real_fixtures: Vec<PathBuf>,
    /// The part of the run's groups this run checks (`--partition K/N`):
    /// group g when g is K - 1 modulo N; the remembered failures in part 1.
    pub partition: Partition,
}

impl CheckOptions {
    /// `cases` generated cases of `implementations` within `bounds`, the
    /// report in `report_dir`, everything else at `check`'s defaults: seed
    /// 0, nothing remembered, the plan on, the shrinker's 300 s and 256
    /// steps, no conventions tried, no real-model cases. Callers change what
    /// they need with struct update syntax.
    pub fn new(implementations: Vec<String>, cases: u32, bounds: Bounds, report_dir: PathBuf) -> CheckOptions {
        CheckOptions {
            implementations,
            cases,
            seed: 0,
            bounds,
            report_dir,
            regressions_dir: None,
            shrink_time: Duration::from_secs(300),
            shrink_iters: 256,
            draws_per_signature: DRAWS_PER_SIGNATURE,
            conventions: Vec::new(),
            keep_going: None,
            plan: true,
            real_cases: 0,
            real_fixtures: Vec::new(),
            partition: Partition::WHOLE,
        }
    }

    /// Generated signature groups: `cases` drawn `draws_per_signature` at a time.
    fn generated_groups(&self) -> usize {
        (self.cases as usize).div_ceil(self.draws_per_signature.max(1))
    }

    /// Real-model groups, after the generated ones.
    fn real_groups(&self) -> usize {
        (self.real_cases as usize).div_ceil(self.draws_per_signature.max(1))
    }

    /// Every group of the run.
    fn groups(&self) -> usize {
        self.generated_groups() + self.real_groups()
    }

    /// The groups of the run this part checks.
    fn groups_held(&self) -> usize {
        (0..self.groups()).filter(|&g| self.partition.holds(g)).count()
    }

    /// Cases in group g, and whether it is a real-model group.
    fn group_size(&self, g: usize) -> (usize, bool) {
        let per = self.draws_per_signature.max(1);
        let (first, cases, real) = match g.checked_sub(self.generated_groups()) {
            None => (g, self.cases as usize, false),
            Some(r) => (r, self.real_cases as usize, true),
        };
        (per.min(cases - first * per), real)
    }
}

/// `--real-cases` unless told otherwise: one case in eight of `cases` (at
/// least one group), so every run meets a real model's numbers.
pub fn default_real_cases(cases: u32) -> u32 {
    cases.div_ceil(8).max(DRAWS_PER_SIGNATURE as u32)
}

/// Failing groups shrunk per implementation with `--keep-going` unless told
/// otherwise: each costs a shrink (seconds to minutes), and a library with
/// more distinct bugs than this is rare; the report says when it was reached.
pub const MAX_FAILURES: usize = 8;

/// Cases per signature unless told otherwise: enough that compiling is a
/// small share of a case, few enough that 100 cases still see 25 shapes.
pub const DRAWS_PER_SIGNATURE: usize = 4;

/// Draws per requested case over a whole run before it settles for fewer
/// checked cases.
const MAX_DRAWS_PER_CASE: usize = 40;

/// `grpo-verify check`: starts up to `jobs` workers (no more than the run
/// has groups: a worker costs its JAX import, seconds of CPU), loads the
/// implementations (none named: the built-ins) and their baselines, keeps
/// those of `kind`, checks them, writes the report and prints the summary.
/// `Ok(false)` is a verification failure.
pub fn command(mut opts: CheckOptions, kind: Option<Kind>, jobs: usize, timeout: Duration) -> Result<bool> {
    let started = Instant::now();
    let jobs = jobs.clamp(1, opts.groups_held().max(1));
    let devices = opts.bounds.devices;
    // The other workers start while the first loads the implementations.
    let (first, others) = std::thread::scope(|scope| {
        let others = scope.spawn(|| Evaluator::start_pool(timeout, devices, jobs - 1));
        let first = Evaluator::start(timeout, devices).and_then(|mut eval| {
            let kinds = load(&mut opts, kind, &mut eval)?;
            Ok((eval, kinds))
        });
        (first, others.join().expect("a worker-starting thread panicked"))
    });
    let (first, kinds) = first?;
    let mut pool = vec![first];
    pool.extend(others?);
    // The real banks once the implementations are known to load (a bad
    // --impl is refused without them).
    if opts.real_cases > 0 {
        let banks = crate::case::real::load_banks(&crate::worker::pyenv::resolve()?, &opts.real_fixtures)?;
        crate::case::real::install(banks)?;
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
        real_cases: opts.real_cases,
        real_fixtures: crate::case::real::installed().map(|b| b.fixtures()).unwrap_or_default(),
        partition: opts.partition,
        objective: &opts.bounds.objective,
        dtypes: &opts.bounds.dtypes,
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

/// Loads the implementations of `opts` (none named: the built-ins) and their
/// baselines on `eval`'s worker and keeps those of `kind`: their kinds.
fn load(opts: &mut CheckOptions, kind: Option<Kind>, eval: &mut Evaluator) -> Result<Vec<Kind>> {
    let worker = &mut eval.worker;
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
    Ok(kinds)
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
    if opts.real_cases > 0 && crate::case::real::installed().is_none() {
        bail!("{} real-model cases asked for, and no real bank is loaded (check::command loads them)", opts.real_cases);
    }
    let bars = MultiProgress::new();
    let progress = opts
        .implementations
        .iter()
        .map(|i| {
            let bar = bars.add(ProgressBar::new(opts.cases as u64 + opts.real_cases as u64));
            bar.set_style(
                ProgressStyle::with_template("{prefix:>16} [{bar:30}] {pos}/{len} {elapsed} {msg}").unwrap().progress_chars("=> "),
            );
            bar.set_prefix(slug(i));
            bar
        })
        .collect();
    let space = Arc::new(Space::new(&opts.bounds.objective, &opts.bounds.dtypes));
    let plan = if opts.plan { space.plan(opts.seed, opts.generated_groups()) } else { Vec::new() };
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
    // Failures remembered from earlier runs come first, on the first
    // evaluator, in part 1 of a partitioned run.
    for i in (0..opts.implementations.len()).filter(|_| opts.partition.k == 1) {
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
        let refused: Vec<_> = recs
            .iter()
            .filter(|r| r.phase != Phase::Shrink && r.result.outcome == Outcome::Unsupported)
            .map(|r| (&r.spec, r.result.refused_switch.as_deref(), r.result.reason.as_str()))
            .collect();
        let declared: Vec<(String, serde_json::Value)> = pool[0]
            .worker
            .builtins()
            .into_iter()
            .find(|b| b.name == *implementation)
            .map(|b| b.refuses.into_iter().flat_map(|(switch, values)| values.into_iter().map(move |v| (switch.clone(), v))).collect())
            .unwrap_or_default();
        summary.coverage = Some(crate::coverage::coverage(&shared.space, &checked, &refused, &declared));
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
        if !opts.partition.holds(g) {
            continue;
        }
        let (size, real) = opts.group_size(g);
        for (i, implementation) in opts.implementations.iter().enumerate() {
            if shared.done_before(i, g) {
                continue;
            }
            let budget = (opts.cases + opts.real_cases) as usize * MAX_DRAWS_PER_CASE;
            if shared.rejects[i].load(Ordering::SeqCst) > budget {
                continue;
            }
            match run_group(shared, i, implementation, g, size, real, eval) {
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

