//! `grpo-verify merge`: the reports of the N parts of a partitioned run
//! (`--partition K/N`, `partition`) joined into the whole run's report.
//!
//! The parts must be one run's: the same report kind, the same N, every K
//! once, and the same seed, budget and implementations (or catalog). A
//! `check` report is joined record by record: each implementation's counts
//! are the sums of its parts', its verdict passes when every part's does,
//! its coverage is computed again from every part's cases (a value a part
//! missed and another exercised is exercised), and its failure, when it
//! has one, is that of the part whose failing group comes first. A
//! `mutants` report is the parts' mutants in catalog order, a `gradcheck`
//! or `invariance` report the parts' implementations in the order the
//! whole run lists them. Exit 0 when
//! the whole run passes, 1 when it fails, 2 when the parts are not one
//! run's (nothing is written then).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::case::objective::Objective;
use crate::case::plan::Space;
use crate::case::{CaseSpec, Dtype};
use crate::coverage::{coverage, CaseEdges};
use crate::partition::Partition;
use crate::report::write_atomic;

/// One part's report.json, read.
struct Part {
    path: PathBuf,
    partition: Partition,
    report: Value,
}

/// Reads `path` (a report directory or its report.json).
fn read_part(path: &Path) -> Result<Part> {
    let file = if path.is_dir() { path.join("report.json") } else { path.to_path_buf() };
    let text = std::fs::read_to_string(&file).with_context(|| format!("{}: cannot read the part's report", file.display()))?;
    let report: Value = serde_json::from_str(&text).with_context(|| format!("{}: not a JSON report", file.display()))?;
    let partition: Partition = serde_json::from_value(report["partition"].clone())
        .with_context(|| format!("{}: no \"partition\" (a report of a run without --partition, or of an older grpo-verify)", file.display()))?;
    Ok(Part { path: file, partition, report })
}

/// The fields every part of one run agrees on, by report kind (JSON pointers).
fn run_identity(kind: &str) -> &'static [&'static str] {
    match kind {
        "check" => &["/seed", "/cases", "/real_cases", "/objective", "/dtypes", "/draws_per_signature"],
        "mutants" => &["/seed", "/cases", "/catalog", "/bounds"],
        "gradcheck" => &["/gradcheck/fixture", "/gradcheck/shape", "/gradcheck/dtype", "/gradcheck/config", "/gradcheck/hparams", "/gradcheck/token_block"],
        "invariance" => &["/seed", "/cases", "/max_ulps", "/properties"],
        _ => &[],
    }
}

/// `grpo-verify merge PART... --report DIR`: the whole run's report in
/// `out`; `Ok(false)` when the whole run fails.
pub fn command(paths: &[PathBuf], out: &Path) -> Result<bool> {
    let parts = paths.iter().map(|p| read_part(p)).collect::<Result<Vec<_>>>()?;
    let parts = one_run(parts)?;
    let kind = parts[0].report["report"].as_str().unwrap_or_default().to_string();
    let (report, markdown, lines) = match kind.as_str() {
        "check" => merge_check(&parts)?,
        "mutants" => merge_mutants(&parts),
        "gradcheck" | "invariance" => merge_per_implementation(&parts, &kind),
        other => bail!("{}: merge joins check, mutants, gradcheck and invariance reports, not {other:?}", parts[0].path.display()),
    };
    std::fs::create_dir_all(out).with_context(|| format!("creating report directory {}", out.display()))?;
    write_atomic(&out.join("report.json"), &serde_json::to_string_pretty(&report)?)?;
    write_atomic(&out.join("report.md"), &markdown)?;
    for line in lines {
        println!("{line}");
    }
    println!("report: {}", out.join("report.md").display());
    Ok(report["passed"].as_bool().unwrap_or(false))
}

/// The parts in order of K, refused unless they are the N parts of one run.
fn one_run(mut parts: Vec<Part>) -> Result<Vec<Part>> {
    let Some(first) = parts.first() else { bail!("merge: no parts given") };
    let (n, kind) = (first.partition.n, first.report["report"].clone());
    for part in &parts {
        if part.report["report"] != kind {
            bail!("{}: a {} report, but {} is a {} report", part.path.display(), part.report["report"], first.path.display(), kind);
        }
        if part.partition.n != n {
            bail!("{}: part {} but {} is part {}: not one run's parts", part.path.display(), part.partition, first.path.display(), first.partition);
        }
        for pointer in run_identity(kind.as_str().unwrap_or_default()) {
            let (here, there) = (part.report.pointer(pointer), first.report.pointer(pointer));
            if here != there {
                let field = pointer.trim_start_matches('/').replace('/', ".");
                let show = |v: Option<&Value>| v.map_or("nothing".to_string(), Value::to_string);
                bail!("{}: {field} = {} but {} has {}: not one run's parts", part.path.display(), show(here), first.path.display(), show(there));
            }
        }
    }
    parts.sort_by_key(|p| p.partition.k);
    let held: Vec<usize> = parts.iter().map(|p| p.partition.k).collect();
    let want: Vec<usize> = (1..=n).collect();
    if held != want {
        let missing: Vec<String> = want.iter().filter(|k| !held.contains(k)).map(|k| format!("{k}/{n}")).collect();
        let twice: Vec<String> = want.iter().filter(|k| held.iter().filter(|h| h == k).count() > 1).map(|k| format!("{k}/{n}")).collect();
        bail!("the parts of a {n}-part run are each needed once: missing [{}], given twice [{}]", missing.join(", "), twice.join(", "));
    }
    Ok(parts)
}

/// A part's records of implementation `name`.
fn records_of<'a>(part: &'a Part, name: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    part.report["records"].as_array().into_iter().flatten().filter(move |r| r["implementation"] == name)
}

/// The first group of a part in which implementation `name` failed.
fn first_failing_group(part: &Part, name: &str) -> Option<u64> {
    records_of(part, name).filter(|r| r["outcome"] == "fail" && r["phase"] != "shrink").filter_map(|r| r["group"].as_u64()).min()
}

type Merged = (Value, String, Vec<String>);

fn merge_check(parts: &[Part]) -> Result<Merged> {
    let first = &parts[0].report;
    let objective: Objective = serde_json::from_value(first["objective"].clone()).context("the parts' \"objective\"")?;
    let dtypes: Vec<Dtype> = serde_json::from_value(first["dtypes"].clone()).context("the parts' \"dtypes\"")?;
    let space = Space::new(&objective, &dtypes);
    let names: Vec<String> = first["implementations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["summary"]["implementation"].as_str().map(String::from))
        .collect();
    let mut implementations = Vec::new();
    let mut records = Vec::new();
    let mut lines = Vec::new();
    for name in &names {
        let summaries: Vec<&Value> = parts
            .iter()
            .map(|p| {
                p.report["implementations"].as_array().into_iter().flatten().find(|i| i["summary"]["implementation"] == name.as_str()).map(|i| &i["summary"])
            })
            .collect::<Option<_>>()
            .with_context(|| format!("{name}: not in every part's report"))?;
        let mut summary = summaries[0].clone();
        for field in ["cases", "supported", "unsupported", "real_cases", "signatures", "cases_under_conventions", "shrink_steps"] {
            summary[field] = json!(summaries.iter().map(|s| s[field].as_u64().unwrap_or(0)).sum::<u64>());
        }
        summary["seconds"] = json!(summaries.iter().map(|s| s["seconds"].as_f64().unwrap_or(0.0)).sum::<f64>());
        summary["passed"] = json!(summaries.iter().all(|s| s["passed"] == true));
        // The failure reported is that of the first failing group.
        let failing = parts.iter().zip(&summaries).filter(|(_, s)| s["passed"] == false).min_by_key(|(p, _)| first_failing_group(p, name).unwrap_or(u64::MAX));
        if let Some((_, failed)) = failing {
            for field in ["failure", "minimal_case", "replay", "repro", "note", "discrepancies"] {
                if !failed[field].is_null() {
                    summary[field] = failed[field].clone();
                }
            }
        }
        let mine: Vec<Value> = parts
            .iter()
            .flat_map(|p| records_of(p, name).map(move |r| (p.partition.k, r)))
            .map(|(k, r)| {
                let mut r = r.clone();
                r["part"] = json!(k);
                r
            })
            .collect();
        // A built-in's declared refusals, as the parts' coverage lists them.
        let declared: Vec<(String, Value)> = summaries
            .iter()
            .flat_map(|s| s["coverage"]["values_refused_as_declared"].as_array().into_iter().flatten())
            .filter_map(|v| v.as_str()?.split_once('='))
            .map(|(switch, value)| (switch.to_string(), serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.to_string()))))
            .collect();
        summary["coverage"] = serde_json::to_value(coverage_of(&space, &mine, &declared)?)?;
        let worst = worst_of(parts, name);
        lines.push(format!(
            "{} {name:<24} {} cases ({} unsupported) in {} parts; coverage: switch values {}/{}, pairs {}/{}",
            if summary["passed"] == true { "PASS" } else { "FAIL" },
            summary["supported"],
            summary["unsupported"],
            parts.len(),
            summary["coverage"]["values_exercised"],
            summary["coverage"]["values_required"],
            summary["coverage"]["pairs_exercised"],
            summary["coverage"]["pairs_required"],
        ));
        if let Some(failure) = summary["failure"].as_str() {
            lines.push(format!("     what: {failure}"));
        }
        implementations.push(json!({"summary": summary, "worst": worst}));
        records.extend(mine);
    }
    let passed = implementations.iter().all(|i| i["summary"]["passed"] == true);
    let checked: u64 = implementations.iter().map(|i| i["summary"]["supported"].as_u64().unwrap_or(0)).sum();
    let mut report = first.clone();
    report["partition"] = json!(Partition::WHOLE);
    report["parts"] = json!(parts.iter().map(|p| json!({"path": p.path, "partition": p.partition, "command": p.report["command"], "seconds": p.report["seconds"]})).collect::<Vec<_>>());
    report["command"] = json!(std::env::args().collect::<Vec<_>>().join(" "));
    report["passed"] = json!(passed);
    report["checked"] = json!(checked);
    report["seconds"] = json!(parts.iter().map(|p| p.report["seconds"].as_f64().unwrap_or(0.0)).sum::<f64>());
    report["implementations"] = json!(implementations);
    report["records"] = json!(records);
    let markdown = markdown(&report, "check", &lines);
    Ok((report, markdown, lines))
}

/// An implementation's coverage over the records of every part, as
/// `check` computes it over its own.
fn coverage_of(space: &Space, records: &[Value], declared: &[(String, Value)]) -> Result<crate::coverage::Coverage> {
    let mut checked: Vec<(CaseSpec, CaseEdges)> = Vec::new();
    let mut refused: Vec<(CaseSpec, Option<String>, String)> = Vec::new();
    for r in records.iter().filter(|r| r["phase"] != "shrink") {
        let spec: CaseSpec = serde_json::from_value(r["spec"].clone()).context("a record's spec")?;
        if r["outcome"] == "unsupported" {
            refused.push((spec, r["refused_switch"].as_str().map(String::from), r["reason"].as_str().unwrap_or_default().to_string()));
        } else if !r["edges"].is_null() {
            checked.push((spec, serde_json::from_value(r["edges"].clone()).context("a record's edges")?));
        }
    }
    let checked: Vec<(&CaseSpec, &CaseEdges)> = checked.iter().map(|(s, e)| (s, e)).collect();
    let refused: Vec<(&CaseSpec, Option<&str>, &str)> = refused.iter().map(|(s, w, r)| (s, w.as_deref(), r.as_str())).collect();
    Ok(coverage(space, &checked, &refused, declared))
}

/// The worst error of each quantity over the parts (`compared_on`: the
/// cases compared on it, summed; `part`: the part whose case it was, whose
/// records `case_index` counts).
fn worst_of(parts: &[Part], name: &str) -> Vec<Value> {
    // In the order the parts list them (`check`'s order of quantities).
    let mut worst: Vec<Value> = Vec::new();
    for part in parts {
        let Some(entry) = part.report["implementations"].as_array().into_iter().flatten().find(|i| i["summary"]["implementation"] == name) else { continue };
        for w in entry["worst"].as_array().into_iter().flatten() {
            let compared = w["compared_on"].as_u64().unwrap_or(0);
            let mut w = w.clone();
            w["part"] = json!(part.partition.k);
            match worst.iter_mut().find(|kept| kept["quantity"] == w["quantity"]) {
                Some(kept) => {
                    let total = kept["compared_on"].as_u64().unwrap_or(0) + compared;
                    if w["err"].as_f64().unwrap_or(0.0) > kept["err"].as_f64().unwrap_or(0.0) {
                        *kept = w;
                    }
                    kept["compared_on"] = json!(total);
                }
                None => worst.push(w),
            }
        }
    }
    worst
}

fn merge_mutants(parts: &[Part]) -> Merged {
    let mutants = interleaved(parts, "mutants");
    let caught = mutants.iter().filter(|m| m["caught"] == true).count();
    let mut lines: Vec<String> = mutants.iter().filter(|m| m["caught"] != true).map(|m| format!("SURVIVED {}", m["name"].as_str().unwrap_or("?"))).collect();
    lines.push(format!("{caught} of {} mutants caught, in {} parts", mutants.len(), parts.len()));
    let mut report = parts[0].report.clone();
    report["partition"] = json!(Partition::WHOLE);
    report["parts"] = json!(parts.iter().map(|p| json!({"path": p.path, "partition": p.partition, "command": p.report["command"]})).collect::<Vec<_>>());
    report["command"] = json!(std::env::args().collect::<Vec<_>>().join(" "));
    report["caught"] = json!(caught);
    report["total"] = json!(mutants.len());
    report["passed"] = json!(caught == mutants.len());
    report["seconds"] = json!(parts.iter().map(|p| p.report["seconds"].as_f64().unwrap_or(0.0)).sum::<f64>());
    report["mutants"] = json!(mutants);
    let markdown = markdown(&report, "mutants", &lines);
    (report, markdown, lines)
}

/// The units of the parts in the whole run's order: unit i of the whole
/// is unit i / N of part i % N + 1 (`Partition::holds`).
fn interleaved(parts: &[Part], field: &str) -> Vec<Value> {
    let lists: Vec<Vec<Value>> = parts.iter().map(|p| p.report[field].as_array().cloned().unwrap_or_default()).collect();
    let longest = lists.iter().map(Vec::len).max().unwrap_or(0);
    (0..longest).flat_map(|i| lists.iter().filter_map(move |l| l.get(i).cloned())).collect()
}

/// `gradcheck` and `invariance`, whose parts hold implementations: the
/// whole run's list of them, passing when every part's does.
fn merge_per_implementation(parts: &[Part], kind: &str) -> Merged {
    let implementations = interleaved(parts, "implementations");
    let passed = parts.iter().all(|p| p.report["passed"] == true);
    let lines: Vec<String> = parts
        .iter()
        .map(|p| {
            let names: Vec<&str> = p.report["implementations"].as_array().into_iter().flatten().filter_map(|i| i["implementation"].as_str()).collect();
            format!("{} part {}: {}", if p.report["passed"] == true { "PASS" } else { "FAIL" }, p.partition, names.join(", "))
        })
        .collect();
    let mut report = parts[0].report.clone();
    report["partition"] = json!(Partition::WHOLE);
    report["parts"] = json!(parts.iter().map(|p| json!({"path": p.path, "partition": p.partition, "command": p.report["command"]})).collect::<Vec<_>>());
    report["command"] = json!(std::env::args().collect::<Vec<_>>().join(" "));
    report["passed"] = json!(passed);
    report["implementations"] = json!(implementations);
    let markdown = markdown(&report, kind, &lines);
    (report, markdown, lines)
}

/// report.md of a merged run: the verdict lines and the parts it came from
/// (each part's own report.md has the detail).
fn markdown(report: &Value, kind: &str, lines: &[String]) -> String {
    let mut md = String::new();
    let verdict = if report["passed"] == true { "PASS" } else { "FAIL" };
    let _ = writeln!(md, "# grpo-verify {kind}, merged from its parts: {verdict}\n");
    let _ = writeln!(md, "`{}`\n", report["command"].as_str().unwrap_or_default());
    let _ = writeln!(md, "```");
    for line in lines {
        let _ = writeln!(md, "{line}");
    }
    let _ = writeln!(md, "```\n");
    let _ = writeln!(md, "| part | report | command |");
    let _ = writeln!(md, "|---|---|---|");
    for part in report["parts"].as_array().into_iter().flatten() {
        let partition: Option<Partition> = serde_json::from_value(part["partition"].clone()).ok();
        let _ = writeln!(
            md,
            "| {} | `{}` | `{}` |",
            partition.map_or("?".into(), |p| p.to_string()),
            part["path"].as_str().unwrap_or_default(),
            part["command"].as_str().unwrap_or_default()
        );
    }
    md
}
