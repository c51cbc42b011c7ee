//! The fixture's training step as cases: the fused case (hidden, lm_head),
//! the logits case formed from it when a logits-kind implementation needs
//! it, micro-batches of a long step, and the production presets' memory
//! check.


use anyhow::Result;
use grpo_oracle::{Aggregation, Hparams};
use rayon::prelude::*;

use crate::case::objective::Preset;
use crate::case::{training_step, Case, CaseProblem, Dtype, Inputs, NormalizerChoice};
use grpo_oracle::Shape;
use crate::gradcheck::fixture::Fixture;
use crate::case::prng::Prng;

/// How `gradcheck` forms its case from a fixture (docs/cli.md, `gradcheck`).
pub struct GradcheckOptions {
    /// Check the first `time` positions of every row (None: all of T).
    pub time: Option<usize>,
    /// The float inputs' dtype (`--dtype`; bf16 by default, as the field trains).
    pub dtype: Dtype,
    /// A SPEC v2 preset whose switches and hyperparameters replace the seed
    /// team's training step (`--objective`), at the fixture's temperature.
    pub objective: Option<&'static Preset>,
    /// The standard deviation of the noise added to the sampler's old_logp at each valid token (`--ratio-noise`).
    pub ratio_noise: f64,
    /// The seed of that noise (and of a preset's fixture).
    pub seed: u64,
    /// Run the step as micro-batches of this many positions (None: whole).
    pub token_block: Option<usize>,
}

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
    /// The step as a fused case (hidden and lm_head).
    pub fused: Case,
    /// The whole step's logits case (None when not needed, or when the step
    /// runs in micro-batches: each forms its own).
    pub logits: Option<Case>,
    /// Positions checked per row.
    pub time: usize,
    /// Micro-batches of this many positions, when the step is split.
    pub token_block: Option<usize>,
}

/// The first `time` positions of every row: [B, T, W] -> [B, time, W].
fn prefix<T: Copy>(a: &[T], t_full: usize, time: usize, width: usize) -> Vec<T> {
    a.chunks(t_full * width).flat_map(|row| row[..time * width].iter().copied()).collect()
}

/// The fixture's step as cases under `opts` (the logits case only when `need_logits`).
pub fn cases(fixture: &Fixture, lm_head: Vec<f32>, opts: &GradcheckOptions, need_logits: bool) -> Result<FixtureCases> {
    let time = opts.time.unwrap_or(fixture.time).min(fixture.time).max(1);
    let (b, h, v) = (fixture.batch, fixture.hidden_dim, fixture.vocab);
    let (mut config, mut hparams) = training_step(fixture.temperature);
    let mask = prefix(&fixture.mask, fixture.time, time, 1);
    if let Some(preset) = opts.objective {
        config = preset.config(config);
        // One step of the fixture: the global counts are its own.
        let valid = mask.iter().filter(|&&m| m != 0.0).count().max(1);
        let non_empty = mask.chunks(time).filter(|row| row.iter().any(|&m| m != 0.0)).count().max(1);
        hparams = Hparams {
            normalizer: match preset.normalizer {
                Some(NormalizerChoice::BatchTimesTime) => (b * time) as f64,
                Some(NormalizerChoice::NonEmptyRows) => non_empty as f64,
                _ => valid as f64,
            },
            ..preset.hparams(hparams)
        };
        if !config.two_sided {
            hparams.delta = f64::INFINITY;
        }
    }
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
        shape: Shape { batch: b, time, vocab: v },
        dtype: opts.dtype,
        config,
        hparams,
        cotangent: 1.0,
        inputs: Inputs::Fused { hidden_dim: h, hidden: prefix(&fixture.hidden, fixture.time, time, h), lm_head },
        tokens: prefix(&fixture.tokens, fixture.time, time, 1),
        mask,
        advantages: fixture.advantages.clone(),
        old_logp: Some(old_logp),
        ref_logp: None,
        is_weights: None,
        mesh: None,
    };
    let token_block = opts.token_block.filter(|&tb| tb < time);
    let token_level = matches!(config.aggregation, Aggregation::TokenMean | Aggregation::SumOverConstant)
        && config.ratio_level == grpo_oracle::RatioLevel::Token;
    if token_block.is_some() && !token_level {
        anyhow::bail!(
            "--token-block splits every row into micro-batches, which only a token-level objective survives (token_mean or \
             sum_over_constant, ratio_level=token); --objective {} is not one: check this fixture whole",
            opts.objective.map_or("?", |p| p.name)
        );
    }
    let logits = (need_logits && token_block.is_none()).then(|| logits_case(&fused));
    Ok(FixtureCases { fused, logits, time, token_block })
}

/// The logits-kind twin of a fused case: hidden @ lm_head formed exactly
/// (blocked f64 products), rounded to the case's dtype.
pub fn logits_case(fused: &Case) -> Case {
    let CaseProblem::Fused(problem) = fused.problem() else { unreachable!("the fixture case is fused") };
    let (rows, v) = (fused.shape.batch * fused.shape.time, fused.shape.vocab);
    let mut logits = vec![0.0f32; rows * v];
    let mut z = Vec::new();
    for (block, out) in logits.chunks_mut(LOGIT_BLOCK_ROWS * v).enumerate() {
        let block_rows: Vec<usize> = (block * LOGIT_BLOCK_ROWS..(block * LOGIT_BLOCK_ROWS + out.len() / v)).collect();
        z.resize(out.len(), 0.0);
        problem.logit_block(&block_rows, &mut z);
        let dtype = fused.dtype;
        out.par_iter_mut().zip(z.par_iter()).for_each(|(o, &zv)| *o = dtype.round(zv));
    }
    fused.with_inputs(Inputs::Logits { logits })
}

/// Positions `range` of every row of a token-mean fused case, as a complete
/// micro-batch: the same sum over its tokens divided by the whole step's
/// valid-token count (`sum_over_constant`), so the micro-batches' losses
/// and gradients add up to the whole step's. lm_head is moved in (and must
/// be moved back with [`restore_lm_head`]): at production shapes it is GBs.
pub fn micro_batch(full: &mut Case, range: std::ops::Range<usize>) -> Case {
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
        shape: Shape { batch: b, time: range.len(), vocab: full.shape.vocab },
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
        // Gradcheck steps are v1 (a time block would split a sequence-level ratio's row).
        is_weights: None,
        mesh: full.mesh,
    }
}

/// Moves a micro-batch's lm_head back into the whole step's case.
pub fn restore_lm_head(full: &mut Case, micro: Case) {
    if let (Inputs::Fused { lm_head, .. }, Inputs::Fused { lm_head: from, .. }) = (&mut full.inputs, micro.inputs) {
        *lm_head = from;
    }
}

