//! The command line of `../shared/CLI.md`. Exit codes: 0 everything checked
//! holds, 1 a verification failure (reported, with a repro), 2 a usage,
//! setup or input error (a message naming the input; no report left behind).

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use serde_json::{json, Value};

use crate::case::{Dtype, Kind};
use crate::check::{canonical_impl, run_check, CheckOptions, CheckRun, ImplSummary};
use crate::compare::Tolerance;
use crate::evaluate::{baseline, Evaluator, Outcome};
use crate::worker::process::Worker;
use crate::repro::Repro;
use crate::case::strategy::Bounds;
use crate::report;
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
    /// at most 2^19 logits compile at -O0: half the compile time, see runner.py).
    #[arg(long, global = true)]
    pub no_fast_compile: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum DtypeArg {
    F32,
    Bf16,
    All,
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
        #[arg(long, default_value_t = 4)]
        max_batch: usize,
        #[arg(long, default_value_t = 48)]
        max_time: usize,
        #[arg(long, default_value_t = 4100)]
        max_vocab: usize,
        #[arg(long, default_value_t = 256)]
        max_hidden: usize,
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
    },
    /// Re-run the case of a repro file.
    Replay {
        file: PathBuf,
        #[arg(long = "impl")]
        implementation: Option<String>,
        #[arg(long, default_value_t = 600.0, env = "GRPO_VERIFY_CASE_TIMEOUT")]
        case_timeout: f64,
    },
    /// List the built-in implementations.
    Impls,
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
        #[arg(long, value_enum, default_value_t = DtypeArg::Bf16)]
        dtype: DtypeArg,
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
            max_batch,
            max_time,
            max_vocab,
            max_hidden,
            devices,
            report,
            case_timeout,
            shrink_time,
            regressions,
            jobs,
            draws_per_signature,
        } => {
            if devices == 0 {
                bail!("--devices must be >= 1");
            }
            for (name, v) in [("--max-batch", max_batch), ("--max-time", max_time), ("--max-vocab", max_vocab)] {
                if v == 0 {
                    bail!("{name} must be >= 1");
                }
            }
            if cases == 0 {
                bail!("--cases must be >= 1");
            }
            if draws_per_signature == 0 {
                bail!("--draws-per-signature must be >= 1");
            }
            let jobs = jobs_flag(jobs)?;
            let timeout = positive_seconds("--case-timeout", case_timeout)?;
            let shrink = positive_seconds("--shrink-time", shrink_time)?;
            let report_dir = report.unwrap_or_else(default_report_dir);
            let started = Instant::now();
            let mut pool = start_pool(timeout, devices, jobs)?;
            let eval = &mut pool[0];
            let implementations: Vec<String> = if implementations.is_empty() {
                builtin_names(&eval.worker)
            } else {
                implementations.iter().map(|i| canonical_impl(i)).collect()
            };
            let kinds = load_all(&mut eval.worker, &implementations)?;
            // --kind keeps the implementations of that kind (with none given: the built-ins).
            let (implementations, kinds): (Vec<String>, Vec<String>) = implementations
                .into_iter()
                .zip(kinds)
                .filter(|(_, k)| kind.is_none_or(|want| want.name() == k))
                .unzip();
            if implementations.is_empty() {
                bail!("no implementation of the {} kind among those named", kind.map_or("?", |k| k.name()));
            }
            for k in &kinds {
                eval.worker.load(baseline(Kind::parse(k).unwrap_or(Kind::Logits)))
                    .with_context(|| format!("loading the {k} baseline"))?;
            }
            let opts = CheckOptions {
                implementations,
                cases,
                seed,
                bounds: Bounds {
                    max_batch,
                    max_time,
                    max_vocab,
                    max_hidden,
                    dtypes: match dtype {
                        DtypeArg::F32 => vec![Dtype::F32],
                        DtypeArg::Bf16 => vec![Dtype::Bf16],
                        DtypeArg::All => vec![Dtype::F32, Dtype::Bf16],
                    },
                    devices,
                },
                report_dir: report_dir.clone(),
                regressions_dir: (regressions != "none").then(|| PathBuf::from(regressions)),
                shrink_time: shrink,
                shrink_iters: 256,
                draws_per_signature,
            };
            let run = run_check(&opts, &mut pool, &kinds)?;
            let info = report::RunInfo {
                command: std::env::args().collect::<Vec<_>>().join(" "),
                seed,
                cases,
                jobs: pool.len(),
                draws_per_signature,
                worker: &pool[0].worker.hello,
                tolerance: &pool[0].tolerance,
                seconds: started.elapsed().as_secs_f64(),
            };
            report::write(&report_dir, &info, &run)?;
            print_summary(&run, &report_dir);
            println!(
                "{} cases in {} signatures checked in {:.1} s: {:.2} cases/s ({} jobs)",
                run.checked(),
                run.summaries.iter().map(|s| s.signatures).sum::<usize>(),
                info.seconds,
                run.checked() as f64 / info.seconds,
                info.jobs
            );
            Ok(run.summaries.iter().all(|s| s.passed))
        }
        Command::Replay { file, implementation, case_timeout } => {
            let repro = Repro::load(&file)?;
            // Bad input is a usage error (exit 2), not a verification failure.
            repro.case.problem().forward().map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
            let implementation = implementation.map(|i| canonical_impl(&i)).unwrap_or(repro.implementation.clone());
            let devices = repro.case.mesh.map_or(1, |m| m.devices());
            let mut eval = start_evaluator(positive_seconds("--case-timeout", case_timeout)?, devices)?;
            let kinds = load_all(&mut eval.worker, std::slice::from_ref(&implementation))?;
            if kinds[0] != repro.case.kind().name() {
                bail!("--impl {implementation} is of the {} kind; the repro's case is {}", kinds[0], repro.case.kind().name());
            }
            println!("replaying {} on `{implementation}`", file.display());
            println!("case: {}", repro.case.summary());
            let result = eval.evaluate(&implementation, &repro.case).map_err(|e| anyhow::anyhow!("{e}"))?;
            println!("{:<16} {:>11} {:>11} {:>11}  verdict  where", "quantity", "error", "bound", "baseline");
            for v in &result.verdicts {
                let verdict = if v.not_covered { "n/a" } else if v.pass { "pass" } else { "FAIL" };
                println!(
                    "{:<16} {:>11.3e} {:>11.3e} {:>11.3e}  {:<7}  {}",
                    v.quantity, v.err, v.bound, v.baseline_err, verdict, v.at
                );
            }
            match result.outcome {
                Outcome::Pass => println!("PASS"),
                Outcome::Unsupported => println!("UNSUPPORTED: {}", result.reason),
                Outcome::Fail => println!("FAIL: {}", result.reason),
            }
            Ok(result.outcome != Outcome::Fail)
        }
        Command::Impls => {
            let env = pyenv::resolve()?;
            let mut worker = Worker::start(&env).map_err(|e| anyhow::anyhow!("{e}"))?;
            for name in builtin_names(&worker) {
                let info = worker.load(&name)?;
                println!("{name:<20} {}", info);
            }
            Ok(true)
        }
        Command::Lower { implementation, platform, cases, seed, max_batch, max_time, max_vocab, max_hidden, case_timeout } => {
            if platform != "tpu" {
                bail!("--platform {platform}: only tpu is supported");
            }
            let env = pyenv::resolve()?;
            let mut worker = Worker::start(&env).map_err(|e| anyhow::anyhow!("{e}"))?;
            let implementation = canonical_impl(&implementation);
            let kind = worker.load(&implementation)?;
            let opts = crate::lower::LowerOptions {
                implementation,
                kind,
                platform,
                cases,
                seed,
                bounds: Bounds::new(max_batch, max_time, max_vocab, max_hidden, vec![Dtype::F32, Dtype::Bf16]),
                timeout: positive_seconds("--case-timeout", case_timeout)?,
            };
            crate::lower::run_lower(&mut worker, &opts)
        }
        Command::Mutants { catalog, cases, seed, report, case_timeout, shrink_time, jobs } => {
            let catalog = catalog.unwrap_or_else(crate::mutants::builtin_catalog);
            let mutants = crate::mutants::catalog(&catalog)?;
            let mut opts = crate::mutants::MutantOptions::ci(report.unwrap_or_else(default_report_dir));
            if let Some(cases) = cases {
                if cases == 0 {
                    bail!("--cases must be >= 1");
                }
                opts.cases = cases;
            }
            if let Some(seed) = seed {
                opts.seed = seed;
            }
            if let Some(s) = shrink_time {
                opts.shrink_time = positive_seconds("--shrink-time", s)?;
            }
            let jobs = jobs_flag(jobs)?.min(mutants.len().max(1));
            let started = Instant::now();
            let mut pool = start_pool(positive_seconds("--case-timeout", case_timeout)?, 1, jobs)?;
            println!("{} mutants from {}, up to {} cases each (seed {}, {jobs} jobs)", mutants.len(), catalog.display(), opts.cases, opts.seed);
            let results = crate::mutants::run_catalog(&mut pool, &mutants, &opts)?;
            let info = crate::mutants::MutantsInfo {
                command: std::env::args().collect::<Vec<_>>().join(" "),
                catalog: &catalog,
                opts: &opts,
                worker: &pool[0].worker.hello,
                seconds: started.elapsed().as_secs_f64(),
            };
            crate::mutants::write_report(&info, &results)?;
            let caught = results.iter().filter(|r| r.caught).count();
            println!("{caught} of {} mutants caught", results.len());
            println!("report: {}", opts.report_dir.join("report.md").display());
            Ok(caught == results.len())
        }
        Command::Gradcheck { fixture, preset, token_block, implementations, report, time, ratio_noise, seed, model_dir, case_timeout } => {
            if time == Some(0) {
                bail!("--time must be >= 1");
            }
            if token_block == Some(0) {
                bail!("--token-block must be >= 1");
            }
            if !(ratio_noise.is_finite() && ratio_noise >= 0.0) {
                bail!("--ratio-noise {ratio_noise}: must be a number >= 0");
            }
            let env = pyenv::resolve()?;
            let (fixture, token_block, implementations) = match &preset {
                Some(name) => {
                    let p = crate::gradcheck::fixture::production_preset(name)?;
                    crate::gradcheck::check_preset_fits(p, token_block.unwrap_or(crate::gradcheck::PRESET_TOKEN_BLOCK))?;
                    let dir = crate::gradcheck::fixture::preset_fixture(&env, p, seed, &PathBuf::from("target/grpo-verify/presets"))?;
                    let implementations = if implementations.is_empty() { vec!["fused_chunked".to_string()] } else { implementations };
                    (dir, Some(token_block.unwrap_or(crate::gradcheck::PRESET_TOKEN_BLOCK)), implementations)
                }
                None => (fixture.expect("clap requires --fixture without --preset"), token_block, implementations),
            };
            let fx = crate::gradcheck::fixture::load(&fixture)?;
            let report_dir = report.unwrap_or_else(default_report_dir);
            let mut eval = start_evaluator(positive_seconds("--case-timeout", case_timeout)?, 1)?;
            let implementations: Vec<String> = if implementations.is_empty() {
                crate::gradcheck::DEFAULT_IMPLS.iter().map(|s| s.to_string()).collect()
            } else {
                implementations.iter().map(|i| canonical_impl(i)).collect()
            };
            let kinds = load_all(&mut eval.worker, &implementations)?;
            let kinds: Vec<Kind> = kinds.iter().map(|k| Kind::parse(k).expect("the worker names a known kind")).collect();
            let lm_head = crate::gradcheck::fixture::lm_head(&env, &fx, model_dir.as_deref(), &std::env::temp_dir()).map_err(|e| match e {
                crate::gradcheck::fixture::LmHeadError::CheckpointAbsent(m) => {
                    anyhow::anyhow!("--fixture {}: its checkpoint is absent on this machine, so it cannot be checked here. {m}", fixture.display())
                }
                other => anyhow::anyhow!("--fixture {}: {other}", fixture.display()),
            })?;
            let opts = crate::gradcheck::GradcheckOptions { time, ratio_noise, seed, token_block };
            let mut cases = crate::gradcheck::cases(&fx, lm_head, &opts, kinds.contains(&Kind::Logits))?;
            let pairs: Vec<(String, Kind)> = implementations.into_iter().zip(kinds).collect();
            let results = crate::gradcheck::run(&mut eval, &mut cases, &pairs)?;
            let command = std::env::args().collect::<Vec<_>>().join(" ");
            crate::gradcheck::write_report(&report_dir, &fx, &cases, &results, &command)?;
            print!("{}", std::fs::read_to_string(report_dir.join("report.md")).unwrap_or_default());
            println!("\nreport: {}", report_dir.join("report.html").display());
            Ok(results.iter().all(|r| r.passed()))
        }
        Command::Bench { implementations, preset, kind, batch, time, vocab, hidden, dtype, iters, warmup, json, case_timeout, wandb } => {
            let dtype = match dtype {
                DtypeArg::F32 => Dtype::F32,
                DtypeArg::Bf16 => Dtype::Bf16,
                DtypeArg::All => bail!("--dtype all: bench takes one dtype (f32 or bf16)"),
            };
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
            for (name, v) in [("--batch", batch), ("--time", time), ("--vocab", vocab), ("--hidden", hidden)] {
                if v == 0 {
                    bail!("{name} must be >= 1");
                }
            }
            let implementations = match (implementations.is_empty(), preset) {
                (true, Some(p)) => crate::bench::default_impls(p.kind),
                _ => implementations,
            };
            let wandb = wandb.options();
            let env = pyenv::resolve()?;
            if wandb.is_some() {
                crate::bench::wandb::check_available(&env)?;
            }
            let mut worker = Worker::start(&env).map_err(|e| anyhow::anyhow!("{e}"))?;
            let on_cpu = worker.hello["backend"].as_str() == Some("cpu");
            let opts = crate::bench::BenchOptions {
                batch,
                time,
                vocab,
                hidden,
                dtype,
                iters,
                warmup,
                timeout: positive_seconds("--case-timeout", case_timeout)?,
                host_budget: if on_cpu { crate::bench::available_host_bytes()? } else { None },
            };
            let mut lines = Vec::new();
            for implementation in &implementations {
                let implementation = canonical_impl(implementation);
                let k = worker.load(&implementation)?;
                let want = kind.map(|k| k.name()).or(preset.map(|p| p.kind));
                if let Some(want) = want {
                    if want != k {
                        bail!("--impl {implementation} is of the {k} kind, not {want}");
                    }
                }
                let mut line = crate::bench::bench_one(&mut worker, &implementation, &k, &opts)?;
                line["preset"] = json!(preset.map(|p| p.name));
                line["backend"] = worker.hello["backend"].clone();
                if json {
                    println!("{line}");
                }
                lines.push(line);
            }
            if !json {
                print!("{}", crate::bench::table(&lines));
            }
            if let Some(w) = &wandb {
                let group = preset.map_or_else(|| format!("B{batch}-T{time}-V{vocab}"), |p| p.name.to_string());
                let runs: Vec<Value> = lines
                    .iter()
                    .map(|l| crate::bench::wandb::bench_run(l, &group))
                    .collect();
                crate::bench::wandb::log_runs(&env, w, &runs)?;
            }
            Ok(true)
        }
        Command::BenchOracle { kind, rows, vocab, hidden, reps, seed, json, wandb } => {
            let rows = rows.unwrap_or(match kind {
                Kind::Logits => 1024,
                Kind::Fused => 256,
            });
            for (name, v) in [("--rows", rows), ("--vocab", vocab), ("--reps", reps), ("--hidden", hidden.unwrap_or(1))] {
                if v == 0 {
                    bail!("{name} must be >= 1");
                }
            }
            if kind == Kind::Fused {
                if wandb.options().is_some() {
                    bail!("--wandb-project: bench-oracle logs the logits kind only (--kind logits)");
                }
                let opts = crate::bench::fused_oracle::FusedBenchOptions { rows, hidden: hidden.unwrap_or(1536), vocab, seed, reps };
                let result = crate::bench::fused_oracle::run(&opts)?;
                if json {
                    println!("{result}");
                } else {
                    print!("{}", crate::bench::fused_oracle::summary(&result));
                }
                return Ok(true);
            }
            if hidden.is_some() {
                bail!("--hidden: only with --kind fused");
            }
            let env = pyenv::resolve()?;
            let opts = crate::bench::oracle::OracleBenchOptions { rows, vocab, seed, reps };
            let wandb = wandb.options();
            if wandb.is_some() {
                crate::bench::wandb::check_available(&env)?;
            }
            let result = crate::bench::oracle::run(&env, &opts)?;
            if json {
                println!("{result}");
            } else {
                print!("{}", crate::bench::oracle::summary(&result));
            }
            if let Some(w) = &wandb {
                crate::bench::wandb::log_runs(&env, w, &[crate::bench::wandb::oracle_run(&result)])?;
            }
            Ok(true)
        }
    }
}

fn positive_seconds(flag: &str, s: f64) -> Result<Duration> {
    if !(s.is_finite() && s > 0.0) {
        bail!("{flag} {s}: must be a positive number of seconds");
    }
    Ok(Duration::from_secs_f64(s))
}

fn start_evaluator(timeout: Duration, devices: usize) -> Result<Evaluator> {
    let env = pyenv::resolve()?;
    let worker = Worker::start_with_devices(&env, devices).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(Evaluator::new(worker, Tolerance::default(), timeout))
}

/// `jobs` workers started side by side (each imports JAX: seconds).
fn start_pool(timeout: Duration, devices: usize, jobs: usize) -> Result<Vec<Evaluator>> {
    std::thread::scope(|scope| {
        let started: Vec<_> = (0..jobs).map(|_| scope.spawn(move || start_evaluator(timeout, devices))).collect();
        started.into_iter().map(|h| h.join().expect("a worker-starting thread panicked")).collect()
    })
}

/// `--jobs`: at least 1; default the number of cores.
fn jobs_flag(jobs: Option<usize>) -> Result<usize> {
    match jobs {
        Some(0) => bail!("--jobs must be >= 1"),
        Some(n) => Ok(n),
        None => Ok(std::thread::available_parallelism().map_or(1, |n| n.get())),
    }
}

fn builtin_names(worker: &Worker) -> Vec<String> {
    worker.hello["builtins"]
        .as_array()
        .map(|a| a.iter().filter_map(|b| b["name"].as_str().map(String::from)).collect())
        .unwrap_or_default()
}

fn load_all(worker: &mut Worker, implementations: &[String]) -> Result<Vec<String>> {
    implementations.iter().map(|i| worker.load(i)).collect()
}

fn default_report_dir() -> PathBuf {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    PathBuf::from("target/grpo-verify").join(utc_timestamp(secs))
}

/// "20261122T041500Z" (civil-from-days, proleptic Gregorian).
fn utc_timestamp(secs: u64) -> String {
    let days = (secs / 86400) as i64;
    let rem = secs % 86400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

fn print_summary(run: &CheckRun, dir: &std::path::Path) {
    for s in &run.summaries {
        print_one(s);
    }
    println!("report: {}", dir.join("report.md").display());
}

fn print_one(s: &ImplSummary) {
    if s.passed {
        println!(
            "PASS {:<24} {} cases in {} signatures ({} unsupported), {:.1} s of worker time",
            s.implementation, s.supported, s.signatures, s.unsupported, s.seconds
        );
        if let Some(note) = &s.note {
            println!("     note: {note}");
        }
    } else {
        println!("FAIL {:<24} after {} cases; shrunk in {} steps", s.implementation, s.cases, s.shrink_steps);
        println!("     what: {}", s.failure.as_deref().unwrap_or(""));
        println!("     minimal case: {}", s.minimal_case.as_deref().unwrap_or(""));
        if let Some(r) = &s.replay {
            println!("     replay: {r}");
        }
    }
}
