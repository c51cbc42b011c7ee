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

pub mod fixture;
pub mod html;
pub mod plots;

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
use crate::gradcheck::fixture::Fixture;
use crate::worker::outputs::Outputs;
use crate::case::prng::Prng;

pub struct GradcheckOptions {
    /// Check the first `time` positions of every row (None: all of T).
    pub time: Option<usize>,
    pub ratio_noise: f64,
    pub seed: u64,
    /// Run the step as micro-batches of this many positions (None: whole).
    pub token_block: Option<usize>,
}

/// The built-ins gradcheck runs when no `--impl` is given.
pub const DEFAULT_IMPLS: [&str; 3] = ["reference", "fused_chunked", "pallas_logits"];

/// Positions per micro-batch of a production preset (`--token-block`).
pub const PRESET_TOKEN_BLOCK: usize = 1024;

/// What a preset's gradcheck holds at its peak, in both processes: lm_head
/// (f32 here, bf16 twice in the worker), two implementations' d lm_head
/// (f32 here; in the worker and on the wire), and the plain baseline's
/// temporaries for one micro-batch (about 16 bytes per logit).
pub fn preset_peak_bytes(p: &crate::gradcheck::fixture::ProductionPreset, token_block: usize) -> u64 {
    let head = (p.hidden * p.vocab) as u64;
    34 * head + 16 * (p.vocab * token_block.min(p.time)) as u64
}

/// Exit 2 (a clear error naming the preset) when the preset's peak cannot
/// fit in the memory this machine can give (`GRPO_VERIFY_HOST_MEMORY_GIB`
/// or MemAvailable).
pub fn check_preset_fits(p: &crate::gradcheck::fixture::ProductionPreset, token_block: usize) -> Result<()> {
    let need = preset_peak_bytes(p, token_block);
    if let Some(have) = crate::bench::available_host_bytes()? {
        if need > have {
            let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
            anyhow::bail!(
                "--preset {}: B={} T={} H={} V={} needs about {:.1} GiB at its peak (lm_head and two d lm_head in both processes, \
                 the baseline's temporaries for {} positions) and this machine can give {:.1} GiB; run it on a larger machine \
                 or set GRPO_VERIFY_HOST_MEMORY_GIB if more is free than MemAvailable says",
                p.name, p.batch, p.time, p.hidden, p.vocab, gib(need), token_block, gib(have)
            );
        }
    }
    Ok(())
}

/// Rows of logits formed at a time for the logits-kind case (f64, 311 MB at V = 151936).
const LOGIT_BLOCK_ROWS: usize = 256;

/// The fixture's step as cases of both kinds (the logits case is formed only if needed).
pub struct FixtureCases {
    pub fused: Case,
    /// The whole step's logits case (None when not needed, or when the step
    /// runs in micro-batches: each forms its own).
    pub logits: Option<Case>,
    pub time: usize,
    /// Micro-batches of this many positions, when the step is split.
    pub token_block: Option<usize>,
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
    let token_block = opts.token_block.filter(|&tb| tb < time);
    let logits = (need_logits && token_block.is_none()).then(|| logits_case(&fused));
    Ok(FixtureCases { fused, logits, time, token_block })
}

/// The logits-kind twin of a fused case: hidden @ lm_head formed exactly
/// (blocked f64 products), rounded to bf16.
fn logits_case(fused: &Case) -> Case {
    let CaseProblem::Fused(problem) = fused.problem() else { unreachable!("the fixture case is fused") };
    let (rows, v) = (fused.shape.batch * fused.shape.time, fused.shape.vocab);
    let mut logits = vec![0.0f32; rows * v];
    let mut z = Vec::new();
    for (block, out) in logits.chunks_mut(LOGIT_BLOCK_ROWS * v).enumerate() {
        let block_rows: Vec<usize> = (block * LOGIT_BLOCK_ROWS..(block * LOGIT_BLOCK_ROWS + out.len() / v)).collect();
        z.resize(out.len(), 0.0);
        problem.logit_block(&block_rows, &mut z);
        out.par_iter_mut().zip(z.par_iter()).for_each(|(o, &zv)| *o = half::bf16::from_f64(zv).to_f32());
    }
    fused.with_inputs(Inputs::Logits { logits })
}

/// Positions `range` of every row of a token-mean fused case, as a complete
/// micro-batch: the same sum over its tokens divided by the whole step's
/// valid-token count (`sum_over_constant`), so the micro-batches' losses
/// and gradients add up to the whole step's. lm_head is moved in (and must
/// be moved back with [`restore_lm_head`]): at production shapes it is GBs.
fn micro_batch(full: &mut Case, range: std::ops::Range<usize>) -> Case {
    let (b, t_full) = (full.shape.batch, full.shape.time);
    let valid = full.mask.iter().filter(|&&m| m != 0.0).count().max(1);
    let rows = |a: &[f32], width: usize| -> Vec<f32> {
        (0..b).flat_map(|r| a[(r * t_full + range.start) * width..(r * t_full + range.end) * width].iter().copied()).collect()
    };
    let Inputs::Fused { hidden_dim, hidden, lm_head } = &mut full.inputs else { unreachable!("the fixture case is fused") };
    let h = *hidden_dim;
    let inputs = Inputs::Fused { hidden_dim: h, hidden: rows(hidden, h), lm_head: std::mem::take(lm_head) };
    let tokens: Vec<i32> = (0..b).flat_map(|r| full.tokens[r * t_full + range.start..r * t_full + range.end].iter().copied()).collect();
    let mut config = full.config;
    config.aggregation = Aggregation::SumOverConstant;
    Case {
        shape: ShapeJson { batch: b, time: range.len(), vocab: full.shape.vocab },
        dtype: full.dtype,
        config,
        hparams: Hparams { normalizer: valid as f64, ..full.hparams },
        cotangent: full.cotangent,
        inputs,
        tokens,
        mask: rows(&full.mask, 1),
        advantages: full.advantages.clone(),
        old_logp: full.old_logp.as_ref().map(|o| rows(o, 1)),
        ref_logp: full.ref_logp.as_ref().map(|r| rows(r, 1)),
        mesh: full.mesh,
    }
}

/// Moves a micro-batch's lm_head back into the whole step's case.
fn restore_lm_head(full: &mut Case, micro: Case) {
    if let (Inputs::Fused { lm_head, .. }, Inputs::Fused { lm_head: from, .. }) = (&mut full.inputs, micro.inputs) {
        *lm_head = from;
    }
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

/// Runs every implementation on the fixture's step (whole, or micro-batch
/// by micro-batch when `cases.token_block` says so).
pub fn run(eval: &mut Evaluator, cases: &mut FixtureCases, implementations: &[(String, Kind)]) -> Result<Vec<ImplGradcheck>> {
    let Some(tb) = cases.token_block else {
        return run_cases(eval, &cases.fused, cases.logits.as_ref(), implementations);
    };
    let need_logits = implementations.iter().any(|(_, k)| *k == Kind::Logits);
    let mut merged: Vec<ImplGradcheck> = Vec::new();
    for start in (0..cases.time).step_by(tb) {
        let range = start..(start + tb).min(cases.time);
        let micro = micro_batch(&mut cases.fused, range.clone());
        let logits = need_logits.then(|| logits_case(&micro));
        let results = run_cases(eval, &micro, logits.as_ref(), implementations);
        restore_lm_head(&mut cases.fused, micro);
        for mut r in results? {
            r.tokens.iter_mut().for_each(|t| t.t += range.start);
            let label = format!("positions {}..{}", range.start, range.end);
            match merged.iter_mut().find(|m| m.implementation == r.implementation) {
                Some(m) => m.absorb(r, &label),
                None => {
                    r.result.reason = labelled(&label, &r.result.reason);
                    merged.push(r)
                }
            }
        }
    }
    Ok(merged)
}

fn labelled(label: &str, reason: &str) -> String {
    if reason.is_empty() {
        String::new()
    } else {
        format!("{label}: {reason}")
    }
}

impl ImplGradcheck {
    /// Adds another micro-batch's result: any failure fails the whole, each
    /// quantity keeps its worst verdict (by error over bound).
    fn absorb(&mut self, other: ImplGradcheck, label: &str) {
        let (mine, theirs) = (&mut self.result, other.result);
        if theirs.outcome == Outcome::Fail || (theirs.outcome == Outcome::Unsupported && mine.outcome == Outcome::Pass) {
            mine.outcome = theirs.outcome.clone();
        }
        let reason = labelled(label, &theirs.reason);
        if !reason.is_empty() {
            mine.reason = if mine.reason.is_empty() { reason } else { format!("{}; {reason}", mine.reason) };
        }
        for v in theirs.verdicts {
            let ratio = |v: &crate::compare::Verdict| if v.bound > 0.0 { v.err / v.bound } else { v.err };
            match mine.verdicts.iter_mut().find(|m| m.quantity == v.quantity) {
                Some(m) if ratio(&v) > ratio(m) => *m = v,
                Some(_) => {}
                None => mine.verdicts.push(v),
            }
        }
        mine.seconds += theirs.seconds;
        mine.compiled |= theirs.compiled;
        self.seconds += other.seconds;
        self.tokens.extend(other.tokens);
    }
}

/// Runs every implementation on the case of its kind; the oracle's forward
/// pass of each case is made once.
fn run_cases(eval: &mut Evaluator, fused: &Case, logits: Option<&Case>, implementations: &[(String, Kind)]) -> Result<Vec<ImplGradcheck>> {
    let mut results = Vec::new();
    for kind in [Kind::Fused, Kind::Logits] {
        let wanted: Vec<&String> = implementations.iter().filter(|(_, k)| *k == kind).map(|(i, _)| i).collect();
        if wanted.is_empty() {
            continue;
        }
        let case = match kind {
            Kind::Fused => fused,
            Kind::Logits => logits.context("the logits case was not formed")?,
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
        "token_block": cases.token_block,
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
    fs::write(dir.join("report.html"), crate::gradcheck::html::page(fixture, cases, results, command))?;
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
    if let Some(tb) = cases.token_block {
        let _ = writeln!(
            w,
            "Run as {} micro-batches of {tb} positions, each a complete case whose loss is its tokens' sum over the whole step's valid-token count \
             (the micro-batches add up to the token-mean step; `suites/sharded.rs` checks that identity). Every implementation and its plain baseline \
             run on each, and each is judged by the rule on its own: the plain baselines do not fit in this machine's memory at T = {}.\n",
            cases.time.div_ceil(tb),
            cases.time
        );
    }
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
