//! A check run's memory of failures (`--regressions DIR`): each
//! implementation's minimal failing cases, replayed first in the next run and
//! added to when a new one is found. A file that cannot be read or parsed is
//! an error naming it, never silently ignored or overwritten.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};

use super::group::Recorder;
use super::{GroupEnd, GroupRun, Shared};
use crate::case::CaseSpec;
use crate::evaluate::{Evaluator, Outcome};
use crate::repro::slug;
use crate::report::write_atomic;

/// The file of implementation i's remembered failures.
fn regressions_file(dir: &Path, implementation: &str) -> PathBuf {
    dir.join(format!("{}.json", slug(implementation)))
}

/// Evaluates implementation i's remembered minimal failing cases, each a run
/// of its own: all of them with --keep-going, else up to the first that
/// still fails (none remembered: no runs).
pub(super) fn regressions(shared: &Shared<'_>, i: usize, eval: &mut Evaluator) -> Result<Vec<GroupRun>> {
    let implementation = &shared.opts.implementations[i];
    let Some(dir) = &shared.opts.regressions_dir else { return Ok(Vec::new()) };
    let specs = read_regressions(&regressions_file(dir, implementation))?;
    // Only what this run could draw: a failure remembered from a bf16 run
    // or another --objective does not end an f32 run or this objective's;
    // a real-model one is replayed by runs that load the real banks (the
    // same fixtures give the same case).
    let bounds = &shared.opts.bounds;
    let real_banks = crate::case::real::installed().is_some();
    let drawable = |spec: &&CaseSpec| {
        bounds.dtypes.contains(&spec.dtype)
            && bounds.objective.admits(spec.config, spec.hparams, spec.preset.as_deref())
            && (!spec.real || real_banks)
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

pub(super) fn remember(dir: &Path, implementation: &str, minimal: &CaseSpec) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let path = regressions_file(dir, implementation);
    let mut specs = read_regressions(&path)?;
    if !specs.contains(minimal) {
        specs.push(minimal.clone());
        write_atomic(&path, &serde_json::to_string_pretty(&specs)?)?;
    }
    Ok(())
}

