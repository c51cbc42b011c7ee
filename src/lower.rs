//! `grpo-verify lower`: export an implementation's value-and-grad step for a
//! platform (TPU) on every generated shape and configuration, without
//! executing it (works on CPU). Lowering errors — block shapes that break
//! Mosaic's tiling rules, rank-1 blocks, index maps — are what broke kernels
//! on real hardware; the first failure is shrunk to a minimal shape.

use std::cell::RefCell;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use grpo_oracle::{Aggregation, Config, Hparams, TemperatureMode};
use proptest::test_runner::{Config as ProptestConfig, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};
use serde_json::{json, Value};

use crate::case::{AdvantagePattern, CaseSpec, Dtype, Kind, LogitPattern, MaskPattern, NormalizerChoice, RatioPattern, TokenPattern};
use crate::worker::process::{ReplyKind, Worker, WorkerError};
use crate::worker::protocol::shapes_request;
use crate::case::strategy::{case_spec, Bounds};

/// What one `lower` run exports (docs/cli.md, `lower`).
pub struct LowerOptions {
    /// The implementation lowered.
    pub implementation: String,
    /// The platform it is exported for (`tpu`).
    pub platform: String,
    /// Generated signatures lowered.
    pub cases: u32,
    /// The run's seed.
    pub seed: u64,
    /// Shapes and dtypes drawn.
    pub bounds: Bounds,
    /// How long one export may take.
    pub timeout: Duration,
}

/// Shapes every `lower` run tries first: the production shapes of the seed
/// team (Qwen2.5: V = 151936 and its unpadded 151643), B > 1, and H = 1536 / 4096.
pub fn presets() -> Vec<CaseSpec> {
    let (step, step_hparams) = crate::case::training_step(0.7);
    let all_on = Config { aggregation: Aggregation::SumOverConstant, kl: true, entropy_bonus: true, two_sided: true, ..step };
    let base = CaseSpec {
        batch: 4,
        time: 8192,
        vocab: 151_936,
        hidden: 1536,
        dtype: Dtype::Bf16,
        config: all_on,
        hparams: Hparams { beta: 0.04, entropy_coef: 0.01, delta: 3.0, ..step_hparams },
        normalizer: NormalizerChoice::BatchTimesTime,
        logits: LogitPattern::Normal { scale: 1.0 },
        tokens: TokenPattern::Random,
        mask: MaskPattern::Full,
        ratios: RatioPattern::Mixed,
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
    };
    let with = |f: &dyn Fn(&mut CaseSpec)| {
        let mut s = base.clone();
        f(&mut s);
        s
    };
    vec![
        base.clone(),
        with(&|s| s.vocab = 151_643),
        with(&|s| {
            s.batch = 1;
            s.hidden = 4096;
            s.config.temperature_mode = TemperatureMode::Logp;
            s.config.on_policy = true;
            s.config.kl = false;
        }),
        with(&|s| {
            s.batch = 3;
            s.time = 5;
            s.vocab = 130;
            s.hidden = 33;
            s.dtype = Dtype::F32;
            s.config.aggregation = Aggregation::TokenMean;
        }),
    ]
}

fn describe(spec: &CaseSpec, kind: Kind) -> String {
    let hidden = if kind == Kind::Fused { format!(" H={}", spec.hidden) } else { String::new() };
    format!(
        "B={} T={} V={}{hidden} {} {:?}-mode {:?}{}{}{}{}",
        spec.batch,
        spec.time,
        spec.vocab,
        spec.dtype.name(),
        spec.config.temperature_mode,
        spec.config.aggregation,
        if spec.config.on_policy { " on-policy" } else { " off-policy" },
        if spec.config.kl { " kl" } else { "" },
        if spec.config.entropy_bonus { " entropy" } else { "" },
        if spec.config.two_sided { " two-sided" } else { "" },
    )
}

/// One configuration lowered: its seconds (NaN: unsupported) and what its
/// f32 matmuls are traced at.
struct Lowered {
    seconds: f64,
    /// "3 at HIGHEST, 1 at DEFAULT" (empty without f32 matmuls).
    f32_matmuls: String,
    /// Some f32 matmul runs below f32 precision on GPU or TPU.
    below_f32: bool,
}

/// The reply's `f32_matmul_precisions` ({"DEFAULT": 1, ...}) as a phrase.
fn f32_matmuls(reply: &Value) -> (String, bool) {
    let Some(counts) = reply.get("f32_matmul_precisions").and_then(Value::as_object) else { return (String::new(), false) };
    let below = counts.keys().any(|p| p != "HIGHEST");
    let phrase = counts.iter().map(|(p, n)| format!("{n} at {p}")).collect::<Vec<_>>().join(", ");
    (phrase, below)
}

/// Lowers one configuration: Ok(lowered), Err(message) for a lowering error,
/// seconds NaN when unsupported. `Err` of the outer result: the run cannot go on.
fn lower_one(worker: &mut Worker, opts: &LowerOptions, kind: Kind, spec: &CaseSpec) -> Result<std::result::Result<Lowered, String>, WorkerError> {
    let version = worker.spec_version(&opts.implementation).map_err(|e| WorkerError::Setup(format!("{e:#}")))?;
    let mut header = shapes_request("lower", &opts.implementation, spec, kind, version);
    header["platform"] = json!(opts.platform);
    let started = Instant::now();
    let unsupported = Lowered { seconds: f64::NAN, f32_matmuls: String::new(), below_f32: false };
    match worker.request(&header, &[], opts.timeout) {
        Ok(reply) => {
            let (f32_matmuls, below_f32) = f32_matmuls(&reply.header);
            Ok(Ok(Lowered { seconds: started.elapsed().as_secs_f64(), f32_matmuls, below_f32 }))
        }
        Err(WorkerError::Reply { kind: ReplyKind::Unsupported, .. }) => Ok(Ok(unsupported)),
        Err(WorkerError::Reply { kind: ReplyKind::Lowering | ReplyKind::Impl, message, .. }) => Ok(Err(message)),
        Err(e @ (WorkerError::Crashed { .. } | WorkerError::Timeout { .. })) => Ok(Err(e.to_string())),
        Err(e) => Err(e),
    }
}

/// `grpo-verify lower`: starts a worker, loads the implementation, lowers it.
pub fn command(opts: &LowerOptions) -> Result<bool> {
    let env = crate::worker::pyenv::resolve()?;
    let mut worker = Worker::start(&env).map_err(|e| anyhow!("{e}"))?;
    let kind = worker.load(&opts.implementation)?;
    run_lower(&mut worker, opts, kind)
}

/// Runs the presets, then generated cases; returns whether all lowered.
pub fn run_lower(worker: &mut Worker, opts: &LowerOptions, kind: Kind) -> Result<bool> {
    let mut ok = true;
    let report = |spec: &CaseSpec, outcome: &std::result::Result<Lowered, String>| match outcome {
        Ok(l) if l.seconds.is_nan() => println!("unsupported {}", describe(spec, kind)),
        Ok(l) => {
            let matmuls = if l.f32_matmuls.is_empty() { String::new() } else { format!("; f32 matmuls: {}", l.f32_matmuls) };
            // docs/conventions.md, tf32_matmul: JAX's and Triton's default on NVIDIA GPUs.
            let warning = if l.below_f32 { " (below f32 on GPU and TPU: TF32 or bf16 passes, unless declared tf32_matmul)" } else { "" };
            println!("lowered     {} ({:.1} s{matmuls}){warning}", describe(spec, kind), l.seconds)
        }
        Err(m) => println!("FAILED      {}\n            {}", describe(spec, kind), first_lines(m, 6)),
    };
    for spec in presets() {
        let outcome = lower_one(worker, opts, kind, &spec).map_err(|e| anyhow!("{e}"))?;
        ok &= outcome.is_ok();
        report(&spec, &outcome);
    }
    let fatal: RefCell<Option<String>> = RefCell::new(None);
    let worker = RefCell::new(worker);
    let config = ProptestConfig { cases: opts.cases, failure_persistence: None, max_shrink_iters: 128, ..ProptestConfig::default() };
    let mut seed = [0u8; 32];
    seed[..8].copy_from_slice(&opts.seed.to_le_bytes());
    let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &seed));
    let result = runner.run(&case_spec(&opts.bounds), |spec| {
        if let Some(f) = fatal.borrow().as_ref() {
            return Err(TestCaseError::fail(f.clone()));
        }
        match lower_one(&mut worker.borrow_mut(), opts, kind, &spec) {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(m)) => Err(TestCaseError::fail(m)),
            Err(e) => {
                *fatal.borrow_mut() = Some(e.to_string());
                Err(TestCaseError::fail(e.to_string()))
            }
        }
    });
    if let Some(f) = fatal.into_inner() {
        return Err(anyhow!("{f}"));
    }
    match result {
        Ok(()) => println!("lowered {} generated configurations", opts.cases),
        Err(TestError::Fail(message, minimal)) => {
            ok = false;
            println!("FAILED (shrunk) {}\n            {}", describe(&minimal, kind), first_lines(message.message(), 12));
        }
        Err(TestError::Abort(m)) => return Err(anyhow!("proptest aborted: {m}")),
    }
    Ok(ok)
}

fn first_lines(text: &str, n: usize) -> String {
    text.lines().take(n).collect::<Vec<_>>().join("\n            ")
}
