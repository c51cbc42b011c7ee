//! `grpo-verify bench-oracle --kind fused`: the fused oracle's tokens per
//! second at production shapes (the forward pass and the comparison's sweep:
//! what `check` and `gradcheck` spend on a fused case), next to the f64 and
//! f32 GEMM rates measured on this machine in the same run, and the tokens
//! per second those rates would allow (the roofline).
//!
//! Work per token, in units of 2 H V flops (one product of a token's hidden
//! row with lm_head): the forward's logits (f64) and magnitudes (f32, a
//! block past f32's range summed again in f64); the sweep's logits again,
//! d hidden and d lm_head (f64), and the two magnitude sums, all in f64 (a
//! row scale can exceed f32's range). The roofline counts each at its
//! rate: six f64 products and one f32.

use std::time::Instant;

use anyhow::Result;
use grpo_oracle::gemm::{matmul, Layout};
use grpo_oracle::{FusedProblem, Magnitudes, Shape, Sweep};
use serde_json::{json, Value};

use crate::case::prng::Prng;

/// What `bench-oracle --kind fused` times.
pub struct FusedBenchOptions {
    /// Rows (tokens) of B = 1.
    pub rows: usize,
    /// H.
    pub hidden: usize,
    /// V.
    pub vocab: usize,
    /// The inputs' seed.
    pub seed: u64,
    /// Repetitions; the median is reported.
    pub reps: usize,
}


/// flop/s of `dst += lhs @ rhs` at the sweep's shapes (512 rows, H, 4096
/// columns), the best of three.
fn gemm_rate<T: grpo_oracle::gemm::Scalar + From<f32>>(hidden: usize) -> f64 {
    let (m, k, n) = (512, hidden, 4096);
    let lhs: Vec<T> = (0..m * k).map(|i| T::from((i % 7) as f32 * 0.25)).collect();
    let rhs: Vec<T> = (0..k * n).map(|i| T::from((i % 5) as f32 * 0.5)).collect();
    let mut dst = vec![T::default(); m * n];
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let started = Instant::now();
        matmul(&mut dst, Layout::dense(m, n), &lhs, Layout::dense(m, k), &rhs, Layout::dense(k, n), true);
        best = best.min(started.elapsed().as_secs_f64());
    }
    2.0 * (m * k * n) as f64 / best
}

/// Runs the benchmark; the result is the JSON object `--json` prints.
pub fn run(opts: &FusedBenchOptions) -> Result<Value> {
    let (rows, h_, v_) = (opts.rows, opts.hidden, opts.vocab);
    let f64_rate = gemm_rate::<f64>(h_);
    let f32_rate = gemm_rate::<f32>(h_);
    // bf16-valued inputs at Qwen-like sizes; tokens uniform, ratios mixed.
    let bf16 = |x: f64| half::bf16::from_f64(x).to_f32();
    let mut prng = Prng::keyed(opts.seed, 71, 0, 0);
    let hidden: Vec<f32> = (0..rows * h_).map(|_| bf16(prng.normal())).collect();
    let lm_head: Vec<f32> = (0..h_ * v_).map(|_| bf16(0.02 * prng.normal())).collect();
    let tokens: Vec<i32> = (0..rows).map(|_| (prng.next_u64() % v_ as u64) as i32).collect();
    let old_logp: Vec<f32> = (0..rows).map(|_| (-(v_ as f64).ln() + 0.3 * prng.normal()) as f32).collect();
    let mask = vec![1.0f32; rows];
    let advantages = vec![0.7f32];
    let (config, hparams) = crate::case::training_step(0.7);
    let problem = FusedProblem {
        shape: Shape { batch: 1, time: rows, vocab: v_ },
        hidden_dim: h_,
        hidden: &hidden,
        lm_head: &lm_head,
        per_token: grpo_oracle::TokenInputs {
            tokens: &tokens,
            mask: &mask,
            advantages: &advantages,
            old_logp: Some(&old_logp),
            ref_logp: None,
            is_weights: None,
        },
        config,
        hparams,
    };
    let live: Vec<usize> = (0..rows).collect();
    let row_scale = vec![1.0; rows];
    let (mut forward_s, mut sweep_s) = (Vec::new(), Vec::new());
    let mut checksum = 0.0;
    for _ in 0..opts.reps {
        let started = Instant::now();
        let fwd = problem.forward().map_err(|e| anyhow::anyhow!("bench-oracle inputs: {e}"))?;
        forward_s.push(started.elapsed().as_secs_f64());
        let coef: Vec<f64> = live.iter().map(|&i| fwd.tokens[i].policy_interval.midpoint()).collect();
        let magnitudes = Magnitudes { row_scale: &row_scale, g_weight_hidden: (v_ as f64).sqrt(), g_weight_lm_head: (rows as f64).sqrt() };
        let sweep = Sweep { rows: &live, ppo_coef: &coef, directions: &[], magnitudes: Some(magnitudes), lm_head: true, rounding: None };
        let started = Instant::now();
        let mut d_lm_head_sum = 0.0;
        let result = problem.sweep(&fwd, 1.0, &sweep, |chunk| d_lm_head_sum += chunk.d_lm_head.iter().sum::<f64>());
        sweep_s.push(started.elapsed().as_secs_f64());
        checksum = fwd.loss + d_lm_head_sum + result.d_hidden.iter().sum::<f64>();
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (forward, sweep) = (median(&mut forward_s), median(&mut sweep_s));
    let per_token_flops = 2.0 * (h_ * v_) as f64;
    // The roofline: six f64 products and the forward's f32 magnitude product, each at its rate.
    let roofline_s_per_token = per_token_flops * (6.0 / f64_rate + 1.0 / f32_rate);
    let tokens_per_s = rows as f64 / (forward + sweep);
    Ok(json!({
        "kind": "fused",
        "rows": rows,
        "hidden": h_,
        "vocab": v_,
        "forward_s": forward,
        "sweep_s": sweep,
        "oracle_tokens_per_s": tokens_per_s,
        "gemm_f64_flops": f64_rate,
        "gemm_f32_flops": f32_rate,
        "roofline_tokens_per_s": 1.0 / roofline_s_per_token,
        "fraction_of_roofline": tokens_per_s * roofline_s_per_token,
        "checksum": checksum,
        "isa": grpo_oracle::isa(),
    }))
}

/// The human-readable lines of `bench-oracle --kind fused`.
pub fn summary(r: &Value) -> String {
    let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
    format!(
        "fused oracle, B=1 T={} H={} V={}: forward {:.2} s + sweep {:.2} s = {:.1} tokens/s\n\
         GEMM on this machine ({}): f64 {:.1} GFLOP/s, f32 {:.1} GFLOP/s -> roofline {:.1} tokens/s; the oracle runs at {:.0}% of it\n",
        r["rows"],
        r["hidden"],
        r["vocab"],
        f("forward_s"),
        f("sweep_s"),
        f("oracle_tokens_per_s"),
        r["isa"].as_str().unwrap_or("?"),
        f("gemm_f64_flops") / 1e9,
        f("gemm_f32_flops") / 1e9,
        f("roofline_tokens_per_s"),
        100.0 * f("fraction_of_roofline"),
    )
}
