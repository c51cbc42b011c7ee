//! A test case: the compact description proptest generates and shrinks
//! ([`CaseSpec`], drawn by `strategy` from `prng` streams), and the arrays it
//! materialises into ([`Case`]), already rounded to the implementation's
//! dtype so the oracle sees exactly the values the implementation sees.

pub mod arrays;
pub mod dimension;
pub mod group;
pub mod materialise;
pub mod objective;
pub mod plan;
pub mod prng;
pub mod real;
pub mod spec;
pub mod strategy;
pub mod vocabulary;

pub use materialise::{Case, CaseProblem, Inputs};
pub use spec::CaseSpec;
pub use vocabulary::{
    training_step, AdvantagePattern, Dtype, IsWeightsPattern, KlPattern, Kind, LogitPattern, MaskPattern, Mesh, NormalizerChoice, RatioPattern, TokenPattern,
};
