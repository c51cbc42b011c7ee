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

pub mod cases;
pub mod fixture;
pub mod html;
pub mod plots;
pub mod report;
pub mod run;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};

use crate::case::Kind;
use crate::evaluate::Evaluator;
use crate::gradcheck::cases::{check_preset_fits, GradcheckOptions, PRESET_TOKEN_BLOCK};
use crate::gradcheck::fixture::LmHeadError;

/// What `grpo-verify gradcheck` was asked (flags already checked).
pub struct GradcheckRequest {
    /// The fixture directory, or the production preset to make one from.
    pub fixture: Option<PathBuf>,
    /// A production preset to make the fixture from (`--preset`).
    pub preset: Option<String>,
    /// Empty: the built-ins `hello` marks as gradcheck defaults (of the
    /// fused kind for a preset).
    pub implementations: Vec<String>,
    /// Where report.json, report.md and report.html go.
    pub report_dir: PathBuf,
    /// Where the fixture's checkpoint is (None: where its manifest says).
    pub model_dir: Option<PathBuf>,
    /// How long one implementation's run may take.
    pub timeout: Duration,
    /// How the case is formed.
    pub opts: GradcheckOptions,
    /// The part of the implementations this run checks (`--partition K/N`).
    pub partition: crate::partition::Partition,
}

/// `grpo-verify gradcheck`: the fixture (or a preset's), the implementations
/// on its step, the report, and the verdict (`Ok(false)`: a failure).
pub fn command(mut req: GradcheckRequest) -> Result<bool> {
    let env = crate::worker::pyenv::resolve()?;
    let fixture_dir = match &req.preset {
        Some(name) => {
            let p = fixture::production_preset(name)?;
            let token_block = *req.opts.token_block.get_or_insert(PRESET_TOKEN_BLOCK);
            check_preset_fits(p, token_block)?;
            fixture::preset_fixture(&env, p, req.opts.seed, &PathBuf::from("target/grpo-verify/presets"))?
        }
        None => req.fixture.clone().expect("clap requires --fixture without --preset"),
    };
    let fx = fixture::load(&fixture_dir)?;
    let mut eval = Evaluator::start(req.timeout, 1)?;
    if req.implementations.is_empty() {
        let wanted = |k: Kind| req.preset.is_none() || k == Kind::Fused;
        req.implementations =
            eval.worker.builtins().into_iter().filter(|b| b.gradcheck_default && wanted(b.kind)).map(|b| b.name).collect();
    }
    let all = req.implementations.len();
    req.implementations = req.partition.keep(std::mem::take(&mut req.implementations));
    if req.implementations.is_empty() {
        bail!("--partition {}: the run's {all} implementations make at most {all} parts, and this one would hold none", req.partition);
    }
    let kinds = eval.worker.load_all(&req.implementations)?;
    let lm_head = fixture::lm_head(&env, &fx, req.model_dir.as_deref(), &std::env::temp_dir()).map_err(|e| match e {
        LmHeadError::CheckpointAbsent(m) => anyhow::anyhow!(
            "--fixture {}: its checkpoint is absent on this machine, so it cannot be checked here. {m}",
            fixture_dir.display()
        ),
        other => anyhow::anyhow!("--fixture {}: {other}", fixture_dir.display()),
    })?;
    let mut cases = cases::cases(&fx, lm_head, &req.opts, kinds.contains(&Kind::Logits))?;
    let pairs: Vec<(String, Kind)> = req.implementations.into_iter().zip(kinds).collect();
    let results = run::run(&mut eval, &mut cases, &pairs)?;
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    report::write_report(&req.report_dir, &fx, &cases, &results, &command, req.partition)?;
    print!("{}", std::fs::read_to_string(req.report_dir.join("report.md")).unwrap_or_default());
    println!("\nreport: {}", req.report_dir.join("report.html").display());
    Ok(results.iter().all(|r| r.passed()))
}
