//! The `cargo test` suites, one module each, run as one binary: one pool of
//! test threads for every suite's trials, so that no suite's last long
//! trial runs alone while the next suite waits (cargo runs test binaries one
//! after another), and one link instead of eleven.
//!
//! One suite: `cargo test --release --test suites -- mutants::` (every
//! trial is named `<suite>::<what it checks>`).

mod common;

mod check;
mod cli;
mod conventions;
mod gradcheck;
mod head;
mod mutants;
mod oracle;
mod partition;
mod real;
mod sharded;
mod torch;
mod transformers;
mod worker;

use libtest_mimic::{Arguments, Trial};

/// The suites whose trials run PyTorch implementations (or the Transformers
/// model) or the libraries' adapters (`libraries::`, head.rs: tokamax is JAX,
/// and in the same lock): the repository's .venv gets the torch lock before
/// any of them runs.
const WITH_TORCH: [&str; 5] = ["cli::", "conventions::", "torch::", "transformers::", "libraries::"];

/// Whether the trial named `name` runs under `args`'s filter and skips (as
/// libtest-mimic applies them).
fn selected(args: &Arguments, name: &str) -> bool {
    let matches = |filter: &str| if args.exact { name == filter } else { name.contains(filter) };
    args.filter.as_deref().map_or(true, matches) && !args.skip.iter().any(|s| matches(s))
}

fn main() {
    grpo_verify::memory::keep_freed_memory();
    let args = Arguments::from_args();
    // libtest-mimic starts the trials in this order on its threads: the
    // longest first (each suite keeps its own order, longest first where it
    // matters), the many short ones last, where they fill in beside whatever
    // is still running.
    let suites = [
        gradcheck::trials(),
        torch::trials(),
        check::trials(),
        real::trials(),
        transformers::trials(),
        conventions::trials(),
        sharded::trials(),
        cli::trials(),
        mutants::trials(),
        head::trials(),
        worker::trials(),
        oracle::trials(),
        partition::trials(),
    ];
    let runs = |prefix: &str| !args.list && suites.iter().flatten().any(|t| t.name().starts_with(prefix) && selected(&args, t.name()));
    if WITH_TORCH.iter().any(|prefix| runs(prefix)) {
        common::with_torch();
    }
    let gate_transformers = runs("transformers::");
    let tests: Vec<Trial> = suites
        .into_iter()
        .map(|suite| match suite.first() {
            Some(t) if gate_transformers && t.name().starts_with("transformers::") => transformers::gated(suite),
            _ => suite,
        })
        .flatten()
        .collect();
    libtest_mimic::run(&args, tests).exit();
}
