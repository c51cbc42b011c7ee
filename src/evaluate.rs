//! One case, one implementation: run it and the baseline, run the oracle,
//! apply the tolerance rule. The result is a [`CaseResult`].

use std::collections::HashMap;
use std::time::Duration;

use serde::Serialize;

use crate::case::{Case, Kind};
use crate::compare::{errors, judge, Errors, Scales, Tolerance, Verdict};
use crate::host::{Worker, WorkerError};
use crate::outputs::{run_case, RunResult};

/// The plain-JAX baselines of the tolerance rule, one per kind.
pub fn baseline(kind: Kind) -> &'static str {
    match kind {
        Kind::Logits => "reference",
        Kind::Fused => "fused_reference",
    }
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Pass,
    Fail,
    Unsupported,
}

/// The verdict of one implementation on one case.
#[derive(Clone, Debug, Serialize)]
pub struct CaseResult {
    pub outcome: Outcome,
    /// Why it failed or is unsupported, in one paragraph.
    pub reason: String,
    pub verdicts: Vec<Verdict>,
    pub seconds: f64,
    pub compiled: bool,
}

impl CaseResult {
    fn failed(reason: String) -> Self {
        CaseResult { outcome: Outcome::Fail, reason, verdicts: vec![], seconds: 0.0, compiled: false }
    }
}

/// A hash of everything in a case (its JSON streamed through a hasher: the
/// arrays of a fused case are megabytes, too large to keep as a key).
fn case_fingerprint(case: &Case) -> u64 {
    struct HashWriter(std::collections::hash_map::DefaultHasher);
    impl std::io::Write for HashWriter {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            std::hash::Hasher::write(&mut self.0, bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut w = HashWriter(Default::default());
    serde_json::to_writer(&mut w, case).expect("a case serialises");
    std::hash::Hasher::finish(&w.0)
}

/// The worker, the tolerance constants and a cache of the baseline's errors
/// (each generated case is checked against several implementations).
pub struct Evaluator {
    pub worker: Worker,
    pub tolerance: Tolerance,
    pub timeout: Duration,
    baseline_cache: HashMap<u64, Result<Errors, String>>,
}

impl Evaluator {
    pub fn new(worker: Worker, tolerance: Tolerance, timeout: Duration) -> Self {
        Evaluator { worker, tolerance, timeout, baseline_cache: HashMap::new() }
    }

    /// Checks `implementation` on `case`. `Err` only when the run cannot go on
    /// (the worker cannot start, or the harness sent something malformed).
    pub fn evaluate(&mut self, implementation: &str, case: &Case) -> Result<CaseResult, WorkerError> {
        let baseline = baseline(case.kind());
        let problem = case.problem();
        let fwd = match problem.forward() {
            Ok(f) => f,
            Err(e) => return Ok(CaseResult::failed(format!("invalid case (a harness bug if generated): {e}"))),
        };
        let out = match run_case(&mut self.worker, implementation, case, self.timeout)? {
            RunResult::Ok(out) => out,
            RunResult::Unsupported(msg) => {
                return Ok(CaseResult {
                    outcome: Outcome::Unsupported,
                    reason: msg,
                    verdicts: vec![],
                    seconds: 0.0,
                    compiled: false,
                })
            }
            RunResult::Failed(msg) => return Ok(CaseResult::failed(msg)),
        };
        let scales = Scales::new(&fwd, case, &self.tolerance);
        let impl_errors = errors(&fwd, &scales, case, &out);
        let key = case_fingerprint(case);
        let base = if implementation == baseline {
            Ok(impl_errors.clone())
        } else if let Some(cached) = self.baseline_cache.get(&key) {
            cached.clone()
        } else {
            let base = match run_case(&mut self.worker, baseline, case, self.timeout)? {
                RunResult::Ok(b) => Ok(errors(&fwd, &scales, case, &b)),
                RunResult::Unsupported(m) | RunResult::Failed(m) => Err(m),
            };
            if self.baseline_cache.len() > 4096 {
                self.baseline_cache.clear();
            }
            self.baseline_cache.insert(key, base.clone());
            base
        };
        let base = match base {
            Ok(b) => b,
            Err(m) => return Ok(CaseResult::failed(format!("the baseline `{baseline}` failed on this case: {m}"))),
        };
        let verdicts = judge(&impl_errors, &base, &self.tolerance);
        let mut reasons: Vec<String> = verdicts
            .iter()
            .filter(|v| !v.pass)
            .map(|v| {
                format!(
                    "{} error {:.3e} > bound {:.3e} (abs {:.3e} at {}{})",
                    v.quantity,
                    v.err,
                    v.bound,
                    v.abs_err,
                    if v.at.is_empty() { "the scalar" } else { &v.at },
                    if v.err.is_infinite() { ", non-finite" } else { "" }
                )
            })
            .collect();
        reasons.extend(verdicts.iter().filter(|v| !v.baseline_pass && !v.not_covered).map(|v| {
            format!(
                "baseline `{baseline}` {} error {:.3e} exceeds its analytic bound {:.3e}",
                v.quantity, v.baseline_err, v.analytic
            )
        }));
        Ok(CaseResult {
            outcome: if reasons.is_empty() { Outcome::Pass } else { Outcome::Fail },
            reason: reasons.join("; "),
            verdicts,
            seconds: out.seconds,
            compiled: out.compiled,
        })
    }
}
