//! The command line of `docs/cli.md`. Exit codes: 0 everything checked
//! holds, 1 a verification failure (reported, with a repro), 2 a usage,
//! setup or input error (a message naming the input; no report left behind).


mod args;
mod command;

pub use args::*;
pub use command::Command;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;

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

/// The command line (docs/cli.md).
#[derive(Parser, Debug)]
#[command(name = "grpo-verify", version, about = "Property-based numerical verification of GRPO loss kernels against an f64 oracle")]
pub struct Cli {
    /// The subcommand run.
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

/// Runs a command; `Ok(true)` = everything held (exit 0), `Ok(false)` = a
/// verification failure (exit 1), `Err` = usage/setup/input error (exit 2).
/// Each arm checks its flags and hands the command to its module.
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
            conventions,
            keep_going,
            max_failures,
            no_plan,
            real_cases,
            real_fixtures,
            partition,
        } => {
            if let Some(head) = objective.head()? {
                let refused = [
                    ("--convention", !conventions.is_empty()),
                    ("--keep-going", keep_going),
                    ("--real-cases", real_cases.is_some_and(|n| n > 0)),
                    ("--real-fixture", !real_fixtures.is_empty()),
                    ("--partition", partition != crate::partition::Partition::WHOLE),
                    ("--devices", devices != 1),
                ];
                if let Some((flag, _)) = refused.iter().find(|(_, given)| *given) {
                    bail!("{flag}: does not apply to --objective {} (docs/cli.md, \"The head losses\")", head.name());
                }
                at_least_one(&[("--cases", cases as usize), ("--max-batch", max_batch), ("--max-time", max_time), ("--max-vocab", max_vocab), ("--max-hidden", max_hidden)])?;
                let _ = (jobs, draws_per_signature, max_failures, no_plan, regressions, kind);
                return crate::head::command(crate::head::HeadOptions {
                    implementations: implementations.iter().map(|i| canonical_impl(i)).collect(),
                    objective: head,
                    cases,
                    seed,
                    dtypes: dtype.dtypes(),
                    max_batch,
                    max_time,
                    max_vocab,
                    max_hidden,
                    report_dir: report.unwrap_or_else(report::default_dir),
                    timeout: positive_seconds("--case-timeout", case_timeout)?,
                    shrink_iters: 256,
                });
            }
            let objective = objective.parse()?;
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
                partition,
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
            partition,
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
                partition,
            })
        }
        Command::Replay { file, implementation, case_timeout, conventions } => {
            let conventions = crate::repro::parse_conventions(&conventions).context("--convention")?;
            let timeout = positive_seconds("--case-timeout", case_timeout)?;
            if crate::head::is_repro(&file) {
                return crate::head::replay(&file, implementation, timeout);
            }
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
        Command::Presets { json } => {
            use crate::case::objective::PRESET_TABLE;
            use std::io::Write as _;
            let mut out = std::io::stdout().lock();
            for preset in &PRESET_TABLE {
                let line = if json { preset_json(preset).to_string() } else { preset.name.to_string() };
                if writeln!(out, "{line}").is_err() {
                    break; // the reader has gone (`| head`): nothing more to say
                }
            }
            Ok(true)
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
        Command::Mutants { catalog, cases, seed, report, case_timeout, shrink_time, jobs, no_plan, partition, objective } => {
            match objective.as_deref() {
                None => {}
                Some("head") => {
                    if partition != crate::partition::Partition::WHOLE || no_plan || shrink_time.is_some() || jobs.is_some() {
                        bail!("--objective head: --partition, --no-plan, --shrink-time and --jobs do not apply to the head-loss catalog");
                    }
                    let mut opts = crate::head::mutants::ci_options(report.unwrap_or_else(report::default_dir));
                    if let Some(cases) = cases {
                        at_least_one(&[("--cases", cases as usize)])?;
                        opts.cases = cases;
                    }
                    opts.seed = seed.unwrap_or(opts.seed);
                    opts.timeout = positive_seconds("--case-timeout", case_timeout)?;
                    return crate::head::mutants::command(catalog, opts);
                }
                Some(other) => bail!("--objective {other}: mutants takes `head` (the head losses' catalog) or no --objective (GRPO's)"),
            }
            let mut opts = MutantOptions::ci(report.unwrap_or_else(report::default_dir));
            opts.plan = !no_plan;
            opts.partition = partition;
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
        Command::Merge { parts, report } => crate::merge::command(&parts, &report.unwrap_or_else(report::default_dir)),
        Command::Gradcheck { fixture, preset, token_block, implementations, report, time, ratio_noise, seed, model_dir, case_timeout, dtype, objective, partition } => {
            at_least_one(&[("--time", time.unwrap_or(1)), ("--token-block", token_block.unwrap_or(1))])?;
            let objective = match &objective {
                None => None,
                Some(name) => match crate::case::objective::Preset::named(name) {
                    Some(preset) => Some(preset),
                    None => bail!("--objective {name}: not a preset; the presets are {}", crate::case::objective::PRESETS.join(", ")),
                },
            };
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
                partition,
            })
        }
        Command::Bench { implementations, preset, kind, batch, time, vocab, hidden, dtype, iters, warmup, json, case_timeout, wandb, objective } => {
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
            let implementations = implementations.iter().map(|i| canonical_impl(i)).collect();
            let timeout = positive_seconds("--case-timeout", case_timeout)?;
            let opts = BenchOptions { batch, time, vocab, hidden, dtype, iters, warmup, timeout, host_budget: None };
            if let Some(name) = objective {
                let Some(objective) = crate::head::case::HeadObjective::named(&name) else {
                    bail!("--objective {name}: bench takes cross_entropy or distillation (the head losses); GRPO is the default");
                };
                if kind.is_some() || wandb.options().is_some() {
                    bail!("--kind and --wandb-project do not apply to bench --objective {name}");
                }
                return crate::head::bench::command(crate::head::bench::HeadBench { implementations, objective, json, opts });
            }
            crate::bench::command(BenchRequest { implementations, preset, kind, json, wandb: wandb.options(), opts })
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

/// What `presets --json` prints of one preset: its name, the switches and
/// hyperparameters it fixes (an infinity as "inf" or "-inf"; the rest are
/// drawn) and the normalizer it divides by (null: drawn).
fn preset_json(preset: &crate::case::objective::Preset) -> serde_json::Value {
    use serde_json::{json, Map, Value};
    let switches: Map<String, Value> = preset
        .fixed_switches()
        .into_iter()
        .map(|(name, value)| {
            let value = match value {
                "true" => Value::Bool(true),
                "false" => Value::Bool(false),
                text => Value::String(text.to_string()),
            };
            (name.to_string(), value)
        })
        .collect();
    let hparams: Map<String, Value> = preset
        .fixed_hparams()
        .into_iter()
        .map(|(name, value)| (name.to_string(), if value.is_finite() { json!(value) } else { json!(if value > 0.0 { "inf" } else { "-inf" }) }))
        .collect();
    json!({"name": preset.name, "switches": switches, "hparams": hparams, "normalizer": preset.normalizer})
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// `--help` and docs/cli.md name every preset and every convention form
    /// of the one lists (`PRESETS`, `grpo_oracle::FORMS`), and docs/cli.md's
    /// `--convention` row no other. Red when a preset is dropped from
    /// docs/cli.md's `--objective` row, or a form from `FORMS`.
    #[test]
    fn help_and_docs_name_every_preset_and_convention() {
        let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/cli.md")).unwrap();
        let row = |flag: &str| docs.lines().find(|l| l.starts_with(&format!("| `{flag}"))).unwrap_or_else(|| panic!("docs/cli.md has no {flag} row")).to_string();
        let mut cli = super::Cli::command();
        let check = cli.find_subcommand_mut("check").expect("check");
        let help = |id: &str| check.get_arguments().find(|a| a.get_id() == id).and_then(|a| a.get_help()).map(|h| h.to_string()).unwrap_or_default();
        let (objective_help, convention_help) = (help("objective"), help("conventions"));
        let (objective_row, convention_row) = (row("--objective NAME"), row("--convention NAME"));
        for preset in crate::case::objective::PRESETS {
            let named = format!("`{preset}`");
            assert!(objective_row.contains(&named), "docs/cli.md's --objective row lacks {named}");
            assert!(objective_help.contains(preset), "--objective's help lacks {preset}");
        }
        let forms: Vec<String> = grpo_oracle::FORMS.iter().map(grpo_oracle::Form::usage).collect();
        let listed: Vec<&str> = convention_row.split("one of ").nth(1).unwrap_or_default().split('`').skip(1).step_by(2).collect();
        assert_eq!(listed, forms, "docs/cli.md's --convention row lists other forms than FORMS");
        for form in &forms {
            let form = form.as_str();
            assert!(convention_help.contains(form), "--convention's help lacks {form}");
            // The form the help offers is one the parser takes.
            let example = form.replace("[:K]", ":2").replace("=C", "=32");
            assert!(grpo_oracle::Convention::parse(&example).is_ok(), "{example} (from {form}) does not parse");
        }
    }
}
