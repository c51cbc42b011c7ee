//! One implementation's result from its group runs: the summary the report
//! shows, its case records, and a repro file (and a remembered failure) for
//! each distinct discrepancy.

use anyhow::Result;

use super::persistence::remember;
use super::{CheckOptions, GroupEnd, GroupRun};
use crate::case::Kind;
use crate::discrepancy::{distinct, Discrepancies, Discrepancy, Failure};
use crate::evaluate::Outcome;
use crate::repro::{replay_command, repro_file, Repro};
use crate::report::{CaseRecord, ImplSummary, Phase};

/// One implementation's summary and records from its group runs (in group
/// order): everything up to and including its first failing group, or with
/// --keep-going its `--max-failures`-th. Each distinct discrepancy among the
/// failures gets a repro file and is remembered.
pub(super) fn summarise(opts: &CheckOptions, implementation: &str, kind: Kind, runs: Vec<GroupRun>) -> Result<(ImplSummary, Vec<CaseRecord>)> {
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
    let real_cases = records.iter().filter(|r| r.phase != Phase::Shrink && r.result.outcome != Outcome::Unsupported && r.spec.real).count();
    let mut summary = ImplSummary {
        implementation: implementation.to_string(),
        kind,
        framework: String::new(), // run_check asks the worker
        passed: failures.is_empty(),
        cases: generated,
        supported: generated - unsupported,
        unsupported,
        real_cases,
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
    let requested = (opts.cases + opts.real_cases) as usize;
    if failures.is_empty() && summary.supported < requested {
        summary.note = Some(format!(
            "only {} of the {} requested cases were supported ({} draws, {} signature groups with no supported draw; \
             the rest raised NotImplementedError)",
            summary.supported, requested, generated, unsupported_groups
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
