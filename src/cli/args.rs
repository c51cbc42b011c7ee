//! The flag groups and value types the subcommands share: dtypes, shape
//! bounds, `check`'s run flags, the declared-run flags of `necessity` and
//! `tightness`, and W&B logging.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::ValueEnum;

use crate::case::strategy::Bounds;
use crate::case::Dtype;
use crate::report;
use crate::repro::canonical_impl;

use super::{at_least_one, positive_seconds};

/// `gradcheck`'s and `bench`'s one dtype.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum GradcheckDtype {
    /// IEEE single precision.
    F32,
    /// bfloat16.
    Bf16,
}

impl GradcheckDtype {
    /// The dtype it names.
    pub fn dtype(self) -> Dtype {
        match self {
            GradcheckDtype::F32 => Dtype::F32,
            GradcheckDtype::Bf16 => Dtype::Bf16,
        }
    }
}

/// The dtypes a run draws.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum DtypeArg {
    /// f32 only.
    F32,
    /// bf16 only.
    Bf16,
    /// Both.
    All,
}

/// `check`'s bounds on a generated case's shape (and `sensitivity`'s, which runs `check`).
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct ShapeBounds {
    #[arg(long, default_value_t = 4)]
    pub(super) max_batch: usize,
    #[arg(long, default_value_t = 48)]
    pub(super) max_time: usize,
    #[arg(long, default_value_t = 4100)]
    pub(super) max_vocab: usize,
    #[arg(long, default_value_t = 256)]
    pub(super) max_hidden: usize,
}

/// What a command that runs `check` on a wrapped implementation takes
/// beside its own flags (`sensitivity`, `necessity`).
#[derive(clap::Args, Debug, Clone)]
pub struct CheckRunArgs {
    #[command(flatten)]
    pub(super) shape: ShapeBounds,
    /// Default: target/grpo-verify/<timestamp>/
    #[arg(long)]
    pub(super) report: Option<PathBuf>,
    #[arg(long, default_value_t = 600.0, env = "GRPO_VERIFY_CASE_TIMEOUT")]
    pub(super) case_timeout: f64,
}

/// `necessity`'s and `tightness`'s flags: one implementation, checked
/// under declarations.
#[derive(clap::Args, Debug, Clone)]
pub struct DeclaredRunArgs {
    #[arg(long = "impl")]
    implementation: String,
    /// Generated cases a check.
    #[arg(long, default_value_t = 60)]
    cases: u32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long, value_enum, default_value_t = DtypeArg::Bf16)]
    dtype: DtypeArg,
    #[command(flatten)]
    objective: ObjectiveArgs,
    #[command(flatten)]
    run: CheckRunArgs,
}

/// What a run draws (`check`, `necessity`, `tightness`): the objectives
/// and the pins on them.
#[derive(clap::Args, Debug, Clone)]
pub struct ObjectiveArgs {
    /// SPEC v2 objectives to draw: `all` (every switch, free and the
    /// presets), a preset (`grpo-verify presets` lists them) or `v1` (the
    /// default: v1 switches only).
    #[arg(long, help = objective_help())]
    objective: Option<String>,
    /// Pin one switch, NAME=VALUE (e.g. ratio_level=sequence,
    /// temperature_mode=logp, kl=true). Repeatable.
    #[arg(long = "switch")]
    switches: Vec<String>,
    /// Pin one hyperparameter, NAME=VALUE (e.g. kl_max=10,
    /// log_ratio_max=inf). Repeatable.
    #[arg(long = "hparam")]
    hparams: Vec<String>,
}

impl ObjectiveArgs {
    /// The head loss `--objective` names (cross_entropy, distillation), if
    /// it names one; `--switch` and `--hparam` are GRPO's and are refused beside it.
    pub(super) fn head(&self) -> Result<Option<crate::head::case::HeadObjective>> {
        let Some(objective) = self.objective.as_deref().and_then(crate::head::case::HeadObjective::named) else { return Ok(None) };
        if let Some(flag) = self.switches.first().map(|s| format!("--switch {s}")).or(self.hparams.first().map(|h| format!("--hparam {h}"))) {
            anyhow::bail!("{flag}: GRPO's switches and hyperparameters do not apply to --objective {}", objective.name());
        }
        Ok(Some(objective))
    }

    /// The objective the flags name, its pins applied.
    pub(super) fn parse(&self) -> Result<crate::case::objective::Objective> {
        crate::case::objective::Objective::parse(self.objective.as_deref(), &self.switches, &self.hparams)
    }
}

impl DeclaredRunArgs {
    /// (implementation, cases, seed, bounds, report directory, case timeout).
    pub(super) fn resolve(self) -> Result<(String, u32, u64, Bounds, PathBuf, Duration)> {
        let DeclaredRunArgs { implementation, cases, seed, dtype, objective, run } = self;
        let CheckRunArgs { shape: ShapeBounds { max_batch, max_time, max_vocab, max_hidden }, report, case_timeout } = run;
        at_least_one(&[("--cases", cases as usize), ("--max-time", max_time), ("--max-vocab", max_vocab), ("--max-hidden", max_hidden)])?;
        let mut bounds = Bounds::new(max_batch, max_time, max_vocab, max_hidden, dtype.dtypes());
        bounds.objective = objective.parse()?;
        let timeout = positive_seconds("--case-timeout", case_timeout)?;
        Ok((canonical_impl(&implementation), cases, seed, bounds, report.unwrap_or_else(report::default_dir), timeout))
    }
}

/// Optional Weights & Biases logging of bench figures (as the seed team ran it).
#[derive(clap::Args, Debug)]
pub struct WandbArgs {
    /// Log the figures to this W&B project (one run per implementation).
    #[arg(long)]
    pub wandb_project: Option<String>,
    /// online, offline (a local run directory, `wandb sync` later) or disabled.
    #[arg(long, value_enum, default_value_t = WandbModeArg::Online, env = "WANDB_MODE", requires = "wandb_project")]
    pub wandb_mode: WandbModeArg,
    /// Where W&B writes its run directories (default: the current directory).
    #[arg(long, requires = "wandb_project")]
    pub wandb_dir: Option<PathBuf>,
}

/// How W&B logs (`--wandb-mode`).
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum WandbModeArg {
    /// To the W&B server.
    Online,
    /// To local files, synced later.
    Offline,
    /// Not at all.
    Disabled,
}

impl DtypeArg {
    pub(super) fn dtypes(self) -> Vec<Dtype> {
        match self {
            DtypeArg::F32 => vec![Dtype::F32],
            DtypeArg::Bf16 => vec![Dtype::Bf16],
            DtypeArg::All => vec![Dtype::F32, Dtype::Bf16],
        }
    }
}

impl WandbArgs {
    pub(super) fn options(&self) -> Option<crate::bench::wandb::WandbOptions> {
        let mode = match self.wandb_mode {
            WandbModeArg::Online => "online",
            WandbModeArg::Offline => "offline",
            WandbModeArg::Disabled => "disabled",
        };
        self.wandb_project.as_ref().map(|project| crate::bench::wandb::WandbOptions {
            project: project.clone(),
            mode: mode.to_string(),
            dir: self.wandb_dir.clone(),
        })
    }
}

/// `--objective`'s help, its presets from the one list (`case::objective::PRESETS`).
fn objective_help() -> String {
    format!(
        "SPEC v2 objectives to draw: `all` (every switch, free and the presets), a preset ({}) or `v1` (the default: v1 switches only); \
         or another loss on the head: `cross_entropy` (SFT) or `distillation` (forward KL, reverse KL, JSD), \
         checked on the head-loss implementations",
        crate::case::objective::PRESETS.join(", ")
    )
}

/// `--convention`'s help, its grammar from the one table (`grpo_oracle::FORMS`).
pub(super) fn convention_help() -> String {
    format!(
        "Judge the implementations under this declared precision convention too, beside their own `precision_conventions` \
         (docs/conventions.md: {}). Repeatable",
        grpo_oracle::Convention::names()
    )
}
