//! The words a case is made of: the two kinds of implementation, the dtypes,
//! the patterns the generators draw logits, tokens, masks, ratios and
//! advantages from, the device mesh, and the seed team's training step.

use grpo_oracle::{Config, Hparams};
use serde::{Deserialize, Serialize};


/// The seed team's training step at sampling temperature `temperature`:
/// logits mode, clip-higher 0.2 / 0.28, token-mean, off-policy, no KL, no
/// entropy bonus, one-sided (also what `bench-oracle --kind fused` times).
pub fn training_step(temperature: f64) -> (Config, Hparams) {
    let config = Config { on_policy: false, ..Config::default() };
    let hparams = Hparams {
        eps_low: 0.2,
        eps_high: 0.28,
        temperature: temperature as f32 as f64,
        ..Hparams::default()
    };
    (config, hparams)
}

/// docs/spec.md's two kinds of implementation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Takes logits [B, T, V].
    Logits,
    /// Takes hidden [B, T, H] and lm_head [H, V].
    Fused,
}

impl Kind {
    /// Its name (`logits`, `fused`).
    pub fn name(self) -> &'static str {
        match self {
            Kind::Logits => "logits",
            Kind::Fused => "fused",
        }
    }
    /// The kind named `s`, if it is one.
    pub fn parse(s: &str) -> Option<Kind> {
        match s {
            "logits" => Some(Kind::Logits),
            "fused" => Some(Kind::Fused),
            _ => None,
        }
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The float inputs' dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dtype {
    /// IEEE single precision.
    F32,
    /// bfloat16: f32's exponent, 8 significant bits.
    Bf16,
}

impl Dtype {
    /// x rounded to the nearest value of this dtype, as an f32.
    pub fn round(self, x: f64) -> f32 {
        match self {
            Dtype::F32 => x as f32,
            Dtype::Bf16 => half::bf16::from_f64(x).to_f32(),
        }
    }
    /// Its name (`f32`, `bf16`).
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::Bf16 => "bf16",
        }
    }
}

/// How a row of logits is drawn. `scale` multiplies a unit pattern.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "pattern")]
pub enum LogitPattern {
    /// scale * N(0, 1).
    Normal {
        /// The standard deviation.
        scale: f64,
    },
    /// A policy-like long tail: -scale * ln(rank), ranks shuffled.
    Zipf {
        /// The tail's slope.
        scale: f64,
    },
    /// scale * N(0, 1) plus one column 6 * scale + 8 above the rest.
    NearOneHot {
        /// The standard deviation of the rest.
        scale: f64,
    },
    /// Every column equal: a uniform softmax.
    Flat {
        /// The one value.
        value: f64,
    },
    /// scale * N(0, 1) - offset: all negative, large common offset.
    AllNegative {
        /// The standard deviation.
        scale: f64,
        /// The common offset subtracted.
        offset: f64,
    },
    /// scale * N(0, 1) + offset: all far above zero (exp overflows f32
    /// without the max subtracted first).
    Shifted {
        /// The standard deviation.
        scale: f64,
        /// The common offset added.
        offset: f64,
    },
    /// scale * N(0, 1) with the row's maximum moved into the last columns
    /// (the tail tile of any block size).
    TailMax {
        /// The standard deviation.
        scale: f64,
    },
}

/// Which token id each position holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenPattern {
    /// Uniform over [0, V).
    Random,
    /// Each position draws one of the others.
    Mixed,
    /// Each row's largest logit (the sampler's mode).
    Argmax,
    /// Each row's smallest logit.
    Argmin,
    /// Id 0, the first column.
    Zero,
    /// Id V - 1, the last column (the last tile's).
    Last,
    /// Ids on both sides of multiples of 128 and 2048.
    TileEdge,
}

/// Which positions are valid (mask = 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MaskPattern {
    /// Every position.
    Full,
    /// Each row valid up to a drawn length, padding after.
    RightPadded,
    /// Each row valid in one drawn span: a masked prompt before it, padding after.
    PromptAndPadding,
    /// One row with no valid position.
    FullyMaskedRow,
    /// No valid position at all (the loss and every gradient must be exactly 0).
    FullyMaskedBatch,
    /// Each position valid or not at random.
    Random,
}

/// Where the ratios r = exp(logp - old) fall (off-policy cases).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RatioPattern {
    /// Each token draws a region: below, inside or above the clip band,
    /// beyond delta, exactly on an edge, exactly 1, or extreme.
    Mixed,
    /// Within ~1% of 1 (what Liger's tests draw).
    NearOne,
    /// Exactly on 1 - eps_low, 1 + eps_high or delta (as far as f32 allows).
    OnEdges,
    /// log r ~ N(0, 1.5).
    Wide,
    /// Each token (each row's mean log-ratio at the sequence levels) on a
    /// finite log-ratio clamp, just past it, far past it (|log r| > 89:
    /// exp overflows f32 unless the clamp comes first) or inside; as
    /// `Mixed` where no clamp is finite.
    PastClamps,
}

/// The advantages' signs and sizes, one per sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdvantagePattern {
    /// Each row draws N(0,1), +-|N(0,1)|, 0 or +-1.
    Mixed,
    /// Every row's advantage above 0.
    Positive,
    /// Every row's advantage below 0.
    Negative,
    /// Every advantage exactly 0.
    Zero,
}

/// The N of `sum_over_constant`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NormalizerChoice {
    /// Dr.GRPO: B * T.
    BatchTimesTime,
    /// This micro-batch's valid-token count (at least 1).
    ValidCount,
    /// A global count shared with other micro-batches: 3 * valid + 5.
    GlobalCount,
    /// A fixed constant (37.5), independent of the mask.
    Constant,
    /// verl's seq-mean modes: the number of rows with a valid token (at least 1).
    NonEmptyRows,
}

/// The values of v2's rollout-correction weights (`is_weights`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IsWeightsPattern {
    /// All exactly 1 (what no correction means).
    Ones,
    /// TIS: the sampler ratio truncated at a cap, uniform in [0, 3].
    Truncated,
    /// MIS: 1 or a ratio in [0.5, 2], with some tokens (or rows) masked to 0.
    Masked,
    /// Large weights, up to 100 (the ~100x gradient-norm bug shows here).
    Large,
}

/// How the KL's log-ratio d = ref - logp is drawn (off the clamps, or at and past them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KlPattern {
    /// d ~ 0.5 N(0, 1).
    Near,
    /// Each token draws: near, d = 0 (|d|'s kink), on a clamp edge, past it, at
    /// k3's kl_max crossing, or far (|d| up to 40: exp(d) overflows f32).
    Mixed,
    /// As `Mixed`, but with a finite k3 clamp a third of the tokens lie far
    /// past it, mostly above: d of 89 to 110, where exp(d) overflows f32
    /// unless the clamp comes first (a value clamp after it hides the inf in
    /// the forward, not in the gradient).
    Overflow,
}

/// A device mesh: `data` devices along the batch axis times `model` devices
/// along the vocabulary axis (axis names "data" and "model" in the worker).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Mesh {
    /// Devices along the batch axis.
    pub data: usize,
    /// Devices along the vocabulary axis.
    pub model: usize,
}

impl Mesh {
    /// data * model.
    pub fn devices(&self) -> usize {
        self.data * self.model
    }
}
