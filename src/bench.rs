//! `grpo-verify bench`: each implementation's compile time, median step time
//! of the value-and-grad step, and XLA's compiled memory analysis, side by
//! side, in one worker (one run, so ratios are comparable). The worker makes
//! the inputs itself with live ratios near 1 (docs/worker-protocol.md, `bench`).

use std::time::Duration;

use anyhow::{bail, Result};
use grpo_oracle::{Aggregation, Config, Hparams, TemperatureMode};
use serde_json::{json, Value};

use crate::case::{AdvantagePattern, CaseSpec, Dtype, LogitPattern, MaskPattern, NormalizerChoice, RatioPattern, TokenPattern};
use crate::host::{Worker, WorkerError};
use crate::outputs::op_header;

pub struct BenchOptions {
    pub batch: usize,
    pub time: usize,
    pub vocab: usize,
    pub hidden: usize,
    pub dtype: Dtype,
    pub iters: u32,
    pub warmup: u32,
    pub timeout: Duration,
}

/// The configuration benchmarked: the seed team's training setup (SPEC's
/// logits temperature mode, clip-higher eps 0.2 / 0.28, off-policy, the loss
/// summed and divided by a global token count, no KL, no entropy bonus).
pub fn bench_spec(o: &BenchOptions) -> CaseSpec {
    CaseSpec {
        batch: o.batch,
        time: o.time,
        vocab: o.vocab,
        hidden: o.hidden,
        dtype: o.dtype,
        config: Config {
            temperature_mode: TemperatureMode::Logits,
            aggregation: Aggregation::SumOverConstant,
            on_policy: false,
            kl: false,
            entropy_bonus: false,
            two_sided: false,
        },
        hparams: Hparams { eps_low: 0.2, eps_high: 0.28, temperature: 1.0, beta: 0.0, entropy_coef: 0.0, delta: f64::INFINITY, normalizer: 1.0 },
        normalizer: NormalizerChoice::BatchTimesTime,
        logits: LogitPattern::Normal { scale: 1.0 },
        tokens: TokenPattern::Random,
        mask: MaskPattern::Full,
        ratios: RatioPattern::NearOne,
        advantages: AdvantagePattern::Mixed,
        masked_garbage: false,
        cotangent: 1.0,
        seed: 0,
    }
}

/// One implementation's figures, as `bench --json` prints them (CLI.md).
pub fn bench_one(worker: &mut Worker, implementation: &str, kind: &str, o: &BenchOptions) -> Result<Value> {
    let spec = bench_spec(o);
    let mut header = op_header("bench", implementation, &spec.config, &spec.resolved_hparams(o.batch * o.time));
    header["specs"] = Value::Array(
        spec.array_specs(kind).into_iter().map(|(n, d, s)| json!({"name": n, "dtype": d, "shape": s})).collect(),
    );
    header["iters"] = json!(o.iters);
    header["warmup"] = json!(o.warmup);
    header["seed"] = json!(0);
    let reply = match worker.request(&header, &[], o.timeout) {
        Ok(r) => r.header,
        Err(WorkerError::Reply { kind, message, .. }) => bail!("--impl {implementation}: bench failed ({kind}): {message}"),
        Err(e) => bail!("--impl {implementation}: {e}"),
    };
    let mut line = json!({
        "impl": implementation,
        "kind": kind,
        "shape": {"batch": o.batch, "time": o.time, "vocab": o.vocab, "hidden": if kind == "fused" { json!(o.hidden) } else { Value::Null }},
        "dtype": o.dtype.name(),
        "iters": o.iters,
        "warmup": o.warmup,
    });
    for key in ["first_call_s", "avg_step_ms", "temp_bytes", "peak_bytes", "argument_bytes", "output_bytes", "generated_code_bytes", "step_ms"] {
        line[key] = reply.get(key).cloned().unwrap_or(Value::Null);
    }
    Ok(line)
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
    }
    out
}
