//! `grpo-verify tightness`: how loose are the declared conventions'
//! allowances? One check of an implementation under its own declarations;
//! on every generated case that passed with a convention in force, each
//! quantity's allowance over the error it had to admit: at the element that
//! used the most of its allowance, allowance / |impl - oracle|. A ratio
//! near 1 is an allowance the code needs all of; 100 is one a bug a hundred
//! times the rounding could hide in (docs/conventions.md, "How tight the
//! allowances are").

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Result};
use serde::Serialize;

use crate::case::strategy::Bounds;
use crate::check::{run_check, CheckOptions};
use crate::compare::Quantity;
use crate::evaluate::{Evaluator, Outcome};
use crate::report::{CaseRecord, Phase};

/// What one `tightness` run measures (docs/conventions.md, "How tight the allowances are").
pub struct TightnessOptions {
    /// The implementation whose declared allowances are measured.
    pub implementation: String,
    /// Generated cases measured.
    pub cases: u32,
    /// The run's seed.
    pub seed: u64,
    /// Shapes, dtypes and objective drawn.
    pub bounds: Bounds,
    /// Where report.json and report.md go.
    pub report_dir: PathBuf,
}

/// One quantity under one set of conventions in force.
#[derive(Debug, Serialize, PartialEq)]
pub struct Row {
    /// The conventions that held on these cases (as the report's per-case `conventions`).
    pub conventions: String,
    /// The quantity measured.
    pub quantity: Quantity,
    /// Passing cases where an element of the quantity had an allowance.
    pub cases: usize,
    /// Of those, the cases where no element's error went past f32 noise
    /// (the rule's floor): they say nothing of the allowance and are left
    /// out of the figures below.
    pub noise_only: usize,
    /// allowance / observed error over the other cases.
    pub median: f64,
    /// The 99th percentile of allowance / observed error over the same cases.
    pub p99: f64,
    /// The largest allowance / observed error over them (the loosest case).
    pub max: f64,
    /// The tightest case: below 1 the error went past the allowance and the
    /// rule's f32 bound admitted the rest.
    pub min: f64,
}

/// The q-quantile (nearest rank) of sorted values.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// The table of one implementation's passing generated cases.
pub fn table(records: &[CaseRecord]) -> Vec<Row> {
    let mut ratios: BTreeMap<(String, String), (Quantity, Vec<f64>)> = BTreeMap::new();
    let passing = records.iter().filter(|r| r.phase == Phase::Generated && r.result.outcome == Outcome::Pass);
    for r in passing.filter(|r| !r.result.conventions.is_empty()) {
        for v in &r.result.verdicts {
            let Some(used) = v.allowance_used else { continue };
            // f64::INFINITY: only f32 noise (counted, left out of the figures).
            let ratio = if used > 0.0 { 1.0 / used } else { f64::INFINITY };
            ratios.entry((r.result.conventions.join(", "), v.quantity.name().to_string())).or_insert((v.quantity, Vec::new())).1.push(ratio);
        }
    }
    ratios
        .into_iter()
        .filter_map(|((conventions, _), (quantity, mut values))| {
            let cases = values.len();
            values.retain(|r| r.is_finite());
            values.sort_by(f64::total_cmp);
            (!values.is_empty()).then(|| Row {
                conventions,
                quantity,
                cases,
                noise_only: cases - values.len(),
                median: quantile(&values, 0.5),
                p99: quantile(&values, 0.99),
                max: *values.last().expect("a row has a case"),
                min: values[0],
            })
        })
        .collect()
}

fn figure(x: f64) -> String {
    if x >= 1e4 {
        format!("{x:.1e}")
    } else if x >= 100.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.2}")
    }
}

/// The table as markdown.
pub fn markdown(rows: &[Row]) -> String {
    let mut out = String::from("| conventions in force | quantity | cases (f32 noise only) | median | p99 | max | min |\n|---|---|---|---|---|---|---|\n");
    for r in rows {
        out += &format!(
            "| {} | {} | {} ({}) | {} | {} | {} | {} |\n",
            r.conventions,
            r.quantity.spoken(),
            r.cases,
            r.noise_only,
            figure(r.median),
            figure(r.p99),
            figure(r.max),
            figure(r.min)
        );
    }
    out
}

/// `grpo-verify tightness`: measures, writes the report, prints the table.
pub fn command(opts: TightnessOptions, timeout: std::time::Duration) -> Result<()> {
    let mut eval = Evaluator::start(timeout, opts.bounds.devices.max(1))?;
    let kind = eval.worker.load(&opts.implementation)?;
    let declared = eval.worker.conventions(&opts.implementation)?;
    if declared.is_empty() {
        bail!("{} declares no precision conventions: it is judged by SPEC's contract alone, with no allowance to measure", opts.implementation);
    }
    let check = CheckOptions {
        seed: opts.seed,
        shrink_time: std::time::Duration::from_secs(60),
        ..CheckOptions::new(vec![opts.implementation.clone()], opts.cases, opts.bounds.clone(), opts.report_dir.join("check"))
    };
    let run = run_check(&check, std::slice::from_mut(&mut eval), &[kind])?;
    let summary = &run.summaries[0];
    if summary.supported == 0 {
        bail!("{}: every one of {} cases was unsupported: nothing was checked", opts.implementation, summary.cases);
    }
    if !summary.passed {
        println!(
            "note: {} fails a case under its declarations ({}); the table is of the cases that passed",
            opts.implementation,
            summary.failure.as_deref().and_then(|f| f.lines().next()).unwrap_or("")
        );
    }
    let rows = table(&run.records);
    if rows.is_empty() {
        bail!("{}: no passing case had a declared convention in force (bf16 draws are where they apply: --dtype bf16)", opts.implementation);
    }
    let text = markdown(&rows);
    println!(
        "{} declares {}; {} cases (seed {}). Allowance / observed error, per passing case at its tightest element:\n\n{text}",
        opts.implementation,
        declared.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
        summary.supported,
        opts.seed
    );
    std::fs::create_dir_all(&opts.report_dir)?;
    let path = opts.report_dir.join("tightness.json");
    crate::report::write_atomic(
        &path,
        &serde_json::to_string_pretty(&serde_json::json!({
            "implementation": opts.implementation, "cases": opts.cases, "seed": opts.seed, "rows": rows,
        }))?,
    )?;
    println!("report: {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=200).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 100.0);
        assert_eq!(quantile(&v, 0.99), 198.0);
        assert_eq!(quantile(&[3.0], 0.99), 3.0);
    }
}
