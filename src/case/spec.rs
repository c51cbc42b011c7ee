//! [`CaseSpec`]: everything proptest draws for one case, compact enough to
//! shrink and to keep in a repro; the arrays follow from it and its seed
//! (`materialise`).

use grpo_oracle::{
    Config, Hparams,
};
use serde::{Deserialize, Serialize};

use crate::case::vocabulary::{AdvantagePattern, Dtype, Kind, LogitPattern, MaskPattern, Mesh, NormalizerChoice, RatioPattern, TokenPattern};

/// Everything proptest draws for one case; the arrays follow from it and `seed`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CaseSpec {
    pub batch: usize,
    pub time: usize,
    pub vocab: usize,
    /// H: used by the fused kind only.
    pub hidden: usize,
    pub dtype: Dtype,
    pub config: Config,
    /// `normalizer` here is a placeholder; see `normalizer`.
    pub hparams: Hparams,
    pub normalizer: NormalizerChoice,
    pub logits: LogitPattern,
    pub tokens: TokenPattern,
    pub mask: MaskPattern,
    pub ratios: RatioPattern,
    pub advantages: AdvantagePattern,
    /// Fill masked positions with garbage: old/ref log-probs of +-1e9, token ids -100 or >= V.
    pub masked_garbage: bool,
    /// The loss's cotangent in the VJP.
    pub cotangent: f64,
    pub seed: u64,
    /// The mesh the implementation runs under (`check --devices N`); none
    /// on one device. Absent in repros written before meshes existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mesh: Option<Mesh>,
}

impl CaseSpec {
    /// The hyperparameters an implementation receives: the normalizer
    /// resolved for `valid` unmasked tokens, switched-off terms zeroed and
    /// delta = +inf unless two-sided (SPEC.md).
    pub fn resolved_hparams(&self, valid: usize) -> Hparams {
        let mut h = self.hparams;
        let (n, valid) = ((self.batch * self.time) as f64, valid as f64);
        h.normalizer = f32_round(match self.normalizer {
            NormalizerChoice::BatchTimesTime => n,
            NormalizerChoice::ValidCount => valid.max(1.0),
            NormalizerChoice::GlobalCount => 3.0 * valid + 5.0,
            NormalizerChoice::Constant => 37.5,
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
        specs
    }
}

pub fn f32_round(x: f64) -> f32 {
    x as f32
}
