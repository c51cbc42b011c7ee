//! One case, one implementation: run it and the baseline, run the oracle,
//! apply the tolerance rule. The result is a [`CaseResult`].

use std::collections::HashMap;
use std::time::Duration;

use serde::Serialize;

use std::borrow::Cow;

use crate::case::{Case, Dtype, Kind};
use crate::compare::classify::{self, classify, Bf16Reach};
use grpo_oracle::{applicable, AccumulatedGradient, CaseFacts, Convention, Declared, Forward, Rounding};

use crate::compare::{errors, errors_many, judge, Category, Errors, Quantity, QuantityError, Scales, Tolerance, Verdict};
use crate::worker::process::{Worker, WorkerError};
use crate::worker::outputs::{run_case, FailedRun, Outputs, Refusal, RunResult};

/// How a case ended for an implementation.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Every quantity within the tolerance rule (docs/spec.md, "What \"correct\" means").
    Pass,
    /// Some quantity over its bound, or the case did not run (`unjudged` says which).
    Fail,
    /// The implementation refused the configuration (NotImplementedError while tracing).
    Unsupported,
}

/// The verdict of one implementation on one case.
#[derive(Clone, Debug, Serialize)]
pub struct CaseResult {
    /// Pass, fail or unsupported.
    pub outcome: Outcome,
    /// Why it failed or is unsupported, in one paragraph.
    pub reason: String,
    /// Each returned quantity's error, bound and verdict (empty when the case did not run).
    pub verdicts: Vec<Verdict>,
    /// Wall time of the implementation's call, compilation included when `compiled`.
    pub seconds: f64,
    /// The call compiled a new step (its signature was new to the worker).
    pub compiled: bool,
    /// The declared conventions that moved this case's allowances
    /// (docs/conventions.md); empty: judged by SPEC's contract alone.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub conventions: Vec<String>,
    /// Why a failed case has no verdicts (None: the rule judged it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unjudged: Option<Unjudged>,
    /// The switch an unsupported case's refusal names as data (None: no
    /// refusal, or a bare message; `coverage` and the plan then search it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused_switch: Option<String>,
}

/// Why a case failed without reaching the rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unjudged {
    /// The implementation did not run to the end (raised, crashed, hung, malformed).
    Run(FailedRun),
    /// The case was invalid (a harness bug if generated).
    InvalidCase,
    /// The baseline did not run on it: the baseline's finding, not the implementation's.
    Baseline,
    /// A built-in refused a configuration its registry entry declares
    /// supported, or ran one it declares refused
    /// (python/grpo_kernels/registry.py, `refuses`).
    Declaration,
}

impl CaseResult {
    fn failed(unjudged: Unjudged, reason: String) -> Self {
        CaseResult {
            outcome: Outcome::Fail,
            reason,
            verdicts: vec![],
            seconds: 0.0,
            compiled: false,
            conventions: vec![],
            unjudged: Some(unjudged),
            refused_switch: None,
        }
    }
}

/// The failing quantities of a case that roundings account for: those that
/// pass under bf16 rounding of their terms (`BF16_TERMS`), those that pass
/// only with bf16 sums across the case's chunks as well
/// (`BF16_ACCUMULATION`; bf16's the classes speak of), and on f32 fused
/// inputs on a GPU those that pass under TF32 products (None: not asked).
struct Explained {
    bf16_terms: Option<Vec<Quantity>>,
    /// Each undeclared rounding of the terms, with what it alone accounts for.
    bf16_alone: Vec<(String, Vec<Quantity>)>,
    bf16_sums: Option<Vec<Quantity>>,
    tf32: Option<Vec<Quantity>>,
}

impl Explained {
    fn reach(&self, q: Quantity) -> Option<Bf16Reach> {
        let (terms, sums) = (self.bf16_terms.as_ref()?, self.bf16_sums.as_ref()?);
        Some(if terms.contains(&q) {
            Bf16Reach::Terms(self.bf16_alone.iter().filter(|(_, within)| within.contains(&q)).map(|(c, _)| c.clone()).collect())
        } else if sums.contains(&q) {
            Bf16Reach::Accumulation
        } else {
            Bf16Reach::Beyond
        })
    }
}

/// Every bf16 rounding of a case's terms in docs/conventions.md at its
/// widest count: a failure within what these can move is a precision
/// finding (`classify`).
const BF16_TERMS: [Convention; 4] = [
    Convention::Bf16Logits { stages: 2 },
    Convention::Bf16Temperature,
    Convention::Bf16Softmax,
    Convention::Bf16GradLogits { stages: 2 },
];

/// bf16 sums across chunks, at the finest chunks kernels use: they move a
/// fused gradient only where the case's shape spans two chunks (more than
/// 128 vocabulary columns, more than one row); a failure within these and
/// the terms' is precision, one beyond them is math.
const BF16_ACCUMULATION: [Convention; 2] = [
    Convention::Bf16Accumulation { gradient: AccumulatedGradient::HiddenOverColumns, chunk: 128 },
    Convention::Bf16Accumulation { gradient: AccumulatedGradient::LmHeadOverSequences, chunk: 1 },
];

/// What the declared conventions need to know of a case and of what the
/// implementation returned on it.
fn case_facts(case: &Case, out: &Outputs) -> CaseFacts {
    CaseFacts {
        bf16: case.dtype == Dtype::Bf16,
        fused: case.kind() == Kind::Fused,
        batch: case.shape.batch,
        time: case.shape.time,
        vocab: case.shape.vocab,
        live_rows: case.mask.chunks(case.shape.time).filter(|row| row.iter().any(|&m| m != 0.0)).count(),
        bf16_gradients: out.grad_dtype == Dtype::Bf16,
    }
}

/// Can the worker's platform run f32 products in TF32? A GPU's: JAX's
/// default f32 matmul and Triton's tl.dot there; XLA:CPU and NumPy (the
/// Triton interpreter) compute f32 products in f32.
pub fn tf32_possible(hello: &serde_json::Value) -> bool {
    matches!(hello["backend"].as_str(), Some("gpu" | "cuda" | "rocm"))
}

/// A hash of everything in a case: the float inputs by their bits (the
/// fused kind's lm_head is hundreds of millions of values at production
/// vocabulary; formatting them as JSON would take longer than checking
/// them), everything else through its JSON.
fn case_fingerprint(case: &Case) -> u64 {
    use std::hash::{Hash, Hasher};
    struct HashWriter<'a>(&'a mut std::collections::hash_map::DefaultHasher);
    impl std::io::Write for HashWriter<'_> {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.write(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for (name, values) in case.float_inputs() {
        name.hash(&mut h);
        values.len().hash(&mut h);
        for chunk in values.chunks(4096) {
            let bits: Vec<u8> = chunk.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect();
            h.write(&bits);
        }
    }
    let rest = (
        &case.shape,
        &case.dtype,
        &case.config,
        &case.hparams,
        case.cotangent,
        &case.tokens,
        &case.mask,
        &case.advantages,
        &case.old_logp,
        &case.ref_logp,
        &case.is_weights,
        &case.mesh,
        case.kind().name(),
    );
    serde_json::to_writer(HashWriter(&mut h), &rest).expect("a case serialises");
    h.finish()
}

/// The worker, the tolerance constants and a cache of the baseline's errors
/// (each generated case is checked against several implementations).
pub struct Evaluator {
    /// The JAX worker the implementations run in.
    pub worker: Worker,
    /// The tolerance rule's constants (docs/tolerance.md).
    pub tolerance: Tolerance,
    /// How long one case may take before the worker is restarted and the case failed.
    pub timeout: Duration,
    baseline_cache: HashMap<u64, Result<Errors, String>>,
    /// Times the baseline was run (cache misses).
    pub baseline_runs: usize,
    /// Conventions tried on every implementation but the baselines, beside
    /// their own declarations (`check --convention`).
    pub tried_conventions: Vec<Convention>,
}

/// When a case's judgement runs the baseline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Baseline {
    /// Always (`check`: the report gives both errors), sharing the fused
    /// oracle's sweep with the implementation.
    Always,
    /// Only when the implementation's own errors leave the verdict open;
    /// a failure over the loosest bound is decided without it too.
    Shrink,
    /// Only when the implementation's own errors do not pass with the
    /// baseline's taken as zero (`gradcheck`).
    WhenNeeded,
}

/// What decides a shrink step (see [`Evaluator::evaluate_shrink_step`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decided {
    /// By the implementation's errors alone: the baseline did not run.
    WithoutBaseline,
    /// By the full rule.
    ByTheRule,
}

/// A stand-in baseline at `err` in every quantity the implementation returned.
fn baseline_at(implementation: &Errors, err: f64) -> Errors {
    let q = || QuantityError { err, ..QuantityError::default() };
    let like = |o: &Option<QuantityError>| o.as_ref().map(|_| q());
    Errors {
        loss: q(),
        logp: like(&implementation.logp),
        per_token_loss: like(&implementation.per_token_loss),
        entropy: like(&implementation.entropy),
        grad: q(),
        grad_lm_head: like(&implementation.grad_lm_head),
        grad_zero_rows: QuantityError::default(),
        grad_row_errors: Vec::new(),
    }
}

impl Evaluator {
    /// An evaluator over a started worker, its baseline cache empty.
    pub fn new(worker: Worker, tolerance: Tolerance, timeout: Duration) -> Self {
        Evaluator { worker, tolerance, timeout, baseline_cache: HashMap::new(), baseline_runs: 0, tried_conventions: Vec::new() }
    }

    /// A worker on `devices` devices in the resolved Python environment,
    /// with the SPEC's tolerance and `timeout` per request.
    pub fn start(timeout: Duration, devices: usize) -> anyhow::Result<Evaluator> {
        let env = crate::worker::pyenv::resolve()?;
        let worker = Worker::start_with_devices(&env, devices).map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(Evaluator::new(worker, Tolerance::default(), timeout))
    }

    /// `jobs` evaluators started side by side (each worker imports JAX: seconds).
    pub fn start_pool(timeout: Duration, devices: usize, jobs: usize) -> anyhow::Result<Vec<Evaluator>> {
        std::thread::scope(|scope| {
            let started: Vec<_> = (0..jobs).map(|_| scope.spawn(move || Evaluator::start(timeout, devices))).collect();
            started.into_iter().map(|h| h.join().expect("a worker-starting thread panicked")).collect()
        })
    }

    /// The conventions `implementation` is judged under: its own
    /// declaration and the tried ones (a baseline is held to SPEC alone).
    pub fn conventions(&mut self, implementation: &str) -> anyhow::Result<Vec<Declared>> {
        let mut conventions = self.worker.conventions(implementation)?;
        let is_baseline = [Kind::Logits, Kind::Fused].iter().any(|&k| self.worker.baseline(k).is_ok_and(|b| b == implementation));
        if !is_baseline {
            for c in &self.tried_conventions {
                if !conventions.iter().any(|d| d.convention == *c && d.when.is_none()) {
                    conventions.push(Declared::always(*c));
                }
            }
        }
        Ok(conventions)
    }

    /// For a built-in, what its run did against what its registry entry
    /// declares (`refuses`): a refusal of a configuration it declares
    /// supported, or a run of one it declares refused. None when they agree,
    /// and for any other implementation (it declares nothing).
    fn declaration_disagrees(&self, implementation: &str, case: &Case, run: &RunResult) -> Option<String> {
        let builtin = self.worker.builtins().into_iter().find(|b| b.name == implementation)?;
        declaration_disagrees(&builtin, &case.config, run)
    }

    /// A shrink step: [`Evaluator::evaluate`], except that the baseline is
    /// not run when the implementation's own errors decide the rule
    /// whatever the baseline's are: some quantity over the loosest bound
    /// the rule can give (2 analytic + floor, or non-finite) fails, every
    /// quantity within the floor passes (a baseline failing there is the
    /// baseline's finding, not this implementation's, and a repro must be
    /// the implementation's). Shrinking only asks pass or fail, and most of
    /// its steps are one of these, so it skips the baseline's compile and
    /// run; the minimal case is evaluated in full again for its report. A
    /// baseline already cached for the case costs nothing: the full rule.
    pub fn evaluate_shrink_step(&mut self, implementation: &str, case: &Case) -> Result<(CaseResult, Decided), WorkerError> {
        let problem = case.problem();
        let fwd = match problem.forward() {
            Ok(f) => f,
            Err(e) => {
                return Ok((CaseResult::failed(Unjudged::InvalidCase, format!("invalid case (a harness bug if generated): {e}")), Decided::ByTheRule))
            }
        };
        let (result, _, _, decided) = self.judge_case(implementation, case, &fwd, Baseline::Shrink)?;
        Ok((result, decided))
    }

    /// The result of the implementation's own errors when they decide the
    /// rule whatever the baseline's are (None: the baseline must run).
    fn decided_alone(&self, own: &Errors, out: &Outputs, inputs: Dtype, baseline: &str, conventions: &[String]) -> Option<CaseResult> {
        let analytic = self.tolerance.analytic_units * crate::compare::U32;
        let loosest = judge(own, &baseline_at(own, analytic), &self.tolerance);
        if loosest.iter().any(|v| !v.pass) {
            return Some(self.result(loosest, out, inputs, baseline, "(decided without the baseline: over the loosest bound) ", conventions, None));
        }
        let tightest = judge(own, &baseline_at(own, 0.0), &self.tolerance);
        tightest.iter().all(|v| v.pass).then(|| self.result(tightest, out, inputs, baseline, "", conventions, None))
    }

    /// Checks `implementation` on `case`. `Err` only when the run cannot go on
    /// (the worker cannot start, or the harness sent something malformed).
    pub fn evaluate(&mut self, implementation: &str, case: &Case) -> Result<CaseResult, WorkerError> {
        Ok(self.evaluate_with_outputs(implementation, case)?.0)
    }

    /// [`Evaluator::evaluate`], also returning what the implementation
    /// returned (None when it failed to run or was unsupported).
    pub fn evaluate_with_outputs(&mut self, implementation: &str, case: &Case) -> Result<(CaseResult, Option<Outputs>), WorkerError> {
        let problem = case.problem();
        let fwd = match problem.forward() {
            Ok(f) => f,
            Err(e) => return Ok((CaseResult::failed(Unjudged::InvalidCase, format!("invalid case (a harness bug if generated): {e}")), None)),
        };
        let (result, out, _) = self.evaluate_on(implementation, case, &fwd)?;
        Ok((result, out))
    }

    /// [`Evaluator::evaluate_with_outputs`] with the oracle's forward pass
    /// of `case` already made (it is the costly part at production shapes),
    /// also returning the implementation's measured errors.
    pub fn evaluate_on(
        &mut self,
        implementation: &str,
        case: &Case,
        fwd: &Forward<'_>,
    ) -> Result<(CaseResult, Option<Outputs>, Option<Errors>), WorkerError> {
        let (result, out, errors, _) = self.judge_case(implementation, case, fwd, Baseline::Always)?;
        Ok((result, out, errors))
    }

    /// [`Evaluator::evaluate_on`], where the baseline runs only when the
    /// verdict needs it: an implementation whose own errors pass with the
    /// baseline's taken as zero passes whatever the baseline's are, and is
    /// reported without them (the verdict is the full rule's). What
    /// `gradcheck` asks at production shapes, where the baseline's run and
    /// its share of the sweep are a third of a fixture's time.
    pub fn evaluate_on_baseline_when_needed(
        &mut self,
        implementation: &str,
        case: &Case,
        fwd: &Forward<'_>,
    ) -> Result<(CaseResult, Option<Outputs>, Option<Errors>), WorkerError> {
        let (result, out, errors, _) = self.judge_case(implementation, case, fwd, Baseline::WhenNeeded)?;
        Ok((result, out, errors))
    }

    /// [`Evaluator::evaluate_on`]; with `shrink`, a baseline not yet cached
    /// runs only when the implementation's own errors leave the rule open.
    fn judge_case(
        &mut self,
        implementation: &str,
        case: &Case,
        fwd: &Forward<'_>,
        when: Baseline,
    ) -> Result<(CaseResult, Option<Outputs>, Option<Errors>, Decided), WorkerError> {
        let shrink = when == Baseline::Shrink;
        let baseline = self.worker.baseline(case.kind()).map_err(|e| WorkerError::Setup(format!("{e:#}")))?;
        let baseline = baseline.as_str();
        let run = run_case(&mut self.worker, implementation, case, self.timeout)?;
        if let Some(disagreement) = self.declaration_disagrees(implementation, case, &run) {
            return Ok((CaseResult::failed(Unjudged::Declaration, disagreement), None, None, Decided::WithoutBaseline));
        }
        let out = match run {
            RunResult::Ok(out) => out,
            RunResult::Unsupported(refusal) => {
                let result = CaseResult {
                    outcome: Outcome::Unsupported,
                    reason: refusal.message,
                    verdicts: vec![],
                    seconds: 0.0,
                    compiled: false,
                    conventions: vec![],
                    unjudged: None,
                    refused_switch: refusal.switch,
                };
                return Ok((result, None, None, Decided::WithoutBaseline));
            }
            RunResult::Failed(how, msg) => return Ok((CaseResult::failed(Unjudged::Run(how), msg), None, None, Decided::WithoutBaseline)),
        };
        let scales = Scales::new(fwd, case, &self.tolerance);
        // The implementation's declared conventions widen its own measure;
        // the baseline's is SPEC's.
        // The declarations that hold on this case (each on every case, or under its condition).
        let declared = self.conventions(implementation).map_err(|e| WorkerError::Setup(format!("{e:#}")))?;
        let conventions = applicable(&declared, &case.config, case.hparams.temperature);
        let rounding = Rounding::of(&conventions, case_facts(case, &out), &case.config, case.hparams.temperature);
        let own_scales = if rounding.is_none() { Cow::Borrowed(&scales) } else { Cow::Owned(scales.under(fwd, rounding)) };
        // Each convention that moves something on this case by itself (a
        // bf16_accumulation whose chunks the case does not span moves nothing).
        let facts = case_facts(case, &out);
        let moved: Vec<String> = conventions
            .iter()
            .filter(|c| !Rounding::of(std::slice::from_ref(*c), facts, &case.config, case.hparams.temperature).is_none())
            .map(ToString::to_string)
            .collect();
        let key = case_fingerprint(case);
        let cached = if implementation == baseline { None } else { self.baseline_cache.get(&key).cloned() };
        let (impl_errors, base) = match cached {
            Some(base) => (errors(fwd, &own_scales, case, &out), base),
            None if implementation == baseline => {
                let e = errors(fwd, &scales, case, &out);
                (e.clone(), Ok(e))
            }
            None => {
                let own = (when != Baseline::Always).then(|| errors(fwd, &own_scales, case, &out));
                if let Some(result) = own.as_ref().and_then(|e| self.decided_alone(e, &out, case.dtype, baseline, &moved)) {
                    // A failure is judged in full (and classified) unless shrinking.
                    if shrink {
                        return Ok((result, Some(out), own, Decided::WithoutBaseline));
                    }
                    if result.outcome == Outcome::Pass {
                        let reason = "the baseline was not run: every quantity passes with its errors taken as zero (baseline_err 0)";
                        return Ok((CaseResult { reason: reason.into(), ..result }, Some(out), own, Decided::WithoutBaseline));
                    }
                }
                self.baseline_runs += 1;
                let (impl_errors, base) = match (run_case(&mut self.worker, baseline, case, self.timeout)?, own) {
                    (RunResult::Ok(b), Some(own)) => (own, Ok(errors(fwd, &scales, case, &b))),
                    (RunResult::Ok(b), None) if rounding.is_none() => {
                        // Both measured in one call: the fused oracle's sweep is shared.
                        let mut both = errors_many(fwd, &scales, case, &[&out, &b]);
                        let base = both.pop().expect("two results");
                        (both.pop().expect("two results"), Ok(base))
                    }
                    (RunResult::Ok(b), None) => (errors(fwd, &own_scales, case, &out), Ok(errors(fwd, &scales, case, &b))),
                    (RunResult::Unsupported(Refusal { message: m, .. }) | RunResult::Failed(_, m), own) => (own.unwrap_or_else(|| errors(fwd, &own_scales, case, &out)), Err(m)),
                };
                if self.baseline_cache.len() > 4096 {
                    self.baseline_cache.clear();
                }
                self.baseline_cache.insert(key, base.clone());
                (impl_errors, base)
            }
        };
        let base = match base {
            Ok(b) => b,
            Err(m) => {
                let result = CaseResult::failed(Unjudged::Baseline, format!("the baseline `{baseline}` failed on this case: {m}"));
                return Ok((result, Some(out), Some(impl_errors), Decided::ByTheRule));
            }
        };
        let verdicts = judge(&impl_errors, &base, &self.tolerance);
        // A failure the bf16 roundings could explain is precision, one they
        // cannot is math: judged again under those of its terms, then with
        // bf16 sums across the case's chunks too (shrink steps ask only
        // pass or fail, and skip it).
        let failing = !shrink && verdicts.iter().any(|v| !v.pass);
        let within = |envelope: &[Convention]| -> Vec<Quantity> {
            let mut all = envelope.to_vec();
            all.extend(conventions.iter().filter(|c| !envelope.contains(c)).copied());
            let facts = CaseFacts { bf16: true, ..case_facts(case, &out) };
            let widest = scales.under(fwd, Rounding::of(&all, facts, &case.config, case.hparams.temperature));
            judge(&errors(fwd, &widest, case, &out), &base, &self.tolerance).into_iter().filter(|v| v.pass).map(|v| v.quantity).collect()
        };
        let bf16_terms = failing.then(|| within(&BF16_TERMS));
        // Which one alone would do it: the label names that rounding (only
        // where the terms together reach the failure at all).
        let bf16_alone = match &bf16_terms {
            Some(terms) if verdicts.iter().any(|v| !v.pass && terms.contains(&v.quantity)) => {
                // One stage before two: a second stage is named only where one is not enough.
                let singles = [Convention::Bf16Logits { stages: 1 }, Convention::Bf16GradLogits { stages: 1 }].into_iter().chain(BF16_TERMS);
                let mut alone: Vec<(String, Vec<Quantity>)> = Vec::new();
                for c in singles.filter(|c| !conventions.contains(c)) {
                    let mut within_c = within(std::slice::from_ref(&c));
                    if let Convention::Bf16Logits { stages: 2 } | Convention::Bf16GradLogits { stages: 2 } = c {
                        let one = c.to_string().trim_end_matches(":2").to_string();
                        within_c.retain(|q| !alone.iter().any(|(name, qs)| *name == one && qs.contains(q)));
                    }
                    alone.push((c.to_string(), within_c));
                }
                alone
            }
            _ => Vec::new(),
        };
        let bf16_sums = failing.then(|| within(&[BF16_TERMS.as_slice(), BF16_ACCUMULATION.as_slice()].concat()));
        // On f32 fused inputs a failure TF32 products explain is reported as
        // TF32 (a GPU's default, undeclared), not as f32 accuracy lost; only
        // where the platform has TF32 to use.
        let ask_tf32 = case.kind() == Kind::Fused
            && case.dtype == Dtype::F32
            && !conventions.contains(&Convention::Tf32Matmul)
            && tf32_possible(&self.worker.hello);
        let tf32 = (failing && ask_tf32).then(|| {
            let under = scales.under(fwd, Rounding::of(&[Convention::Tf32Matmul], case_facts(case, &out), &case.config, case.hparams.temperature));
            judge(&errors(fwd, &under, case, &out), &base, &self.tolerance).into_iter().filter(|v| v.pass).map(|v| v.quantity).collect()
        });
        let explained = Explained { bf16_terms, bf16_alone, bf16_sums, tf32 };
        let result = self.result(verdicts, &out, case.dtype, baseline, "", &moved, Some(&explained));
        Ok((result, Some(out), Some(impl_errors), Decided::ByTheRule))
    }

    /// The case's result from its verdicts: failing quantities classified,
    /// math findings first, then any the baseline failed.
    /// `explained`: which failing quantities roundings account for (None
    /// where that was not asked: shrink steps).
    #[allow(clippy::too_many_arguments)]
    fn result(
        &self,
        mut verdicts: Vec<Verdict>,
        out: &Outputs,
        inputs: Dtype,
        baseline: &str,
        prefix: &str,
        conventions: &[String],
        explained: Option<&Explained>,
    ) -> CaseResult {
        let logp_exact = verdicts.iter().any(|v| v.quantity == Quantity::Logp && !v.not_covered && v.pass);
        for v in verdicts.iter_mut().filter(|v| !v.pass) {
            let returned = if v.quantity.is_gradient() { out.grad_dtype } else { Dtype::F32 };
            let within_tf32 = explained.and_then(|e| e.tf32.as_ref()).is_some_and(|q| q.contains(&v.quantity));
            let reach = explained.and_then(|e| e.reach(v.quantity));
            let as_tf32 = within_tf32.then(|| classify::tf32(v)).flatten();
            v.class = Some(as_tf32.unwrap_or_else(|| classify(v, returned, inputs, logp_exact, reach)));
        }
        // Math findings first: they are what a reader must not miss.
        let mut failing: Vec<&Verdict> = verdicts.iter().filter(|v| !v.pass).collect();
        failing.sort_by_key(|v| !v.class.as_ref().is_some_and(|c| c.category == Category::Math));
        let mut reasons: Vec<String> = failing
            .into_iter()
            .map(|v| {
                format!(
                    "{} error {:.3e} > bound {:.3e} (abs {:.3e} at {}{}): {}",
                    v.quantity,
                    v.err,
                    v.bound,
                    v.abs_err,
                    if v.at.is_empty() { "the scalar" } else { &v.at },
                    if v.err.is_infinite() { ", non-finite" } else { "" },
                    v.class.as_ref().map(ToString::to_string).unwrap_or_default(),
                )
            })
            .collect();
        reasons.extend(verdicts.iter().filter(|v| !v.baseline_pass && !v.not_covered).map(|v| {
            format!(
                "baseline `{baseline}` {} error {:.3e} exceeds its analytic bound {:.3e}",
                v.quantity, v.baseline_err, v.analytic
            )
        }));
        let outcome = if reasons.is_empty() { Outcome::Pass } else { Outcome::Fail };
        let reason = if reasons.is_empty() { String::new() } else { format!("{prefix}{}", reasons.join("; ")) };
        CaseResult { outcome, reason, verdicts, seconds: out.seconds, compiled: out.compiled, conventions: conventions.to_vec(), unjudged: None, refused_switch: None }
    }
}
/// [`Evaluator::declaration_disagrees`] for one built-in's entry.
fn declaration_disagrees(builtin: &crate::worker::process::Builtin, config: &grpo_oracle::Config, run: &RunResult) -> Option<String> {
    let entry = "its entry in python/grpo_kernels/registry.py";
    match (run, builtin.refused(config)) {
        (RunResult::Unsupported(refusal), None) => {
            Some(format!("{} refused a configuration {entry} declares supported: {}", builtin.name, refusal.message))
        }
        (RunResult::Ok(_), Some((switch, value))) => Some(format!("{} ran {switch}={value}, which {entry} declares refused", builtin.name)),
        _ => None,
    }
}


#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::process::Builtin;

    fn onepass() -> Builtin {
        Builtin {
            name: "fused_onepass".into(),
            kind: Kind::Fused,
            sharded: false,
            gradcheck_default: false,
            refuses: vec![("ratio_level".into(), vec![serde_json::json!("sequence"), serde_json::json!("sequence_token")])],
        }
    }

    fn ran() -> RunResult {
        RunResult::Ok(Outputs {
            loss: 0.0,
            grad: vec![],
            grad_lm_head: None,
            grad_dtype: crate::case::Dtype::F32,
            logp: None,
            per_token_loss: None,
            entropy: None,
            bf16_returned: Default::default(),
            seconds: 0.0,
            compiled: false,
        })
    }

    fn refused() -> RunResult {
        RunResult::Unsupported(Refusal { message: "no".into(), switch: Some("ratio_level".into()) })
    }

    /// A built-in is held to its registry entry: refusing what it declares
    /// supported, or running what it declares refused, is a failure; the
    /// two that agree are not.
    #[test]
    fn a_builtin_is_held_to_its_declared_refusals() {
        let sequence = grpo_oracle::Config { ratio_level: grpo_oracle::RatioLevel::Sequence, ..Default::default() };
        let token = grpo_oracle::Config::default();
        let b = onepass();
        assert_eq!(declaration_disagrees(&b, &sequence, &refused()), None);
        assert_eq!(declaration_disagrees(&b, &token, &ran()), None);
        let e = declaration_disagrees(&b, &token, &refused()).expect("a refusal of a supported configuration");
        assert!(e.contains("declares supported: no"), "{e}");
        let e = declaration_disagrees(&b, &sequence, &ran()).expect("a run of a refused configuration");
        assert!(e.contains("ran ratio_level=\"sequence\", which its entry"), "{e}");
        // A failure to run is judged as one, whatever the declaration.
        assert_eq!(declaration_disagrees(&b, &sequence, &RunResult::Failed(FailedRun::Raised, "boom".into())), None);
    }
}
