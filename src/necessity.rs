//! `grpo-verify necessity`: is every declared convention needed? For each
//! declaration of an implementation (and each stage of a multi-stage one),
//! the same implementation is checked declaring everything but that
//! (`python/grpo_verify_worker/perturb.py`). A declaration
//! whose removal no case fails is broader than the code, or than what the
//! draws reach: either way a verdict under it is weaker than it reads.

use std::path::PathBuf;

use anyhow::{bail, Result};
use grpo_oracle::{Convention, Declared};
use serde::Serialize;

use crate::case::strategy::Bounds;
use crate::check::{run_check, CheckOptions};
use crate::evaluate::Evaluator;

pub struct NecessityOptions {
    pub implementation: String,
    pub cases: u32,
    pub seed: u64,
    pub bounds: Bounds,
    pub report_dir: PathBuf,
}

#[derive(Serialize)]
pub struct Removal {
    /// What was taken away: a whole declaration, or one stage of it.
    pub removed: String,
    /// The declaration checked instead.
    pub declared: Vec<String>,
    pub needed: bool,
    pub cases: usize,
    /// The first failure without it, and its minimal case.
    pub failure: Option<String>,
    pub minimal_case: Option<String>,
}

/// The loader name of `implementation` declaring `declared` instead of its own.
fn redeclared(implementation: &str, declared: &[String]) -> String {
    crate::sensitivity::perturb_name(&serde_json::json!({"conventions": declared, "impl": implementation}))
}

/// The stage counts a declaration can lose one of.
fn fewer_stages(c: Convention) -> Option<Convention> {
    match c {
        Convention::Bf16Logits { stages } if stages > 1 => Some(Convention::Bf16Logits { stages: stages - 1 }),
        Convention::Bf16GradLogits { stages } if stages > 1 => Some(Convention::Bf16GradLogits { stages: stages - 1 }),
        _ => None,
    }
}

/// Every declaration with one thing taken away: (what, the rest).
fn removals(declared: &[Declared]) -> Vec<(String, Vec<Declared>)> {
    let mut out = Vec::new();
    for (i, d) in declared.iter().enumerate() {
        if let Some(fewer) = fewer_stages(d.convention) {
            let mut rest = declared.to_vec();
            rest[i] = Declared { convention: fewer, ..*d };
            out.push((format!("one stage of `{d}`"), rest));
        }
        let rest = declared.iter().enumerate().filter(|&(j, _)| j != i).map(|(_, d)| *d).collect();
        out.push((format!("`{d}`"), rest));
    }
    out
}

fn check(eval: &mut Evaluator, opts: &NecessityOptions, declared: &[String], k: usize) -> Result<crate::report::ImplSummary> {
    let name = redeclared(&opts.implementation, declared);
    let kind = eval.worker.load(&name)?;
    let check = CheckOptions {
        seed: opts.seed,
        shrink_time: std::time::Duration::from_secs(60),
        ..CheckOptions::new(vec![name], opts.cases, opts.bounds.clone(), opts.report_dir.join(format!("removal-{k:02}")))
    };
    let summary = run_check(&check, std::slice::from_mut(eval), &[kind])?.summaries.remove(0);
    if summary.supported == 0 {
        bail!("{}: every one of {} cases was unsupported: nothing was checked", opts.implementation, summary.cases);
    }
    Ok(summary)
}

/// `Ok(true)`: every declaration and stage was needed by some case.
pub fn command(opts: NecessityOptions, timeout: std::time::Duration) -> Result<bool> {
    let mut eval = Evaluator::start(timeout, opts.bounds.devices.max(1))?;
    eval.worker.load(&opts.implementation)?;
    let declared = eval.worker.conventions(&opts.implementation)?;
    if declared.is_empty() {
        bail!("{} declares no precision conventions: nothing to take away", opts.implementation);
    }
    let names = |d: &[Declared]| d.iter().map(ToString::to_string).collect::<Vec<_>>();
    println!("{} declares {}; {} cases a check (seed {})", opts.implementation, names(&declared).join(", "), opts.cases, opts.seed);
    let whole = check(&mut eval, &opts, &names(&declared), 0)?;
    if !whole.passed {
        bail!(
            "{} fails under its own declarations: {}; necessity is asked of an implementation that passes",
            opts.implementation,
            whole.failure.unwrap_or_default().lines().next().unwrap_or("")
        );
    }
    let mut results = Vec::new();
    for (k, (removed, rest)) in removals(&declared).into_iter().enumerate() {
        let s = check(&mut eval, &opts, &names(&rest), k + 1)?;
        let needed = !s.passed;
        println!(
            "{} {removed}{}",
            if needed { "needed " } else { "BROADER" },
            if needed {
                format!(": without it {} (minimal: {})", s.failure.as_deref().and_then(|f| f.lines().next()).unwrap_or(""), s.minimal_case.as_deref().unwrap_or("?"))
            } else {
                format!(": no case of {} fails without it", s.supported)
            }
        );
        results.push(Removal {
            removed,
            declared: names(&rest),
            needed,
            cases: s.supported,
            failure: s.failure.map(|f| f.lines().next().unwrap_or("").to_string()),
            minimal_case: s.minimal_case,
        });
    }
    std::fs::create_dir_all(&opts.report_dir)?;
    let path = opts.report_dir.join("report.json");
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&serde_json::json!({
            "implementation": opts.implementation, "declared": names(&declared), "cases": opts.cases, "seed": opts.seed,
            "removals": results, "worker": eval.worker.hello,
        }))?,
    )?;
    let broader = results.iter().filter(|r| !r.needed).count();
    println!("{} of {} removals needed; report: {}", results.len() - broader, results.len(), path.display());
    Ok(broader == 0)
}
