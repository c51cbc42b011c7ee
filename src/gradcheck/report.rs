//! The gradcheck report: report.md, report.json and the self-contained
//! report.html (`html`), written whole or not at all.

use std::fs;
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::{json, Value};

use crate::evaluate::Outcome;
use crate::gradcheck::cases::FixtureCases;
use crate::gradcheck::fixture::Fixture;
use crate::gradcheck::run::{quantiles, ImplGradcheck};

/// report.json, report.md and report.html in `dir`.
pub fn write_report(
    dir: &Path,
    fixture: &Fixture,
    cases: &FixtureCases,
    results: &[ImplGradcheck],
    command: &str,
    partition: crate::partition::Partition,
) -> Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let case = &cases.fused;
    let valid = case.mask.iter().filter(|&&m| m != 0.0).count();
    let summary = json!({
        "fixture": fixture.dir.display().to_string(),
        "synthetic": fixture.synthetic,
        "model": fixture.manifest["model"],
        "shape": {"batch": case.shape.batch, "time": cases.time, "fixture_time": fixture.time, "hidden": fixture.hidden_dim, "vocab": fixture.vocab},
        "valid_tokens": valid,
        "dtype": case.dtype,
        "config": case.config,
        "hparams": case.hparams,
        "token_block": cases.token_block,
        "command": command,
    });
    let per_impl: Vec<Value> = results
        .iter()
        .map(|r| {
            let mut logp: Vec<f64> = r.tokens.iter().filter_map(|t| t.logp_error).collect();
            let mut grad: Vec<f64> = r.tokens.iter().map(|t| t.grad_row_error).collect();
            json!({
                "implementation": r.implementation,
                "kind": r.kind,
                "outcome": r.result.outcome,
                "reason": r.result.reason,
                "verdicts": r.result.verdicts,
                "seconds": r.seconds,
                "logp_error_p50_p99_max": quantiles(&mut logp),
                "grad_row_error_p50_p99_max": quantiles(&mut grad),
                "tokens": r.tokens,
            })
        })
        .collect();
    let report = json!({
        "tool": format!("grpo-verify {}", env!("CARGO_PKG_VERSION")),
        "report": "gradcheck",
        "partition": partition,
        "passed": results.iter().all(|r| r.passed()),
        "gradcheck": summary,
        "implementations": per_impl,
    });
    fs::write(dir.join("report.json"), serde_json::to_string_pretty(&report)?)?;
    fs::write(dir.join("report.md"), markdown(fixture, cases, results, command))?;
    fs::write(dir.join("report.html"), crate::gradcheck::html::page(fixture, cases, results, command))?;
    Ok(())
}

fn markdown(fixture: &Fixture, cases: &FixtureCases, results: &[ImplGradcheck], command: &str) -> String {
    use std::fmt::Write;
    let case = &cases.fused;
    let mut w = String::new();
    let _ = writeln!(w, "# gradcheck: {}\n", fixture.name());
    let _ = writeln!(
        w,
        "{} fixture: B={} T={} (of {}) H={} V={}, {} valid tokens, {}; {:?}-mode tau={}, {:?}, eps {}/{}, old_logp = the sampler's + noise.\n",
        if fixture.synthetic { "Synthetic" } else { "Model" },
        case.shape.batch,
        cases.time,
        fixture.time,
        fixture.hidden_dim,
        fixture.vocab,
        case.mask.iter().filter(|&&m| m != 0.0).count(),
        case.dtype.name(),
        case.config.temperature_mode,
        case.hparams.temperature as f32,
        case.config.aggregation,
        case.hparams.eps_low,
        case.hparams.eps_high,
    );
    if let Some(tb) = cases.token_block {
        let _ = writeln!(
            w,
            "Run as {} micro-batches of {tb} positions, each a complete case whose loss is its tokens' sum over the whole step's valid-token count \
             (the micro-batches add up to the token-mean step; `suites/sharded.rs` checks that identity). Every implementation and its plain baseline \
             run on each, and each is judged by the rule on its own: the plain baselines do not fit in this machine's memory at T = {}.\n",
            cases.time.div_ceil(tb),
            cases.time
        );
    }
    let _ = writeln!(w, "    {command}\n");
    let _ = writeln!(w, "| implementation | kind | verdict | logp error p50 / p99 / max (nats) | grad row error p50 / p99 / max (relative) | seconds |");
    let _ = writeln!(w, "|---|---|---|---|---|---|");
    for r in results {
        let mut logp: Vec<f64> = r.tokens.iter().filter_map(|t| t.logp_error).collect();
        let mut grad: Vec<f64> = r.tokens.iter().map(|t| t.grad_row_error).collect();
        let (l50, l99, lmax) = quantiles(&mut logp);
        let (g50, g99, gmax) = quantiles(&mut grad);
        let _ = writeln!(
            w,
            "| `{}` | {} | {} | {l50:.2e} / {l99:.2e} / {lmax:.2e} | {g50:.2e} / {g99:.2e} / {gmax:.2e} | {:.1} |",
            r.implementation,
            r.kind,
            match r.result.outcome {
                Outcome::Pass => "PASS",
                Outcome::Fail => "**FAIL**",
                Outcome::Unsupported => "unsupported",
            },
            r.seconds
        );
    }
    for r in results.iter().filter(|r| !r.passed()) {
        let _ = writeln!(w, "\n`{}`: {}", r.implementation, r.result.reason);
    }
    let _ = writeln!(w, "\nThe verdict is the tolerance rule of docs/spec.md (docs/tolerance.md) on every quantity; the error columns are per-token diagnostics (plots in report.html).");
    w
}
