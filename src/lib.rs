//! grpo-verify: property-based numerical verification of GRPO loss kernels.
//!
//! The data path, one module per arrow, in the order a case travels:
//!
//!   `case`      a spec drawn by `case::strategy` (its first groups from
//!               the covering array of `case::plan`), materialised into
//!               arrays rounded to the implementation's dtype
//!   `worker`    the JAX worker runs the implementation on them
//!               (`worker::protocol` frames the request, `worker::outputs`
//!               reads what came back)
//!   `evaluate`  the f64 oracle's forward pass on the same inputs
//!               (`grpo_oracle`), the baseline, and
//!   `compare`   the tolerance rule: errors in units of u, kink-aware
//!   `check`     drives it: groups of cases, every implementation, shrinking
//!   `discrepancy` (`check --keep-going`) failures put together into
//!               distinct discrepancies, each with its own repro
//!   `repro`     the minimal failing case as a file, and its replay
//!   `coverage`  what the run's cases exercised: switch values, pairs, edges
//!   `report`    report.json and report.md
//!
//! The other commands sit beside the path and reuse it: `gradcheck`
//! (hidden-state fixtures at production vocabulary), `mutants` (the bug
//! catalog), `lower` (TPU lowering from CPU) and `bench` (speed and memory,
//! and the oracle's own). `cli` is the grammar of `docs/cli.md` and a
//! dispatch to them. `partition` and `merge` split a run over machines and
//! join its reports. `head` is the same path for the other losses trained
//! on the head (cross-entropy and distillation): its own cases, the
//! worker's `head_run` op, the oracle's `losses`.

#![deny(missing_docs)]

pub mod case;
pub mod worker;
pub mod evaluate;
pub mod compare;
pub mod check;
pub mod discrepancy;
pub mod invariance;
pub mod repro;
pub mod sensitivity;
pub mod necessity;
pub mod tightness;
pub mod coverage;
pub mod report;
pub mod partition;
pub mod merge;

pub mod head;
pub mod gradcheck;
pub mod mutants;
pub mod lower;
pub mod memory;
pub mod bench;
pub mod cli;
