//! The f64 oracle of the GRPO clipped objective (`docs/spec.md`).
//!
//! Pure math: no I/O, no Python, no tolerance policy. Inputs are read exactly
//! (f32 and bf16 widen to f64 without rounding) and every quantity the SPEC
//! defines is computed in f64 with max-subtracted, compensated reductions.
//!
//! The logits kind is [`LogitsProblem`]; its forward pass ([`Forward`]) holds
//! O(B*T) per-token statistics, and the gradient is produced row by row
//! ([`Forward::grad_row`]) or as one [B*T, V] buffer ([`Forward::grad`]), so
//! no other [B*T, V] f64 temporary is ever built. Rows run in parallel
//! (rayon). The fused kind reuses the same per-row math on logit rows that
//! it computes itself, through the [`LogitRows`] trait.

#![deny(missing_docs)]

mod config;
mod conventions;
mod error;
mod exp;
mod forward;
mod fused;
pub mod gemm;
mod kl;
mod logits;
pub mod losses;
mod objective;
pub mod pieces;
mod policy;
mod problem;
mod simd;
mod softmax;
mod sum;
mod transform;
mod vector;

pub use conventions::{
    applicable, AccumulatedGradient, Argument, CaseFacts, Condition, Convention, Declared, Form, Rounding, RoundingAllowances, TokenRounding, BF16_UNIT, FORMS,
    TF32_UNIT,
};
pub use config::{
    Aggregation, Config, EntropyAggregation, HparamInfo, Hparams, KlEstimator, KlGradient, PolicyLoss, RatioLevel, SwitchInfo,
    TemperatureMode, ValueInfo, HPARAMS, SWITCHES,
};
#[cfg(feature = "serde")]
pub use config::JsonNumber;
pub use forward::{Forward, TokenStats};
pub use kl::KlTerm;
pub use policy::{clamped_interval, sigmoid, PolicyTerm};
pub use transform::LogitTransform;
pub use error::InputError;
pub use simd::isa;
pub use fused::{vocab_chunks, FusedProblem, Magnitudes, Sweep, SweepChunk, SweepResult, rounding_weight, UNDERFLOW_P, VOCAB_CHUNK};
pub use objective::{aggregation_weights, kink_interval, kl_per_token, ppo_per_token, KinkInterval};
pub use logits::LogitsProblem;
pub use problem::{LogitRows, Real, RowStats, Shape, TokenInputs};
pub use softmax::{row_softmax_stats, stored_row_softmax_stats_f32, RowSoftmax};
pub use sum::CompensatedSum;
