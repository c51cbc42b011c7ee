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
pub mod worker;
pub mod compare;
pub mod evaluate;
pub mod check;
pub mod repro;
pub mod report;
pub mod cli;
pub mod lower;
pub mod mutants;
pub mod bench;
pub mod gradcheck;
