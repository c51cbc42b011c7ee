//! The binary's contract (docs/cli.md): exit codes 0 / 1 / 2, the
//! report files, repro + replay, regression persistence, and clear errors
//! naming bad input.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use libtest_mimic::{Failed, Trial};
use serde_json::Value;

pub(crate) fn grpo_verify(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_grpo-verify")).args(args).current_dir(common::repo()).output().expect("runs")
}

pub(crate) fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("grpo-verify-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

pub(crate) fn expect_exit(out: &Output, code: i32, stderr_has: &str) -> Result<(), Failed> {
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() != Some(code) || !stderr.contains(stderr_has) {
        return Err(format!(
            "expected exit {code} with {stderr_has:?} on stderr; got {:?}\nstdout: {}\nstderr: {stderr}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout)
        )
        .into());
    }
    Ok(())
}

pub(crate) fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn passing_check_writes_reports() -> Result<(), Failed> {
    let dir = scratch("pass");
    // The main job's defaults: 8 generated cases, then real-model ones (one in
    // eight of --cases, at least 4) from the committed real fixtures.
    let out = grpo_verify(&["check", "--impl", "reference", "--cases", "8", "--report", s(&dir), "--regressions", "none"]);
    expect_exit(&out, 0, "")?;
    let md = std::fs::read_to_string(dir.join("report.md"))?;
    for want in ["PASS", "| loss |", "| grad |", "its bound"] {
        if !md.contains(want) {
            return Err(format!("report.md lacks {want:?}:\n{md}").into());
        }
    }
    let json: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("report.json"))?)?;
    let records = json["records"].as_array().ok_or("no records")?;
    if records.len() != 12 || records.iter().any(|r| r["verdicts"].as_array().map_or(true, |v| v.is_empty())) {
        return Err(format!("report.json should hold 8 + 4 cases with verdicts, has {}", records.len()).into());
    }
    let real = records.iter().filter(|r| r["spec"]["real"] == true && r["summary"].as_str().is_some_and(|s| s.contains(" real("))).count();
    if real != 4 || records[..8].iter().any(|r| r["spec"]["real"] == true) {
        return Err(format!("the last 4 of the 12 cases should be real-model ones; {real} are").into());
    }
    Ok(())
}

/// `invariance`: a kernel whose vocabulary chunk follows B * T is
/// variant under padding, shrunk to a repro whose replay shows it again,
/// while the reference is bitwise there; bad input exits 2 naming it.
fn invariance_catches_a_variant_kernel_and_names_bad_input() -> Result<(), Failed> {
    let variant = common::fixture_impl("invariance/chunk_from_batch.py");
    let run = |implementation: &str, dir: &Path| {
        grpo_verify(&["invariance", "--impl", implementation, "--property", "padded", "--cases", "8", "--dtype", "f32", "--report", s(dir)])
    };
    let dir = scratch("invariance-variant");
    let out = run(&variant, &dir);
    expect_exit(&out, 1, "")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !stdout.contains("VARIANT") || !stdout.contains("padded variant") {
        return Err(format!("the chunked kernel should be variant under padded:\n{stdout}").into());
    }
    let repro = std::fs::read_dir(dir.join("repro"))?.next().ok_or("no repro written")??.path();
    let replay = grpo_verify(&["replay", s(&repro)]);
    expect_exit(&replay, 1, "")?;
    if !String::from_utf8_lossy(&replay.stdout).contains("VARIANT") {
        return Err(format!("replay should show the variance again:\n{}", String::from_utf8_lossy(&replay.stdout)).into());
    }
    expect_exit(&run("reference", &scratch("invariance-reference")), 0, "")?;
    // Bad input: a batch of one, a property that does not exist, a kernel that refuses the split.
    let tiny = ["--cases", "2", "--dtype", "f32", "--max-time", "4", "--max-vocab", "16"];
    expect_exit(&grpo_verify(&[&["invariance", "--impl", "reference", "--max-batch", "1"][..], &tiny[..]].concat()), 2, "needs two rows")?;
    expect_exit(&grpo_verify(&[&["invariance", "--impl", "reference", "--property", "sideways"][..], &tiny[..]].concat()), 2, "--property")?;
    let refuses = common::fixture_impl("invariance/refuses_a_batch_of_one.py");
    let dir = scratch("invariance-refuses");
    let out = grpo_verify(&[&["invariance", "--impl", &refuses, "--property", "alone", "--report", s(&dir)][..], &tiny[..]].concat());
    expect_exit(&out, 2, "refused")?;
    if !std::fs::read_to_string(dir.join("report.md"))?.contains("Not measured") {
        return Err("report.md should say the property was not measured".into());
    }
    Ok(())
}

fn failing_check_writes_repro_and_replay_reproduces() -> Result<(), Failed> {
    let dir = scratch("fail");
    let regressions = scratch("regressions");
    let broken = common::mutant_impl("agg_padding_in_mean");
    let run = |seed: &str, report: &Path| {
        grpo_verify(&["check", "--impl", &broken, "--cases", "40", "--real-cases", "0", "--seed", seed, "--report", s(report), "--regressions", s(&regressions)])
    };
    let out = run("3", &dir);
    expect_exit(&out, 1, "")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let replay_line = stdout.lines().find(|l| l.contains("replay: ")).ok_or(format!("no replay line in:\n{stdout}"))?;
    let repro = replay_line.split_whitespace().last().unwrap().to_string();
    // The report's verdict, read from its fields: a "FAIL" anywhere in
    // report.md could be any implementation's, or a case's name.
    let json: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("report.json"))?)?;
    let summary = &json["implementations"][0]["summary"];
    if json["passed"] != false || summary["passed"] != false || summary["implementation"] != broken.as_str() || !summary["failure"].is_string() {
        return Err(format!("report.json does not give {broken} as failed: passed {}, its summary {summary}", json["passed"]).into());
    }
    expect_exit(&grpo_verify(&["replay", &repro]), 1, "")?;
    // The same case passes on the reference: the repro isolates the bug.
    expect_exit(&grpo_verify(&["replay", &repro, "--impl", "reference"]), 0, "")?;
    // Persisted: a run with another seed tries the saved failure first.
    let second = scratch("fail-again");
    expect_exit(&run("99", &second), 1, "")?;
    let json: Value = serde_json::from_str(&std::fs::read_to_string(second.join("report.json"))?)?;
    if json["records"][0]["outcome"] != "fail" {
        return Err("the persisted failure was not tried first".into());
    }
    // A remembered-failures file that no longer parses is named, exit 2,
    // and left as it was (ignored, the next failure would overwrite it).
    let file = std::fs::read_dir(&regressions)?.next().ok_or("no regressions file written")??.path();
    std::fs::write(&file, "[{\"not\": \"a case\"}]")?;
    let out = run("5", &scratch("fail-unreadable"));
    expect_exit(&out, 2, &file.display().to_string())?;
    if std::fs::read_to_string(&file)? != "[{\"not\": \"a case\"}]" {
        return Err(format!("{} was rewritten", file.display()).into());
    }
    Ok(())
}

/// `check --keep-going` on a kernel with two independent bugs (the KL's sign
/// with `kl` on, delta ignored with `two_sided` on) reports both, each with
/// its own minimal repro that fails again on replay with the other bug's
/// switch off, and remembers each; a later --keep-going run replays the
/// remembered ones and goes on. Plain `check` reports exactly one.
fn keep_going_reports_every_distinct_discrepancy() -> Result<(), Failed> {
    let fixture = common::fixture_impl("discrepancies/kl_sign_and_delta.py");
    let tiny = ["--max-batch", "2", "--max-time", "4", "--max-vocab", "16", "--cases", "24"];
    let (dir, remembered) = (scratch("keep-going"), scratch("keep-going-regressions"));
    let check = |extra: &[&str], report: &Path, regressions: &str| {
        grpo_verify(&[&["check", "--impl", &fixture, "--real-cases", "0", "--report", s(report), "--regressions", regressions][..], &tiny[..], extra].concat())
    };
    let out = check(&["--keep-going", "--seed", "1"], &dir, s(&remembered));
    expect_exit(&out, 1, "")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary = |report: &Path| -> Result<Value, Failed> {
        let json: Value = serde_json::from_str(&std::fs::read_to_string(report.join("report.json"))?)?;
        Ok(json["implementations"][0]["summary"].clone())
    };
    let distinct = summary(&dir)?["discrepancies"]["distinct"].as_array().cloned().ok_or("no discrepancies in report.json")?;
    let md = std::fs::read_to_string(dir.join("report.md"))?;
    // Each discrepancy is one of the two bugs: its switch on, the other's off.
    let mut found = Vec::new();
    for (n, d) in distinct.iter().enumerate() {
        let switches: Vec<&str> = d["key"]["switches"].as_array().ok_or("no switches")?.iter().filter_map(Value::as_str).collect();
        let bug = match (switches.contains(&"kl=true"), switches.contains(&"two_sided=true")) {
            (true, false) => "kl",
            (false, true) => "two_sided",
            _ => return Err(format!("discrepancy {} should need exactly one of kl, two_sided: {switches:?}", n + 1).into()),
        };
        found.push(bug);
        let repro = d["repro"].as_str().ok_or("no repro path")?;
        let want_name = if n == 0 { "discrepancies_kl_sign_and_delta_py_grpo_loss.json".to_string() } else { format!("discrepancies_kl_sign_and_delta_py_grpo_loss-{}.json", n + 1) };
        if !repro.ends_with(&format!("/repro/{want_name}")) {
            return Err(format!("discrepancy {} has repro {repro}, expected repro/{want_name}", n + 1).into());
        }
        let case: Value = serde_json::from_str(&std::fs::read_to_string(repro)?)?;
        let other = if bug == "kl" { "two_sided" } else { "kl" };
        if case["case"]["config"][bug] != true || case["case"]["config"][other] != false {
            return Err(format!("{repro}: {bug} should be on and {other} off: {}", case["case"]["config"]).into());
        }
        expect_exit(&grpo_verify(&["replay", repro]), 1, "")?;
        let label = d["label"].as_str().unwrap_or("?");
        if !md.contains(label) || !md.contains(repro) || !stdout.contains(&format!("replay: cargo run --release -- replay {repro}")) {
            return Err(format!("report.md or the summary lacks discrepancy {label:?} with {repro}:\n{stdout}\n{md}").into());
        }
    }
    if !(found.contains(&"kl") && found.contains(&"two_sided")) {
        return Err(format!("both bugs should be reported, found {found:?}:\n{stdout}").into());
    }
    // Every distinct discrepancy's minimal case is remembered.
    let file = std::fs::read_dir(&remembered)?.next().ok_or("nothing remembered")??.path();
    let specs: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(&file)?)?;
    if specs.len() != distinct.len() {
        return Err(format!("{} remembered cases for {} discrepancies", specs.len(), distinct.len()).into());
    }
    // Without --keep-going: exactly one failure, the report as before.
    let plain = scratch("keep-going-plain");
    let out = check(&["--seed", "1"], &plain, "none");
    expect_exit(&out, 1, "")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if stdout.matches("replay: ").count() != 1 || summary(&plain)?.get("discrepancies").is_some() || std::fs::read_dir(plain.join("repro"))?.count() != 1 {
        return Err(format!("plain check should report exactly one failure and one repro:\n{stdout}").into());
    }
    // Remembered failures replay first and do not end a --keep-going run.
    let again = scratch("keep-going-again");
    expect_exit(&check(&["--keep-going", "--seed", "2"], &again, s(&remembered)), 1, "")?;
    let json: Value = serde_json::from_str(&std::fs::read_to_string(again.join("report.json"))?)?;
    let records = json["records"].as_array().ok_or("no records")?;
    let replayed = records.iter().take_while(|r| r["phase"] == "regression").filter(|r| r["outcome"] == "fail").count();
    let generated = records.iter().filter(|r| r["phase"] == "generated").count();
    let remembered_count: u64 = json["implementations"][0]["summary"]["discrepancies"]["distinct"]
        .as_array()
        .ok_or("no discrepancies")?
        .iter()
        .filter_map(|d| d["remembered"].as_u64())
        .sum();
    if replayed != specs.len() || generated == 0 || remembered_count != specs.len() as u64 {
        return Err(format!("{replayed} remembered failures replayed first, {generated} generated cases after them, {remembered_count} counted; expected {} and some", specs.len()).into());
    }
    Ok(())
}

/// A repro file edited into bad input: exit 2 with a message naming it.
fn bad_repro(name: &'static str, edit: fn(&mut Value), message: &'static str) -> Trial {
    crate::common::trial(format!("cli::bad_input_{name}"), move || {
        let dir = scratch(name);
        let out = grpo_verify(&["check", "--impl", "reference", "--cases", "1", "--real-cases", "0", "--report", s(&dir), "--regressions", "none"]);
        expect_exit(&out, 0, "")?;
        // Build a repro from the one recorded case.
        let report: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("report.json"))?)?;
        let spec: grpo_verify::case::CaseSpec = serde_json::from_value(report["records"][0]["spec"].clone())?;
        let case = spec.materialize(grpo_verify::case::Kind::Logits);
        let mut repro = serde_json::to_value(grpo_verify::repro::Repro {
            format: grpo_verify::repro::FORMAT.into(),
            implementation: "reference".into(),
            summary: case.summary(),
            failure: String::new(),
            run_seed: 0,
            spec: None,
            case,
            replay: String::new(),
            conventions: Vec::new(),
            invariance: None,
        })?;
        edit(&mut repro["case"]);
        let path = dir.join("edited.json");
        std::fs::write(&path, serde_json::to_string(&repro)?)?;
        expect_exit(&grpo_verify(&["replay", s(&path)]), 2, message)
    })
}

/// `lower` passes the reference for TPU, and catches (and shrinks) a Pallas
/// block that Mosaic cannot tile, which runs fine on CPU.
fn lower_catches_untileable_blocks() -> Result<(), Failed> {
    let out = grpo_verify(&["lower", "--impl", "reference", "--cases", "3"]);
    expect_exit(&out, 0, "")?;
    let bad = common::fixture_impl("lowering/untileable_block.py");
    let out = grpo_verify(&["lower", "--impl", &bad, "--cases", "5"]);
    expect_exit(&out, 1, "")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !stdout.contains("FAILED (shrunk)") || !stdout.contains("divisible by 8 and 128") {
        return Err(format!("no shrunk lowering failure reported:\n{stdout}").into());
    }
    Ok(())
}

/// The built-ins and baselines trace their matmuls at full f32 precision
/// (on an H100 JAX's default, TF32, put the fused baseline's f32 logp 3425 u
/// off); an implementation under test, the same function under an external
/// name, is traced as written, and `lower` says its f32 matmuls are below f32.
fn lower_reports_f32_matmul_precision() -> Result<(), Failed> {
    let lines = |out: &std::process::Output| -> Vec<String> {
        String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.starts_with("lowered ") && l.contains("f32 matmuls:")).map(String::from).collect()
    };
    for builtin in ["fused_chunked", "fused_reference"] {
        let out = grpo_verify(&["lower", "--impl", builtin, "--cases", "2"]);
        expect_exit(&out, 0, "")?;
        let lowered = lines(&out);
        if lowered.is_empty() || lowered.iter().any(|l| !l.contains("at HIGHEST") || l.contains("at DEFAULT") || l.contains("below f32")) {
            return Err(format!("{builtin}: every f32 matmul should be at HIGHEST:\n{}", String::from_utf8_lossy(&out.stdout)).into());
        }
    }
    let external = common::fixture_impl("precision/fused_chunked_as_external.py");
    let out = grpo_verify(&["lower", "--impl", &external, "--cases", "2"]);
    expect_exit(&out, 0, "")?;
    let lowered = lines(&out);
    if lowered.is_empty() || lowered.iter().any(|l| !l.contains("at DEFAULT") || !l.contains("below f32")) {
        return Err(format!("the external copy should be traced at DEFAULT and said so:\n{}", String::from_utf8_lossy(&out.stdout)).into());
    }
    Ok(())
}

/// `bench --json` carries docs/cli.md's keys; `--iters 0` compiles only.
fn bench_json_has_the_contract_keys() -> Result<(), Failed> {
    for (iters, timed) in [("0", false), ("2", true)] {
        let out = grpo_verify(&[
            "bench", "--impl", "reference", "--batch", "2", "--time", "8", "--vocab", "300", "--dtype", "f32", "--iters", iters, "--json",
        ]);
        expect_exit(&out, 0, "")?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let line: Value = serde_json::from_str(stdout.lines().next().ok_or("no output")?)?;
        for key in ["impl", "kind", "shape", "dtype", "first_call_s", "avg_step_ms", "temp_bytes", "peak_bytes"] {
            if line.get(key).is_none() {
                return Err(format!("bench --json lacks {key}: {line}").into());
            }
        }
        if line["temp_bytes"].as_u64().is_none() || line["avg_step_ms"].is_number() != timed {
            return Err(format!("--iters {iters}: unexpected figures {line}").into());
        }
    }
    // Every built-in the benchmarks compare carries the keys, timed, one line each.
    for (impls, kind) in [("reference,pallas_logits", "logits"), ("fused_reference,fused_chunked,fused_pallas", "fused")] {
        let out = grpo_verify(&[
            "bench", "--impl", impls, "--kind", kind, "--batch", "1", "--time", "8", "--vocab", "300", "--hidden", "32", "--iters", "1", "--json",
        ]);
        expect_exit(&out, 0, "")?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<Value> = stdout.lines().map(serde_json::from_str).collect::<Result<_, _>>()?;
        let names: Vec<&str> = lines.iter().filter_map(|l| l["impl"].as_str()).collect();
        if names.join(",") != impls {
            return Err(format!("bench --json printed {names:?} for {impls}").into());
        }
        for line in &lines {
            let complete = ["first_call_s", "avg_step_ms", "temp_bytes"].iter().all(|k| line[*k].is_number())
                && line.get("peak_bytes").is_some()
                && line["shape"]["vocab"] == 300;
            if !complete {
                return Err(format!("incomplete bench line: {line}").into());
            }
        }
    }
    Ok(())
}

/// `bench-oracle --json` carries docs/cli.md's keys, both sides ran, and they
/// computed the same thing (the command refuses to compare otherwise).
fn bench_oracle_json_has_the_contract_keys() -> Result<(), Failed> {
    let out = grpo_verify(&["bench-oracle", "--rows", "24", "--vocab", "5000", "--reps", "1", "--json"]);
    expect_exit(&out, 0, "")?;
    let line: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim())?;
    for key in ["rows", "vocab", "oracle_elems_per_s", "numpy_elems_per_s", "ratio", "numpy_blocked_elems_per_s"] {
        if !line[key].is_number() {
            return Err(format!("bench-oracle --json lacks the number {key}: {line}").into());
        }
    }
    if line["rows"] != 24 || line["vocab"] != 5000 || !(line["max_rel_diff"].as_f64().unwrap_or(1.0) <= 1e-9) {
        return Err(format!("unexpected bench-oracle figures: {line}").into());
    }
    expect_exit(&grpo_verify(&["bench-oracle", "--rows", "0"]), 2, "--rows")
}

/// `bench --preset` runs the seed shapes; a step that does not fit the
/// host's memory is reported compile-only with a note (here the host is
/// told it has 10 KiB; the step needs about 100 KiB); an unknown preset is
/// a usage error naming it.
fn bench_presets_and_the_memory_guard() -> Result<(), Failed> {
    let out = Command::new(env!("CARGO_BIN_EXE_grpo-verify"))
        .args(["bench", "--impl", "reference", "--batch", "2", "--time", "8", "--vocab", "300", "--iters", "2", "--json"])
        .env("GRPO_VERIFY_HOST_MEMORY_GIB", "0.00001")
        .current_dir(common::repo())
        .output()?;
    expect_exit(&out, 0, "")?;
    let line: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().next().ok_or("no output")?)?;
    if line["compile_only"] != true || !line["avg_step_ms"].is_null() || !line["note"].as_str().unwrap_or("").contains("compile-only") {
        return Err(format!("expected a compile-only line with a note: {line}").into());
    }
    expect_exit(&grpo_verify(&["bench", "--preset", "seed-b9-t9"]), 2, "seed-b9-t9")?;
    // A preset's shape, compile-only (seconds even at V = 151643).
    let out = grpo_verify(&["bench", "--preset", "seed-b1-t2048", "--impl", "reference", "--iters", "0", "--json"]);
    expect_exit(&out, 0, "")?;
    let line: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().next().ok_or("no output")?)?;
    if line["shape"]["vocab"] != 151_643 || line["shape"]["time"] != 2048 || line["preset"] != "seed-b1-t2048" {
        return Err(format!("preset shape not used: {line}").into());
    }
    Ok(())
}

/// `--wandb-mode offline` leaves a W&B run per implementation whose history
/// holds the bench figures (read back from the run file).
fn bench_logs_to_wandb_offline() -> Result<(), Failed> {
    let dir = scratch("wandb");
    let out = grpo_verify(&[
        "bench", "--impl", "reference", "--batch", "1", "--time", "4", "--vocab", "64", "--iters", "1",
        "--wandb-project", "grpo-verify-test", "--wandb-mode", "offline", "--wandb-dir", s(&dir),
    ]);
    expect_exit(&out, 0, "wandb (offline)")?;
    let runs: Vec<PathBuf> = std::fs::read_dir(dir.join("wandb"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("offline-run-")))
        .collect();
    if runs.len() != 1 {
        return Err(format!("expected one offline run in {}, found {runs:?}", dir.display()).into());
    }
    let env = grpo_verify::worker::pyenv::resolve()?;
    let read = env
        .command()
        .args(["-m", "grpo_bench.wandb_log", "read"])
        .arg(&runs[0])
        .output()?;
    let records = String::from_utf8_lossy(&read.stdout);
    let history: Vec<Value> = records
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v.get("history").cloned())
        .collect();
    let logged = |key: &str| history.iter().any(|h| h[key].is_number());
    if !read.status.success() || !["avg_step_ms", "first_call_s", "temp_bytes"].iter().all(|k| logged(k)) || !records.contains("grpo-verify-test") {
        return Err(format!("the offline run lacks the figures:\n{records}\n{}", String::from_utf8_lossy(&read.stderr)).into());
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// `mutants --catalog DIR`: a caught mutant and a survivor (a correct
/// implementation posing as one) give exit 1, a report naming the survivor,
/// and a repro for the caught one.
fn mutants_catalog_reports_survivors() -> Result<(), Failed> {
    let catalog = scratch("catalog");
    std::fs::create_dir_all(&catalog)?;
    let mutants = grpo_verify::mutants::builtin_catalog();
    std::fs::copy(mutants.join("fwd_temperature_multiplied.py"), catalog.join("fwd_temperature_multiplied.py"))?;
    std::fs::write(catalog.join("correct.py"), "\"\"\"Bug: none, a survivor.\"\"\"\nMUTANT_CATEGORY = \"fwd\"\nfrom grpo_kernels.logits.reference import grpo_loss\n")?;
    std::fs::write(catalog.join("_helper.py"), "raise RuntimeError('helpers are not mutants')\n")?;
    let dir = scratch("mutants-report");
    let out = grpo_verify(&["mutants", "--catalog", s(&catalog), "--cases", "12", "--report", s(&dir)]);
    expect_exit(&out, 1, "")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    for want in ["caught   fwd_temperature_multiplied", "SURVIVED correct", "1 of 2 mutants caught"] {
        if !stdout.contains(want) {
            return Err(format!("stdout lacks {want:?}:\n{stdout}").into());
        }
    }
    let md = std::fs::read_to_string(dir.join("report.md"))?;
    if !md.contains("1 of 2 caught") || !md.contains("**SURVIVED**") || !md.contains("multiplied by the temperature") {
        return Err(format!("report.md:\n{md}").into());
    }
    let json: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("report.json"))?)?;
    let repro = json["mutants"][1]["check"]["repro"].as_str().ok_or("no repro for the caught mutant")?;
    expect_exit(&grpo_verify(&["replay", repro]), 1, "")?;
    // Bad catalogs are input errors: a missing directory, a file that does not load.
    expect_exit(&grpo_verify(&["mutants", "--catalog", "/no/such/catalog"]), 2, "/no/such/catalog")?;
    std::fs::write(catalog.join("broken_syntax.py"), "MUTANT_CATEGORY = \"fwd\"\ndef grpo_loss(:\n")?;
    let dir = scratch("mutants-bad");
    expect_exit(&grpo_verify(&["mutants", "--catalog", s(&catalog), "--report", s(&dir)]), 2, "broken_syntax.py")?;
    if dir.join("report.json").exists() {
        return Err("a report was left behind".into());
    }
    // A file that declares no category is refused, naming it and the line to add.
    std::fs::remove_file(catalog.join("broken_syntax.py"))?;
    std::fs::write(catalog.join("undeclared.py"), "from grpo_kernels.logits.reference import grpo_loss\n")?;
    expect_exit(&grpo_verify(&["mutants", "--catalog", s(&catalog), "--report", s(&dir)]), 2, "undeclared.py: no MUTANT_CATEGORY")?;
    if dir.join("report.json").exists() {
        return Err("a report was left behind".into());
    }
    Ok(())
}

/// This suite's trials (suites/main.rs runs them with the others).
pub fn trials() -> Vec<Trial> {
    let tests = vec![
        crate::common::trial("cli::lower_catches_untileable_blocks_and_passes_the_reference", lower_catches_untileable_blocks),
        crate::common::trial("cli::lower_reports_f32_matmul_precision", lower_reports_f32_matmul_precision),
        crate::common::trial("cli::bench_json_has_the_contract_keys", bench_json_has_the_contract_keys),
        crate::common::trial("cli::bench_oracle_json_has_the_contract_keys", bench_oracle_json_has_the_contract_keys),
        crate::common::trial("cli::bench_presets_and_the_memory_guard", bench_presets_and_the_memory_guard),
        crate::common::trial("cli::bench_logs_to_wandb_offline", bench_logs_to_wandb_offline),
        crate::common::trial("cli::passing_check_exits_0_and_writes_reports", passing_check_writes_reports),
        crate::common::trial("cli::mutants_catalog_reports_survivors_and_bad_catalogs_exit_2", mutants_catalog_reports_survivors),
        crate::common::trial("cli::failing_check_exits_1_with_repro_replay_and_persistence", failing_check_writes_repro_and_replay_reproduces),
        crate::common::trial("cli::invariance_catches_a_variant_kernel_and_names_bad_input", invariance_catches_a_variant_kernel_and_names_bad_input),
        crate::common::trial("cli::keep_going_reports_every_distinct_discrepancy_with_its_repro", keep_going_reports_every_distinct_discrepancy),
        crate::common::trial("cli::missing_impl_file_exits_2_without_report", || {
            let dir = scratch("missing");
            expect_exit(&grpo_verify(&["check", "--impl", "no/such/file.py:grpo_loss", "--report", s(&dir)]), 2, "no/such/file.py")?;
            if dir.join("report.json").exists() || dir.join("report.md").exists() {
                return Err("a report was left behind".into());
            }
            Ok(())
        }),
        crate::common::trial("cli::rarely_supported_impl_gets_its_cases_or_a_note", || {
            // One configuration in 192 is supported: 2 checked cases need
            // ~400 draws (unsupported ones are redrawn), within the 1024
            // floor of the draw budget; 20 would need ~3800 and stop there
            // with a note. Tiny shapes keep a draw at milliseconds.
            let fixture = common::fixture_impl("worker/unsupported_nearly_always.py");
            let tiny = ["--max-batch", "1", "--max-time", "2", "--max-vocab", "8", "--regressions", "none", "--real-cases", "0"];
            let dir = scratch("rare");
            let out = grpo_verify(&[&["check", "--impl", &fixture, "--cases", "2", "--report", s(&dir)][..], &tiny[..]].concat());
            expect_exit(&out, 0, "")?;
            let stdout = String::from_utf8_lossy(&out.stdout);
            if !stdout.contains(" 2 cases in ") || stdout.contains("note:") {
                return Err(format!("expected 2 checked cases and no note:\n{stdout}").into());
            }
            let out = grpo_verify(&[&["check", "--impl", &fixture, "--cases", "20", "--report", s(&dir)][..], &tiny[..]].concat());
            expect_exit(&out, 0, "")?;
            let stdout = String::from_utf8_lossy(&out.stdout);
            if !stdout.contains("note: only ") || !std::fs::read_to_string(dir.join("report.md"))?.contains("Note on") {
                return Err(format!("expected a note on the cases checked:\n{stdout}").into());
            }
            Ok(())
        }),
        crate::common::trial("cli::a_check_where_every_draw_is_unsupported_exits_2_and_says_so", || {
            // fused_onepass refuses the sequence levels: verl:gspo leaves it nothing.
            let tiny = ["--max-batch", "2", "--max-time", "3", "--max-vocab", "16", "--max-hidden", "8", "--regressions", "none", "--real-cases", "0"];
            let dir = scratch("unchecked");
            let out = grpo_verify(&[&["check", "--impl", "fused_onepass", "--objective", "verl:gspo", "--cases", "2", "--report", s(&dir)][..], &tiny[..]].concat());
            expect_exit(&out, 2, "nothing was checked")?;
            let stdout = String::from_utf8_lossy(&out.stdout);
            if !stdout.contains("UNCHECKED fused_onepass") || !std::fs::read_to_string(dir.join("report.md"))?.contains("NOTHING CHECKED") {
                return Err(format!("expected UNCHECKED in the summary and NOTHING CHECKED in report.md:\n{stdout}").into());
            }
            // Beside an implementation that checks its cases: exit 0, the refusing one still UNCHECKED.
            let out = grpo_verify(&[&["check", "--impl", "fused_onepass", "--impl", "fused_reference", "--objective", "verl:gspo", "--cases", "2", "--report", s(&dir)][..], &tiny[..]].concat());
            expect_exit(&out, 0, "")?;
            if !String::from_utf8_lossy(&out.stdout).contains("UNCHECKED fused_onepass") {
                return Err("the refusing implementation was not marked UNCHECKED beside a checked one".into());
            }
            Ok(())
        }),
        crate::common::trial("cli::a_remembered_failure_replays_only_within_the_runs_dtypes", || {
            // The torch fixture computes its softmax in the input dtype: wrong in bf16, right in f32.
            let fixture = common::fixture_impl("torch/bf16_softmax.py");
            let tiny = ["--max-batch", "2", "--max-time", "3", "--max-vocab", "16", "--cases", "4", "--real-cases", "0"];
            let (dir, remembered) = (scratch("replay-scope"), scratch("replay-scope-regressions"));
            let run = |dtype: &str| grpo_verify(&[&["check", "--impl", &fixture, "--dtype", dtype, "--report", s(&dir), "--regressions", s(&remembered)][..], &tiny[..]].concat());
            expect_exit(&run("bf16"), 1, "")?;
            // The bf16 failure is remembered; an f32 run must not replay it.
            expect_exit(&run("f32"), 0, "")?;
            // A run that draws bf16 again replays it first.
            let out = run("all");
            expect_exit(&out, 1, "")?;
            if !String::from_utf8_lossy(&out.stdout).contains("shrunk in 0 steps") {
                return Err(format!("the remembered bf16 failure was not replayed first:\n{}", String::from_utf8_lossy(&out.stdout)).into());
            }
            Ok(())
        }),
        crate::common::trial("cli::the_pytest_example_passes_and_catches_its_broken_kernel", || {
            // examples/pytest: the Python API (python/grpo_verify) from a user's
            // test file, on this binary; one of its tests expects a failure.
            let env = grpo_verify::worker::pyenv::resolve()?;
            let out = env
                .command()
                .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "examples/pytest"])
                .env("GRPO_VERIFY_BIN", env!("CARGO_BIN_EXE_grpo-verify"))
                .env("GRPO_VERIFY_EXAMPLE_CASES", "20")
                .current_dir(common::repo())
                .output()?;
            let stdout = String::from_utf8_lossy(&out.stdout);
            if !out.status.success() || !stdout.contains("4 passed") {
                return Err(format!("pytest examples/pytest: {:?}\n{stdout}\n{}", out.status, String::from_utf8_lossy(&out.stderr)).into());
            }
            Ok(())
        }),
        crate::common::trial("cli::wrappers_declare_their_kind", || {
            // A `def f(**kwargs)` wrapper runs when it declares `kind`, a
            // functools.wraps decorator needs no declaration; an undeclared or
            // contradicting one exits 2 saying how to declare it.
            let file = common::repo().join("suites/fixtures/impls/worker/wrappers.py");
            let wrapper = |function: &str| format!("{}:{function}", file.display());
            for passing in ["declared_kwargs_wrapper", "decorated"] {
                let dir = scratch(passing);
                let out = grpo_verify(&["check", "--impl", &wrapper(passing), "--cases", "2", "--real-cases", "0", "--report", s(&dir), "--regressions", "none"]);
                expect_exit(&out, 0, "")?;
            }
            expect_exit(&grpo_verify(&["check", "--impl", &wrapper("undeclared_kwargs_wrapper"), "--cases", "1"]), 2, "f.kind = \"logits\" or \"fused\"")?;
            expect_exit(&grpo_verify(&["check", "--impl", &wrapper("contradicting"), "--cases", "1"]), 2, "declares kind = 'fused'")
        }),
        crate::common::trial("cli::a_missing_or_too_old_package_exits_2_naming_it_and_its_version", || {
            // environment.py reads versions from the package metadata: a
            // dist-info directory first on PYTHONPATH stands in for an old release.
            let fake = |package: &str, version: &str| -> Result<PathBuf, Failed> {
                let dir = scratch(&format!("fake-{package}"));
                let info = dir.join(format!("{package}-{version}.dist-info"));
                std::fs::create_dir_all(&info)?;
                std::fs::write(info.join("METADATA"), format!("Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n"))?;
                Ok(dir)
            };
            let with_pythonpath = |dir: &Path, args: &[&str]| {
                Command::new(env!("CARGO_BIN_EXE_grpo-verify")).args(args).env("PYTHONPATH", dir).current_dir(common::repo()).output().expect("runs")
            };
            let report = scratch("too-old-report");
            let old_jax = fake("jax", "0.8.1")?;
            let out = with_pythonpath(&old_jax, &["check", "--impl", "reference", "--cases", "1", "--report", s(&report)]);
            expect_exit(&out, 2, "jax 0.8.1 in ")?;
            expect_exit(&out, 2, "needs jax >= 0.9")?;
            if report.exists() {
                return Err("a report was left behind".into());
            }
            expect_exit(&with_pythonpath(&old_jax, &["setup"]), 2, "jax 0.8.1")?;
            let old_torch = fake("torch", "2.10.0")?;
            let torch_impl = "examples/torch_reference/adapter.py:grpo_loss";
            let out = with_pythonpath(&old_torch, &["check", "--impl", torch_impl, "--cases", "1", "--regressions", "none"]);
            expect_exit(&out, 2, "torch 2.10.0 in ")?;
            expect_exit(&out, 2, "is a PyTorch implementation")?;
            // A JAX implementation runs whatever torch the environment has.
            let dir = scratch("old-torch-jax-impl");
            expect_exit(&with_pythonpath(&old_torch, &["check", "--impl", "reference", "--cases", "1", "--report", s(&dir), "--regressions", "none"]), 0, "")?;
            // An interpreter with nothing installed names every package.
            let bare = scratch("bare-venv");
            let env = grpo_verify::worker::pyenv::resolve()?;
            let created = Command::new(&env.python).args(["-m", "venv", "--without-pip"]).arg(&bare).status()?;
            if !created.success() {
                return Err(format!("creating {} failed", bare.display()).into());
            }
            let out = Command::new(env!("CARGO_BIN_EXE_grpo-verify"))
                .args(["check", "--impl", "reference", "--cases", "1"])
                .env("GRPO_VERIFY_PYTHON", bare.join("bin/python"))
                .current_dir(common::repo())
                .output()?;
            expect_exit(&out, 2, "jax is not installed in ")?;
            expect_exit(&out, 2, "numpy is not installed in ")
        }),
        crate::common::trial("cli::unknown_builtin_exits_2", || {
            expect_exit(&grpo_verify(&["check", "--impl", "no_such_kernel"]), 2, "no_such_kernel")
        }),
        crate::common::trial("cli::bad_flag_values_exit_2", || {
            expect_exit(&grpo_verify(&["check", "--cases", "0"]), 2, "--cases")?;
            expect_exit(&grpo_verify(&["check", "--devices", "0"]), 2, "--devices")?;
            expect_exit(&grpo_verify(&["gradcheck", "--fixture", "fixtures", "--time", "0"]), 2, "--time")?;
            expect_exit(&grpo_verify(&["check", "--dtype", "f16"]), 2, "f16")?;
            expect_exit(&grpo_verify(&["check", "--max-failures", "3"]), 2, "--keep-going")?;
            expect_exit(&grpo_verify(&["check", "--keep-going", "--max-failures", "0"]), 2, "--max-failures")?;
            expect_exit(&grpo_verify(&["replay", "/no/such/repro.json"]), 2, "/no/such/repro.json")?;
            expect_exit(&grpo_verify(&["sensitivity", "--impl", "reference", "--quantity", "gradient"]), 2, "--quantity gradient")?;
            expect_exit(&grpo_verify(&["sensitivity", "--impl", "reference", "--scope", "column"]), 2, "--scope column")?;
            // The logits kind has no d hidden: the wrapper refuses to load.
            expect_exit(&grpo_verify(&["sensitivity", "--impl", "reference", "--quantity", "grad_hidden", "--scope", "tensor"]), 2, "which has no grad_hidden")
        }),
        crate::common::trial("cli::bad_conventions_exit_2", || {
            // docs/conventions.md: a name off the list, a malformed parameter,
            // and an implementation declaring either, exit 2 naming it.
            expect_exit(&grpo_verify(&["check", "--convention", "bf16_logit", "--cases", "1"]), 2, "bf16_temperature")?;
            expect_exit(&grpo_verify(&["check", "--convention", "bf16_accumulation:d_hidden:tokens=4", "--cases", "1"]), 2, "d_hidden:columns")?;
            expect_exit(&grpo_verify(&["check", "--convention", "bf16_logits:0", "--cases", "1"]), 2, "1 to 16")?;
            let file = common::repo().join("suites/fixtures/impls/conventions/malformed_declarations.py");
            let declared = |function: &str| format!("{}:{function}", file.display());
            expect_exit(&grpo_verify(&["check", "--impl", &declared("declared_as_a_string"), "--cases", "1"]), 2, "must be a tuple of strings")?;
            expect_exit(&grpo_verify(&["check", "--impl", &declared("declared_unknown"), "--cases", "1"]), 2, "fp8_logits")
        }),
        crate::common::trial("cli::a_bad_torch_device_exits_2_naming_it", || {
            // torch_runner reads GRPO_VERIFY_TORCH_DEVICE when it first runs a torch implementation.
            let out = Command::new(env!("CARGO_BIN_EXE_grpo-verify"))
                .args(["check", "--impl", "examples/torch_reference/adapter.py:grpo_loss", "--cases", "1", "--regressions", "none"])
                .env("GRPO_VERIFY_TORCH_DEVICE", "nonsense")
                .current_dir(common::repo())
                .output()
                .expect("runs");
            expect_exit(&out, 2, "GRPO_VERIFY_TORCH_DEVICE = 'nonsense' is not a torch device")
        }),
        crate::common::trial("cli::bad_objectives_exit_2", || {
            // SPEC v2: an unknown preset, a preset and a flag that
            // contradicts it, and hyperparameters outside their ranges.
            expect_exit(&grpo_verify(&["check", "--objective", "trl:nope"]), 2, "--objective trl:nope")?;
            expect_exit(&grpo_verify(&["check", "--objective", "trl:dapo", "--switch", "temperature_mode=logp"]), 2, "contradicts --objective trl:dapo")?;
            expect_exit(&grpo_verify(&["check", "--objective", "verl:gspo", "--hparam", "log_ratio_max=5"]), 2, "contradicts --objective verl:gspo")?;
            expect_exit(&grpo_verify(&["check", "--objective", "all", "--switch", "ratio_level=tokens"]), 2, "ratio_level")?;
            expect_exit(&grpo_verify(&["check", "--objective", "all", "--switch", "no_such=1"]), 2, "no_such")?;
            expect_exit(&grpo_verify(&["check", "--switch", "policy_loss=cispo"]), 2, "SPEC v2 switch")?;
            expect_exit(&grpo_verify(&["check", "--hparam", "kl_max=10"]), 2, "SPEC v2 hyperparameter")?;
            expect_exit(
                &grpo_verify(&["check", "--objective", "all", "--hparam", "log_ratio_min=1", "--hparam", "log_ratio_max=0.5"]),
                2,
                "log_ratio_min = 1 must be <= log_ratio_max = 0.5",
            )?;
            expect_exit(&grpo_verify(&["check", "--objective", "all", "--hparam", "kl_max=0"]), 2, "kl_max = 0 must be > 0")?;
            expect_exit(&grpo_verify(&["check", "--objective", "all", "--hparam", "kl_max=abc"]), 2, "kl_max=abc")
        }),
        crate::common::trial("cli::malformed_repro_exits_2", || {
            let dir = scratch("malformed");
            std::fs::create_dir_all(&dir)?;
            std::fs::write(dir.join("x.json"), "{\"format\": 3}")?;
            expect_exit(&grpo_verify(&["replay", s(&dir.join("x.json"))]), 2, "not a grpo-verify repro file")
        }),
        bad_repro("token_outside_vocabulary", |c| {
            let v = c["shape"]["vocab"].as_u64().unwrap();
            let mask = c["mask"].as_array().unwrap().clone();
            let i = mask.iter().position(|m| m.as_f64() == Some(1.0)).unwrap_or(0);
            c["mask"][i] = 1.0.into();
            c["tokens"][i] = v.into();
        }, "is outside the vocabulary"),
        bad_repro("temperature_not_positive", |c| c["hparams"]["temperature"] = 0.0.into(), "temperature (tau) = 0"),
        bad_repro("log_ratio_clamp_inverted", |c| {
            c["hparams"]["log_ratio_min"] = 2.0.into();
            c["hparams"]["log_ratio_max"] = 1.0.into();
        }, "log_ratio_min = 2 must be <= log_ratio_max = 1"),
        bad_repro("kl_max_not_positive", |c| c["hparams"]["kl_max"] = (-1.0).into(), "kl_max = -1 must be > 0"),
        bad_repro("mismatched_shapes", |c| {
            c["tokens"].as_array_mut().unwrap().pop();
        }, "tokens has"),
    ];
    tests
}
