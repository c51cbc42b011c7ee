//! SPEC v1's self-checks on the fused kind: its gradients against finite
//! differences, the logits oracle on the product, and the blocked sweep
//! against its rows.

use super::helpers::*;
use super::v1::*;



use grpo_oracle::{Aggregation, Forward, FusedProblem, TemperatureMode};
use grpo_verify::case::{Case, CaseSpec, Inputs, Kind};
use libtest_mimic::Failed;
use proptest::test_runner::TestCaseError;
/// A fused-kind case with its inputs widened to f64.
pub(super) struct OwnedFused {
    pub(super) case: Case,
    pub(super) hidden_dim: usize,
    pub(super) hidden: Vec<f64>,
    pub(super) lm_head: Vec<f64>,
}

impl OwnedFused {
    pub(super) fn new(spec: &CaseSpec) -> Self {
        let case = spec.materialize(Kind::Fused);
        let Inputs::Fused { hidden_dim, hidden, lm_head } = &case.inputs else { unreachable!() };
        let widen = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
        OwnedFused { hidden_dim: *hidden_dim, hidden: widen(hidden), lm_head: widen(lm_head), case }
    }
    pub(super) fn problem(&self) -> FusedProblem<'_, f64> {
        let c = &self.case;
        FusedProblem {
            shape: c.shape(),
            hidden_dim: self.hidden_dim,
            hidden: &self.hidden,
            lm_head: &self.lm_head,
            per_token: grpo_oracle::TokenInputs {
                tokens: &c.tokens,
                mask: &c.mask,
                advantages: &c.advantages,
                old_logp: c.old_logp.as_deref(),
                ref_logp: c.ref_logp.as_deref(),
                is_weights: None,
            },
            config: c.config,
            hparams: c.hparams,
        }
    }
    pub(super) fn loss(&self) -> f64 {
        self.problem().forward().expect("valid").loss
    }
}

/// At least a sixth of the cases (4 of the default 24). About half skip, as
/// in [`FINITE_DIFFERENCES_MIN`] (a token within 1e-5 of a kink), and 24
/// cases spread wide: measured 4 to 18 of 24 over GRPO_VERIFY_TEST_SEED
/// 0..200 (10 at the default seed 0). The budget stays 24: a sixth of it
/// still fails a property that skips (almost) every case.
pub(super) const FUSED_FINITE_DIFFERENCES_MIN: Minimum = Minimum {
    num: 1,
    den: 6,
    check: "d lm_head compared with central differences at a live token (no token within 1e-5 of a kink)",
    why: "about half the cases have a token near a kink; 4 to 18 of 24 over seeds 0..200",
};

/// The fused oracle's d hidden and d lm_head against central differences: a
/// case counts when d lm_head was compared at a live token (no token within
/// 1e-5 of a kink; with no live token d hidden is 0 and nothing is tested).
pub(super) fn fused_finite_differences(spec: &CaseSpec) -> Checked {
    let mut spec = spec.clone();
    spec.config.on_policy = false;
    let owned = OwnedFused::new(&spec);
    let problem = owned.problem();
    let fwd = problem.forward().expect("valid");
    let tau = owned.case.hparams.temperature;
    let max_w = owned.lm_head.iter().fold(0.0f64, |m, w| m.max(w.abs()));
    let max_x = owned.hidden.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    // Each step moves a logit by 1e-6 tau: logp by at most 2e-6.
    let steps = [1e-6 * tau / (1.0 + max_w), 1e-6 * tau / (1.0 + max_x)];
    if near_kink(&fwd, 1e-5) {
        return Ok(false);
    }
    let cot = owned.case.cotangent;
    let (d_hidden, d_lm_head) = problem.grads(&fwd, cot);
    let max_z = max_x * max_w * owned.hidden_dim as f64 / tau;
    let (h_, v_) = (owned.hidden_dim, owned.case.shape.vocab);
    let mut probe = OwnedFused { case: owned.case.clone(), hidden_dim: h_, hidden: owned.hidden.clone(), lm_head: owned.lm_head.clone() };
    let mut check = |which: usize, i: usize, analytic: f64, grads: &[f64]| -> Result<(), TestCaseError> {
        let step = steps[which];
        // Central-difference noise (as in `finite_differences`).
        let noise = 64.0 * f64::EPSILON * (1.0 + max_z) * (loss_scale(&fwd) + natural_scale(&fwd, cot)) * cot.abs() / step;
        let atol = 1e-8 * grads.iter().fold(0.0f64, |m, g| m.max(g.abs())) + 10.0 * noise;
        let at = |probe: &mut OwnedFused, value: f64| {
            if which == 0 { probe.hidden[i] = value } else { probe.lm_head[i] = value }
        };
        let x = if which == 0 { owned.hidden[i] } else { owned.lm_head[i] };
        at(&mut probe, x + step);
        let up = probe.loss();
        at(&mut probe, x - step);
        let down = probe.loss();
        at(&mut probe, x);
        let fd = cot * (up - down) / (2.0 * step);
        if (analytic - fd).abs() <= 1e-4 * analytic.abs().max(fd.abs()) + atol {
            return Ok(());
        }
        Err(TestCaseError::fail(format!("{} element {i}: {analytic:e} vs {fd:e} (atol {atol:e})", ["d hidden", "d lm_head"][which])))
    };
    for i in (0..d_hidden.len()).step_by((d_hidden.len() / 7).max(1)) {
        check(0, i, d_hidden[i], &d_hidden)?;
    }
    let mut compared = 0;
    for st in fwd.tokens.iter().filter(|s| !s.masked).take(3) {
        for h in [0, h_ - 1] {
            let i = h * v_ + st.chosen;
            check(1, i, d_lm_head[i], &d_lm_head)?;
            compared += 1;
        }
    }
    Ok(compared > 0)
}

/// The fused oracle equals the logits oracle on logits = hidden @ lm_head.
pub(super) fn fused_is_logits_of_the_product(spec: &CaseSpec) -> Result<(), TestCaseError> {
    let owned = OwnedFused::new(spec);
    let problem = owned.problem();
    let fused = problem.forward().expect("valid");
    let (h_, v_) = (owned.hidden_dim, owned.case.shape.vocab);
    let rows = owned.case.shape.batch * owned.case.shape.time;
    let mut logits = vec![0.0f64; rows * v_];
    for i in 0..rows {
        for h in 0..h_ {
            for v in 0..v_ {
                logits[i * v_ + v] += owned.hidden[i * h_ + h] * owned.lm_head[h * v_ + v];
            }
        }
    }
    let mut as_logits = Owned::new(spec.materialize(Kind::Logits));
    as_logits.logits = logits;
    // Compare like for like: the logits-kind case with the fused case's token inputs.
    let mut same = as_logits.clone();
    same.case.tokens = owned.case.tokens.clone();
    same.case.old_logp = owned.case.old_logp.clone();
    same.case.ref_logp = owned.case.ref_logp.clone();
    same.case.mask = owned.case.mask.clone();
    same.case.advantages = owned.case.advantages.clone();
    same.case.hparams = owned.case.hparams;
    close(fused.loss, same.loss(), 1e-12, loss_scale(&fused), "fused vs logits-kind loss")
}

/// The fused kind's blocked passes (matrix products over token blocks and
/// vocabulary chunks) against the same math row by row, at the edges of
/// both: V with a short last chunk and V an exact multiple, one column past
/// a chunk, rows spanning two blocks, chosen tokens at 0, V - 1 and either
/// side of a chunk edge, masked rows, entropy and KL terms on. Forward
/// statistics, d hidden, d lm_head, the rounding magnitudes, the kink
/// directions and lm_head @ direction are each held to their definition.
pub(super) fn fused_blocks_are_the_rows() -> Result<(), Failed> {
    use grpo_oracle::{Config, Hparams, LogitRows, Magnitudes, Shape, Sweep, VOCAB_CHUNK};
    for (vocab, rows, h_) in [(2 * VOCAB_CHUNK + 5, 600usize, 5), (VOCAB_CHUNK, 3, 7), (VOCAB_CHUNK + 1, 2, 3), (37, 9, 4)] {
        let shape = Shape { batch: 2, time: rows.div_ceil(2), vocab };
        let n = shape.rows();
        let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ vocab as u64;
        let mut uniform = move || {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (state >> 11) as f64 / (1u64 << 53) as f64 - 0.5
        };
        let bf16 = |x: f64| half::bf16::from_f64(x).to_f64();
        let hidden: Vec<f64> = (0..n * h_).map(|_| bf16(4.0 * uniform())).collect();
        let lm_head: Vec<f64> = (0..h_ * vocab).map(|_| bf16(2.0 * uniform())).collect();
        let edges = [0, vocab - 1, (VOCAB_CHUNK - 1).min(vocab - 1), VOCAB_CHUNK.min(vocab - 1)];
        let tokens: Vec<i32> = (0..n).map(|i| edges[i % 4] as i32).collect();
        let mask: Vec<f32> = (0..n).map(|i| if i % 7 == 3 { 0.0 } else { 1.0 }).collect();
        let advantages = vec![1.3f32, -0.7];
        let old_logp: Vec<f32> = (0..n).map(|_| (-9.0 + 3.0 * uniform()) as f32).collect();
        let ref_logp: Vec<f32> = (0..n).map(|_| (-9.0 + 3.0 * uniform()) as f32).collect();
        let config = Config {
            temperature_mode: TemperatureMode::Logits,
            aggregation: Aggregation::TokenMean,
            on_policy: false,
            kl: true,
            entropy_bonus: true,
            two_sided: false,
            ..Config::default()
        };
        let hparams = Hparams { eps_low: 0.2, eps_high: 0.28, temperature: 0.7, beta: 0.04, entropy_coef: 0.01, delta: f64::INFINITY, normalizer: 1.0, ..Hparams::default() };
        let problem = FusedProblem {
            shape,
            hidden_dim: h_,
            hidden: &hidden,
            lm_head: &lm_head,
            per_token: grpo_oracle::TokenInputs {
                tokens: &tokens,
                mask: &mask,
                advantages: &advantages,
                old_logp: Some(&old_logp),
                ref_logp: Some(&ref_logp),
                is_weights: None,
            },
            config,
            hparams,
        };
        let blocked = problem.forward().map_err(|e| e.to_string())?;
        // The same problem through the trait's row-by-row default.
        struct RowByRow<'a>(&'a FusedProblem<'a, f64>);
        impl LogitRows for RowByRow<'_> {
            fn shape(&self) -> Shape {
                self.0.shape
            }
            fn logit_row(&self, row: usize, out: &mut [f64], magnitude: Option<&mut [f64]>) {
                self.0.logit_row(row, out, magnitude)
            }
        }
        let by_row = RowByRow(&problem);
        let rowwise = Forward::new(&by_row, problem.token_inputs(), config, hparams).map_err(|e| e.to_string())?;
        let what = |q: &str, i: usize| format!("V={vocab} rows={n}: {q} at row {i}");
        let near = |a: f64, b: f64, rel: f64, q: &str, i: usize| -> Result<(), Failed> {
            if (a - b).abs() <= rel * (a.abs().max(b.abs()) + 1e-300) {
                Ok(())
            } else {
                Err(format!("{}: blocked {a:e} vs row by row {b:e}", what(q, i)).into())
            }
        };
        near(blocked.loss, rowwise.loss, 1e-12, "loss", 0)?;
        for (i, (a, b)) in blocked.tokens.iter().zip(&rowwise.tokens).enumerate() {
            if a.masked != b.masked {
                return Err(what("masking", i).into());
            }
            if a.masked {
                continue;
            }
            near(a.logp, b.logp, 1e-12, "logp", i)?;
            near(a.entropy, b.entropy, 1e-12, "entropy", i)?;
            near(a.softmax.lse, b.softmax.lse, 1e-13, "lse", i)?;
            // Magnitudes come from an f32 product: a few digits are their job.
            near(a.mag_chosen, b.mag_chosen, 1e-5, "mag_chosen", i)?;
            near(a.softmax.sum_p_abs_x, b.softmax.sum_p_abs_x, 1e-5, "sum_p_abs_x", i)?;
            near(a.softmax.max_p_abs_x, b.softmax.max_p_abs_x, 1e-5, "max_p_abs_x", i)?;
            near(a.softmax.max_abs_x, b.softmax.max_abs_x, 1e-5, "max_abs_x", i)?;
        }
        // The sweep: every live row, half of them with a direction, magnitudes on.
        let cot = -1.7;
        let live: Vec<usize> = (0..n).filter(|&i| mask[i] != 0.0).collect();
        let coef: Vec<f64> = live.iter().enumerate().map(|(k, _)| 0.3 * k as f64 % 1.1 - 0.5).collect();
        let directions: Vec<usize> = (0..live.len()).step_by(2).collect();
        let row_scale: Vec<f64> = (0..live.len()).map(|k| 1.0 + k as f64 / 10.0).collect();
        let (gw_h, gw_w) = (3.0, 5.0);
        let sweep = Sweep {
            rows: &live,
            ppo_coef: &coef,
            directions: &directions,
            magnitudes: Some(Magnitudes { row_scale: &row_scale, g_weight_hidden: gw_h, g_weight_lm_head: gw_w }),
            lm_head: true,
            rounding: None,
        };
        let mut d_lm_head = vec![f64::NAN; h_ * vocab];
        let mut s_lm_head = vec![f64::NAN; h_ * vocab];
        let mut dir_cols = vec![f64::NAN; directions.len() * vocab];
        let result = problem.sweep(&blocked, cot, &sweep, |chunk| {
            let c = chunk.cols.len();
            for h in 0..h_ {
                for (k, v) in chunk.cols.clone().enumerate() {
                    d_lm_head[h * vocab + v] = chunk.d_lm_head[h * c + k];
                    s_lm_head[h * vocab + v] = chunk.s_lm_head[h * c + k];
                }
            }
            for a in 0..directions.len() {
                for (k, v) in chunk.cols.clone().enumerate() {
                    dir_cols[a * vocab + v] = chunk.directions[a * c + k];
                }
            }
        });
        // Row by row: g from Forward::grad_row (stored row path), p from softmax_row.
        let (mut want_dw, mut want_sw) = (vec![0.0; h_ * vocab], vec![0.0; h_ * vocab]);
        let (mut g, mut p, mut z) = (vec![0.0; vocab], vec![0.0; vocab], vec![0.0; vocab]);
        for (k, &i) in live.iter().enumerate() {
            rowwise.grad_row(i, cot, Some(coef[k]), &mut g);
            rowwise.softmax_row(i, &mut p);
            let y = tokens[i] as usize;
            let entropy = config.entropy_bonus && hparams.entropy_coef != 0.0;
            let e = |v: usize| row_scale[k] * (grpo_oracle::rounding_weight(p[v], entropy) + if v == y { 1.0 } else { 0.0 });
            for h in 0..h_ {
                let w = &lm_head[h * vocab..(h + 1) * vocab];
                let dh: f64 = (0..vocab).map(|v| w[v] * g[v]).sum();
                let sh: f64 = (0..vocab).map(|v| w[v].abs() * (e(v) + gw_h * g[v].abs())).sum();
                near(result.d_hidden[k * h_ + h], dh, 1e-11, "d hidden", i)?;
                near(result.s_hidden[k * h_ + h], sh, 1e-5, "s hidden", i)?;
                let x = hidden[i * h_ + h];
                for v in 0..vocab {
                    want_dw[h * vocab + v] += x * g[v];
                    want_sw[h * vocab + v] += x.abs() * (e(v) + gw_w * g[v].abs());
                }
            }
            if let Some(a) = directions.iter().position(|&d| d == k) {
                rowwise.dlogp_dlogits_row(i, &mut z);
                let scale = cot * blocked.tokens[i].weight;
                for v in 0..vocab {
                    near(dir_cols[a * vocab + v], scale * z[v], 1e-12, "direction", i)?;
                }
                for h in 0..h_ {
                    let along: f64 = (0..vocab).map(|v| lm_head[h * vocab + v] * scale * z[v]).sum();
                    near(result.along_hidden[a * h_ + h], along, 1e-11, "lm_head @ direction", i)?;
                }
            }
        }
        for j in 0..h_ * vocab {
            near(d_lm_head[j], want_dw[j], 1e-10, "d lm_head (h, v) = (row/V, row%V)", j)?;
            near(s_lm_head[j], want_sw[j], 1e-5, "s lm_head", j)?;
        }
    }
    Ok(())
}
