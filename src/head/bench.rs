//! `grpo-verify bench --objective cross_entropy|distillation`: XLA's
//! compiled memory (`temp_bytes`) and the median step time of head-loss
//! implementations at one shape, side by side, the first the base of the
//! ratios (the worker's `head_run` op with `"bench": true`).

use anyhow::{Context, Result};
use serde_json::{json, Value};

use super::case::HeadObjective;
use crate::bench::BenchOptions;
use crate::case::Dtype;
use crate::worker::process::Worker;

/// What one head-loss bench measures: `bench`'s shape, dtype, steps and limit.
pub struct HeadBench {
    /// The implementations, the first the base of the ratios.
    pub implementations: Vec<String>,
    /// Cross-entropy or distillation.
    pub objective: HeadObjective,
    /// One JSON object per implementation instead of the table.
    pub json: bool,
    /// B, T, V, H (the teacher's too), the dtype, the steps and one implementation's limit.
    pub opts: BenchOptions,
}

/// Runs the bench and prints it; Ok(true) when every implementation measured.
pub fn command(bench: HeadBench) -> Result<bool> {
    let b = &bench.opts;
    let env = crate::worker::pyenv::resolve()?;
    let mut worker = Worker::start(&env).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut rows: Vec<Value> = Vec::new();
    for implementation in &bench.implementations {
        super::load(&mut worker, implementation, b.timeout)?;
        let header = json!({
            "op": "head_run", "impl": implementation, "bench": true, "objective": bench.objective.name(),
            "batch": b.batch, "time": b.time, "vocab": b.vocab, "hidden": b.hidden,
            "dtype": match b.dtype { Dtype::F32 => "f32", Dtype::Bf16 => "bf16" },
            "iters": b.iters, "warmup": b.warmup,
        });
        let reply = worker.request(&header, &[], b.timeout).map_err(|e| anyhow::anyhow!("{implementation}: {e}")).context("bench")?;
        let mut row = reply.header.clone();
        row.as_object_mut().map(|o| {
            o.remove("ok");
            o.remove("arrays");
        });
        rows.push(row);
    }
    let base_bytes = rows.first().and_then(|r| r["temp_bytes"].as_f64());
    let base_ms = rows.first().and_then(|r| r["median_ms"].as_f64());
    if bench.json {
        for r in &rows {
            println!("{}", serde_json::to_string(r)?);
        }
        return Ok(true);
    }
    println!(
        "{} at B={} T={} V={} H={} {} (mean over the tokens; {} timed steps after {} warmup)",
        bench.objective.name(),
        b.batch,
        b.time,
        b.vocab,
        b.hidden,
        match b.dtype {
            Dtype::F32 => "f32",
            Dtype::Bf16 => "bf16",
        },
        b.iters,
        b.warmup
    );
    println!("{:<28} {:>12} {:>8} {:>12} {:>8} {:>10}", "implementation", "temp GiB", "share", "median ms", "ratio", "compile s");
    for r in &rows {
        let bytes = r["temp_bytes"].as_f64();
        let ms = r["median_ms"].as_f64();
        let share = match (bytes, base_bytes) {
            (Some(x), Some(base)) if base > 0.0 => format!("{:.1}%", 100.0 * x / base),
            _ => "-".into(),
        };
        let ratio = match (ms, base_ms) {
            (Some(x), Some(base)) if base > 0.0 => format!("{:.2}x", x / base),
            _ => "-".into(),
        };
        println!(
            "{:<28} {:>12} {:>8} {:>12} {:>8} {:>10.1}",
            r["impl"].as_str().unwrap_or("?"),
            bytes.map_or("-".into(), |x| format!("{:.3}", x / (1u64 << 30) as f64)),
            share,
            ms.map_or("-".into(), |x| format!("{x:.0}")),
            ratio,
            r["compile_seconds"].as_f64().unwrap_or(f64::NAN)
        );
    }
    Ok(true)
}
