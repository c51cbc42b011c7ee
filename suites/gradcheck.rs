//! Hidden-state fixtures end to end: a tiny random
//! Qwen2-architecture checkpoint in the Hugging Face layout -> its forward
//! checked against an independent NumPy forward -> a fixture sampled from it
//! -> `grpo-verify gradcheck` on the built-ins, with the HTML report; a
//! broken kernel is caught on it; the committed synthetic fixture and a real
//! model's one pass (on a prefix of their positions: the f64
//! oracle at V = 151936 is the cost); malformed fixtures, an absent
//! checkpoint and bad presets are input errors (exit 2). The
//! synthetic fixtures regenerate (the committed one byte for byte), and a
//! fused kernel that drops the last partial 2048-wide vocabulary block is
//! caught at V = 151936 while its twin passes.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use libtest_mimic::{Failed, Trial};
use serde_json::Value;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("grpo-verify-gradcheck-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn python(args: &[&str]) -> Result<Output, Failed> {
    common::python_with(args, &[])
}

fn ok(out: Output, what: &str) -> Result<String, Failed> {
    if !out.status.success() {
        return Err(format!("{what} failed ({}):\n{}\n{}", out.status, String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn gradcheck(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_grpo-verify")).arg("gradcheck").args(args).current_dir(common::repo()).output().expect("runs")
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The tiny checkpoint and a fixture sampled from it (made once per test that needs them).
fn tiny_fixture(dir: &Path) -> Result<(PathBuf, PathBuf), Failed> {
    let (ckpt, fixture) = (dir.join("ckpt"), dir.join("fixture"));
    ok(python(&["-m", "grpo_fixtures", "tiny-checkpoint", "--out", s(&ckpt), "--seed", "3"])?, "tiny-checkpoint")?;
    // A random model rarely samples its one eos id: ten eos ids give rows of different lengths.
    ok(
        python(&[
            "-m", "grpo_fixtures", "make", "--model-dir", s(&ckpt), "--out", s(&fixture), "--batch", "4", "--time", "24",
            "--temperature", "0.9", "--seed", "1", "--eos", "0,1,2,3,4,5,6,7,8,9",
        ])?,
        "make",
    )?;
    Ok((ckpt, fixture))
}

/// checkpoint -> NumPy-checked forward -> fixture -> gradcheck of the three built-ins, HTML report included.
fn tiny_checkpoint_pipeline() -> Result<(), Failed> {
    let dir = scratch("tiny");
    let (ckpt, fixture) = tiny_fixture(&dir)?;
    let forward: Value = serde_json::from_str(ok(python(&["-m", "grpo_fixtures", "check-forward", "--model-dir", s(&ckpt)])?, "check-forward")?.trim())?;
    let worst = forward["hidden_rel_err"].as_f64().zip(forward["logits_rel_err"].as_f64()).map(|(h, l)| h.max(l));
    if !worst.is_some_and(|w| w < 1e-4) {
        return Err(format!("the JAX forward disagrees with the NumPy one: {forward}").into());
    }
    ok(python(&["-m", "grpo_fixtures", "verify", "--fixture", s(&fixture), "--deep"])?, "verify --deep")?;
    let report = dir.join("report");
    let out = gradcheck(&["--fixture", s(&fixture), "--impl", "reference,fused_chunked,pallas_logits", "--report", s(&report)]);
    ok(out, "gradcheck")?;
    let html = std::fs::read_to_string(report.join("report.html"))?;
    for needle in ["<svg", "logp error", "clip region", "logit scale", "PASS"] {
        if !html.contains(needle) {
            return Err(format!("report.html lacks {needle:?}").into());
        }
    }
    // Self-contained: no scripts, stylesheets or fetched resources (the SVG namespace URI is not fetched).
    if ["<script", "<link", "@import", "src=\"http", "href=\"http", "url("].iter().any(|n| html.contains(n)) {
        return Err("report.html is not self-contained".into());
    }
    let json: Value = serde_json::from_str(&std::fs::read_to_string(report.join("report.json"))?)?;
    let regions: std::collections::BTreeSet<String> = json["implementations"][0]["tokens"]
        .as_array()
        .ok_or("no tokens in report.json")?
        .iter()
        .filter_map(|t| t["region"].as_str().map(|r| r.split(',').next().unwrap_or("").to_string()))
        .collect();
    // The ratio noise must reach the clip regions, or the plots show one region only.
    if regions.len() < 3 {
        return Err(format!("the fixture's tokens fall in too few clip regions: {regions:?}").into());
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Kernels with a temperature bug and a clip bug are caught on the fixture (exit 1).
fn broken_kernels_are_caught() -> Result<(), Failed> {
    let dir = scratch("broken");
    let (_, fixture) = tiny_fixture(&dir)?;
    for mutant in ["fwd_temperature_multiplied", "fused_online_rescale_missing", "bwd_clipped_tokens_get_gradient"] {
        let out = gradcheck(&["--fixture", s(&fixture), "--impl", &common::mutant_impl(mutant), "--report", s(&dir.join(mutant))]);
        if out.status.code() != Some(1) {
            return Err(format!("{mutant}: expected exit 1, got {:?}\n{}", out.status.code(), String::from_utf8_lossy(&out.stdout)).into());
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// `--dtype f32 --objective mllm-jax`: the fixture's step in f32 under the
/// seed team's preset (logp temperature mode, a sum over the step's
/// valid-token count) passes on the built-ins, a temperature bug fails it,
/// and the report says what was run; an unknown preset and a preset that a
/// `--token-block` split would break exit 2.
fn dtype_and_objective() -> Result<(), Failed> {
    let dir = scratch("objective");
    let (_, fixture) = tiny_fixture(&dir)?;
    let report = dir.join("report");
    let args = ["--fixture", s(&fixture), "--dtype", "f32", "--objective", "mllm-jax", "--report", s(&report)];
    ok(gradcheck(&[&args[..], &["--impl", "reference,fused_chunked"]].concat()), "gradcheck --dtype f32 --objective mllm-jax")?;
    let json: Value = serde_json::from_str(&std::fs::read_to_string(report.join("report.json"))?)?;
    let g = &json["gradcheck"];
    if g["dtype"] != "f32" || g["config"]["temperature_mode"] != "logp" || g["config"]["aggregation"] != "sum_over_constant" {
        return Err(format!("the report should say f32, logp mode, sum_over_constant: {} {}", g["dtype"], g["config"]).into());
    }
    let valid = g["valid_tokens"].as_f64().ok_or("no valid_tokens")?;
    if g["hparams"]["normalizer"].as_f64() != Some(valid) {
        return Err(format!("mllm-jax divides by the step's valid-token count {valid}; the normalizer is {}", g["hparams"]["normalizer"]).into());
    }
    let out = gradcheck(&[&args[..], &["--impl", &common::mutant_impl("fwd_temperature_multiplied")]].concat());
    if out.status.code() != Some(1) {
        return Err(format!("the temperature mutant should fail under mllm-jax in f32; exit {:?}", out.status.code()).into());
    }
    for (extra, needle) in [
        (vec!["--objective", "trl:nope"], "--objective trl:nope: not a preset"),
        (vec!["--objective", "trl:gspo", "--token-block", "4"], "--token-block splits every row"),
    ] {
        let out = gradcheck(&[&["--fixture", s(&fixture), "--report", s(&dir.join("bad"))][..], &extra[..]].concat());
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.code() != Some(2) || !stderr.contains(needle) {
            return Err(format!("{extra:?}: expected exit 2 naming {needle:?}; got {:?}: {stderr}", out.status.code()).into());
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// A committed fixture passes on its first positions: the synthetic one,
/// and CI's real one (a real model's rollout, its LM head
/// fetched from the package registry). 2 positions of each row: 8 tokens
/// of the synthetic fixture, 16 of the real one. The fused comparison at V
/// = 151936 costs about a minute whatever the token count (two [H, V] f64
/// sums); the nightly checks every committed fixture at every position
/// (ci/nightly's gradcheck loop).
fn committed_fixture_passes(name: &'static str, synthetic: bool) -> impl FnOnce() -> Result<(), Failed> {
    move || {
        let dir = common::repo().join("fixtures").join(name);
        let report = scratch(&format!("committed-{name}"));
        ok(gradcheck(&["--fixture", s(&dir), "--time", "2", "--report", s(&report)]), &format!("gradcheck --fixture {}", dir.display()))?;
        let json: Value = serde_json::from_str(&std::fs::read_to_string(report.join("report.json"))?)?;
        if json["gradcheck"]["synthetic"] != Value::Bool(synthetic) {
            return Err(format!("{name}: the report says synthetic = {}", json["gradcheck"]["synthetic"]).into());
        }
        Ok(())
    }
}

/// A malformed fixture, a missing one and an absent checkpoint are input errors naming the problem.
fn bad_fixtures_exit_2() -> Result<(), Failed> {
    let dir = scratch("bad");
    let (ckpt, fixture) = tiny_fixture(&dir)?;
    let expect = |out: Output, needle: &str| -> Result<(), Failed> {
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.code() != Some(2) || !stderr.contains(needle) {
            return Err(format!("expected exit 2 naming {needle:?}; got {:?}: {stderr}", out.status.code()).into());
        }
        Ok(())
    };
    expect(gradcheck(&["--fixture", "/no/such/fixture"]), "/no/such/fixture")?;
    let manifest_path = fixture.join("manifest.json");
    let original = std::fs::read_to_string(&manifest_path)?;
    let mut manifest: Value = serde_json::from_str(&original)?;
    manifest["shapes"]["T"] = Value::from(23);
    std::fs::write(&manifest_path, serde_json::to_string(&manifest)?)?;
    expect(gradcheck(&["--fixture", s(&fixture)]), "hidden has shape")?;
    std::fs::write(&manifest_path, &original)?;
    // An unmasked token id at V: the arrays file edited in place, then restored.
    let arrays_path = fixture.join("arrays.safetensors");
    let arrays = std::fs::read(&arrays_path)?;
    let header_len = u64::from_le_bytes(arrays[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&arrays[8..8 + header_len])?;
    let start = 8 + header_len + header["tokens"]["data_offsets"][0].as_u64().unwrap() as usize;
    let vocab = manifest["shapes"]["V"].as_u64().unwrap() as i32;
    let mut edited = arrays.clone();
    edited[start..start + 4].copy_from_slice(&vocab.to_le_bytes());
    std::fs::write(&arrays_path, &edited)?;
    expect(gradcheck(&["--fixture", s(&fixture), "--impl", "reference"]), &format!("tokens[0, 0] = {vocab} is outside the vocabulary"))?;
    std::fs::write(&arrays_path, &arrays)?;
    std::fs::rename(&ckpt, dir.join("elsewhere"))?;
    expect(gradcheck(&["--fixture", s(&fixture), "--impl", "reference"]), "absent")?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Synthetic fixtures: the committed one regenerates byte for
/// byte from its defaults with the BLAS settings fixtures/README.md names
/// (its f32 logits were summed by OpenBLAS's Haswell kernel on 2 threads;
/// x86-64 only); any H and V can be made and pass `verify --deep`; an
/// unknown preset name exits 2 listing the presets.
fn synthetic_fixtures_regenerate() -> Result<(), Failed> {
    let dir = scratch("synthetic");
    let committed = common::repo().join("fixtures/synthetic-qwen2.5-1.5b/arrays.safetensors");
    if cfg!(target_arch = "x86_64") {
        let again = dir.join("committed");
        let blas = [("OPENBLAS_CORETYPE", "Haswell"), ("OPENBLAS_NUM_THREADS", "2")];
        ok(common::python_with(&["-m", "grpo_fixtures", "synthetic", "--out", s(&again)], &blas)?, "synthetic (defaults)")?;
        if std::fs::read(again.join("arrays.safetensors"))? != std::fs::read(&committed)? {
            return Err(format!("{} regenerated differs from {}", again.display(), committed.display()).into());
        }
    } else {
        eprintln!("not checked here: the committed fixture's bytes come from OpenBLAS's x86-64 Haswell kernel");
    }
    let small = dir.join("small");
    let args = ["-m", "grpo_fixtures", "synthetic", "--out", s(&small), "--batch", "2", "--time", "16", "--hidden-size", "64", "--vocab-size", "4480", "--group", "1"];
    ok(python(&args)?, "synthetic --hidden-size 64 --vocab-size 4480")?;
    ok(python(&["-m", "grpo_fixtures", "verify", "--fixture", s(&small), "--deep"])?, "verify --deep")?;
    let manifest: Value = serde_json::from_str(&std::fs::read_to_string(small.join("manifest.json"))?)?;
    if manifest["shapes"] != serde_json::json!({"B": 2, "T": 16, "H": 64, "V": 4480}) {
        return Err(format!("shapes {}", manifest["shapes"]).into());
    }
    let out = python(&["-m", "grpo_fixtures", "preset", "--name", "qwen-fused-t9999", "--out", s(&dir.join("preset"))])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() != Some(2) || !stderr.contains("no such preset; the presets are qwen-fused-t8192, seed-fused-t8192") || dir.join("preset").exists() {
        return Err(format!("an unknown preset should exit 2 listing the presets, writing nothing; got {:?}: {stderr}", out.status.code()).into());
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// A bug only production V shows: a fused kernel with 2048-wide
/// vocabulary blocks (`suites/fixtures/impls/tail_block/kernel.py`) whose
/// loop runs V // 2048 times never visits the last partial block, the 384
/// columns of 151936 = 74 x 2048 + 384. Its twin runs ceil(V / 2048) blocks.
/// Both are checked on the committed fixture (V = 151936) on the first
/// `TAIL_TIME` positions of each row: 8 tokens.
const TAIL_KERNEL: &str = "suites/fixtures/impls/tail_block/kernel.py";
const TAIL_TIME: &str = "2";

/// gradcheck of one tail-block kernel: (exit code, report.md, that implementation's report.json entry).
fn tail_block_gradcheck(function: &str) -> Result<(Option<i32>, String, Value), Failed> {
    let report = scratch(&format!("tail-{function}"));
    let implementation = format!("{TAIL_KERNEL}:{function}");
    let out = gradcheck(&["--fixture", "fixtures/synthetic-qwen2.5-1.5b", "--time", TAIL_TIME, "--impl", &implementation, "--report", s(&report)]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let md = std::fs::read_to_string(report.join("report.md")).map_err(|e| format!("{function}: no report.md ({e}); exit {:?}:\n{stderr}", out.status.code()))?;
    let json: Value = serde_json::from_str(&std::fs::read_to_string(report.join("report.json"))?)?;
    let result = json["implementations"]
        .as_array()
        .and_then(|a| a.iter().find(|i| i["implementation"].as_str().is_some_and(|n| n.ends_with(&format!(":{function}")))))
        .cloned()
        .ok_or_else(|| format!("report.json has no result for {function}"))?;
    let _ = std::fs::remove_dir_all(&report);
    Ok((out.status.code(), md, result))
}

/// The twin that visits the partial last block passes at V = 151936 (exit 0).
fn tail_block_twin_passes_at_production_vocab() -> Result<(), Failed> {
    let (code, md, result) = tail_block_gradcheck("visits_tail")?;
    if code != Some(0) || result["outcome"] != "pass" {
        return Err(format!("the twin that visits the tail should pass (exit 0); got exit {code:?}, {}:\n{md}", result["reason"]).into());
    }
    Ok(())
}

/// The kernel that drops the partial last block fails at V = 151936 (exit
/// 1): its d lm_head is 0 in the 384 tail columns, a math finding in a
/// column >= 74 x 2048, and report.md says so. (Its logp is off by up to
/// 9e-4 nats there, which is within the logp bound at this V.)
fn tail_block_dropped_tail_is_caught_at_production_vocab() -> Result<(), Failed> {
    let (code, md, result) = tail_block_gradcheck("drops_tail")?;
    if code != Some(1) || result["outcome"] != "fail" {
        return Err(format!("the kernel that drops the tail should fail (exit 1); got exit {code:?}, outcome {}:\n{md}", result["outcome"]).into());
    }
    let lm_head = result["verdicts"].as_array().and_then(|v| v.iter().find(|v| v["quantity"] == "grad_lm_head")).ok_or("no grad_lm_head verdict")?;
    let column: usize = lm_head["at"].as_str().and_then(|a| a.rsplit("v=").next()).and_then(|v| v.parse().ok()).ok_or("no column")?;
    if lm_head["pass"] != false || column < 74 * 2048 || lm_head["class"]["category"] != "math" {
        return Err(format!("the dropped tail should fail d lm_head in a tail column as math: {lm_head}").into());
    }
    let named = md.lines().any(|l| l.contains("drops_tail") && l.contains("grad_lm_head error") && l.contains(&format!("v={column}")) && l.contains("math: d lm_head"));
    if !md.lines().any(|l| l.contains("drops_tail") && l.contains("**FAIL**")) || !named {
        return Err(format!("report.md should show drops_tail failing on d lm_head at v={column}:\n{md}").into());
    }
    Ok(())
}

/// Production presets: an unknown name and one that cannot fit in the
/// memory this machine can give are input errors naming the preset, before
/// anything is generated or written.
fn bad_presets_exit_2() -> Result<(), Failed> {
    let report = scratch("preset-report");
    for (args, memory_gib, needle) in [
        (vec!["--preset", "qwen-fused-t9999"], None, "--preset qwen-fused-t9999: no such preset; the presets are qwen-fused-t8192, seed-fused-t8192"),
        (vec!["--preset", "seed-fused-t8192"], Some("4"), "--preset seed-fused-t8192: B=1 T=8192 H=4096 V=151936 needs about"),
        (vec!["--preset", "qwen-fused-t8192", "--token-block", "0"], None, "--token-block must be >= 1"),
        (vec!["--preset", "qwen-fused-t8192", "--fixture", "fixtures/synthetic-qwen2.5-1.5b"], None, "cannot be used with"),
    ] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_grpo-verify"));
        cmd.arg("gradcheck").args(&args).arg("--report").arg(&report).current_dir(common::repo());
        if let Some(gib) = memory_gib {
            cmd.env("GRPO_VERIFY_HOST_MEMORY_GIB", gib);
        }
        let out = cmd.output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.code() != Some(2) || !stderr.contains(needle) {
            return Err(format!("{args:?}: expected exit 2 naming {needle:?}; got {:?}: {stderr}", out.status.code()).into());
        }
        if report.exists() {
            return Err(format!("{args:?}: a report was left behind").into());
        }
    }
    Ok(())
}

/// This suite's trials (suites/main.rs runs them with the others).
pub fn trials() -> Vec<Trial> {
    // The longest first (libtest-mimic starts them in this order on its
    // threads): the short ones then fill in beside them instead of leaving a
    // long one running alone at the end.
    let tests = vec![
        crate::common::trial(
            "gradcheck::a_real_fixture_passes",
            committed_fixture_passes("qwen2.5-coder-1.5b-instruct-q4km-math-tau1.0", false),
        ),
        crate::common::trial("gradcheck::tail_block_twin_passes_at_production_vocab", tail_block_twin_passes_at_production_vocab),
        crate::common::trial("gradcheck::tail_block_dropped_tail_is_caught_at_production_vocab", tail_block_dropped_tail_is_caught_at_production_vocab),
        crate::common::trial("gradcheck::tiny_checkpoint_pipeline_end_to_end", tiny_checkpoint_pipeline),
        crate::common::trial("gradcheck::broken_kernels_are_caught_on_a_fixture", broken_kernels_are_caught),
        crate::common::trial("gradcheck::dtype_and_objective_change_the_step", dtype_and_objective),
        crate::common::trial("gradcheck::the_synthetic_fixture_passes", committed_fixture_passes("synthetic-qwen2.5-1.5b", true)),
        crate::common::trial("gradcheck::bad_fixtures_exit_2", bad_fixtures_exit_2),
        crate::common::trial("gradcheck::bad_presets_exit_2", bad_presets_exit_2),
        crate::common::trial("gradcheck::synthetic_fixtures_regenerate_and_presets_by_name", synthetic_fixtures_regenerate),
    ];
    tests
}
