//! `grpo-verify gradcheck --fixture DIR`: implementations on a hidden-state
//! fixture (real or synthetic policy logits at production vocabulary),
//! judged by the same tolerance rule as generated cases, with per-token
//! diagnostics a person reads at a glance (report.md, report.json and a
//! self-contained report.html with plots).
//!
//! The configuration is the seed team's training step: logits temperature
//! mode at the fixture's sampling temperature, clip-higher 0.2 / 0.28,
//! token-mean, off-policy. The fixture's `old_logp` is the sampler's own, so
//! every ratio would be 1 and every token would sit inside the clip band;
//! `--ratio-noise s` (default 0.2) adds s * N(0, 1) to it at each valid
//! token, as after a few optimiser steps, so every clip region and both
//! advantage signs are populated.
//!
//! Fused implementations get `hidden` and `lm_head` (bf16); logits-kind ones
//! get the logits hidden @ lm_head formed exactly and rounded to bf16.

use std::fs;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use grpo_oracle::{Aggregation, Config, Forward, Hparams, Shape, TemperatureMode};
use rayon::prelude::*;
use serde::Serialize;
use serde_json::{json, Value};

use crate::case::{Case, CaseProblem, Dtype, Inputs, Kind, ShapeJson};
use crate::compare::Errors;
use crate::evaluate::{CaseResult, Evaluator, Outcome};
use crate::fixture::Fixture;
use crate::outputs::Outputs;
use crate::prng::Prng;

pub struct GradcheckOptions {
    /// Check the first `time` positions of every row (None: all of T).
    pub time: Option<usize>,
    pub ratio_noise: f64,
    pub seed: u64,
}

/// The built-ins gradcheck runs when no `--impl` is given.
pub const DEFAULT_IMPLS: [&str; 3] = ["reference", "fused_chunked", "pallas_logits"];

/// Rows of logits formed at a time for the logits-kind case (f64, 311 MB at V = 151936).
const LOGIT_BLOCK_ROWS: usize = 256;

/// The fixture's step as cases of both kinds (the logits case is formed only if needed).
pub struct FixtureCases {
    pub fused: Case,
    pub logits: Option<Case>,
    pub time: usize,
}

/// The seed team's training step at sampling temperature `temperature`:
/// logits mode, clip-higher 0.2 / 0.28, token-mean, off-policy, no KL, no
/// entropy bonus, one-sided (also what `bench-oracle --kind fused` times).
pub fn training_step(temperature: f64) -> (Config, Hparams) {
    let config = Config {
        temperature_mode: TemperatureMode::Logits,
        aggregation: Aggregation::TokenMean,
        on_policy: false,
        kl: false,
        entropy_bonus: false,
        two_sided: false,
    };
    let hparams = Hparams {
        eps_low: 0.2,
        eps_high: 0.28,
        temperature: temperature as f32 as f64,
        beta: 0.0,
        entropy_coef: 0.0,
        delta: f64::INFINITY,
        normalizer: 1.0,
    };
    (config, hparams)
}

/// The first `time` positions of every row: [B, T, W] -> [B, time, W].
fn prefix<T: Copy>(a: &[T], t_full: usize, time: usize, width: usize) -> Vec<T> {
    a.chunks(t_full * width).flat_map(|row| row[..time * width].iter().copied()).collect()
}

pub fn cases(fixture: &Fixture, lm_head: Vec<f32>, opts: &GradcheckOptions, need_logits: bool) -> Result<FixtureCases> {
    let time = opts.time.unwrap_or(fixture.time).min(fixture.time).max(1);
    let (b, h, v) = (fixture.batch, fixture.hidden_dim, fixture.vocab);
    let (config, hparams) = training_step(fixture.temperature);
    let mask = prefix(&fixture.mask, fixture.time, time, 1);
    let old_logp: Vec<f32> = prefix(&fixture.old_logp, fixture.time, time, 1)
        .iter()
        .enumerate()
        .map(|(i, &old)| {
            if mask[i] == 0.0 {
                old
            } else {
                (old as f64 + opts.ratio_noise * Prng::keyed(opts.seed, 41, i / time, i % time).normal()) as f32
            }
        })
        .collect();
    let fused = Case {
        shape: ShapeJson { batch: b, time, vocab: v },
        dtype: Dtype::Bf16,
        config,
        hparams,
        cotangent: 1.0,
        inputs: Inputs::Fused { hidden_dim: h, hidden: prefix(&fixture.hidden, fixture.time, time, h), lm_head },
        tokens: prefix(&fixture.tokens, fixture.time, time, 1),
        mask,
        advantages: fixture.advantages.clone(),
        old_logp: Some(old_logp),
        ref_logp: None,
        mesh: None,
    };
    let logits = need_logits.then(|| {
        let CaseProblem::Fused(problem) = fused.problem() else { unreachable!("the fixture case is fused") };
        // hidden @ lm_head formed exactly (blocked f64 products), rounded to bf16.
        let rows = b * time;
        let mut logits = vec![0.0f32; rows * v];
        let mut z = Vec::new();
        for (block, out) in logits.chunks_mut(LOGIT_BLOCK_ROWS * v).enumerate() {
            let block_rows: Vec<usize> = (block * LOGIT_BLOCK_ROWS..(block * LOGIT_BLOCK_ROWS + out.len() / v)).collect();
            z.resize(out.len(), 0.0);
            problem.logit_block(&block_rows, &mut z);
            out.par_iter_mut().zip(z.par_iter()).for_each(|(o, &zv)| *o = half::bf16::from_f64(zv).to_f32());
        }
        Case { inputs: Inputs::Logits { logits }, ..fused.clone() }
    });
    Ok(FixtureCases { fused, logits, time })
}

/// Where a token sits in the PPO objective (SPEC.md): the clip region of its
/// ratio and the sign of its advantage.
pub fn region(fwd: &Forward<'_>, row: usize) -> String {
    let st = &fwd.tokens[row];
    let r = st.log_ratio.exp();
    let (lo, hi) = (1.0 - fwd.hparams.eps_low, 1.0 + fwd.hparams.eps_high);
    let place = if st.ppo_interval.lo != st.ppo_interval.hi {
        "at a kink"
    } else if r <= lo {
        "r below the band"
    } else if r >= hi {
        "r above the band"
    } else {
        "r inside the band"
    };
    let sign = if st.advantage > 0.0 {
        "A>0"
    } else if st.advantage < 0.0 {
        "A<0"
    } else {
        "A=0"
    };
    format!("{place}, {sign}")
}

/// Per valid token: what the plots show.
#[derive(Clone, Debug, Serialize)]
pub struct TokenDiagnostic {
    pub b: usize,
    pub t: usize,
    /// |logp_impl - logp_oracle| (nats); None when logp is not returned.
    pub logp_error: Option<f64>,
    /// max |grad_impl - grad_oracle| over the token's gradient row (logits
    /// row, or d hidden row for the fused kind) over the row's max |grad_oracle|.
    pub grad_row_error: f64,
    pub region: String,
    /// max_v |z_v| of the token's logit row.
    pub logit_scale: f64,
}

/// The diagnostics of one implementation's outputs against the oracle
/// (its per-row gradient errors come from the comparison itself).
pub fn diagnostics(case: &Case, fwd: &Forward<'_>, out: &Outputs, errors: &Errors) -> Vec<TokenDiagnostic> {
    let shape: Shape = case.shape();
    let tau = fwd.hparams.temperature;
    let scale_of = |row: usize| {
        let st = &fwd.tokens[row];
        match fwd.config.temperature_mode {
            TemperatureMode::Logits => st.softmax.max_abs_x * tau,
            TemperatureMode::Logp => st.softmax.max_abs_x,
        }
    };
    (0..shape.rows())
        .filter(|&i| case.mask[i] != 0.0)
        .map(|row| TokenDiagnostic {
            b: row / shape.time,
            t: row % shape.time,
            logp_error: out.logp.as_ref().map(|l| (l[row] as f64 - fwd.tokens[row].logp).abs()),
            grad_row_error: errors.grad_row_errors[row],
            region: region(fwd, row),
            logit_scale: scale_of(row),
        })
        .collect()
}

/// One implementation's result on the fixture.
#[derive(Clone, Debug, Serialize)]
pub struct ImplGradcheck {
    pub implementation: String,
    pub kind: String,
    pub result: CaseResult,
    pub seconds: f64,
    #[serde(skip)]
    pub tokens: Vec<TokenDiagnostic>,
}

impl ImplGradcheck {
    pub fn passed(&self) -> bool {
        self.result.outcome == Outcome::Pass
    }
}

/// Runs every implementation on the fixture's case of its kind; the
/// oracle's forward pass of each case is made once.
pub fn run(eval: &mut Evaluator, cases: &FixtureCases, implementations: &[(String, Kind)]) -> Result<Vec<ImplGradcheck>> {
    let mut results = Vec::new();
    for kind in [Kind::Fused, Kind::Logits] {
        let wanted: Vec<&String> = implementations.iter().filter(|(_, k)| *k == kind).map(|(i, _)| i).collect();
        if wanted.is_empty() {
            continue;
        }
        let case = match kind {
            Kind::Fused => &cases.fused,
            Kind::Logits => cases.logits.as_ref().context("the logits case was not formed")?,
        };
        let problem = case.problem();
        let fwd = problem.forward().map_err(|e| anyhow::anyhow!("the fixture's {} case: {e}", kind.name()))?;
        for implementation in wanted {
            let started = Instant::now();
            let (result, out, errors) =
                eval.evaluate_on(implementation, case, &fwd).map_err(|e| anyhow::anyhow!("{implementation}: {e}"))?;
            let tokens = match (&out, &errors) {
                (Some(out), Some(errors)) => diagnostics(case, &fwd, out, errors),
                _ => Vec::new(),
            };
            results.push(ImplGradcheck {
                implementation: implementation.clone(),
                kind: kind.name().to_string(),
                result,
                seconds: started.elapsed().as_secs_f64(),
                tokens,
            });
        }
    }
    // In the order asked for.
    results.sort_by_key(|r| implementations.iter().position(|(i, _)| *i == r.implementation));
    Ok(results)
}

/// Quantiles of a list (for the tables): (p50, p99, max).
pub fn quantiles(values: &mut [f64]) -> (f64, f64, f64) {
    if values.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    values.sort_by(f64::total_cmp);
    let at = |q: f64| values[((values.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99), values[values.len() - 1])
}

/// report.json, report.md and report.html in `dir`.
pub fn write_report(dir: &Path, fixture: &Fixture, cases: &FixtureCases, results: &[ImplGradcheck], command: &str) -> Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let case = &cases.fused;
    let valid = case.mask.iter().filter(|&&m| m != 0.0).count();
    let summary = json!({
        "fixture": fixture.dir.display().to_string(),
        "synthetic": fixture.synthetic,
        "model": fixture.manifest["model"],
        "shape": {"batch": case.shape.batch, "time": cases.time, "fixture_time": fixture.time, "hidden": fixture.hidden_dim, "vocab": fixture.vocab},
        "valid_tokens": valid,
        "config": case.config,
        "hparams": case.hparams,
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
    let report = json!({"gradcheck": summary, "implementations": per_impl});
    fs::write(dir.join("report.json"), serde_json::to_string_pretty(&report)?)?;
    fs::write(dir.join("report.md"), markdown(fixture, cases, results, command))?;
    fs::write(dir.join("report.html"), crate::gradcheck_html::page(fixture, cases, results, command))?;
    Ok(())
}

fn markdown(fixture: &Fixture, cases: &FixtureCases, results: &[ImplGradcheck], command: &str) -> String {
    use std::fmt::Write;
    let case = &cases.fused;
    let mut w = String::new();
    let _ = writeln!(w, "# gradcheck: {}\n", fixture.name());
    let _ = writeln!(
        w,
        "{} fixture: B={} T={} (of {}) H={} V={}, {} valid tokens; {:?}-mode tau={}, {:?}, eps {}/{}, old_logp = the sampler's + noise.\n",
        if fixture.synthetic { "Synthetic" } else { "Model" },
        case.shape.batch,
        cases.time,
        fixture.time,
        fixture.hidden_dim,
        fixture.vocab,
        case.mask.iter().filter(|&&m| m != 0.0).count(),
        case.config.temperature_mode,
        case.hparams.temperature as f32,
        case.config.aggregation,
        case.hparams.eps_low,
        case.hparams.eps_high,
    );
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
    let _ = writeln!(w, "\nThe verdict is the tolerance rule of SPEC.md (docs/tolerance.md) on every quantity; the error columns are per-token diagnostics (plots in report.html).");
    w
}
