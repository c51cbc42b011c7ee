//! Many devices: the `shard_map` implementations on 8 simulated
//! devices. They pass generated cases with generated meshes; every mesh of 8
//! passes on the same case (results do not depend on the mesh shape);
//! splitting a batch into micro-batches with `sum_over_constant` and the
//! global token count gives the full batch's loss and gradients when summed;
//! and copies with the classic distributed bugs (shards' exp-sums added
//! without rescaling to the global max; seq-mean over the padded batch) are
//! caught.

use crate::common;

use std::time::Duration;

use grpo_oracle::Aggregation;
use grpo_verify::case::objective::Objective;
use grpo_verify::case::{Case, Dtype, Inputs, Kind};
use grpo_verify::check::{run_check, CheckOptions};
use grpo_verify::evaluate::{Evaluator, Outcome};
use grpo_verify::worker::outputs::{run_case, Outputs, RunResult};
use grpo_verify::case::strategy::{case_spec, meshes, Bounds};
use libtest_mimic::{Failed, Trial};
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config as RunnerConfig, RngAlgorithm, TestRng, TestRunner};

const DEVICES: usize = 8;

fn bounds() -> Bounds {
    // V up to 300 puts many vocabularies below or not divisible by 8 shards.
    Bounds { devices: DEVICES, ..Bounds::new(4, 12, 300, 40, vec![Dtype::F32, Dtype::Bf16]) }
}

fn evaluator() -> Evaluator {
    let env = grpo_verify::worker::pyenv::resolve().expect("python environment");
    let worker = grpo_verify::worker::process::Worker::start_with_devices(&env, DEVICES).expect("a worker with 8 devices");
    Evaluator::new(worker, grpo_verify::compare::Tolerance::default(), Duration::from_secs(600))
}

fn options(implementation: &str, cases: u32, report: &str) -> CheckOptions {
    let report_dir = std::env::temp_dir().join(format!("grpo-verify-sharded-{}-{report}", std::process::id()));
    CheckOptions { seed: 1, shrink_iters: 128, ..CheckOptions::new(vec![implementation.to_string()], cases, bounds(), report_dir) }
}

/// `cases` generated cases of `kind`, deterministic in `seed`.
fn generated(kind: Kind, cases: usize, seed: u8) -> Vec<Case> {
    let mut runner = TestRunner::new_with_rng(RunnerConfig::default(), TestRng::from_seed(RngAlgorithm::ChaCha, &[seed; 32]));
    let strategy = case_spec(&bounds());
    (0..cases).map(|_| strategy.new_tree(&mut runner).expect("a case").current().materialize(kind)).collect()
}

/// The kind `implementation` declares, as the worker loads it.
fn kind_of(eval: &mut Evaluator, implementation: &str) -> Result<Kind, Failed> {
    eval.worker.load(implementation).map_err(|e| format!("loading {implementation}: {e:#}").into())
}

/// The implementation passes generated cases, each on a generated mesh:
/// v1's, or SPEC v2's (`--objective all`) with `v2`.
fn passes(implementation: &'static str, cases: u32, v2: bool) -> Trial {
    let name = if v2 { "passes_v2_objectives_on_8_devices" } else { "passes_generated_cases_on_8_devices" };
    crate::common::trial(format!("sharded::{implementation}_{name}"), move || {
        let mut eval = evaluator();
        let kind = kind_of(&mut eval, implementation)?;
        let mut opts = options(implementation, common::cases(cases), &format!("{implementation}-{name}"));
        if v2 {
            opts.bounds.objective = Objective::parse(Some("all"), &[], &[]).map_err(|e| format!("{e:#}"))?;
        }
        let run = run_check(&opts, std::slice::from_mut(&mut eval), &[kind]).map_err(|e| format!("{e:#}"))?;
        let s = &run.summaries[0];
        if !s.passed {
            return Err(format!("{implementation} failed: {:?} on {:?}", s.failure, s.minimal_case).into());
        }
        // Every requested case: neither refuses a v1 or v2 draw (40 of 40
        // v1, 12 and 8 of 12 and 8 v2 checked, none refused).
        common::checked_at_least(s, opts.cases as usize, "every requested case; the shard_map implementations refuse no draw")
    })
}

/// A copy with a distributed bug is caught, on a shrunk case that needs a mesh.
fn caught(fixture: &'static str, kind: Kind, cases: u32) -> Trial {
    crate::common::trial(format!("sharded::{}_is_caught", fixture.trim_end_matches(".py")), move || {
        let implementation = common::fixture_impl(&format!("sharded/{fixture}"));
        let mut eval = evaluator();
        let run = run_check(&options(&implementation, common::cases(cases), fixture), std::slice::from_mut(&mut eval), &[kind])
            .map_err(|e| format!("{e:#}"))?;
        let s = &run.summaries[0];
        if s.passed {
            return Err(format!("{fixture} survived {} cases", s.supported).into());
        }
        eprintln!("{fixture}: caught; minimal case {}", s.minimal_case.as_deref().unwrap_or("?"));
        Ok(())
    })
}

/// Every mesh of 8 devices (1x8, 2x4, 4x2, 8x1) passes on the same case, so
/// a bug that shows on one mesh shape only is not left to the mesh drawn.
fn mesh_invariance(implementation: &'static str, cases: usize) -> Trial {
    crate::common::trial(format!("sharded::{implementation}_passes_every_mesh_of_8_on_the_same_case"), move || {
        let mut eval = evaluator();
        let (full, _) = meshes(DEVICES);
        let mut passed = 0;
        for base in generated(kind_of(&mut eval, implementation)?, common::cases(cases as u32) as usize, 3) {
            for mesh in &full {
                let case = Case { mesh: Some(*mesh), ..base.clone() };
                let result = eval.evaluate(implementation, &case).map_err(|e| e.to_string())?;
                if result.outcome == Outcome::Fail {
                    return Err(format!("{implementation} fails on mesh {}x{} of {}: {}", mesh.data, mesh.model, case.summary(), result.reason).into());
                }
                passed += usize::from(result.outcome == Outcome::Pass);
            }
        }
        // Every (case, mesh) run, or a mesh went unchecked (24 of 24 pass).
        let runs = common::cases(cases as u32) as usize * full.len();
        if passed < runs {
            return Err(format!("{implementation}: passed on only {passed} of {runs} (case, mesh) runs; the rest were refused").into());
        }
        Ok(())
    })
}

/// Rows [b0, b1) of a case as a case of its own, its loss summed over
/// `normalizer` (the global token count every micro-batch shares).
fn micro_batch(case: &Case, b0: usize, b1: usize, normalizer: f64) -> Case {
    let (t, v) = (case.shape.time, case.shape.vocab);
    fn rows<T: Copy>(a: &[T], t: usize, width: usize, b0: usize, b1: usize) -> Vec<T> {
        a[b0 * t * width..b1 * t * width].to_vec()
    }
    let rows_of = |a: &[f32], width: usize| rows(a, t, width, b0, b1);
    let inputs = match &case.inputs {
        Inputs::Logits { logits } => Inputs::Logits { logits: rows_of(logits, v) },
        Inputs::Fused { hidden_dim, hidden, lm_head } => {
            Inputs::Fused { hidden_dim: *hidden_dim, hidden: rows_of(hidden, *hidden_dim), lm_head: lm_head.clone() }
        }
    };
    let mut micro = case.clone();
    micro.shape.batch = b1 - b0;
    micro.inputs = inputs;
    micro.tokens = rows(&case.tokens, t, 1, b0, b1);
    micro.mask = rows_of(&case.mask, 1);
    micro.advantages = case.advantages[b0..b1].to_vec();
    micro.old_logp = case.old_logp.as_ref().map(|a| rows_of(a, 1));
    micro.ref_logp = case.ref_logp.as_ref().map(|a| rows_of(a, 1));
    micro.config.aggregation = Aggregation::SumOverConstant;
    micro.hparams.normalizer = normalizer;
    micro
}

fn outputs(eval: &mut Evaluator, implementation: &str, case: &Case) -> Result<Option<Outputs>, Failed> {
    match run_case(&mut eval.worker, implementation, case, eval.timeout).map_err(|e| e.to_string())? {
        RunResult::Ok(out) => Ok(Some(out)),
        RunResult::Unsupported(_) => Ok(None),
        RunResult::Failed(_, m) => Err(format!("{implementation} failed on {}: {m}", case.summary()).into()),
    }
}

/// |a - b| within a few f32 roundings of the larger and of `terms` (the
/// size of the terms summed: only the order of the cross-row and
/// cross-device sums differs), plus `bf16_roundings` bf16 ulps of the larger
/// and of `result` (the largest result) where the outputs are bf16.
fn close(a: f32, b: f32, result: f64, terms: f64, bf16_roundings: usize) -> bool {
    let m = (a.abs().max(b.abs())) as f64;
    let rounding = bf16_roundings as f64 * (m + result) * 2f64.powi(-7);
    ((a - b).abs() as f64) <= 64.0 * f32::EPSILON as f64 * (m + terms.max(result)) + rounding
}

/// Split a batch into micro-batches (each row its own, and halves), run each
/// with `sum_over_constant` over the global valid-token count, and the sum
/// of their losses and their gradients (concatenated over rows; summed for
/// d lm_head) is the full batch's token-mean loss and gradients. Each micro
/// batch is also checked against the oracle like any case.
fn micro_batches(implementation: &'static str, cases: usize) -> Trial {
    crate::common::trial(format!("sharded::{implementation}_micro_batches_with_a_global_count_sum_to_the_full_batch"), move || {
        let mut eval = evaluator();
        let mut checked = 0;
        for mut full in generated(kind_of(&mut eval, implementation)?, common::cases(cases as u32) as usize * 2, 5) {
            if full.shape.batch < 2 {
                continue;
            }
            full.config.aggregation = Aggregation::TokenMean;
            let valid = full.mask.iter().filter(|&&m| m != 0.0).count();
            let normalizer = valid.max(1) as f32 as f64;
            let Some(whole) = outputs(&mut eval, implementation, &full)? else { continue };
            // The size of the terms each gradient element is summed from,
            // per element: a gradient that cancels to nearly nothing (every
            // token the row's argmax, onehot - p with p near 1) is still
            // formed from terms this large, and its rounding is relative to
            // them, not to the result. Row i's logits-gradient terms are
            // natural_i (p_iv + [v = y_i]); through lm_head and hidden
            // they are sum_v |W_hv| (...) and sum_i |x_ih| (...).
            let (fwd_scale, grad_terms, lm_head_terms) = {
                let problem = full.problem();
                let fwd = problem.forward().map_err(|e| e.to_string())?;
                let scales = grpo_verify::compare::Scales::new(&fwd, &full, &eval.tolerance);
                let (n, v_) = (full.shape.batch * full.shape.time, full.shape.vocab);
                let mut terms = vec![0.0f64; n * v_];
                let mut p = vec![0.0f64; v_];
                for i in (0..n).filter(|&i| !fwd.tokens[i].masked) {
                    fwd.softmax_row(i, &mut p);
                    for v in 0..v_ {
                        terms[i * v_ + v] = scales.grad_terms(i) * (p[v] + if v == fwd.tokens[i].chosen { 1.0 } else { 0.0 });
                    }
                }
                let (grad_terms, lm_head_terms) = match &full.inputs {
                    Inputs::Logits { .. } => (terms, Vec::new()),
                    Inputs::Fused { hidden_dim, hidden, lm_head } => {
                        let h_ = *hidden_dim;
                        let through_w = (0..n * h_)
                            .map(|ih| (0..v_).map(|v| terms[ih / h_ * v_ + v] * (lm_head[ih % h_ * v_ + v] as f64).abs()).sum())
                            .collect();
                        let through_x = (0..h_ * v_)
                            .map(|hv| (0..n).map(|i| terms[i * v_ + hv % v_] * (hidden[i * h_ + hv / v_] as f64).abs()).sum())
                            .collect();
                        (through_w, through_x)
                    }
                };
                (fwd.tokens.iter().map(|t| (t.weight * t.per_token_loss).abs()).sum::<f64>(), grad_terms, lm_head_terms)
            };
            let b = full.shape.batch;
            for splits in [(0..=b).collect::<Vec<_>>(), vec![0, b / 2, b]] {
                let mut loss = 0.0f64;
                let mut grad = Vec::new();
                let mut grad_lm_head: Option<Vec<f32>> = None;
                for w in splits.windows(2) {
                    let micro = micro_batch(&full, w[0], w[1], normalizer);
                    // One run gives both the verdict against the oracle and the outputs summed below.
                    let (verdict, out) = eval.evaluate_with_outputs(implementation, &micro).map_err(|e| e.to_string())?;
                    if verdict.outcome == Outcome::Fail {
                        return Err(format!("micro-batch rows {}..{} of {}: {}", w[0], w[1], full.summary(), verdict.reason).into());
                    }
                    let out = out.ok_or("a micro-batch is unsupported where the batch is not")?;
                    loss += out.loss;
                    grad.extend(out.grad);
                    if let Some(g) = out.grad_lm_head {
                        grad_lm_head = Some(match grad_lm_head {
                            None => g,
                            Some(acc) => acc.iter().zip(&g).map(|(a, b)| a + b).collect(),
                        });
                    }
                }
                let what = format!("{} split at {splits:?}", full.summary());
                if !close(loss as f32, whole.loss as f32, fwd_scale, fwd_scale, 0) {
                    return Err(format!("summed micro-batch loss {loss:e} != full-batch loss {:e} ({what})", whole.loss).into());
                }
                let grad_scale = |g: &[f32]| g.iter().fold(0.0f64, |m, v| m.max(v.abs() as f64));
                for (name, got, want) in [("grad", Some(&grad), Some(&whole.grad)), ("grad_lm_head", grad_lm_head.as_ref(), whole.grad_lm_head.as_ref())] {
                    let (Some(got), Some(want)) = (got, want) else { continue };
                    let scale = grad_scale(want);
                    let terms = if name == "grad" { &grad_terms } else { &lm_head_terms };
                    // A bf16 gradient is rounded once on each side; d lm_head
                    // once per micro-batch before the sum here.
                    let roundings = match (whole.grad_dtype, name) {
                        (Dtype::F32, _) => 0,
                        (Dtype::Bf16, "grad_lm_head") => splits.len(),
                        (Dtype::Bf16, _) => 1,
                    };
                    if let Some((i, (g, w))) = got.iter().zip(want.iter()).enumerate().find(|(i, (g, w))| !close(**g, **w, scale, terms[*i], roundings)) {
                        return Err(format!("{name}[{i}]: summed micro-batches {g:e} != full batch {w:e} ({what})").into());
                    }
                }
            }
            checked += 1;
        }
        if checked == 0 {
            return Err("no generated case had B >= 2".into());
        }
        Ok(())
    })
}

/// This suite's trials (suites/main.rs runs them with the others).
pub fn trials() -> Vec<Trial> {
    let tests = vec![
        passes("sharded_logits", 40, false),
        passes("sharded_fused", 40, false),
        passes("sharded_logits", 12, true),
        passes("sharded_fused", 8, true),
        mesh_invariance("sharded_logits", 6),
        mesh_invariance("sharded_fused", 6),
        micro_batches("reference", 4),
        micro_batches("sharded_logits", 4),
        micro_batches("sharded_fused", 4),
        caught("lse_sums_not_rescaled.py", Kind::Fused, 60),
        caught("seq_mean_over_padded_batch.py", Kind::Logits, 60),
    ];
    tests
}
