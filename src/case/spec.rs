//! [`CaseSpec`]: everything proptest draws for one case, compact enough to
//! shrink and to keep in a repro; the arrays follow from it and its seed
//! (`materialise`).

use grpo_oracle::{
    Config, Hparams,
};
use serde::{Deserialize, Serialize};

use crate::case::vocabulary::{
    AdvantagePattern, Dtype, IsWeightsPattern, KlPattern, Kind, LogitPattern, MaskPattern, Mesh, NormalizerChoice, RatioPattern, TokenPattern,
};

/// Everything proptest draws for one case; the arrays follow from it and `seed`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CaseSpec {
    /// B, sequences.
    pub batch: usize,
    /// T, positions per sequence.
    pub time: usize,
    /// V, the vocabulary.
    pub vocab: usize,
    /// H: used by the fused kind only.
    pub hidden: usize,
    /// The float inputs' dtype.
    pub dtype: Dtype,
    /// The static switches.
    pub config: Config,
    /// `normalizer` here is a placeholder; see `normalizer`.
    pub hparams: Hparams,
    /// How the `sum_over_constant` normalizer is formed from the mask.
    pub normalizer: NormalizerChoice,
    /// How the logits (or hidden @ lm_head) are drawn.
    pub logits: LogitPattern,
    /// Which token id each position holds.
    pub tokens: TokenPattern,
    /// Which positions are valid.
    pub mask: MaskPattern,
    /// Where the ratios r = exp(logp - old) fall.
    pub ratios: RatioPattern,
    /// The advantages' signs and sizes.
    pub advantages: AdvantagePattern,
    /// Fill masked positions with garbage: old/ref log-probs of +-1e9, token ids -100 or >= V.
    pub masked_garbage: bool,
    /// The loss's cotangent in the VJP.
    pub cotangent: f64,
    /// The seed every array is materialised from.
    pub seed: u64,
    /// The mesh the implementation runs under (`check --devices N`); none
    /// on one device. Absent in repros written before meshes existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mesh: Option<Mesh>,
    /// The SPEC v2 preset the switches come from (None: v1 or drawn freely).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preset: Option<String>,
    /// v2's rollout-correction weights (with `rollout_correction`): their
    /// values, and [B, 1] (one per row) rather than [B, T].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_weights: Option<IsWeightsPattern>,
    /// is_weights of shape [B, 1] (one per row) rather than [B, T].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub is_weights_per_row: bool,
    /// Where the KL's d = ref - logp falls.
    #[serde(default = "near", skip_serializing_if = "is_near")]
    pub kl_pattern: KlPattern,
    /// Drawn from a real model's rollout (`case::real`): its hidden rows,
    /// sampled tokens and LM head columns, not the logit and token patterns.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub real: bool,
}

fn near() -> KlPattern {
    KlPattern::Near
}
fn is_near(p: &KlPattern) -> bool {
    *p == KlPattern::Near
}

impl CaseSpec {
    /// The hyperparameters an implementation receives: the normalizer
    /// resolved for `valid` unmasked tokens, switched-off terms zeroed and
    /// delta = +inf unless two-sided (docs/spec.md).
    pub fn resolved_hparams(&self, mask: &[f32]) -> Hparams {
        let mut h = self.hparams;
        let valid = mask.iter().filter(|&&m| m != 0.0).count();
        let non_empty = mask.chunks(self.time.max(1)).filter(|row| row.iter().any(|&m| m != 0.0)).count();
        let (n, valid) = ((self.batch * self.time) as f64, valid as f64);
        h.normalizer = f32_round(match self.normalizer {
            NormalizerChoice::BatchTimesTime => n,
            NormalizerChoice::ValidCount => valid.max(1.0),
            NormalizerChoice::GlobalCount => 3.0 * valid + 5.0,
            NormalizerChoice::Constant => 37.5,
            NormalizerChoice::NonEmptyRows => non_empty.max(1) as f64,
        }) as f64;
        if !self.config.two_sided {
            h.delta = f64::INFINITY;
        }
        if !self.config.kl {
            h.beta = 0.0;
        }
        if !self.config.entropy_bonus {
            h.entropy_coef = 0.0;
        }
        h
    }

    /// The (name, dtype, shape) of every input array of this case for an
    /// implementation of `kind`, without the data.
    pub fn array_specs(&self, kind: Kind) -> Vec<(&'static str, &'static str, Vec<usize>)> {
        let (b, t, v, h) = (self.batch, self.time, self.vocab, self.hidden);
        let float = self.dtype.name();
        let mut specs = if kind == Kind::Fused {
            vec![("hidden", float, vec![b, t, h]), ("lm_head", float, vec![h, v])]
        } else {
            vec![("logits", float, vec![b, t, v])]
        };
        specs.push(("tokens", "i32", vec![b, t]));
        specs.push(("mask", "f32", vec![b, t]));
        specs.push(("advantages", "f32", vec![b]));
        if !self.config.on_policy {
            specs.push(("old_logp", "f32", vec![b, t]));
        }
        if self.config.kl {
            specs.push(("ref_logp", "f32", vec![b, t]));
        }
        if self.config.rollout_correction {
            specs.push(("is_weights", "f32", vec![b, if self.is_weights_per_row { 1 } else { t }]));
        }
        specs
    }
}

/// x rounded to the nearest f32 (hyperparameters are given to implementations as f32).
pub fn f32_round(x: f64) -> f32 {
    x as f32
}
