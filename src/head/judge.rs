//! A head-loss case's verdict (docs/spec.md, "What correct means for the
//! head losses"): the f64 oracle's loss and gradients, a per-element scale
//! for each, and every returned quantity's worst error in f32 units of that
//! scale, against one bound.

use grpo_oracle::losses::{Divergence, FusedHeadLoss, HeadLoss, Reduction, RowLoss};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::case::{HeadCase, HeadDivergence, HeadObjective, HeadReduction};
use crate::case::{Dtype, Kind};
use crate::compare::rule::{beyond, bf16_half_ulp, U32};
use crate::worker::protocol::Reply;

/// The bound, in f32 units of each element's scale: the largest error a
/// correct f32 implementation may show. Calibration (docs/figures.md, "The
/// head losses"): the three built-ins over 600 cases of each objective, and
/// TRL's and Liger's f32 paths over 150, erred by 9.3 u at worst (the
/// reference's d logits, distillation); 64 u is about 7 times that. At
/// 256 u the mutant gate caught the same 19 at 8 seeds.
pub const BOUND_UNITS: f64 = 64.0;

/// A scale below this is taken as this (an exact zero is held to ~0).
const TINY: f64 = 1e-30;

/// One quantity's worst error.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct HeadError {
    /// `loss`, `z_loss`, `grad`, `grad_hidden`, `grad_lm_head`, `grad_bias`, `grad_zero_rows`.
    pub quantity: String,
    /// max |got - want| / scale, in f32 units (inf: NaN or infinite where the oracle is finite).
    pub units: f64,
    /// Where: "row 3 class 128".
    pub at: String,
    /// The implementation's value there.
    pub got: f64,
    /// The oracle's.
    pub want: f64,
}

/// What the oracle says of a case: each quantity's wanted values and scales.
pub struct Expected {
    quantities: Vec<Wanted>,
    /// The rows whose gradient rows must be exactly zero (ignored rows).
    zero_rows: Vec<usize>,
}

struct Wanted {
    quantity: &'static str,
    wire: &'static str,
    values: Vec<f64>,
    scales: Vec<f64>,
    /// Columns of the array (to say where an element is).
    columns: usize,
}

fn widen(values: &[f32]) -> Vec<f64> {
    values.iter().map(|&v| v as f64).collect()
}

fn transform(z: f64, softcap: f64) -> f64 {
    if softcap.is_finite() {
        softcap * (z / softcap).tanh()
    } else {
        z
    }
}

/// Row-wise max |x| of logits [N, V] after the transform and temperature.
fn row_max(z: &[f64], v: usize, case: &HeadCase) -> Vec<f64> {
    z.chunks(v).map(|row| row.iter().map(|&z| transform(z, case.softcap).abs() / case.temperature).fold(0.0, f64::max)).collect()
}

/// softmax(transform(z) / tau) row by row, in f64 (0 at ignored rows).
fn probabilities(z: &[f64], v: usize, case: &HeadCase) -> Vec<f64> {
    let mut q = vec![0.0; z.len()];
    for (i, (row, out)) in z.chunks(v).zip(q.chunks_mut(v)).enumerate() {
        if case.ignored(i) {
            continue;
        }
        let x: Vec<f64> = row.iter().map(|&z| transform(z, case.softcap) / case.temperature).collect();
        let max = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let total: f64 = x.iter().map(|&x| (x - max).exp()).sum();
        out.iter_mut().zip(&x).for_each(|(o, &x)| *o = (x - max).exp() / total);
    }
    q
}

/// Row-wise max over classes of sum_k |a_ik b_kc| (+ |bias_c|): the size of a matmul's terms.
fn product_magnitude(a: &[f64], b: &[f64], bias: Option<&[f64]>, n: usize, h: usize, v: usize) -> Vec<f64> {
    (0..n)
        .into_par_iter()
        .map(|i| (0..v).map(|c| (0..h).map(|k| (a[i * h + k] * b[k * v + c]).abs()).sum::<f64>() + bias.map_or(0.0, |b| b[c].abs())).fold(0.0, f64::max))
        .collect()
}

/// The teacher's logits of a fused distillation, teacher_hidden @ teacher_lm_head in f64.
fn teacher_logits(case: &HeadCase, th: &[f64], tw: &[f64]) -> Vec<f64> {
    let (n, ht, v) = (case.rows(), case.teacher_hidden_dim, case.vocab);
    let head = HeadLoss {
        rows: n,
        vocab: v,
        logits: &[],
        labels: &[],
        ignore_index: 0,
        softcap: f64::INFINITY,
        temperature: 1.0,
        loss: RowLoss::CrossEntropy { label_smoothing: 0.0, z_loss: 0.0, class_weights: None },
        reduction: Reduction::Sum,
    };
    FusedHeadLoss { hidden: th, lm_head: tw, bias: None, hidden_dim: ht, head }.logits()
}

impl Expected {
    /// The oracle's outputs of `case` and their scales (bad input: an error naming it).
    pub fn of(case: &HeadCase) -> Result<Expected, String> {
        case.validate()?;
        let (n, v, h) = (case.rows(), case.vocab, case.hidden_dim);
        let labels: Vec<i64> = case.labels.iter().map(|&y| y as i64).collect();
        let weights = case.class_weights.as_deref().map(widen);
        let upstream = case.upstream.as_deref().map(widen);
        let (hidden, lm_head, bias) = (widen(&case.hidden), widen(&case.lm_head), case.bias.as_deref().map(widen));
        let (th, tw) = (widen(&case.teacher_hidden), widen(&case.teacher_lm_head));
        let teacher = match (case.objective, case.kind) {
            (HeadObjective::CrossEntropy, _) => Vec::new(),
            (HeadObjective::Distillation, Kind::Logits) => widen(&case.teacher_logits),
            (HeadObjective::Distillation, Kind::Fused) => teacher_logits(case, &th, &tw),
        };
        let student = match case.kind {
            Kind::Logits => widen(&case.logits),
            Kind::Fused => Vec::new(),
        };
        let loss = match case.objective {
            HeadObjective::CrossEntropy => RowLoss::CrossEntropy { label_smoothing: case.label_smoothing, z_loss: case.z_loss, class_weights: weights.as_deref() },
            HeadObjective::Distillation => RowLoss::Distillation {
                divergence: match case.divergence {
                    HeadDivergence::ForwardKl => Divergence::ForwardKl,
                    HeadDivergence::ReverseKl => Divergence::ReverseKl,
                    HeadDivergence::Jsd => Divergence::Jsd(case.beta),
                },
                teacher: &teacher,
            },
        };
        let reduction = match case.reduction {
            HeadReduction::None => Reduction::None,
            HeadReduction::Sum => Reduction::Sum,
            HeadReduction::Mean => Reduction::Mean,
            HeadReduction::OverCount => Reduction::OverCount(case.num_items),
            HeadReduction::Batchmean => Reduction::BatchMean(case.batch),
        };
        let head = HeadLoss { rows: n, vocab: v, logits: &student, labels: &labels, ignore_index: case.ignore_index as i64, softcap: case.softcap, temperature: case.temperature, loss, reduction };
        let fused = FusedHeadLoss { hidden: &hidden, lm_head: &lm_head, bias: bias.as_deref(), hidden_dim: h, head };
        let (out, z, d_hidden, d_lm_head, d_bias) = match case.kind {
            Kind::Logits => (head.evaluate(upstream.as_deref())?, student.clone(), None, None, None),
            Kind::Fused => {
                let z = fused.logits();
                let o = fused.evaluate(upstream.as_deref())?;
                (o.logits, z, Some(o.d_hidden), Some(o.d_lm_head), o.d_bias)
            }
        };

        // Each row's size (docs/spec.md): M_i the log-probabilities' range it reads.
        let ln_v = (v as f64).ln() + 1.0;
        let mut m: Vec<f64> = row_max(&z, v, case).iter().map(|x| x + ln_v).collect();
        if !teacher.is_empty() {
            m.iter_mut().zip(row_max(&teacher, v, case)).for_each(|(m, t)| *m += t);
        }
        if case.kind == Kind::Fused {
            let a = product_magnitude(&hidden, &lm_head, bias.as_deref(), n, h, v);
            m.iter_mut().zip(a).for_each(|(m, a)| *m += (h as f64).sqrt() * a / case.temperature);
            if case.objective == HeadObjective::Distillation {
                let ht = case.teacher_hidden_dim;
                let a = product_magnitude(&th, &tw, None, n, ht, v);
                m.iter_mut().zip(a).for_each(|(m, a)| *m += (ht as f64).sqrt() * a / case.temperature);
            }
        }
        // G_i: the row's weight in its loss.
        let w_max = weights.as_ref().map_or(1.0, |w| w.iter().copied().fold(0.0, f64::max));
        let g: Vec<f64> = (0..n)
            .map(|i| match case.objective {
                HeadObjective::CrossEntropy => {
                    let w_y = match (&weights, case.ignored(i)) {
                        (Some(w), false) => w[case.labels[i] as usize],
                        _ => 1.0,
                    };
                    (1.0 - case.label_smoothing) * w_y + case.label_smoothing * w_max + 2.0 * case.z_loss * (m[i] + 1.0)
                }
                HeadObjective::Distillation => 2.0,
            })
            .collect();
        let row_loss_scale: Vec<f64> = (0..n).map(|i| if case.ignored(i) { 0.0 } else { g[i] * m[i] }).collect();
        // c_i: the row's weight in what is pulled back (the cotangent or upstream included).
        let live_weight: f64 = (0..n).filter(|&i| !case.ignored(i)).map(|i| weights.as_ref().map_or(1.0, |w| w[case.labels[i] as usize])).sum();
        let c: Vec<f64> = (0..n)
            .map(|i| {
                let cot = case.cotangent as f64;
                match case.reduction {
                    HeadReduction::None => upstream.as_ref().map_or(0.0, |u| u[i]),
                    HeadReduction::Sum => cot,
                    HeadReduction::Mean => if live_weight > 0.0 { cot / live_weight } else { 0.0 },
                    HeadReduction::OverCount => cot / case.num_items,
                    HeadReduction::Batchmean => cot / case.batch as f64,
                }
                .abs()
            })
            .collect();
        let r: Vec<f64> = (0..n).map(|i| c[i] * row_loss_scale[i] / case.temperature).collect();
        let floor = |s: f64| if s > TINY { s } else { TINY };
        // Each d z element's scale: the row's, times the probabilities it is
        // made of (q, the teacher's p, the label's one-hot) and 1/V.
        let q = probabilities(&z, v, case);
        let p = if teacher.is_empty() { vec![0.0; n * v] } else { probabilities(&teacher, v, case) };
        let s: Vec<f64> = (0..n * v)
            .map(|e| {
                let (i, col) = (e / v, e % v);
                let onehot = if case.objective == HeadObjective::CrossEntropy && case.labels[i] == col as i32 { 1.0 } else { 0.0 };
                r[i] * (q[e] + p[e] + onehot + 1.0 / v as f64)
            })
            .collect();

        let mut quantities = Vec::new();
        let cot = case.cotangent as f64;
        if case.reduction == HeadReduction::None {
            quantities.push(Wanted { quantity: "loss", wire: "loss", values: out.per_row.clone(), scales: row_loss_scale.iter().map(|&s| floor(s)).collect(), columns: 1 });
        } else {
            let unscaled: f64 = (0..n).map(|i| c[i] * row_loss_scale[i]).sum::<f64>() / cot.abs().max(TINY);
            quantities.push(Wanted { quantity: "loss", wire: "loss", values: vec![out.loss], scales: vec![floor(unscaled)], columns: 1 });
        }
        if case.objective == HeadObjective::CrossEntropy {
            let s: f64 = if case.reduction == HeadReduction::None { (0..n).map(|i| c[i] * row_loss_scale[i]).sum() } else { (0..n).map(|i| c[i] * row_loss_scale[i]).sum::<f64>() / cot.abs().max(TINY) };
            quantities.push(Wanted { quantity: "z_loss", wire: "z_loss", values: vec![out.z_loss], scales: vec![floor(s)], columns: 1 });
        }
        let grad_factor = if case.reduction == HeadReduction::None { 1.0 } else { cot };
        match case.kind {
            Kind::Logits => {
                let scales = s.iter().map(|&s| floor(s)).collect();
                quantities.push(Wanted { quantity: "grad", wire: "d_logits", values: out.grad.iter().map(|g| g * grad_factor).collect(), scales, columns: v });
            }
            Kind::Fused => {
                let scales = (0..n * h).into_par_iter().map(|e| floor((0..v).map(|col| s[(e / h) * v + col] * lm_head[(e % h) * v + col].abs()).sum())).collect();
                let values = d_hidden.unwrap_or_default().iter().map(|g| g * grad_factor).collect();
                quantities.push(Wanted { quantity: "grad_hidden", wire: "d_hidden", values, scales, columns: h });
                let scales = (0..h * v).into_par_iter().map(|e| floor((0..n).map(|i| hidden[i * h + e / v].abs() * s[i * v + e % v]).sum())).collect();
                let values = d_lm_head.unwrap_or_default().iter().map(|g| g * grad_factor).collect();
                quantities.push(Wanted { quantity: "grad_lm_head", wire: "d_lm_head", values, scales, columns: v });
                if let Some(d_bias) = d_bias {
                    let scales = (0..v).map(|col| floor((0..n).map(|i| s[i * v + col]).sum())).collect();
                    quantities.push(Wanted { quantity: "grad_bias", wire: "d_bias", values: d_bias.iter().map(|g| g * grad_factor).collect(), scales, columns: v });
                }
            }
        }
        let zero_rows = (0..n).filter(|&i| case.ignored(i)).collect();
        Ok(Expected { quantities, zero_rows })
    }

    /// Every quantity's worst error in `reply` (a missing or misshapen
    /// output is an error naming it), and the ignored rows' gradient rows.
    pub fn judge(&self, case: &HeadCase, reply: &Reply) -> Result<Vec<HeadError>, String> {
        let mut errors = Vec::new();
        for w in &self.quantities {
            let Some(array) = reply.array(w.wire) else {
                if w.quantity == "z_loss" {
                    // Optional: the loss holds the z-loss whether or not it is returned apart.
                    continue;
                }
                return Err(format!("the implementation returned no `{}`", w.wire));
            };
            let mut got: Vec<f64> = widen(&array.to_f32());
            let bf16 = array.is_bf16();
            if w.wire.starts_with("d_") && case.dtype == Dtype::Bf16 && !bf16 {
                // docs/spec.md: gradients come back in the inputs' dtype. An f32 gradient of a bf16
                // input breaks the caller's autodiff (JAX: a dtype error at the next bf16 op).
                errors.push(HeadError { quantity: "grad_dtype".into(), units: f64::INFINITY, at: format!("`{}` is not bf16 for a bf16 input", w.wire), got: 0.0, want: 0.0 });
            }
            // One rounding of an output returned in bf16 is allowed (half a bf16 ulp of it), as for
            // GRPO's outputs; the per-row z-losses under `none` are summed first, and so are theirs.
            let mut allowance = vec![0.0; got.len()];
            if bf16 {
                allowance = got.iter().map(|&x| bf16_half_ulp(x as f32)).collect();
            }
            if w.quantity == "z_loss" && case.reduction == HeadReduction::None {
                // The per-row z-losses, weighted as the oracle weighs them.
                let u = case.upstream.as_deref().unwrap_or_default();
                if got.len() != u.len() {
                    return Err(format!("z_loss has {} values; expected N = {} under reduction none", got.len(), u.len()));
                }
                allowance = vec![allowance.iter().zip(u).map(|(a, &g)| a * (g as f64).abs()).sum()];
                got = vec![got.iter().zip(u).map(|(z, &g)| z * g as f64).sum()];
            }
            if got.len() != w.values.len() {
                return Err(format!("`{}` has {} values; expected {}", w.wire, got.len(), w.values.len()));
            }
            let mut worst = HeadError { quantity: w.quantity.to_string(), ..HeadError::default() };
            for (e, (&got, &want)) in got.iter().zip(&w.values).enumerate() {
                let diff = beyond((got - want).abs(), allowance[e]);
                let units = if diff.is_finite() { diff / w.scales[e] / U32 } else { f64::INFINITY };
                if units > worst.units || (worst.at.is_empty() && !units.is_finite()) {
                    worst = HeadError { quantity: w.quantity.to_string(), units, at: where_(w, e), got, want };
                }
            }
            errors.push(worst);
        }
        // Ignored rows: exactly zero gradient rows.
        let (wire, columns) = match case.kind {
            Kind::Logits => ("d_logits", case.vocab),
            Kind::Fused => ("d_hidden", case.hidden_dim),
        };
        if let Some(array) = reply.array(wire) {
            let values = array.to_f32();
            let mut worst = HeadError { quantity: "grad_zero_rows".into(), ..HeadError::default() };
            for &i in &self.zero_rows {
                for k in 0..columns {
                    let x = values[i * columns + k] as f64;
                    if x != 0.0 && (x.abs() > worst.got.abs() || x.is_nan()) {
                        worst = HeadError { quantity: "grad_zero_rows".into(), units: f64::INFINITY, at: format!("ignored row {i}, column {k}"), got: x, want: 0.0 };
                    }
                }
            }
            errors.push(worst);
        }
        Ok(errors)
    }
}

fn where_(w: &Wanted, e: usize) -> String {
    match (w.quantity, w.values.len()) {
        (_, 1) => String::new(),
        ("loss", _) => format!("row {e}"),
        ("grad", _) => format!("row {} class {}", e / w.columns, e % w.columns),
        ("grad_hidden", _) => format!("row {} dim {}", e / w.columns, e % w.columns),
        ("grad_lm_head", _) => format!("dim {} class {}", e / w.columns, e % w.columns),
        _ => format!("class {e}"),
    }
}

/// Whether every error is within the bound.
pub fn passes(errors: &[HeadError]) -> bool {
    errors.iter().all(|e| e.units <= BOUND_UNITS)
}
