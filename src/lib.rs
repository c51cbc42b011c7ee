//! grpo-verify: property-based numerical verification of GRPO loss kernels.
//!
//! The data path, one module per arrow:
//!
//!   case (`strategy`, `case`) -> inputs rounded to the dtype (`case`)
//!     -> a JAX worker runs the implementation (`host`) -> outputs (`outputs`)
//!     -> the f64 oracle on the same inputs (`grpo_oracle`)
//!     -> the tolerance rule (`compare`) -> reports (`report`) and, on a
//!        failure, a shrunk repro (`repro`). `check` drives the loop.

pub mod case;
pub mod prng;
pub mod strategy;
pub mod check;
pub mod cli;
pub mod compare;
pub mod classify;
pub mod evaluate;
pub mod host;
pub mod outputs;
pub mod pyenv;
pub mod report;
pub mod repro;
pub mod lower;
pub mod bench;
pub mod bench_oracle;
pub mod bench_fused_oracle;
pub mod wandb;
pub mod fixture;
pub mod gradcheck;
pub mod gradcheck_html;
pub mod plots;
pub mod mutants;
