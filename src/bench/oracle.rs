//! `grpo-verify bench-oracle`: the f64 oracle's forward + backward throughput
//! on the logits kind, next to NumPy float64 doing the same math on the same
//! inputs, measured in the same run (docs/cli.md, `bench-oracle --json`).
//!
//! One problem of B = 1, T = `rows` tokens over `vocab` logits (f32 inputs,
//! the seed team's training configuration plus an entropy bonus, so both
//! sides compute every per-token quantity and the full [T, V] f64 gradient).
//! The inputs are written once to raw files that `python -m
//! grpo_bench.numpy_oracle` reads; it reports its step times, loss and
//! gradient checksum, and the two results must agree: a NumPy figure for
//! different math would be no comparison at all.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use grpo_oracle::{Aggregation, Config, Hparams, LogitsProblem, Shape};
use rayon::prelude::*;
use serde_json::{json, Value};

use crate::case::prng::Prng;
use crate::worker::pyenv::PythonEnv;

/// What `bench-oracle --kind logits` times.
pub struct OracleBenchOptions {
    /// Rows (tokens).
    pub rows: usize,
    /// V.
    pub vocab: usize,
    /// The inputs' seed.
    pub seed: u64,
    /// Timed repetitions of each side; the median is reported.
    pub reps: usize,
}

/// The configuration measured: logits temperature mode at tau = 1, clip-higher
/// 0.2 / 0.28, off-policy, an entropy bonus, the loss over a constant.
pub fn bench_config(rows: usize) -> (Config, Hparams) {
    let (step, step_hparams) = crate::case::training_step(1.0);
    let config = Config { aggregation: Aggregation::SumOverConstant, entropy_bonus: true, ..step };
    let hparams = Hparams { entropy_coef: 0.01, normalizer: rows as f64, ..step_hparams };
    (config, hparams)
}

/// The benchmark's inputs: N(0, 1) logits, uniform tokens, a full mask, one
/// advantage, and old log-probs near a uniform policy's so ratios are mixed
/// (some clipped, some not: both branches of the backward run).
pub struct OracleInputs {
    /// B, T, V.
    pub shape: Shape,
    /// [B, T, V] f32.
    pub logits: Vec<f32>,
    /// [B, T] token ids.
    pub tokens: Vec<i32>,
    /// [B, T], all ones.
    pub mask: Vec<f32>,
    /// [B].
    pub advantages: Vec<f32>,
    /// [B, T] old log-probs.
    pub old_logp: Vec<f32>,
}

/// Random inputs of `rows` tokens over `vocab` from `seed`, the same for both sides.
pub fn make_inputs(rows: usize, vocab: usize, seed: u64) -> OracleInputs {
    let mut logits = vec![0.0f32; rows * vocab];
    logits.par_chunks_mut(vocab).enumerate().for_each(|(t, row)| {
        let mut prng = Prng::keyed(seed, 1, 0, t);
        row.iter_mut().for_each(|z| *z = prng.normal() as f32);
    });
    let mut prng = Prng::keyed(seed, 2, 0, 0);
    let tokens = (0..rows).map(|_| prng.below(vocab) as i32).collect();
    // logp of a uniform token under N(0, 1) logits is about -ln V - 0.5.
    let typical_logp = -(vocab as f64).ln() - 0.5;
    let old_logp = (0..rows).map(|_| (typical_logp + 0.5 * prng.normal()) as f32).collect();
    OracleInputs {
        shape: Shape { batch: 1, time: rows, vocab },
        logits,
        tokens,
        mask: vec![1.0; rows],
        advantages: vec![prng.normal() as f32],
        old_logp,
    }
}

/// What one side measured: the median step and the result it computed.
#[derive(Debug, Clone)]
pub struct SideResult {
    /// Each repetition's wall time.
    pub seconds: Vec<f64>,
    /// The loss it computed (both sides must agree).
    pub loss: f64,
    /// The sum of squares of the gradient it computed (both sides must agree).
    pub grad_sum_squares: f64,
}

impl SideResult {
    /// The median of `seconds`.
    pub fn median_seconds(&self) -> f64 {
        let mut s = self.seconds.clone();
        s.sort_by(f64::total_cmp);
        s[s.len() / 2]
    }
}

/// Times `reps` forward + backward passes of the oracle (the gradient
/// buffer is allocated once, outside the timed region).
pub fn time_oracle(inputs: &OracleInputs, reps: usize) -> Result<SideResult> {
    let (config, hparams) = bench_config(inputs.shape.rows());
    let problem = LogitsProblem {
        shape: inputs.shape,
        logits: &inputs.logits,
        per_token: grpo_oracle::TokenInputs {
            tokens: &inputs.tokens,
            mask: &inputs.mask,
            advantages: &inputs.advantages,
            old_logp: Some(&inputs.old_logp),
            ref_logp: None,
            is_weights: None,
        },
        config,
        hparams,
    };
    let mut grad = vec![0.0f64; inputs.logits.len()];
    grad.par_chunks_mut(1 << 16).for_each(|c| c.fill(0.0)); // touch every page before timing
    let mut seconds = Vec::with_capacity(reps);
    let mut loss = f64::NAN;
    for _ in 0..reps {
        let started = Instant::now();
        let forward = problem.forward().map_err(|e| anyhow::anyhow!("bench-oracle inputs: {e}"))?;
        forward.grad_into(1.0, &mut grad);
        seconds.push(started.elapsed().as_secs_f64());
        loss = forward.loss;
    }
    let grad_sum_squares = grad.par_iter().map(|g| g * g).sum();
    Ok(SideResult { seconds, loss, grad_sum_squares })
}

/// Writes the inputs as raw little-endian files for the NumPy side.
pub fn write_inputs(dir: &Path, inputs: &OracleInputs) -> Result<()> {
    fn bytes<T: Copy>(values: &[T]) -> &[u8] {
        // f32 / i32 slices viewed as bytes (both are plain 4-byte values; this machine and every JAX host is little-endian).
        unsafe { std::slice::from_raw_parts(values.as_ptr() as *const u8, std::mem::size_of_val(values)) }
    }
    assert!(cfg!(target_endian = "little"));
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for (name, data) in [
        ("logits.f32", bytes(&inputs.logits)),
        ("tokens.i32", bytes(&inputs.tokens)),
        ("mask.f32", bytes(&inputs.mask)),
        ("advantages.f32", bytes(&inputs.advantages)),
        ("old_logp.f32", bytes(&inputs.old_logp)),
    ] {
        fs::write(dir.join(name), data).with_context(|| format!("writing {}", dir.join(name).display()))?;
    }
    Ok(())
}

/// Rows per block of NumPy's cache-blocked form ([16, V] f64 temporaries:
/// 19 MB at V = 151936, the size that ran fastest here among 4..256).
pub const NUMPY_BLOCK_ROWS: usize = 16;

/// Runs `python -m grpo_bench.numpy_oracle` on inputs `write_inputs` left
/// in `scratch`; `block_rows` 0 is the plain whole-array form.
pub fn time_numpy(env: &PythonEnv, inputs: &OracleInputs, reps: usize, scratch: &Path, block_rows: usize) -> Result<SideResult> {
    let (_, hparams) = bench_config(inputs.shape.rows());
    let output = env
        .command()
        .args(["-m", "grpo_bench.numpy_oracle", "--dir"])
        .arg(scratch)
        .args(["--rows", &inputs.shape.rows().to_string(), "--vocab", &inputs.shape.vocab.to_string()])
        .args(["--reps", &reps.to_string(), "--block-rows", &block_rows.to_string()])
        .args(["--eps-low", &hparams.eps_low.to_string(), "--eps-high", &hparams.eps_high.to_string()])
        .args(["--temperature", &hparams.temperature.to_string()])
        .args(["--entropy-coef", &hparams.entropy_coef.to_string(), "--normalizer", &hparams.normalizer.to_string()])
        // One thread, as NumPy's elementwise math is; a BLAS pool would not be used by this math anyway.
        .env("OMP_NUM_THREADS", "1")
        .output()
        .with_context(|| format!("starting {}", env.python.display()))?;
    if !output.status.success() {
        bail!(
            "the NumPy side of bench-oracle failed ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let reply: Value = serde_json::from_str(stdout.trim())
        .with_context(|| format!("the NumPy side printed {stdout:?}; expected one JSON object"))?;
    let number = |key: &str| reply[key].as_f64().with_context(|| format!("NumPy reply lacks {key}: {reply}"));
    let seconds = reply["seconds"]
        .as_array()
        .context("NumPy reply lacks seconds")?
        .iter()
        .filter_map(Value::as_f64)
        .collect::<Vec<_>>();
    if seconds.is_empty() {
        bail!("the NumPy side reported no timings: {reply}");
    }
    Ok(SideResult { seconds, loss: number("loss")?, grad_sum_squares: number("grad_sum_squares")? })
}

/// Relative difference, for the agreement check.
fn relative(a: f64, b: f64) -> f64 {
    (a - b).abs() / a.abs().max(b.abs()).max(f64::MIN_POSITIVE)
}

/// The agreement both sides must reach: f64 math on identical inputs differs
/// only by summation order, so anything past 1e-9 means different math.
pub const AGREEMENT: f64 = 1e-9;

/// The whole benchmark: the `bench-oracle --json` object. NumPy runs in two
/// forms (plain whole-array and cache-blocked); `numpy_elems_per_s` and
/// `ratio` are the plain form's, the blocked form's sit beside them.
pub fn run(env: &PythonEnv, opts: &OracleBenchOptions) -> Result<Value> {
    let inputs = make_inputs(opts.rows, opts.vocab, opts.seed);
    let scratch = scratch_dir();
    let numpy = write_inputs(&scratch, &inputs).and_then(|()| {
        Ok((
            time_numpy(env, &inputs, opts.reps, &scratch, 0)?,
            time_numpy(env, &inputs, opts.reps, &scratch, NUMPY_BLOCK_ROWS)?,
        ))
    });
    let _ = fs::remove_dir_all(&scratch);
    let (numpy, blocked) = numpy?;
    let oracle = time_oracle(&inputs, opts.reps)?;
    let mut agreement = 0.0f64;
    for (form, side) in [("plain", &numpy), ("blocked", &blocked)] {
        let loss_diff = relative(oracle.loss, side.loss);
        let grad_diff = relative(oracle.grad_sum_squares, side.grad_sum_squares);
        if loss_diff > AGREEMENT || grad_diff > AGREEMENT {
            bail!(
                "the oracle and NumPy ({form}) disagree (loss {} vs {}, sum of squared gradients {} vs {}): \
                 they are not computing the same thing, so their speeds cannot be compared",
                oracle.loss,
                side.loss,
                oracle.grad_sum_squares,
                side.grad_sum_squares
            );
        }
        agreement = agreement.max(loss_diff).max(grad_diff);
    }
    let elements = (opts.rows * opts.vocab) as f64;
    let rate = |side: &SideResult| elements / side.median_seconds();
    Ok(json!({
        "rows": opts.rows,
        "vocab": opts.vocab,
        "oracle_elems_per_s": rate(&oracle),
        "numpy_elems_per_s": rate(&numpy),
        "ratio": rate(&oracle) / rate(&numpy),
        "numpy_blocked_elems_per_s": rate(&blocked),
        "ratio_blocked": rate(&oracle) / rate(&blocked),
        "numpy_block_rows": NUMPY_BLOCK_ROWS,
        "oracle_seconds": oracle.seconds,
        "numpy_seconds": numpy.seconds,
        "numpy_blocked_seconds": blocked.seconds,
        "threads": rayon::current_num_threads(),
        "max_rel_diff": agreement,
        "reps": opts.reps,
        "seed": opts.seed,
    }))
}

fn scratch_dir() -> PathBuf {
    std::env::temp_dir().join(format!("grpo-verify-bench-oracle-{}", std::process::id()))
}

/// The lines people read.
pub fn summary(v: &Value) -> String {
    let f = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    format!(
        "bench-oracle rows={} vocab={} (forward + backward, median of {}):\n\
         \x20 oracle (f64, {} threads)          {:>8.1} M elem/s\n\
         \x20 NumPy float64, whole-array        {:>8.1} M elem/s   oracle is {:.1}x\n\
         \x20 NumPy float64, blocked {:>3} rows   {:>8.1} M elem/s   oracle is {:.1}x\n\
         \x20 results agree to {:.1e} (relative)\n",
        v["rows"],
        v["vocab"],
        v["reps"],
        v["threads"],
        f("oracle_elems_per_s") / 1e6,
        f("numpy_elems_per_s") / 1e6,
        f("ratio"),
        v["numpy_block_rows"],
        f("numpy_blocked_elems_per_s") / 1e6,
        f("ratio_blocked"),
        f("max_rel_diff"),
    )
}
