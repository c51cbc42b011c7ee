//! The f64 oracle of the other losses trained on the same head
//! (docs/spec.md, "The other losses on the head: cross-entropy and
//! distillation"): cross-entropy with ignore_index, label smoothing, class
//! weights and a z-loss, and distillation (forward KL, reverse KL,
//! JSD(beta)) between a teacher's logits and the student's, each through an
//! optional softcap and a temperature, under the reductions none, sum,
//! mean, over a given count and batchmean.
//!
//! Inputs are read exactly (the caller widens f32 and bf16 to f64); every
//! row is computed in f64 from its maximum, with compensated sums, and its
//! log-probabilities are kept as logs, so distributions that underflow
//! (a mixture of two probabilities both below f64's range) stay finite.
//! An ignored row is never read.

use rayon::prelude::*;

use crate::sum::CompensatedSum;

/// How the row losses become the loss (docs/spec.md, "Reductions").
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Reduction {
    /// The row losses themselves; the gradient is taken against an
    /// upstream vector g [N]: d = sum_i g_i d l_i.
    None,
    /// sum_i l_i.
    Sum,
    /// sum_i l_i / D: D the sum of w_{y_i} over non-ignored rows for
    /// cross-entropy (their count without class weights), the count of
    /// non-ignored rows for distillation; 0 when D = 0.
    Mean,
    /// sum_i l_i / n for a given n > 0 (a global item count).
    OverCount(f64),
    /// sum_i l_i / B for the batch's B > 0 sequences.
    BatchMean(usize),
}

/// The divergence a distillation loss takes between the teacher's p and
/// the student's q.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Divergence {
    /// KL(p || q).
    ForwardKl,
    /// KL(q || p).
    ReverseKl,
    /// beta KL(p || m) + (1 - beta) KL(q || m), m = beta p + (1 - beta) q;
    /// at beta = 0 the forward KL, at 1 the reverse KL.
    Jsd(f64),
}

/// The per-row loss.
#[derive(Clone, Copy, Debug)]
pub enum RowLoss<'a> {
    /// Cross-entropy against the row's label.
    CrossEntropy {
        /// eps in [0, 1].
        label_smoothing: f64,
        /// lambda >= 0: lambda * lse(x)^2 per row, returned on its own too.
        z_loss: f64,
        /// w [V], each >= 0 (None: all 1).
        class_weights: Option<&'a [f64]>,
    },
    /// A divergence from the teacher, whose logits [N, V] go through the
    /// same softcap and temperature and are not differentiated.
    Distillation {
        /// Which divergence.
        divergence: Divergence,
        /// The teacher's logits, [N, V].
        teacher: &'a [f64],
    },
}

/// One case of a head loss on the logits kind.
#[derive(Clone, Copy, Debug)]
pub struct HeadLoss<'a> {
    /// N = B * T rows.
    pub rows: usize,
    /// V.
    pub vocab: usize,
    /// The student's logits z, [N, V].
    pub logits: &'a [f64],
    /// [N]: a class in [0, V), or `ignore_index`.
    pub labels: &'a [i64],
    /// The label of a row that takes no part (torch's default: -100).
    pub ignore_index: i64,
    /// s > 0 in x = s tanh(z / s) / tau; +inf: no softcap.
    pub softcap: f64,
    /// tau > 0.
    pub temperature: f64,
    /// What each row's loss is.
    pub loss: RowLoss<'a>,
    /// How the rows' losses are reduced.
    pub reduction: Reduction,
}

/// What the oracle gives for one case.
#[derive(Clone, Debug, PartialEq)]
pub struct HeadLossOutput {
    /// The reduced loss; with `Reduction::None`, sum_i g_i l_i (the scalar
    /// whose gradient `grad` is).
    pub loss: f64,
    /// l_i per row (ignored rows 0), z-loss included.
    pub per_row: Vec<f64>,
    /// The z-loss alone, reduced as the loss is (0 without one).
    pub z_loss: f64,
    /// d loss / d z, [N, V] (ignored rows exactly 0).
    pub grad: Vec<f64>,
}

/// A row's transformed logits and their log-softmax.
struct Row {
    log_q: Vec<f64>,
    lse: f64,
}

/// x = s tanh(z / s) / tau, its log-softmax and log-sum-exp.
fn row(z: &[f64], softcap: f64, tau: f64) -> Row {
    let x: Vec<f64> = z.iter().map(|&z| transform(z, softcap) / tau).collect();
    let max = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let lse = max + CompensatedSum::of(x.iter().map(|&x| (x - max).exp())).ln();
    Row { log_q: x.iter().map(|&x| x - lse).collect(), lse }
}

fn transform(z: f64, softcap: f64) -> f64 {
    if softcap.is_finite() {
        softcap * (z / softcap).tanh()
    } else {
        z
    }
}

/// d x / d z at z (without the temperature).
fn transform_slope(z: f64, softcap: f64) -> f64 {
    if softcap.is_finite() {
        let t = (z / softcap).tanh();
        1.0 - t * t
    } else {
        1.0
    }
}

/// log(a e^u + b e^v) for a, b >= 0, from the logs (never log 0 of two underflows).
fn log_mix(a: f64, u: f64, b: f64, v: f64) -> f64 {
    let (la, lb) = (a.ln() + u, b.ln() + v);
    let hi = la.max(lb);
    if hi == f64::NEG_INFINITY {
        return hi;
    }
    hi + ((la - hi).exp() + (lb - hi).exp()).ln()
}

impl HeadLoss<'_> {
    /// Checks the case against docs/spec.md's ranges: the first thing wrong, named.
    pub fn validate(&self, upstream: Option<&[f64]>) -> Result<(), String> {
        let (n, v) = (self.rows, self.vocab);
        if v == 0 {
            return Err("the vocabulary is empty (V = 0)".into());
        }
        if self.logits.len() != n * v || self.labels.len() != n {
            return Err(format!("logits hold {} values and labels {}, expected N * V = {} and N = {n}", self.logits.len(), self.labels.len(), n * v));
        }
        if !(self.temperature > 0.0 && self.temperature.is_finite()) {
            return Err(format!("temperature {}: must be finite and > 0", self.temperature));
        }
        if !(self.softcap > 0.0) {
            return Err(format!("softcap {}: must be > 0 (+inf: none)", self.softcap));
        }
        for (i, &y) in self.labels.iter().enumerate() {
            if y != self.ignore_index && !(0..v as i64).contains(&y) {
                return Err(format!("label {y} of row {i} is outside [0, {v}) and is not ignore_index {}", self.ignore_index));
            }
            if y != self.ignore_index && self.logits[i * v..(i + 1) * v].iter().any(|z| !z.is_finite()) {
                return Err(format!("row {i}'s logits are not all finite"));
            }
        }
        match self.loss {
            RowLoss::CrossEntropy { label_smoothing, z_loss, class_weights } => {
                if !(0.0..=1.0).contains(&label_smoothing) {
                    return Err(format!("label_smoothing {label_smoothing}: must be in [0, 1]"));
                }
                if !(z_loss >= 0.0 && z_loss.is_finite()) {
                    return Err(format!("z_loss {z_loss}: must be finite and >= 0"));
                }
                if let Some(w) = class_weights {
                    if w.len() != v || w.iter().any(|&w| !(w >= 0.0 && w.is_finite())) {
                        return Err(format!("class weights: {} of them, each finite and >= 0, expected V = {v}", w.len()));
                    }
                }
            }
            RowLoss::Distillation { divergence, teacher } => {
                if teacher.len() != n * v {
                    return Err(format!("teacher logits hold {} values, expected N * V = {}", teacher.len(), n * v));
                }
                if let Divergence::Jsd(beta) = divergence {
                    if !(0.0..=1.0).contains(&beta) {
                        return Err(format!("JSD beta {beta}: must be in [0, 1]"));
                    }
                }
                for (i, &y) in self.labels.iter().enumerate() {
                    if y != self.ignore_index && teacher[i * v..(i + 1) * v].iter().any(|t| !t.is_finite()) {
                        return Err(format!("row {i}'s teacher logits are not all finite"));
                    }
                }
            }
        }
        match self.reduction {
            Reduction::OverCount(c) if !(c > 0.0 && c.is_finite()) => return Err(format!("over_count {c}: must be finite and > 0")),
            Reduction::BatchMean(0) => return Err("batchmean over B = 0 sequences".into()),
            Reduction::None => match upstream {
                Some(g) if g.len() == n => {}
                _ => return Err(format!("reduction none needs an upstream vector of N = {n} values")),
            },
            _ => {}
        }
        Ok(())
    }

    fn weight(&self, y: usize) -> f64 {
        match self.loss {
            RowLoss::CrossEntropy { class_weights: Some(w), .. } => w[y],
            _ => 1.0,
        }
    }

    /// The loss, its parts and its gradient. `upstream` is g [N] for
    /// `Reduction::None` (ignored otherwise).
    pub fn evaluate(&self, upstream: Option<&[f64]>) -> Result<HeadLossOutput, String> {
        self.validate(upstream)?;
        let (n, v) = (self.rows, self.vocab);
        let live = |i: usize| self.labels[i] != self.ignore_index;
        let denominator = match self.reduction {
            Reduction::Mean => CompensatedSum::of((0..n).filter(|&i| live(i)).map(|i| self.weight(self.labels[i] as usize))),
            _ => 1.0,
        };
        let row_weight = |i: usize| match self.reduction {
            Reduction::None => upstream.expect("validated")[i],
            Reduction::Sum => 1.0,
            Reduction::Mean if denominator > 0.0 => 1.0 / denominator,
            Reduction::Mean => 0.0,
            Reduction::OverCount(c) => 1.0 / c,
            Reduction::BatchMean(b) => 1.0 / b as f64,
        };
        let mut grad = vec![0.0; n * v];
        let rows: Vec<(f64, f64)> = grad
            .par_chunks_mut(v)
            .enumerate()
            .map(|(i, g)| if live(i) { self.row_loss_and_grad(i, row_weight(i), g) } else { (0.0, 0.0) })
            .collect();
        let per_row: Vec<f64> = rows.iter().map(|&(l, _)| l).collect();
        let loss = CompensatedSum::of((0..n).map(|i| row_weight(i) * per_row[i]));
        let z_loss = CompensatedSum::of((0..n).map(|i| row_weight(i) * rows[i].1));
        Ok(HeadLossOutput { loss, per_row, z_loss, grad })
    }

    /// Row i's loss l_i (z-loss included) and its z-loss, with `weight` *
    /// d l_i / d z written into `g`.
    fn row_loss_and_grad(&self, i: usize, weight: f64, g: &mut [f64]) -> (f64, f64) {
        let v = self.vocab;
        let z = &self.logits[i * v..(i + 1) * v];
        let (tau, cap) = (self.temperature, self.softcap);
        let r = row(z, cap, tau);
        let q: Vec<f64> = r.log_q.iter().map(|l| l.exp()).collect();
        // d l / d x into g, then through the transform.
        let (loss, z_part) = match self.loss {
            RowLoss::CrossEntropy { label_smoothing: eps, z_loss: lambda, class_weights } => {
                let y = self.labels[i] as usize;
                let w = |c: usize| class_weights.map_or(1.0, |w| w[c]);
                let total_w = class_weights.map_or(v as f64, |w| CompensatedSum::of(w.iter().copied()));
                let smooth = CompensatedSum::of((0..v).map(|c| -w(c) * r.log_q[c]));
                let ce = (1.0 - eps) * w(y) * (-r.log_q[y]) + eps / v as f64 * smooth;
                let z_row = lambda * r.lse * r.lse;
                for c in 0..v {
                    let onehot = if c == y { 1.0 } else { 0.0 };
                    g[c] = (1.0 - eps) * w(y) * (q[c] - onehot) + eps / v as f64 * (total_w * q[c] - w(c)) + 2.0 * lambda * r.lse * q[c];
                }
                (ce + z_row, z_row)
            }
            RowLoss::Distillation { divergence, teacher } => {
                let p_row = row(&teacher[i * v..(i + 1) * v], cap, tau);
                let (log_p, log_q) = (&p_row.log_q, &r.log_q);
                let p: Vec<f64> = log_p.iter().map(|l| l.exp()).collect();
                // p_c log(p_c / r_c), 0 where p_c is 0.
                let kl = |p: &[f64], log_p: &[f64], log_r: &[f64]| CompensatedSum::of((0..v).filter(|&c| p[c] > 0.0).map(|c| p[c] * (log_p[c] - log_r[c])));
                match divergence {
                    Divergence::ForwardKl | Divergence::Jsd(0.0) => {
                        for c in 0..v {
                            g[c] = q[c] - p[c];
                        }
                        (kl(&p, log_p, log_q), 0.0)
                    }
                    Divergence::ReverseKl | Divergence::Jsd(1.0) => {
                        let dq: Vec<f64> = (0..v).map(|c| log_q[c] - log_p[c]).collect();
                        softmax_pullback(&q, &dq, g);
                        (kl(&q, log_q, log_p), 0.0)
                    }
                    Divergence::Jsd(beta) => {
                        let log_m: Vec<f64> = (0..v).map(|c| log_mix(beta, log_p[c], 1.0 - beta, log_q[c])).collect();
                        let dq: Vec<f64> = (0..v).map(|c| (1.0 - beta) * (log_q[c] - log_m[c])).collect();
                        softmax_pullback(&q, &dq, g);
                        (beta * kl(&p, log_p, &log_m) + (1.0 - beta) * kl(&q, log_q, &log_m), 0.0)
                    }
                }
            }
        };
        for c in 0..v {
            g[c] *= weight * transform_slope(z[c], cap) / tau;
        }
        (loss, z_part)
    }
}

/// The fused kind of a head loss: the student's logits formed as
/// hidden @ lm_head + bias (in f64, exactly from bf16 or f32 inputs), the
/// gradient carried back to the three.
#[derive(Clone, Copy, Debug)]
pub struct FusedHeadLoss<'a> {
    /// [N, H].
    pub hidden: &'a [f64],
    /// [H, V].
    pub lm_head: &'a [f64],
    /// [V], or None: no bias.
    pub bias: Option<&'a [f64]>,
    /// H.
    pub hidden_dim: usize,
    /// Everything but the logits (its `logits` field is not read).
    pub head: HeadLoss<'a>,
}

/// What the oracle gives for a fused case: the logits kind's output (its
/// `grad` the gradient in the logits) and the gradients of the inputs.
#[derive(Clone, Debug, PartialEq)]
pub struct FusedHeadLossOutput {
    /// The loss, its parts and d loss / d z.
    pub logits: HeadLossOutput,
    /// d loss / d hidden, [N, H].
    pub d_hidden: Vec<f64>,
    /// d loss / d lm_head, [H, V].
    pub d_lm_head: Vec<f64>,
    /// d loss / d bias, [V] (None without a bias).
    pub d_bias: Option<Vec<f64>>,
}

impl FusedHeadLoss<'_> {
    /// The logits z = hidden @ lm_head + bias, [N, V], summed compensated.
    pub fn logits(&self) -> Vec<f64> {
        let (n, h_, v) = (self.head.rows, self.hidden_dim, self.head.vocab);
        let mut z = vec![0.0; n * v];
        z.par_chunks_mut(v).enumerate().for_each(|(i, row)| {
            for (c, out) in row.iter_mut().enumerate() {
                let bias = self.bias.map_or(0.0, |b| b[c]);
                *out = CompensatedSum::of((0..h_).map(|k| self.hidden[i * h_ + k] * self.lm_head[k * v + c]).chain([bias]));
            }
        });
        z
    }

    /// The loss and the gradients of hidden, lm_head and bias (`upstream`
    /// as in [`HeadLoss::evaluate`]).
    pub fn evaluate(&self, upstream: Option<&[f64]>) -> Result<FusedHeadLossOutput, String> {
        let (n, h_, v) = (self.head.rows, self.hidden_dim, self.head.vocab);
        if self.hidden.len() != n * h_ || self.lm_head.len() != h_ * v || self.bias.is_some_and(|b| b.len() != v) {
            return Err(format!("hidden holds {} values, lm_head {}, bias {:?}: expected N * H = {}, H * V = {}, V = {v}", self.hidden.len(), self.lm_head.len(), self.bias.map(<[f64]>::len), n * h_, h_ * v));
        }
        let z = self.logits();
        let logits = HeadLoss { logits: &z, ..self.head }.evaluate(upstream)?;
        let g = &logits.grad;
        let mut d_hidden = vec![0.0; n * h_];
        d_hidden.par_chunks_mut(h_).enumerate().for_each(|(i, row)| {
            for (k, out) in row.iter_mut().enumerate() {
                *out = CompensatedSum::of((0..v).map(|c| g[i * v + c] * self.lm_head[k * v + c]));
            }
        });
        let mut d_lm_head = vec![0.0; h_ * v];
        d_lm_head.par_chunks_mut(v).enumerate().for_each(|(k, row)| {
            for (c, out) in row.iter_mut().enumerate() {
                *out = CompensatedSum::of((0..n).map(|i| self.hidden[i * h_ + k] * g[i * v + c]));
            }
        });
        let d_bias = self.bias.map(|_| (0..v).map(|c| CompensatedSum::of((0..n).map(|i| g[i * v + c]))).collect());
        Ok(FusedHeadLossOutput { logits, d_hidden, d_lm_head, d_bias })
    }
}

/// d / d x_v of a function of q = softmax(x) whose gradient in q is `dq`:
/// q_v (dq_v - sum_c q_c dq_c).
fn softmax_pullback(q: &[f64], dq: &[f64], out: &mut [f64]) {
    let mean = CompensatedSum::of(q.iter().zip(dq).map(|(q, d)| q * d));
    for ((o, &q), &d) in out.iter_mut().zip(q).zip(dq) {
        *o = q * (d - mean);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (splitmix64) for the tests' inputs.
    struct Draw(u64);

    impl Draw {
        fn next(&mut self) -> f64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
        }
        fn normal(&mut self, scale: f64) -> f64 {
            (self.next() - 0.5) * 2.0 * scale
        }
    }

    const N: usize = 4;
    const V: usize = 7;

    fn losses(teacher: &[f64], weights: &[f64]) -> Vec<(&'static str, RowLoss<'static>)> {
        let teacher: &'static [f64] = Box::leak(teacher.to_vec().into_boxed_slice());
        let weights: &'static [f64] = Box::leak(weights.to_vec().into_boxed_slice());
        vec![
            ("ce", RowLoss::CrossEntropy { label_smoothing: 0.0, z_loss: 0.0, class_weights: None }),
            ("ce smoothed, z-loss, weighted", RowLoss::CrossEntropy { label_smoothing: 0.1, z_loss: 1e-2, class_weights: Some(weights) }),
            ("forward kl", RowLoss::Distillation { divergence: Divergence::ForwardKl, teacher }),
            ("reverse kl", RowLoss::Distillation { divergence: Divergence::ReverseKl, teacher }),
            ("jsd 0.3", RowLoss::Distillation { divergence: Divergence::Jsd(0.3), teacher }),
        ]
    }

    fn reductions() -> Vec<Reduction> {
        vec![Reduction::None, Reduction::Sum, Reduction::Mean, Reduction::OverCount(5.0), Reduction::BatchMean(2)]
    }

    /// The gradient is the loss's: central differences of the reduced loss
    /// (against non-uniform upstream weights for `none`), every loss and
    /// reduction, with a softcap and a temperature.
    #[test]
    fn gradients_match_finite_differences() {
        let mut d = Draw(7);
        let z: Vec<f64> = (0..N * V).map(|_| d.normal(3.0)).collect();
        let t: Vec<f64> = (0..N * V).map(|_| d.normal(3.0)).collect();
        let w: Vec<f64> = (0..V).map(|_| 0.25 + d.next()).collect();
        let labels = [3i64, -100, 0, 6];
        let upstream = [0.5, 7.0, -1.5, 2.0];
        for (name, loss) in losses(&t, &w) {
            for reduction in reductions() {
                for (softcap, tau) in [(f64::INFINITY, 1.0), (4.0, 0.7)] {
                    let case = |z: &[f64]| -> f64 {
                        let hl = HeadLoss { rows: N, vocab: V, logits: z, labels: &labels, ignore_index: -100, softcap, temperature: tau, loss, reduction };
                        hl.evaluate(Some(&upstream)).unwrap().loss
                    };
                    let hl = HeadLoss { rows: N, vocab: V, logits: &z, labels: &labels, ignore_index: -100, softcap, temperature: tau, loss, reduction };
                    let out = hl.evaluate(Some(&upstream)).unwrap();
                    for k in 0..N * V {
                        let h = 1e-5;
                        let (mut up, mut down) = (z.clone(), z.clone());
                        up[k] += h;
                        down[k] -= h;
                        let fd = (case(&up) - case(&down)) / (2.0 * h);
                        assert!((fd - out.grad[k]).abs() <= 1e-7 * (1.0 + fd.abs()), "{name}, {reduction:?}, softcap {softcap}: d/dz[{k}] {} vs differences {fd}", out.grad[k]);
                    }
                    // The ignored row is never read and gets no gradient.
                    assert!(out.grad[V..2 * V].iter().all(|&g| g == 0.0) && out.per_row[1] == 0.0);
                }
            }
        }
    }

    /// Cross-entropy without smoothing or z-loss is -log softmax(x)_y, its
    /// gradient softmax(x) - onehot(y); with the z-loss the difference is
    /// lambda lse^2 exactly.
    #[test]
    fn cross_entropy_is_the_negative_log_probability() {
        let z = [1.0, -2.0, 0.5, 3.0];
        let labels = [2i64];
        let plain = RowLoss::CrossEntropy { label_smoothing: 0.0, z_loss: 0.0, class_weights: None };
        let hl = HeadLoss { rows: 1, vocab: 4, logits: &z, labels: &labels, ignore_index: -100, softcap: f64::INFINITY, temperature: 1.0, loss: plain, reduction: Reduction::Sum };
        let out = hl.evaluate(None).unwrap();
        let lse = z.iter().map(|z: &f64| z.exp()).sum::<f64>().ln();
        assert!((out.loss - (lse - 0.5)).abs() < 1e-15);
        for c in 0..4 {
            let want = (z[c] - lse).exp() - if c == 2 { 1.0 } else { 0.0 };
            assert!((out.grad[c] - want).abs() < 1e-15, "{c}: {} vs {want}", out.grad[c]);
        }
        let with_z = HeadLoss { loss: RowLoss::CrossEntropy { label_smoothing: 0.0, z_loss: 0.25, class_weights: None }, ..hl };
        let out_z = with_z.evaluate(None).unwrap();
        assert!((out_z.loss - out.loss - 0.25 * lse * lse).abs() < 1e-14 && (out_z.z_loss - 0.25 * lse * lse).abs() < 1e-14);
    }

    /// torch's weighted mean: both terms over the sum of the non-ignored
    /// rows' label weights (0.3 + 2.0 here, the ignored row's weight left out).
    #[test]
    fn weighted_mean_divides_by_the_label_weights() {
        let z = [0.0, 1.0, 2.0, 2.0, 1.0, 0.0, 5.0, 5.0, 5.0];
        let (labels, w) = ([0i64, 2, -100], [0.3, 1.0, 2.0]);
        let loss = RowLoss::CrossEntropy { label_smoothing: 0.2, z_loss: 0.0, class_weights: Some(&w) };
        let mean = HeadLoss { rows: 3, vocab: 3, logits: &z, labels: &labels, ignore_index: -100, softcap: f64::INFINITY, temperature: 1.0, loss, reduction: Reduction::Mean };
        let sum = HeadLoss { reduction: Reduction::Sum, ..mean };
        let (m, s) = (mean.evaluate(None).unwrap(), sum.evaluate(None).unwrap());
        assert!((m.loss - s.loss / 2.3).abs() < 1e-15, "{} vs {}", m.loss, s.loss / 2.3);
    }

    /// Shift invariance: a constant added to a row's logits changes nothing
    /// (without a softcap or a z-loss); JSD(beta) of (p, q) is JSD(1 - beta)
    /// of (q, p) with the roles swapped; a student equal to its teacher has
    /// zero loss and gradient.
    #[test]
    fn divergences_keep_their_identities() {
        let mut d = Draw(11);
        let z: Vec<f64> = (0..N * V).map(|_| d.normal(4.0)).collect();
        let t: Vec<f64> = (0..N * V).map(|_| d.normal(4.0)).collect();
        let labels = [1i64, 2, 3, 4];
        let shifted: Vec<f64> = z.iter().enumerate().map(|(k, z)| z + 100.0 * (k / V) as f64).collect();
        for (name, loss) in losses(&t, &[1.0; V]).into_iter().filter(|(n, _)| !n.contains("z-loss")) {
            let a = HeadLoss { rows: N, vocab: V, logits: &z, labels: &labels, ignore_index: -100, softcap: f64::INFINITY, temperature: 0.9, loss, reduction: Reduction::Mean };
            let b = HeadLoss { logits: &shifted, ..a };
            let (a, b) = (a.evaluate(None).unwrap(), b.evaluate(None).unwrap());
            assert!((a.loss - b.loss).abs() < 1e-12, "{name}: {} vs {} shifted", a.loss, b.loss);
            assert!(a.grad.iter().zip(&b.grad).all(|(x, y)| (x - y).abs() < 1e-12), "{name}: the gradient moved with the shift");
        }
        let jsd = |beta: f64, student: &[f64], teacher: &[f64]| {
            let loss = RowLoss::Distillation { divergence: Divergence::Jsd(beta), teacher };
            HeadLoss { rows: N, vocab: V, logits: student, labels: &labels, ignore_index: -100, softcap: f64::INFINITY, temperature: 1.0, loss, reduction: Reduction::Sum }
                .evaluate(None)
                .unwrap()
                .loss
        };
        for beta in [0.1, 0.5, 0.8] {
            let (pq, qp) = (jsd(beta, &z, &t), jsd(1.0 - beta, &t, &z));
            assert!((pq - qp).abs() < 1e-12, "JSD({beta}) {pq} vs swapped JSD({}) {qp}", 1.0 - beta);
        }
        assert!(jsd(0.5, &z, &t) <= N as f64 * std::f64::consts::LN_2);
        for (name, loss) in losses(&z, &[1.0; V]).into_iter().filter(|(n, _)| !n.starts_with("ce")) {
            let same = HeadLoss { rows: N, vocab: V, logits: &z, labels: &labels, ignore_index: -100, softcap: 3.0, temperature: 0.6, loss, reduction: Reduction::Sum };
            let out = same.evaluate(None).unwrap();
            assert!(out.loss.abs() < 1e-12 && out.grad.iter().all(|g| g.abs() < 1e-12), "{name}: the student equal to its teacher has loss {}", out.loss);
        }
    }

    /// Every row ignored: loss 0 and a zero gradient under every reduction,
    /// never 0/0, whatever the ignored rows hold (NaN here).
    #[test]
    fn an_all_ignored_batch_is_zero() {
        let z = vec![f64::NAN; N * V];
        let labels = [-100i64; N];
        for (name, loss) in losses(&z, &[1.0; V]) {
            for reduction in reductions() {
                let hl = HeadLoss { rows: N, vocab: V, logits: &z, labels: &labels, ignore_index: -100, softcap: f64::INFINITY, temperature: 1.0, loss, reduction };
                let out = hl.evaluate(Some(&[1.0; N])).unwrap();
                assert!(out.loss == 0.0 && out.z_loss == 0.0 && out.grad.iter().all(|&g| g == 0.0), "{name}, {reduction:?}: loss {}", out.loss);
            }
        }
    }

    /// Two distributions that both underflow on a class (logits 0 and
    /// -1000, exp(-1000) = 0 in f64): the mixture's log stays finite, and so
    /// do the JSD and its gradient. Red with the mixture formed as the log
    /// of the sum of the two probabilities (0 * -inf = NaN: the case Liger's
    /// issue #769 reports).
    #[test]
    fn a_mixture_of_two_underflows_stays_finite() {
        let (z, t) = ([0.0, -1000.0], [0.0, -1000.0 + 1e-3]);
        let labels = [0i64];
        let loss = RowLoss::Distillation { divergence: Divergence::Jsd(0.5), teacher: &t };
        let hl = HeadLoss { rows: 1, vocab: 2, logits: &z, labels: &labels, ignore_index: -100, softcap: f64::INFINITY, temperature: 1.0, loss, reduction: Reduction::Sum };
        let out = hl.evaluate(None).unwrap();
        assert!(out.loss.is_finite() && out.loss >= 0.0 && out.grad.iter().all(|g| g.is_finite()), "loss {} grad {:?}", out.loss, out.grad);
    }

    /// The fused kind's gradients (hidden, lm_head, bias) against central
    /// differences, for cross-entropy and a JSD, with an ignored row.
    #[test]
    fn fused_gradients_match_finite_differences() {
        let (h_, mut d) = (3usize, Draw(5));
        let hidden: Vec<f64> = (0..N * h_).map(|_| d.normal(1.5)).collect();
        let lm_head: Vec<f64> = (0..h_ * V).map(|_| d.normal(1.5)).collect();
        let bias: Vec<f64> = (0..V).map(|_| d.normal(1.0)).collect();
        let teacher: Vec<f64> = (0..N * V).map(|_| d.normal(3.0)).collect();
        let labels = [2i64, 5, -100, 0];
        for (name, loss) in losses(&teacher, &[1.0; V]).into_iter().filter(|(n, _)| n.starts_with("ce smoothed") || n.starts_with("jsd")) {
            let head = HeadLoss { rows: N, vocab: V, logits: &[], labels: &labels, ignore_index: -100, softcap: 5.0, temperature: 0.8, loss, reduction: Reduction::Mean };
            let eval = |hd: &[f64], w: &[f64], b: &[f64]| {
                FusedHeadLoss { hidden: hd, lm_head: w, bias: Some(b), hidden_dim: h_, head }.evaluate(None).unwrap()
            };
            let out = eval(&hidden, &lm_head, &bias);
            let h = 1e-5;
            let check = |which: &str, analytic: &[f64], f: &dyn Fn(usize, f64) -> f64| {
                for (k, &a) in analytic.iter().enumerate() {
                    let fd = (f(k, h) - f(k, -h)) / (2.0 * h);
                    assert!((fd - a).abs() <= 1e-7 * (1.0 + fd.abs()), "{name}: d {which}[{k}] {a} vs differences {fd}");
                }
            };
            let moved = |v: &[f64], k: usize, by: f64| {
                let mut v = v.to_vec();
                v[k] += by;
                v
            };
            check("hidden", &out.d_hidden, &|k, by| eval(&moved(&hidden, k, by), &lm_head, &bias).logits.loss);
            check("lm_head", &out.d_lm_head, &|k, by| eval(&hidden, &moved(&lm_head, k, by), &bias).logits.loss);
            check("bias", out.d_bias.as_deref().unwrap(), &|k, by| eval(&hidden, &lm_head, &moved(&bias, k, by)).logits.loss);
        }
    }

    /// Bad input is named: a label outside the vocabulary, tau <= 0, a JSD
    /// beta outside [0, 1], `none` without its upstream vector.
    #[test]
    fn bad_input_is_named() {
        let z = [0.0; 6];
        let ce = RowLoss::CrossEntropy { label_smoothing: 0.0, z_loss: 0.0, class_weights: None };
        let base = HeadLoss { rows: 2, vocab: 3, logits: &z, labels: &[0, 1], ignore_index: -100, softcap: f64::INFINITY, temperature: 1.0, loss: ce, reduction: Reduction::Sum };
        let err = |hl: HeadLoss<'_>, g: Option<&[f64]>| hl.evaluate(g).unwrap_err();
        assert!(err(HeadLoss { labels: &[0, 3], ..base }, None).contains("label 3 of row 1"));
        assert!(err(HeadLoss { temperature: 0.0, ..base }, None).contains("temperature 0"));
        let jsd = RowLoss::Distillation { divergence: Divergence::Jsd(1.5), teacher: &z };
        assert!(err(HeadLoss { loss: jsd, ..base }, None).contains("beta 1.5"));
        assert!(err(HeadLoss { reduction: Reduction::None, ..base }, None).contains("upstream"));
    }
}
