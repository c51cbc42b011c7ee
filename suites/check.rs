//! End to end through the library: the reference passes generated cases
//! against the oracle, and each deliberately broken implementation is
//! caught within the CI case budget, shrunk to a small case, written as a
//! repro, and the repro fails again when replayed.

mod common;

use std::time::Duration;

use grpo_verify::case::Dtype;
use grpo_verify::check::{run_check, CheckOptions};
use grpo_verify::evaluate::Outcome;
use grpo_verify::repro::Repro;
use grpo_verify::strategy::Bounds;
use libtest_mimic::{Arguments, Trial};

fn options(implementation: &str, cases: u32, report: &str) -> CheckOptions {
    CheckOptions {
        implementations: vec![implementation.to_string()],
        cases,
        seed: 1,
        bounds: Bounds { max_batch: 4, max_time: 24, max_vocab: 2100, max_hidden: 64, dtypes: vec![Dtype::F32, Dtype::Bf16] },
        report_dir: std::env::temp_dir().join(format!("grpo-verify-suite-{}-{report}", std::process::id())),
        regressions_dir: None,
        shrink_time: Duration::from_secs(900),
        shrink_iters: 256,
    }
}

/// A correct implementation passes `cases` generated cases of its kind.
fn passes(implementation: &'static str, kind: &'static str, cases: u32) -> Trial {
    let name: String = implementation.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    Trial::test(format!("check::{name}_passes_generated_cases"), move || {
        let mut eval = common::evaluator(600.0);
        let opts = options(implementation, common::cases(cases), implementation);
        let run = run_check(&opts, &mut eval, &[kind.into()]).map_err(|e| format!("{e:#}"))?;
        let s = &run.summaries[0];
        if !s.passed {
            return Err(format!("{implementation} failed: {:?} on {:?}", s.failure, s.minimal_case).into());
        }
        Ok(())
    })
}

/// A correct fused implementation among the suite's fixtures passes.
fn passes_fixture(target: &'static str, cases: u32) -> Trial {
    let name: String = target.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    Trial::test(format!("check::{name}_passes_generated_cases"), move || {
        let (file, function) = target.split_once(':').unwrap();
        let implementation = common::fixture_impl(file).replace(":grpo_loss", &format!(":{function}"));
        let mut eval = common::evaluator(600.0);
        let opts = options(&implementation, common::cases(cases), &name);
        let run = run_check(&opts, &mut eval, &["fused".into()]).map_err(|e| format!("{e:#}"))?;
        let s = &run.summaries[0];
        if !s.passed {
            return Err(format!("{target} failed: {:?} on {:?}", s.failure, s.minimal_case).into());
        }
        Ok(())
    })
}

/// The broken fixture must fail within the budget, shrink to at most
/// `max_elements` logits, and fail again on replay.
fn caught(fixture: &'static str, max_elements: usize) -> Trial {
    Trial::test(format!("check::catches_{}", fixture.trim_end_matches(".py").replace('/', "_")), move || {
        let implementation = common::fixture_impl(fixture);
        let mut eval = common::evaluator(600.0);
        let opts = options(&implementation, common::cases(60), fixture);
        let run = run_check(&opts, &mut eval, &["logits".into()]).map_err(|e| format!("{e:#}"))?;
        let s = &run.summaries[0];
        if s.passed {
            return Err(format!("{fixture} was not caught in {} cases", s.cases).into());
        }
        let repro = Repro::load(s.repro.as_ref().ok_or("no repro written")?).map_err(|e| format!("{e:#}"))?;
        let shape = repro.case.shape;
        let elements = shape.batch * shape.time * shape.vocab;
        if elements > max_elements {
            return Err(format!("{fixture}: shrunk only to {} ({elements} logits)", repro.summary).into());
        }
        let again = eval.evaluate(&repro.implementation, &repro.case).map_err(|e| format!("{e}"))?;
        if again.outcome != Outcome::Fail {
            return Err(format!("{fixture}: the repro does not fail on replay").into());
        }
        Ok(())
    })
}

fn main() {
    let args = Arguments::from_args();
    let tests = vec![
        passes("reference", "logits", 60),
        caught("broken/temperature_multiplied.py", 64),
        caught("broken/max_instead_of_min.py", 64),
        caught("broken/padding_in_mean.py", 64),
        caught("broken/last_vocab_id.py", 64),
        caught("broken/drops_cotangent.py", 64),
        // The Pallas kernel as shipped, and with 16 x 256 tiles so that the
        // generated shapes span several time and vocabulary tiles.
        passes("pallas_logits", "logits", 30),
        passes("grpo_kernels.pallas_logits:grpo_loss_small_blocks", "logits", 30),
        caught("pallas/tail_mask_off_by_one.py", 64),
        caught("pallas/time_padding_leaks.py", 64),
        caught("pallas/advantages_wrong_program_id.py", 64),
        // The fused kind against fused_reference: the shipped paths, and the
        // same with small blocks (several token and vocabulary blocks, remainders).
        passes("fused_reference", "fused", 15),
        passes("fused_chunked", "fused", 15),
        passes("fused_onepass", "fused", 15),
        passes("fused_pallas", "fused", 15),
        passes_fixture("fused/small_blocks.py:chunked", 15),
        passes_fixture("fused/small_blocks.py:onepass", 15),
        passes_fixture("fused/small_blocks.py:pallas", 15),
    ];
    libtest_mimic::run(&args, tests).exit();
}
