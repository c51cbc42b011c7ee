//! Optional Weights & Biases logging of `bench` and `bench-oracle` figures.
//!
//! W&B is a Python library, so the runs are logged by `python -m
//! grpo_bench.wandb_log` in the worker's environment: one JSON line per run
//! on its standard input (name, group, job type, config, metrics), one JSON
//! line per logged run back (its name and run directory). Modes are W&B's
//! own: `online`, `offline` (a run directory to `wandb sync` later) and
//! `disabled`.

use std::io::Write;
use std::path::PathBuf;
use std::process::Stdio;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::worker::pyenv::PythonEnv;

/// Where and how `bench --wandb-project` logs (docs/cli.md).
pub struct WandbOptions {
    /// The W&B project.
    pub project: String,
    /// online, offline or disabled.
    pub mode: String,
    /// The run's directory (None: W&B's default).
    pub dir: Option<PathBuf>,
}

/// Fails early (exit 2) when W&B cannot be imported, before anything is measured.
pub fn check_available(env: &PythonEnv) -> Result<()> {
    let status = env
        .command()
        .args(["-c", "import wandb"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .with_context(|| format!("starting {}", env.python.display()))?;
    if !status.success() {
        bail!(
            "--wandb-project: the Python at {} cannot import wandb; install it there \
             (pip install wandb, the version pinned in python/requirements.txt) or drop --wandb-project",
            env.python.display()
        );
    }
    Ok(())
}

/// A `bench --json` line as one W&B run: the seed team's metric names at the top level.
pub fn bench_run(line: &Value, group: &str) -> Value {
    let metrics: serde_json::Map<String, Value> = ["first_call_s", "avg_step_ms", "temp_bytes", "peak_bytes", "argument_bytes", "output_bytes"]
        .iter()
        .filter(|k| !line[**k].is_null())
        .map(|k| (k.to_string(), line[*k].clone()))
        .collect();
    json!({
        "name": format!("{}/{}", group, line["impl"].as_str().unwrap_or("?")),
        "group": group,
        "job_type": "bench",
        "config": line,
        "metrics": metrics,
    })
}

/// A `bench-oracle --json` object as one W&B run.
pub fn oracle_run(result: &Value) -> Value {
    let metrics: serde_json::Map<String, Value> = ["oracle_elems_per_s", "numpy_elems_per_s", "ratio", "numpy_blocked_elems_per_s", "ratio_blocked"]
        .iter()
        .map(|k| (k.to_string(), result[*k].clone()))
        .collect();
    json!({
        "name": format!("bench-oracle/rows{}-vocab{}", result["rows"], result["vocab"]),
        "group": "bench-oracle",
        "job_type": "bench-oracle",
        "config": result,
        "metrics": metrics,
    })
}

/// Logs `runs`; returns what the logger reported per run ({"name", "run_dir"}).
pub fn log_runs(env: &PythonEnv, opts: &WandbOptions, runs: &[Value]) -> Result<Vec<Value>> {
    let mut cmd = env.command();
    cmd.args(["-m", "grpo_bench.wandb_log", "log", "--project", &opts.project, "--mode", &opts.mode])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(dir) = &opts.dir {
        std::fs::create_dir_all(dir).with_context(|| format!("--wandb-dir {}: cannot create it", dir.display()))?;
        cmd.arg("--dir").arg(dir);
    }
    let mut child = cmd.spawn().with_context(|| format!("starting {}", env.python.display()))?;
    {
        let mut stdin = child.stdin.take().expect("piped stdin");
        for run in runs {
            writeln!(stdin, "{run}").context("writing to the W&B logger")?;
        }
    }
    let output = child.wait_with_output().context("waiting for the W&B logger")?;
    if !output.status.success() {
        bail!(
            "W&B logging to project {} ({} mode) failed ({}):\n{}",
            opts.project,
            opts.mode,
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let logged: Vec<Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    for l in &logged {
        eprintln!("wandb ({}): {} -> {}", opts.mode, l["name"].as_str().unwrap_or("?"), l["run_dir"].as_str().unwrap_or("-"));
    }
    Ok(logged)
}
