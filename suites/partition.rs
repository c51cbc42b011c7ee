//! Partitioned runs (`--partition K/N`, `merge`; docs/cli.md, "Partitioned
//! runs"): the N parts of a run are disjoint and together hold exactly the
//! whole run's cases, verdicts and coverage, at N = 1, 2 and 3; a part of a
//! failing run fails the merge; parts that are not one run's, and a bad
//! K/N, exit 2.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use libtest_mimic::{Failed, Trial};
use serde_json::Value;

use crate::cli::{expect_exit, grpo_verify, s, scratch};
use crate::common;

fn report(dir: &Path) -> Result<Value, Failed> {
    Ok(serde_json::from_str(&std::fs::read_to_string(dir.join("report.json"))?)?)
}

/// What a check report says of each case: (implementation, group, phase,
/// case seed, outcome) with how often it occurs.
fn cases(report: &Value) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for r in report["records"].as_array().into_iter().flatten() {
        let key = format!("{} {} {} {} {}", r["implementation"], r["group"], r["phase"], r["spec"]["seed"], r["outcome"]);
        *out.entry(key).or_default() += 1;
    }
    out
}

/// What a check report says of each implementation, beside its cases.
fn verdicts(report: &Value) -> Vec<Value> {
    report["implementations"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| {
            let s = &i["summary"];
            let worst: Vec<Value> = i["worst"].as_array().into_iter().flatten().map(|w| serde_json::json!([w["quantity"], w["err"], w["case"], w["compared_on"]])).collect();
            serde_json::json!({
                "implementation": s["implementation"], "passed": s["passed"], "cases": s["cases"], "supported": s["supported"],
                "unsupported": s["unsupported"], "real_cases": s["real_cases"], "signatures": s["signatures"],
                "coverage": s["coverage"], "worst": worst,
            })
        })
        .collect()
}

fn the_parts_of_a_check_run_merge_into_the_whole_run() -> Result<(), Failed> {
    let root = scratch("partition-check");
    let run = |partition: &str, dir: &Path| {
        let args = [
            "check", "--impl", "reference", "--impl", "fused_chunked", "--objective", "all", "--cases", "16", "--seed", "5",
            "--regressions", "none", "--jobs", "1", "--partition", partition, "--report", s(dir),
        ];
        grpo_verify(&args)
    };
    let whole_dir = root.join("whole");
    expect_exit(&run("1/1", &whole_dir), 0, "")?;
    let whole = report(&whole_dir)?;
    if cases(&whole).values().sum::<usize>() < 32 {
        return Err(format!("the whole run checked too few cases to compare: {:?}", cases(&whole)).into());
    }
    for n in 1..=3usize {
        let parts: Vec<PathBuf> = (1..=n).map(|k| root.join(format!("{k}of{n}"))).collect();
        let mut held = 0;
        for (k, dir) in parts.iter().enumerate() {
            expect_exit(&run(&format!("{}/{n}", k + 1), dir), 0, "")?;
            held += cases(&report(dir)?).values().sum::<usize>();
        }
        // Listed out of order: merge orders the parts itself.
        let mut listed: Vec<&str> = parts.iter().rev().map(|p| s(p)).collect();
        let merged_dir = root.join(format!("merged{n}"));
        listed.extend(["--report", s(&merged_dir)]);
        let out = grpo_verify(&[&["merge"], listed.as_slice()].concat());
        expect_exit(&out, 0, "")?;
        let merged = report(&merged_dir)?;
        if held != cases(&whole).values().sum::<usize>() {
            return Err(format!("n = {n}: the parts hold {held} cases, the whole run {}", cases(&whole).values().sum::<usize>()).into());
        }
        if cases(&merged) != cases(&whole) {
            return Err(format!("n = {n}: the merged cases differ from the whole run's:\n{:?}\n{:?}", cases(&merged), cases(&whole)).into());
        }
        if verdicts(&merged) != verdicts(&whole) {
            return Err(format!("n = {n}: the merged verdicts differ from the whole run's:\n{:#}\n{:#}", Value::from(verdicts(&merged)), Value::from(verdicts(&whole))).into());
        }
    }
    Ok(())
}

fn a_failing_part_fails_the_merge_and_bad_parts_exit_2() -> Result<(), Failed> {
    let root = scratch("partition-fail");
    let broken = common::mutant_impl("agg_padding_in_mean");
    let run = |seed: &str, partition: &str, dir: &Path| {
        let args = ["check", "--impl", &broken, "--cases", "24", "--real-cases", "0", "--seed", seed, "--regressions", "none", "--partition", partition, "--report", s(dir)];
        grpo_verify(&args)
    };
    let (p1, p2) = (root.join("1of2"), root.join("2of2"));
    let codes = [run("3", "1/2", &p1).status.code(), run("3", "2/2", &p2).status.code()];
    if !codes.contains(&Some(1)) || codes.iter().any(|c| !matches!(c, Some(0 | 1))) {
        return Err(format!("the parts of a run of a broken implementation exit {codes:?}: one of them should find it").into());
    }
    let merged = root.join("merged");
    expect_exit(&grpo_verify(&["merge", s(&p1), s(&p2), "--report", s(&merged)]), 1, "")?;
    let json = report(&merged)?;
    let summary = &json["implementations"][0]["summary"];
    if json["passed"] != false || !summary["failure"].is_string() || !summary["replay"].is_string() {
        return Err(format!("the merged report does not carry the failure: {summary}").into());
    }
    // Not one run's parts: a part missing, a part twice, another seed. Nothing is written.
    let other_seed = root.join("other-seed");
    let _ = run("4", "2/2", &other_seed);
    let nothing = root.join("nothing");
    for (parts, says) in [
        (vec![&p1], "missing [2/2]"),
        (vec![&p1, &p1], "given twice [1/2]"),
        (vec![&p1, &other_seed], "seed = 4"),
    ] {
        let mut args = vec!["merge"];
        args.extend(parts.iter().map(|p| s(p)));
        args.extend(["--report", s(&nothing)]);
        expect_exit(&grpo_verify(&args), 2, says)?;
        if nothing.join("report.json").exists() {
            return Err("merge left a report behind for parts it refused".into());
        }
    }
    expect_exit(&grpo_verify(&["merge", "/no/such/part", "--report", s(&nothing)]), 2, "/no/such/part")?;
    // A bad K/N is refused before anything runs.
    for bad in ["0/3", "4/3", "1/0", "2"] {
        for command in ["check", "mutants", "invariance", "gradcheck"] {
            expect_exit(&grpo_verify(&[command, "--partition", bad, "--report", s(&nothing)]), 2, "--partition")?;
        }
    }
    Ok(())
}

fn the_parts_of_a_mutants_run_merge_into_the_catalog() -> Result<(), Failed> {
    let root = scratch("partition-mutants");
    let catalog = root.join("catalog");
    std::fs::create_dir_all(&catalog)?;
    let builtin = grpo_verify::mutants::builtin_catalog();
    for name in ["fwd_temperature_multiplied.py", "bwd_mask_ignored.py", "agg_padding_in_mean.py"] {
        std::fs::copy(builtin.join(name), catalog.join(name))?;
    }
    // The bases the mutants build on (files starting with `_` are not mutants).
    for entry in std::fs::read_dir(&builtin)? {
        let name = entry?.file_name();
        if name.to_string_lossy().starts_with('_') && name.to_string_lossy().ends_with(".py") {
            std::fs::copy(builtin.join(&name), catalog.join(&name))?;
        }
    }
    std::fs::write(catalog.join("correct.py"), "\"\"\"Bug: none, a survivor.\"\"\"\nMUTANT_CATEGORY = \"fwd\"\nfrom grpo_kernels.logits.reference import grpo_loss\n")?;
    let (p1, p2) = (root.join("1of2"), root.join("2of2"));
    for (partition, dir) in [("1/2", &p1), ("2/2", &p2)] {
        let out = grpo_verify(&["mutants", "--catalog", s(&catalog), "--cases", "12", "--partition", partition, "--report", s(dir)]);
        if !matches!(out.status.code(), Some(0 | 1)) {
            return Err(format!("mutants --partition {partition} exit {:?}: {}", out.status.code(), String::from_utf8_lossy(&out.stderr)).into());
        }
        if report(dir)?["total"] != 2 {
            return Err(format!("part {partition} of a catalog of 4 holds {} mutants, not 2", report(dir)?["total"]).into());
        }
    }
    let merged = root.join("merged");
    let out = grpo_verify(&["merge", s(&p2), s(&p1), "--report", s(&merged)]);
    expect_exit(&out, 1, "")?;
    let json = report(&merged)?;
    let names: Vec<&str> = json["mutants"].as_array().into_iter().flatten().filter_map(|m| m["name"].as_str()).collect();
    let want = ["agg_padding_in_mean", "bwd_mask_ignored", "correct", "fwd_temperature_multiplied"];
    if names != want || json["caught"] != 3 || json["total"] != 4 {
        return Err(format!("merged mutants {names:?}, {} of {} caught; expected {want:?}, 3 of 4", json["caught"], json["total"]).into());
    }
    if !String::from_utf8_lossy(&out.stdout).contains("SURVIVED correct") {
        return Err(format!("merge does not name the survivor:\n{}", String::from_utf8_lossy(&out.stdout)).into());
    }
    Ok(())
}

/// `invariance` (as `gradcheck`) partitions its implementations: the merged
/// parts list them in the whole run's order, with its measures.
fn the_parts_of_an_invariance_run_merge_into_the_whole_run() -> Result<(), Failed> {
    let root = scratch("partition-invariance");
    let run = |partition: &str, dir: &Path| {
        let args = [
            "invariance", "--impl", "reference", "--impl", "fused_reference", "--impl", "fused_chunked", "--property", "padded", "--cases", "3",
            "--dtype", "f32", "--max-time", "8", "--max-vocab", "64", "--max-hidden", "16", "--partition", partition, "--report", s(dir),
        ];
        grpo_verify(&args)
    };
    let whole = root.join("whole");
    expect_exit(&run("1/1", &whole), 0, "")?;
    let (p1, p2, merged) = (root.join("1of2"), root.join("2of2"), root.join("merged"));
    expect_exit(&run("1/2", &p1), 0, "")?;
    expect_exit(&run("2/2", &p2), 0, "")?;
    expect_exit(&grpo_verify(&["merge", s(&p2), s(&p1), "--report", s(&merged)]), 0, "")?;
    let measures = |r: &Value| -> Vec<Value> {
        r["implementations"].as_array().into_iter().flatten().map(|i| serde_json::json!([i["implementation"], i["measures"], i["variant"]])).collect()
    };
    let (whole, merged) = (report(&whole)?, report(&merged)?);
    if measures(&whole).len() != 3 || measures(&whole) != measures(&merged) {
        return Err(format!("merged {:#}
whole {:#}", Value::from(measures(&merged)), Value::from(measures(&whole))).into());
    }
    Ok(())
}

/// This suite's trials (suites/main.rs runs them with the others).
pub fn trials() -> Vec<Trial> {
    vec![
        crate::common::trial("partition::the_parts_of_a_check_run_merge_into_the_whole_run_at_n_1_2_3", the_parts_of_a_check_run_merge_into_the_whole_run),
        crate::common::trial("partition::a_failing_part_fails_the_merge_and_bad_parts_exit_2", a_failing_part_fails_the_merge_and_bad_parts_exit_2),
        crate::common::trial("partition::the_parts_of_a_mutants_run_merge_into_the_catalog", the_parts_of_a_mutants_run_merge_into_the_catalog),
        crate::common::trial("partition::the_parts_of_an_invariance_run_merge_into_the_whole_run", the_parts_of_an_invariance_run_merge_into_the_whole_run),
    ]
}
