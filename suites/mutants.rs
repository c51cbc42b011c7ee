//! The mutant gate: every mutant of the built-in catalog
//! (`suites/fixtures/mutants/`) is caught within the CI budget
//! (`MutantOptions::ci`, the default of `grpo-verify mutants`), shrunk to a
//! small case whose repro fails again on replay; and the correct bases the
//! mutants are built from pass the same budget, so a catch is the bug's
//! doing and not the base's.

use crate::common;

use std::cell::RefCell;

use grpo_verify::evaluate::{Evaluator, Outcome};
use grpo_verify::mutants::{builtin_catalog, catalog, run_mutant, Mutant, MutantOptions};
use grpo_verify::repro::Repro;
use libtest_mimic::{Failed, Trial};

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
    crate::common::trial(format!("mutants::catches_{}", mutant.name), move || {
        with_evaluator(|eval| -> Result<(), Failed> {
            let kind = eval.worker.load(&mutant.implementation()).map_err(|e| format!("{e:#}"))?;
            let opts = options(&mutant.name);
            let r = run_mutant(eval, &mutant, kind, &opts).map_err(|e| format!("{e:#}"))?;
            if let (false, Some(failure)) = (r.caught, &r.check.failure) {
                return Err(format!("{} raises instead of computing (a broken fixture, not a caught bug): {failure}", mutant.name).into());
            }
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
            label_fits(&repro.case, &again, &eval.worker.hello).map_err(|e| format!("{}: {e}", mutant.name))?;
            Ok(())
        })
    })
}

/// Every rounding a minimal case's failure names can happen on that case:
/// bf16 accumulation across vocabulary blocks needs more than one block
/// (128 columns, the finest the classification assumes), across rows more
/// than one row holding a valid token; TF32 needs a GPU backend. Red when
/// the label is chosen by the error's size alone (a 3% d hidden at B=1 T=1
/// V=2 was "consistent with accumulation in bf16").
fn label_fits(case: &grpo_verify::case::Case, result: &grpo_verify::evaluate::CaseResult, hello: &serde_json::Value) -> Result<(), String> {
    use grpo_verify::compare::Hypothesis;
    let rows = case.mask.chunks(case.shape.time).filter(|row| row.iter().any(|&m| m != 0.0)).count();
    for v in result.verdicts.iter().filter(|v| !v.pass) {
        let Some(class) = &v.class else { continue };
        let fits = match class.hypothesis {
            Some(Hypothesis::Bf16AccumulationOverColumns) => case.shape.vocab > 128,
            Some(Hypothesis::Bf16AccumulationOverRows) => rows > 1,
            Some(Hypothesis::Tf32) => grpo_verify::evaluate::tf32_possible(hello),
            _ => true,
        };
        if !fits {
            return Err(format!(
                "its minimal case (B={} T={} V={}, {rows} row(s) with valid tokens) is labelled with a rounding it cannot hold: {v_q}: {class}",
                case.shape.batch,
                case.shape.time,
                case.shape.vocab,
                v_q = v.quantity
            ));
        }
    }
    Ok(())
}

/// A correct base of the catalog (`_file.py:grpo_loss`) passes the budget,
/// on the draws of the mutants built from it (`_conv_*`: declared
/// conventions, bf16 draws only, as the `conv_` mutants).
fn base_passes(file: &'static str) -> Trial {
    let stem = file.trim_start_matches('_').trim_end_matches(".py");
    crate::common::trial(format!("mutants::base_{stem}_passes"), move || {
        with_evaluator(|eval| -> Result<(), Failed> {
            let path = std::fs::canonicalize(builtin_catalog().join(file))?;
            let base = Mutant { name: stem.into(), category: "base".into(), bug: "none".into(), file: path };
            let kind = eval.worker.load(&base.implementation()).map_err(|e| format!("{e:#}"))?;
            let opts = options(file);
            let r = run_mutant(eval, &base, kind, &opts).map_err(|e| format!("{e:#}"))?;
            if r.caught {
                return Err(format!("the correct base {file} failed: {:?} on {:?}", r.check.failure, r.check.minimal_case).into());
            }
            // The whole budget: a base refuses no draw (60 of 60 checked, none refused).
            common::checked_at_least(&r.check, opts.cases as usize, "the whole budget; a correct base refuses no draw")
        })
    })
}

/// Logits at -30000 +- 10 with tau = 0.1 and the entropy bonus on: the
/// correct chunked base passes where every p of some vocabulary columns
/// underflows f32 (it failed d lm_head by 236 u without the underflow floor,
/// `grpo_oracle::UNDERFLOW_P`), and where p is ~1e-20, where its online
/// entropy's d lm_head sat at 37 u of a scale that left out p |log p|
/// (`grpo_oracle::rounding_weight`). Both cases were found by the gate itself.
fn extreme_logits_are_not_a_finding() -> Trial {
    crate::common::trial("mutants::base_fused_chunked_passes_at_extreme_logits", || {
        with_evaluator(|eval| -> Result<(), Failed> {
            let base = format!("{}:grpo_loss", std::fs::canonicalize(builtin_catalog().join("_fused_chunked.py"))?.display());
            let underflow: grpo_verify::case::CaseSpec = serde_json::from_str(UNDERFLOW_SPEC)?;
            let mut tiny_p = underflow.clone();
            (tiny_p.hidden, tiny_p.hparams.entropy_coef) = (64, 0.009999999776482582);
            tiny_p.mask = grpo_verify::case::MaskPattern::FullyMaskedRow;
            for (what, spec) in [("every p underflows", underflow), ("p near 1e-20", tiny_p)] {
                let result = eval.evaluate(&base, &spec.materialize(grpo_verify::case::Kind::Fused)).map_err(|e| format!("{e}"))?;
                if result.outcome != Outcome::Pass {
                    return Err(format!("{what}: the correct base failed: {}", result.reason).into());
                }
            }
            Ok(())
        })
    })
}

const UNDERFLOW_SPEC: &str = r#"{"batch": 2, "time": 4, "vocab": 911, "hidden": 53, "dtype": "f32",
    "config": {"temperature_mode": "logits", "aggregation": "token_mean", "on_policy": false, "kl": false, "entropy_bonus": true, "two_sided": false},
    "hparams": {"eps_low": 0.20000000298023224, "eps_high": 0.20000000298023224, "temperature": 0.10000000149011612, "beta": 0.03999999910593033,
                "entropy_coef": 0.10000000149011612, "delta": 1.7999999523162842, "normalizer": 1.0},
    "normalizer": "batch_times_time", "logits": {"pattern": "all_negative", "scale": 10.0, "offset": 30000.0}, "tokens": "mixed",
    "mask": "prompt_and_padding", "ratios": "mixed", "advantages": "zero", "masked_garbage": false, "cotangent": 1.0, "seed": 4486680655734859167}"#;


/// This suite's trials (suites/main.rs runs them with the others).
pub fn trials() -> Vec<Trial> {
    let mutants = catalog(&builtin_catalog()).expect("the built-in catalog");
    let mut tests = vec![
        base_passes("_handwritten.py"),
        base_passes("_fused_chunked.py"),
        base_passes("_conv_bf16_logits.py"),
        base_passes("_conv_bf16_logits_and_grad.py"),
        extreme_logits_are_not_a_finding(),
    ];
    tests.extend(mutants.into_iter().map(caught));
    tests
}
