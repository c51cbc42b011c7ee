//! `grpo-verify sensitivity`: the smallest bug the suite sees. An
//! implementation is wrapped with a known relative error e in one output
//! (`python/grpo_verify_worker/perturb.py`: the loss, logp, entropy or
//! per-token loss, or d logits, d hidden, d lm_head alone; over the whole
//! tensor, one row or one element), and e is bisected, on a log scale, to
//! the smallest that `check` catches in N cases. The wrapper keeps the
//! implementation's declared conventions, so a library is measured under
//! its declarations, a built-in under SPEC's contract.

use std::path::PathBuf;

use anyhow::{bail, Result};
use serde::Serialize;

use crate::case::strategy::Bounds;
use crate::case::Kind;
use crate::check::{run_check, CheckOptions};
use crate::evaluate::Evaluator;

/// The quantities `--quantity` may perturb.
pub const QUANTITIES: [&str; 7] = ["loss", "logp", "entropy", "per_token_loss", "grad", "grad_hidden", "grad_lm_head"];
/// How much of a quantity one perturbation touches: the whole tensor, one row, one element.
pub const SCOPES: [&str; 3] = ["tensor", "row", "element"];

/// The bisection's range of e: 2^-40 (far below f32's own rounding) to 1.
const LOG2_E_MIN: f64 = -40.0;
const LOG2_E_MAX: f64 = 0.0;

/// What one `sensitivity` run measures (docs/checking.md, "Sensitivity").
pub struct SensitivityOptions {
    /// The implementation wrapped and perturbed.
    pub implementation: String,
    /// The quantity perturbed (one of `QUANTITIES`).
    pub quantity: String,
    /// How much of it (one of `SCOPES`).
    pub scope: String,
    /// Cases checked at each size of perturbation.
    pub cases: u32,
    /// The run's seed (the same cases at every size).
    pub seed: u64,
    /// Shapes, dtypes and objective drawn.
    pub bounds: Bounds,
    /// Halvings of the log2 interval after its ends are checked.
    pub steps: u32,
    /// Where report.json and report.md go.
    pub report_dir: PathBuf,
}

/// One size of perturbation and whether `check` caught it.
#[derive(Serialize)]
pub struct Step {
    /// The relative error e put into the output.
    pub e: f64,
    /// Some case failed.
    pub caught: bool,
    /// Cases checked (up to and including the first failure when caught).
    pub cases: usize,
    /// What failed on the first failing case (None: not caught).
    pub failure: Option<String>,
}

/// The smallest perturbation `check` catches, and the steps that found it.
#[derive(Serialize)]
pub struct Sensitivity {
    /// The implementation wrapped.
    pub implementation: String,
    /// The quantity perturbed.
    pub quantity: String,
    /// How much of it.
    pub scope: String,
    /// Cases checked at each size.
    pub cases: u32,
    /// The run's seed.
    pub seed: u64,
    /// The largest e checked and not caught, and the smallest caught (None:
    /// not caught at e = 1, or caught at 2^-40).
    pub passed_at: Option<f64>,
    /// See `passed_at`.
    pub caught_at: Option<f64>,
    /// Every size tried, in the order tried.
    pub steps: Vec<Step>,
}

/// The loader name of the wrapper `python/grpo_verify_worker/perturb.py`
/// builds from `spec` (its JSON, hex-encoded): an implementation with one
/// output moved, or declaring other conventions (`necessity`).
pub fn perturb_name(spec: &serde_json::Value) -> String {
    let hex: String = spec.to_string().bytes().map(|b| format!("{b:02x}")).collect();
    format!("grpo_verify_worker.perturb:w_{hex}")
}

/// The loader name of `implementation` with `quantity` off by e over `scope`.
pub fn wrapped(implementation: &str, quantity: &str, scope: &str, e: f64) -> String {
    perturb_name(&serde_json::json!({"e": e, "impl": implementation, "quantity": quantity, "scope": scope}))
}

/// One `check` of the wrapped implementation at e: caught or not.
fn check_at(eval: &mut Evaluator, opts: &SensitivityOptions, e: f64, k: usize) -> Result<Step> {
    let name = wrapped(&opts.implementation, &opts.quantity, &opts.scope, e);
    let kind = eval.worker.load(&name)?;
    let check = CheckOptions {
        seed: opts.seed,
        // Caught or not is all a step asks: no shrinking.
        shrink_iters: 0,
        shrink_time: std::time::Duration::from_secs(1),
        ..CheckOptions::new(vec![name], opts.cases, opts.bounds.clone(), opts.report_dir.join(format!("step-{k:02}")))
    };
    let mut run = run_check(&check, std::slice::from_mut(eval), &[kind])?;
    let summary = run.summaries.remove(0);
    if summary.supported == 0 {
        bail!("{}: every one of {} cases was unsupported at e = {e:e}: nothing was checked", opts.implementation, summary.cases);
    }
    let caught = !summary.passed;
    let step = Step { e, caught, cases: summary.supported, failure: summary.failure.map(|f| f.lines().next().unwrap_or("").to_string()) };
    println!(
        "  e = {e:<10.3e} {} ({} cases){}",
        if caught { "caught    " } else { "not caught" },
        step.cases,
        step.failure.as_deref().map(|f| format!(": {}", f.chars().take(120).collect::<String>())).unwrap_or_default()
    );
    Ok(step)
}

/// Bisects e for one (implementation, quantity, scope). Errors: the
/// implementation fails unperturbed (then no e measures the suite).
pub fn measure(eval: &mut Evaluator, opts: &SensitivityOptions) -> Result<Sensitivity> {
    if !QUANTITIES.contains(&opts.quantity.as_str()) {
        bail!("--quantity {}: one of {}", opts.quantity, QUANTITIES.join(", "));
    }
    if !SCOPES.contains(&opts.scope.as_str()) {
        bail!("--scope {}: one of {}", opts.scope, SCOPES.join(", "));
    }
    let kind = eval.worker.load(&opts.implementation)?;
    let needs = match opts.quantity.as_str() {
        "grad" => Some(Kind::Logits),
        "grad_hidden" | "grad_lm_head" => Some(Kind::Fused),
        _ => None,
    };
    if needs.is_some_and(|k| k != kind) {
        bail!("--quantity {}: {} is of the {} kind, which has no {}", opts.quantity, opts.implementation, kind.name(), opts.quantity);
    }
    println!("{} {} over the {}, {} cases a step (seed {})", opts.implementation, opts.quantity, opts.scope, opts.cases, opts.seed);
    let mut steps = Vec::new();
    let unperturbed = check_at(eval, opts, 0.0, 0)?;
    if unperturbed.caught {
        bail!(
            "{} fails with no error added (e = 0): {}; the sensitivity is measured on an implementation that passes",
            opts.implementation,
            unperturbed.failure.unwrap_or_default()
        );
    }
    steps.push(unperturbed);
    let (mut lo, mut hi) = (LOG2_E_MIN, LOG2_E_MAX);
    let top = check_at(eval, opts, hi.exp2(), 1)?;
    let caught_top = top.caught;
    steps.push(top);
    if !caught_top {
        return Ok(result(opts, Some(1.0), None, steps));
    }
    let bottom = check_at(eval, opts, lo.exp2(), 2)?;
    let caught_bottom = bottom.caught;
    steps.push(bottom);
    if caught_bottom {
        return Ok(result(opts, None, Some(lo.exp2()), steps));
    }
    for k in 0..opts.steps {
        let mid = 0.5 * (lo + hi);
        let step = check_at(eval, opts, mid.exp2(), 3 + k as usize)?;
        if step.caught {
            hi = mid;
        } else {
            lo = mid;
        }
        steps.push(step);
    }
    Ok(result(opts, Some(lo.exp2()), Some(hi.exp2()), steps))
}

fn result(opts: &SensitivityOptions, passed_at: Option<f64>, caught_at: Option<f64>, steps: Vec<Step>) -> Sensitivity {
    Sensitivity {
        implementation: opts.implementation.clone(),
        quantity: opts.quantity.clone(),
        scope: opts.scope.clone(),
        cases: opts.cases,
        seed: opts.seed,
        passed_at,
        caught_at,
        steps,
    }
}

/// `grpo-verify sensitivity`: every (quantity, scope) asked, one line each,
/// and report.json. `Ok(true)`: measured (whatever the figures).
pub fn command(quantities: Vec<String>, scopes: Vec<String>, base: SensitivityOptions, timeout: std::time::Duration) -> Result<bool> {
    let mut eval = Evaluator::start(timeout, base.bounds.devices.max(1))?;
    let mut results = Vec::new();
    for quantity in &quantities {
        for scope in &scopes {
            let opts = SensitivityOptions {
                implementation: base.implementation.clone(),
                quantity: quantity.clone(),
                scope: scope.clone(),
                cases: base.cases,
                seed: base.seed,
                bounds: base.bounds.clone(),
                steps: base.steps,
                report_dir: base.report_dir.join(format!("{quantity}-{scope}")),
            };
            let r = measure(&mut eval, &opts)?;
            println!("{}", line(&r));
            results.push(r);
        }
    }
    std::fs::create_dir_all(&base.report_dir)?;
    let path = base.report_dir.join("report.json");
    std::fs::write(&path, serde_json::to_string_pretty(&serde_json::json!({ "worker": eval.worker.hello, "sensitivity": results }))?)?;
    println!("report: {}", path.display());
    Ok(true)
}

fn line(r: &Sensitivity) -> String {
    let what = format!("{} {} over the {}:", r.implementation, r.quantity, r.scope);
    match (r.passed_at, r.caught_at) {
        (Some(p), Some(c)) => format!("{what} caught at e = {c:.2e}, not at {p:.2e} ({} cases a step)", r.cases),
        (Some(_), None) => format!("{what} not caught even at e = 1 ({} cases)", r.cases),
        (None, Some(c)) => format!("{what} caught already at e = {c:.2e}"),
        (None, None) => format!("{what} not measured"),
    }
}
