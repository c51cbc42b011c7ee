//! `grpo-verify bench`: each implementation's compile time, median step time
//! of the value-and-grad step, and XLA's compiled memory analysis, side by
//! side, in one worker (one run, so ratios are comparable). The worker makes
//! the inputs itself with live ratios near 1 (docs/worker-protocol.md, `bench`).

pub mod fused_oracle;
pub mod oracle;
pub mod wandb;

use std::time::Duration;

use anyhow::{bail, Context, Result};
use grpo_oracle::{Aggregation, Config};
use serde_json::{json, Value};

use crate::case::{AdvantagePattern, CaseSpec, Dtype, Kind, LogitPattern, MaskPattern, NormalizerChoice, RatioPattern, TokenPattern};
use crate::worker::process::{Worker, WorkerError};
use crate::worker::protocol::shapes_request;

/// The seed team's benchmark shapes, by name: `bench --preset NAME`.
pub struct Preset {
    /// Its `--preset` name.
    pub name: &'static str,
    /// The kind it benchmarks.
    pub kind: Kind,
    /// B.
    pub batch: usize,
    /// T.
    pub time: usize,
    /// V.
    pub vocab: usize,
    /// H (fused kind).
    pub hidden: usize,
    /// What the shape is, in a few words.
    pub what: &'static str,
}

/// The seed team's shapes (docs/figures.md, "The seed team's shapes").
pub const PRESETS: &[Preset] = &[
    Preset { name: "seed-b1-t2048", kind: Kind::Logits, batch: 1, time: 2048, vocab: 151_643, hidden: 1536, what: "logits kind, B=1 T=2048 V=151643" },
    Preset { name: "seed-b4-t1024", kind: Kind::Logits, batch: 4, time: 1024, vocab: 151_643, hidden: 1536, what: "logits kind, B=4 T=1024 V=151643" },
    Preset { name: "seed-b1-t4096", kind: Kind::Logits, batch: 1, time: 4096, vocab: 151_936, hidden: 1536, what: "logits kind, B=1 T=4096 V=151936" },
    Preset { name: "seed-fused-t8192", kind: Kind::Fused, batch: 1, time: 8192, vocab: 151_936, hidden: 4096, what: "fused kind, B=1 T=8192 H=4096 V=151936" },
];

/// The preset named `name`.
pub fn preset(name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.name == name)
}

/// The built-ins a preset benchmarks when no `--impl` is given: its kind's
/// baseline first (the base of the ratios), then the single-device kernels,
/// as the worker's `hello` lists them.
pub fn default_impls(worker: &Worker, kind: Kind) -> Result<Vec<String>> {
    let baseline = worker.baseline(kind)?;
    let others: Vec<String> =
        worker.builtins().into_iter().filter(|b| b.kind == kind && !b.sharded && b.name != baseline).map(|b| b.name).collect();
    Ok(std::iter::once(baseline).chain(others).collect())
}

/// Bytes this machine can give a run: `GRPO_VERIFY_HOST_MEMORY_GIB` when
/// set, else MemAvailable of /proc/meminfo (None where there is no such
/// file; then nothing is skipped).
pub fn available_host_bytes() -> Result<Option<u64>> {
    if let Ok(text) = std::env::var("GRPO_VERIFY_HOST_MEMORY_GIB") {
        let gib: f64 = text.trim().parse().ok().filter(|g: &f64| g.is_finite() && *g >= 0.0).with_context(|| {
            format!("GRPO_VERIFY_HOST_MEMORY_GIB = {text:?}: expected a number of GiB >= 0")
        })?;
        return Ok(Some((gib * GIB) as u64));
    }
    Ok(meminfo_available())
}

fn meminfo_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// What a compiled step needs while it runs: its arguments, outputs and
/// XLA's temporaries, plus the inputs' generation (about one more argument set).
pub fn run_bytes(line: &Value) -> Option<u64> {
    let get = |k: &str| line[k].as_u64();
    Some(2 * get("argument_bytes")? + get("output_bytes")? + get("temp_bytes")?)
}

/// Headroom kept free when deciding whether a step can run on the host.
pub const HOST_HEADROOM: f64 = 0.8;

/// What one `bench` measures (docs/cli.md, `bench`).
pub struct BenchOptions {
    /// B.
    pub batch: usize,
    /// T.
    pub time: usize,
    /// V.
    pub vocab: usize,
    /// H (fused kind).
    pub hidden: usize,
    /// The float inputs' dtype.
    pub dtype: Dtype,
    /// Timed steps after the warm-up (0: compile only).
    pub iters: u32,
    /// Untimed steps first.
    pub warmup: u32,
    /// How long one implementation's measurement may take.
    pub timeout: Duration,
    /// On a CPU backend, run only what fits in this many bytes (compile-only otherwise).
    pub host_budget: Option<u64>,
}

/// The configuration benchmarked: the seed team's training setup (SPEC's
/// logits temperature mode, clip-higher eps 0.2 / 0.28, off-policy, the loss
/// summed and divided by a global token count, no KL, no entropy bonus).
pub fn bench_spec(o: &BenchOptions) -> CaseSpec {
    let (step, hparams) = crate::case::training_step(1.0);
    CaseSpec {
        batch: o.batch,
        time: o.time,
        vocab: o.vocab,
        hidden: o.hidden,
        dtype: o.dtype,
        config: Config { aggregation: Aggregation::SumOverConstant, ..step },
        hparams,
        normalizer: NormalizerChoice::BatchTimesTime,
        logits: LogitPattern::Normal { scale: 1.0 },
        tokens: TokenPattern::Random,
        mask: MaskPattern::Full,
        ratios: RatioPattern::NearOne,
        advantages: AdvantagePattern::Mixed,
        masked_garbage: false,
        cotangent: 1.0,
        seed: 0,
        mesh: None,
        preset: None,
        is_weights: None,
        is_weights_per_row: false,
        kl_pattern: crate::case::KlPattern::Near,
        real: false,
    }
}

/// One implementation's figures, as `bench --json` prints them (docs/cli.md).
/// With a host budget, the step is compiled first and run only if what it
/// needs fits; otherwise the line is compile-only, with a note saying why.
pub fn bench_one(worker: &mut Worker, implementation: &str, kind: Kind, o: &BenchOptions) -> Result<Value> {
    let mut note = Value::Null;
    let mut iters = o.iters;
    let reply = match o.host_budget {
        Some(budget) if o.iters > 0 => {
            let compiled = request(worker, implementation, kind, o, 0)?;
            let needs = run_bytes(&compiled).unwrap_or(0);
            if needs as f64 > HOST_HEADROOM * budget as f64 {
                iters = 0;
                note = json!(format!(
                    "compile-only: the step needs {:.1} GiB and this host has {:.1} GiB available",
                    needs as f64 / GIB,
                    budget as f64 / GIB
                ));
                compiled
            } else {
                request(worker, implementation, kind, o, o.iters)?
            }
        }
        _ => request(worker, implementation, kind, o, o.iters)?,
    };
    let mut line = json!({
        "impl": implementation,
        "kind": kind.name(),
        "shape": {"batch": o.batch, "time": o.time, "vocab": o.vocab, "hidden": if kind == Kind::Fused { json!(o.hidden) } else { Value::Null }},
        "dtype": o.dtype.name(),
        "iters": iters,
        "warmup": o.warmup,
        "compile_only": iters == 0,
        "note": note,
    });
    for key in ["first_call_s", "avg_step_ms", "temp_bytes", "peak_bytes", "argument_bytes", "output_bytes", "generated_code_bytes", "step_ms"] {
        line[key] = reply.get(key).cloned().unwrap_or(Value::Null);
    }
    Ok(line)
}

const GIB: f64 = (1u64 << 30) as f64;

/// One `bench` request to the worker (docs/worker-protocol.md).
fn request(worker: &mut Worker, implementation: &str, kind: Kind, o: &BenchOptions, iters: u32) -> Result<Value> {
    let version = worker.spec_version(implementation)?;
    let mut header = shapes_request("bench", implementation, &bench_spec(o), kind, version);
    header["iters"] = json!(iters);
    header["warmup"] = json!(o.warmup);
    header["seed"] = json!(0);
    match worker.request(&header, &[], o.timeout) {
        Ok(r) => Ok(r.header),
        Err(WorkerError::Reply { kind, message, .. }) => bail!("--impl {implementation}: bench failed ({kind}): {message}"),
        Err(e) => bail!("--impl {implementation}: {e}"),
    }
}

/// A table for people: one row per implementation, ratios to the first.
pub fn table(lines: &[Value]) -> String {
    let gib = |v: &Value| v.as_f64().map_or("-".to_string(), |b| format!("{:.3}", b / (1u64 << 30) as f64));
    let num = |v: &Value, digits: usize| v.as_f64().map_or("-".to_string(), |x| format!("{x:.digits$}"));
    let first = &lines[0];
    let ratio = |v: &Value, base: &Value| match (v.as_f64(), base.as_f64()) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.3}", a / b),
        _ => "-".into(),
    };
    let mut out = format!(
        "{:<22} {:>12} {:>12} {:>10} {:>14} {:>10} {:>10}\n",
        "impl", "first_call_s", "avg_step_ms", "step ratio", "temp GiB", "mem ratio", "peak GiB"
    );
    let mut notes = String::new();
    for l in lines {
        out += &format!(
            "{:<22} {:>12} {:>12} {:>10} {:>14} {:>10} {:>10}\n",
            l["impl"].as_str().unwrap_or("?"),
            num(&l["first_call_s"], 2),
            num(&l["avg_step_ms"], 1),
            ratio(&l["avg_step_ms"], &first["avg_step_ms"]),
            gib(&l["temp_bytes"]),
            ratio(&l["temp_bytes"], &first["temp_bytes"]),
            gib(&l["peak_bytes"]),
        );
        if let Some(n) = l["note"].as_str() {
            notes += &format!("{}: {n}\n", l["impl"].as_str().unwrap_or("?"));
        }
    }
    out + &notes
}

/// What `grpo-verify bench` was asked (flags already checked; the shape is
/// the preset's when there is one).
pub struct BenchRequest {
    /// Empty: the preset's defaults ([`default_impls`]).
    pub implementations: Vec<String>,
    /// The shape by name (`--preset`), or None: the flags'.
    pub preset: Option<&'static Preset>,
    /// `--kind`: every implementation must be of it.
    pub kind: Option<Kind>,
    /// One JSON object per implementation instead of the table.
    pub json: bool,
    /// Log the figures to Weights & Biases.
    pub wandb: Option<wandb::WandbOptions>,
    /// Host budget left None: filled in on a CPU backend.
    pub opts: BenchOptions,
}

/// `grpo-verify bench`: one worker, every implementation in turn, a table
/// (or one JSON line each), and the figures logged to W&B if asked.
pub fn command(mut req: BenchRequest) -> Result<bool> {
    let env = crate::worker::pyenv::resolve()?;
    if req.wandb.is_some() {
        wandb::check_available(&env)?;
    }
    let mut worker = Worker::start(&env).map_err(|e| anyhow::anyhow!("{e}"))?;
    if worker.hello["backend"].as_str() == Some("cpu") {
        req.opts.host_budget = available_host_bytes()?;
    }
    let implementations = match (req.implementations.is_empty(), req.preset) {
        (true, Some(p)) => default_impls(&worker, p.kind)?,
        _ => req.implementations,
    };
    let mut lines = Vec::new();
    for implementation in &implementations {
        let k = worker.load(implementation)?;
        if let Some(want) = req.kind.or(req.preset.map(|p| p.kind)) {
            if want != k {
                bail!("--impl {implementation} is of the {k} kind, not {want}");
            }
        }
        let mut line = bench_one(&mut worker, implementation, k, &req.opts)?;
        line["preset"] = json!(req.preset.map(|p| p.name));
        line["backend"] = worker.hello["backend"].clone();
        if req.json {
            println!("{line}");
        }
        lines.push(line);
    }
    if !req.json {
        print!("{}", table(&lines));
    }
    if let Some(w) = &req.wandb {
        let o = &req.opts;
        let group = req.preset.map_or_else(|| format!("B{}-T{}-V{}", o.batch, o.time, o.vocab), |p| p.name.to_string());
        let runs: Vec<Value> = lines.iter().map(|l| wandb::bench_run(l, &group)).collect();
        wandb::log_runs(&env, w, &runs)?;
    }
    Ok(true)
}

/// What `grpo-verify bench-oracle` was asked (flags already checked).
pub struct OracleBenchRequest {
    /// Logits or fused oracle.
    pub kind: Kind,
    /// Rows (tokens) timed.
    pub rows: usize,
    /// V.
    pub vocab: usize,
    /// The fused kind's H (default 1536); refused for the logits kind.
    pub hidden: Option<usize>,
    /// Repetitions; the median is reported.
    pub reps: usize,
    /// The inputs' seed.
    pub seed: u64,
    /// One JSON object instead of the summary.
    pub json: bool,
    /// Log the figures to Weights & Biases.
    pub wandb: Option<wandb::WandbOptions>,
}

/// `grpo-verify bench-oracle`: the f64 oracle's own speed, the logits kind
/// against NumPy (optionally logged to W&B) or the fused kind's sweep.
pub fn oracle_command(req: OracleBenchRequest) -> Result<bool> {
    let OracleBenchRequest { kind, rows, vocab, hidden, reps, seed, json, wandb } = req;
    match kind {
        Kind::Fused => {
            if wandb.is_some() {
                bail!("--wandb-project: bench-oracle logs the logits kind only (--kind logits)");
            }
            let opts = fused_oracle::FusedBenchOptions { rows, hidden: hidden.unwrap_or(1536), vocab, seed, reps };
            print_figures(&fused_oracle::run(&opts)?, json, fused_oracle::summary);
        }
        Kind::Logits => {
            if hidden.is_some() {
                bail!("--hidden: only with --kind fused");
            }
            let env = crate::worker::pyenv::resolve()?;
            if wandb.is_some() {
                wandb::check_available(&env)?;
            }
            let result = oracle::run(&env, &oracle::OracleBenchOptions { rows, vocab, seed, reps })?;
            print_figures(&result, json, oracle::summary);
            if let Some(w) = &wandb {
                wandb::log_runs(&env, w, &[wandb::oracle_run(&result)])?;
            }
        }
    }
    Ok(true)
}

/// The figures as one JSON line (`--json`) or as the summary a person reads.
fn print_figures(result: &Value, json: bool, summary: fn(&Value) -> String) {
    if json {
        println!("{result}");
    } else {
        print!("{}", summary(result));
    }
}
