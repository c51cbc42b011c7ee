//! End to end through the library: every built-in implementation (and the
//! small-block variants that exercise their multi-tile paths) passes
//! generated cases against the oracle. That broken implementations are
//! caught is the mutant gate's job (`suites/mutants.rs`).

mod common;

use std::time::Duration;

use grpo_verify::case::Dtype;
use grpo_verify::check::{run_check, CheckOptions};
use grpo_verify::strategy::Bounds;
use libtest_mimic::{Arguments, Trial};

fn options(implementation: &str, cases: u32, report: &str) -> CheckOptions {
    CheckOptions {
        implementations: vec![implementation.to_string()],
        cases,
        seed: 1,
        bounds: Bounds::new(4, 24, 2100, 64, vec![Dtype::F32, Dtype::Bf16]),
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

/// The README's worked example: the adapter around an external per-token
/// kernel passes (its unsupported configurations are drawn again, not
/// counted), and the same adapter around a kernel that applies the
/// temperature to the logits is caught.
fn external_adapter() -> Trial {
    Trial::test("check::external_adapter_passes_and_a_logits_mode_kernel_behind_it_is_caught", || {
        let adapter = format!("{}:grpo_loss", common::repo().join("examples/external_adapter/adapter.py").display());
        let mut eval = common::evaluator(600.0);
        let run = run_check(&options(&adapter, common::cases(40), "adapter"), &mut eval, &["logits".into()]).map_err(|e| format!("{e:#}"))?;
        let s = &run.summaries[0];
        if !s.passed || s.supported < common::cases(40) as usize {
            return Err(format!("the adapter: passed {} on {} checked cases: {:?} {:?}", s.passed, s.supported, s.failure, s.note).into());
        }
        let broken = common::fixture_impl("external/logits_mode_kernel.py");
        let run = run_check(&options(&broken, common::cases(60), "adapter-broken"), &mut eval, &["logits".into()]).map_err(|e| format!("{e:#}"))?;
        if run.summaries[0].passed {
            return Err(format!("the logits-mode kernel was not caught in {} cases", run.summaries[0].supported).into());
        }
        Ok(())
    })
}

fn main() {
    let args = Arguments::from_args();
    let tests = vec![
        passes("reference", "logits", 60),
        external_adapter(),
        // The Pallas kernel as shipped, and with 16 x 256 tiles so that the
        // generated shapes span several time and vocabulary tiles.
        passes("pallas_logits", "logits", 30),
        passes("grpo_kernels.pallas_logits:grpo_loss_small_blocks", "logits", 30),
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
