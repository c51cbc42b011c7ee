//! One group of a check run, driven by proptest: draw a supported signature
//! and its cases, evaluate each (the `Recorder` keeps every case's record),
//! and shrink a failing group to its minimal case.

use std::cell::{Cell, RefCell};
use std::sync::atomic::Ordering;
use std::time::Instant;

use proptest::test_runner::{Config as ProptestConfig, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};

use super::{GroupEnd, GroupRun, Shared};
use crate::case::strategy::{case_group, Planned};
use crate::case::{CaseSpec, Kind};
use crate::evaluate::{CaseResult, Evaluator, Outcome};
use crate::report::{CaseRecord, Phase};

/// Draws of a group's signature before it counts as unsupported: an
/// implementation that supports one configuration in 16 misses 256 draws in
/// a row with probability 7e-8.
const REJECTS_PER_GROUP: u32 = 256;

/// The 32-byte ChaCha seed of group g of a run.
fn group_seed(seed: u64, group: usize) -> [u8; 32] {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    bytes[8..16].copy_from_slice(&(group as u64).to_le_bytes());
    bytes
}

/// Evaluates one case and records it; the verdict proptest sees.
pub(super) struct Recorder<'a> {
    implementation: &'a str,
    group: Option<usize>,
    kind: Kind,
    pub(super) records: RefCell<Vec<CaseRecord>>,
    failing: Cell<bool>,
    pub(super) fatal: RefCell<Option<String>>,
}

impl<'a> Recorder<'a> {
    pub(super) fn new(implementation: &'a str, group: Option<usize>, kind: Kind) -> Self {
        Recorder { implementation, group, kind, records: RefCell::new(Vec::new()), failing: Cell::new(false), fatal: RefCell::new(None) }
    }

    pub(super) fn evaluate(&self, eval: &mut Evaluator, spec: &CaseSpec) -> Result<Outcome, TestCaseError> {
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
            summary: case.summary() + &crate::case::real::label(spec),
            spec: spec.clone(),
            edges: (phase != Phase::Shrink && outcome != Outcome::Unsupported).then(|| crate::coverage::edges(&case)),
            result,
        });
        Ok(outcome)
    }
}

/// Implementation i on group g: draw a supported signature and `size` cases
/// for it (from the real banks when `real`), and shrink on failure.
pub(super) fn run_group(shared: &Shared<'_>, i: usize, implementation: &str, g: usize, size: usize, real: bool, eval: &mut Evaluator) -> Result<GroupRun, String> {
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
    let group = case_group(&opts.bounds, size, planned, real);
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
                        group.refused(r.result.refused_switch.as_deref(), &r.result.reason);
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

