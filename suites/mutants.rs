//! The mutant gate (issue 5): every mutant of the built-in catalog
//! (`suites/fixtures/mutants/`) is caught within the CI budget
//! (`MutantOptions::ci`, the default of `grpo-verify mutants`), shrunk to a
//! small case whose repro fails again on replay; and the correct bases the
//! mutants are built from pass the same budget, so a catch is the bug's
//! doing and not the base's.

mod common;

use std::cell::RefCell;

use grpo_verify::evaluate::{Evaluator, Outcome};
use grpo_verify::mutants::{builtin_catalog, catalog, run_mutant, Mutant, MutantOptions};
use grpo_verify::repro::Repro;
use libtest_mimic::{Arguments, Failed, Trial};

/// A shrunk repro of a caught mutant holds at most this many logits
/// (B * T * V). The shrinker is capped at 64 steps in the CI budget; every
/// catalog mutant gets well under this (most to a handful), so a larger
/// minimal case means shrinking regressed.
const MAX_MINIMAL_ELEMENTS: usize = 4096;

thread_local! {
    // One worker per test thread, reused across trials (starting one costs
    // a JAX import, seconds, against a fraction of a second per case).
    static EVALUATOR: RefCell<Option<Evaluator>> = const { RefCell::new(None) };
}

fn with_evaluator<T>(f: impl FnOnce(&mut Evaluator) -> T) -> T {
    EVALUATOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        let eval = slot.get_or_insert_with(|| common::evaluator(600.0));
        f(eval)
    })
}

fn options(name: &str) -> MutantOptions {
    let mut opts = MutantOptions::ci(std::env::temp_dir().join(format!("grpo-verify-mutants-{}-{name}", std::process::id())));
    opts.cases = common::cases(opts.cases);
    opts
}

fn caught(mutant: Mutant) -> Trial {
    Trial::test(format!("mutants::catches_{}", mutant.name), move || {
        with_evaluator(|eval| -> Result<(), Failed> {
            let kind = eval.worker.load(&mutant.implementation()).map_err(|e| format!("{e:#}"))?;
            let opts = options(&mutant.name);
            let r = run_mutant(eval, &mutant, &kind, &opts).map_err(|e| format!("{e:#}"))?;
            if !r.caught {
                return Err(format!("{} survived {} cases ({} unsupported): {}", mutant.name, r.check.supported, r.check.unsupported, mutant.bug).into());
            }
            let repro = Repro::load(r.check.repro.as_ref().ok_or("no repro written")?).map_err(|e| format!("{e:#}"))?;
            let elements = r.minimal_elements.unwrap_or(usize::MAX);
            if elements > MAX_MINIMAL_ELEMENTS {
                return Err(format!("{}: shrunk only to {} ({elements} logits)", mutant.name, repro.summary).into());
            }
            let again = eval.evaluate(&repro.implementation, &repro.case).map_err(|e| format!("{e}"))?;
            if again.outcome != Outcome::Fail {
                return Err(format!("{}: the repro does not fail on replay", mutant.name).into());
            }
            Ok(())
        })
    })
}

/// A correct base of the catalog (`_file.py:grpo_loss`) passes the budget.
fn base_passes(file: &'static str) -> Trial {
    Trial::test(format!("mutants::base_{}_passes", file.trim_start_matches('_').trim_end_matches(".py")), move || {
        with_evaluator(|eval| -> Result<(), Failed> {
            let path = std::fs::canonicalize(builtin_catalog().join(file))?;
            let base = Mutant { name: file.into(), category: "base".into(), bug: "none".into(), file: path };
            let kind = eval.worker.load(&base.implementation()).map_err(|e| format!("{e:#}"))?;
            let r = run_mutant(eval, &base, &kind, &options(file)).map_err(|e| format!("{e:#}"))?;
            if r.caught {
                return Err(format!("the correct base {file} failed: {:?} on {:?}", r.check.failure, r.check.minimal_case).into());
            }
            Ok(())
        })
    })
}

fn main() {
    let args = Arguments::from_args();
    let mutants = catalog(&builtin_catalog()).expect("the built-in catalog");
    let mut tests = vec![base_passes("_handwritten.py"), base_passes("_fused_chunked.py")];
    tests.extend(mutants.into_iter().map(caught));
    libtest_mimic::run(&args, tests).exit();
}
