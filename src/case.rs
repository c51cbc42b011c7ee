//! A test case: the compact description proptest generates and shrinks
//! ([`CaseSpec`]), and the arrays it materialises into ([`Case`]), already
//! rounded to the implementation's dtype so the oracle sees exactly the values
//! the implementation sees.

use grpo_oracle::{row_softmax_stats, Config, Hparams, InputError, LogitsProblem, Shape, TemperatureMode};
use serde::{Deserialize, Serialize};

use crate::prng::Prng;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dtype {
    F32,
    Bf16,
}

impl Dtype {
    pub fn round(self, x: f64) -> f32 {
        match self {
            Dtype::F32 => x as f32,
            Dtype::Bf16 => half::bf16::from_f64(x).to_f32(),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::Bf16 => "bf16",
        }
    }
}

/// How a row of logits is drawn. `scale` multiplies a unit pattern.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "pattern")]
pub enum LogitPattern {
    /// scale * N(0, 1).
    Normal { scale: f64 },
    /// A policy-like long tail: -scale * ln(rank), ranks shuffled.
    Zipf { scale: f64 },
    /// scale * N(0, 1) plus one column 6 * scale + 8 above the rest.
    NearOneHot { scale: f64 },
    /// Every column equal: a uniform softmax.
    Flat { value: f64 },
    /// scale * N(0, 1) - offset: all negative, large common offset.
    AllNegative { scale: f64, offset: f64 },
    /// scale * N(0, 1) with the row's maximum moved into the last columns
    /// (the tail tile of any block size).
    TailMax { scale: f64 },
}

/// Which token id each position holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenPattern {
    Random,
    /// Each position draws one of the others.
    Mixed,
    Argmax,
    Argmin,
    Zero,
    Last,
    /// Ids on both sides of multiples of 128 and 2048.
    TileEdge,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MaskPattern {
    Full,
    RightPadded,
    PromptAndPadding,
    FullyMaskedRow,
    FullyMaskedBatch,
    Random,
}

/// Where the ratios r = exp(logp - old) fall (off-policy cases).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RatioPattern {
    /// Each token draws a region: below, inside or above the clip band,
    /// beyond delta, exactly on an edge, exactly 1, or extreme.
    Mixed,
    /// Within ~1% of 1 (what Liger's tests draw).
    NearOne,
    /// Exactly on 1 - eps_low, 1 + eps_high or delta (as far as f32 allows).
    OnEdges,
    /// log r ~ N(0, 1.5).
    Wide,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdvantagePattern {
    /// Each row draws N(0,1), +-|N(0,1)|, 0 or +-1.
    Mixed,
    Positive,
    Negative,
    Zero,
}

/// The N of `sum_over_constant`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NormalizerChoice {
    /// Dr.GRPO: B * T.
    BatchTimesTime,
    /// This micro-batch's valid-token count (at least 1).
    ValidCount,
    /// A global count shared with other micro-batches: 3 * valid + 5.
    GlobalCount,
    Constant,
}

/// Everything proptest draws for one case; the arrays follow from it and `seed`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CaseSpec {
    pub batch: usize,
    pub time: usize,
    pub vocab: usize,
    pub dtype: Dtype,
    pub config: Config,
    /// `normalizer` here is a placeholder; see `normalizer`.
    pub hparams: Hparams,
    pub normalizer: NormalizerChoice,
    pub logits: LogitPattern,
    pub tokens: TokenPattern,
    pub mask: MaskPattern,
    pub ratios: RatioPattern,
    pub advantages: AdvantagePattern,
    /// Fill masked positions with garbage: old/ref log-probs of +-1e9, token ids -100 or >= V.
    pub masked_garbage: bool,
    /// The loss's cotangent in the VJP.
    pub cotangent: f64,
    pub seed: u64,
}

/// A materialised case: the exact inputs every implementation and the oracle see.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Case {
    pub shape: ShapeJson,
    pub dtype: Dtype,
    pub config: Config,
    pub hparams: Hparams,
    pub cotangent: f64,
    /// [B, T, V], values exactly representable in `dtype`.
    pub logits: Vec<f32>,
    pub tokens: Vec<i32>,
    pub mask: Vec<f32>,
    pub advantages: Vec<f32>,
    pub old_logp: Option<Vec<f32>>,
    pub ref_logp: Option<Vec<f32>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ShapeJson {
    pub batch: usize,
    pub time: usize,
    pub vocab: usize,
}

impl Case {
    pub fn shape(&self) -> Shape {
        Shape { batch: self.shape.batch, time: self.shape.time, vocab: self.shape.vocab }
    }

    pub fn problem(&self) -> LogitsProblem<'_, f32> {
        LogitsProblem {
            shape: self.shape(),
            logits: &self.logits,
            tokens: &self.tokens,
            mask: &self.mask,
            advantages: &self.advantages,
            old_logp: self.old_logp.as_deref(),
            ref_logp: self.ref_logp.as_deref(),
            config: self.config,
            hparams: self.hparams,
        }
    }

    /// Every logit must be exactly representable in the case's dtype (a
    /// hand-edited repro may not be).
    pub fn check_dtype(&self) -> Result<(), InputError> {
        if let Some((i, z)) =
            self.logits.iter().enumerate().find(|(_, &z)| self.dtype.round(z as f64) != z)
        {
            return Err(InputError(format!(
                "logits element {i} = {z} is not representable in {}",
                self.dtype.name()
            )));
        }
        Ok(())
    }

    /// A one-line description for reports.
    pub fn summary(&self) -> String {
        let c = &self.config;
        let h = &self.hparams;
        let mut s = format!(
            "B={} T={} V={} {} {:?}-mode {:?} {} eps={}/{} tau={}",
            self.shape.batch,
            self.shape.time,
            self.shape.vocab,
            self.dtype.name(),
            c.temperature_mode,
            c.aggregation,
            if c.on_policy { "on-policy" } else { "off-policy" },
            h.eps_low as f32,
            h.eps_high as f32,
            h.temperature as f32,
        );
        if c.kl {
            s += &format!(" kl(beta={})", h.beta as f32);
        }
        if c.entropy_bonus {
            s += &format!(" entropy({})", h.entropy_coef as f32);
        }
        if c.two_sided {
            s += &format!(" delta={}", h.delta as f32);
        }
        if c.aggregation == grpo_oracle::Aggregation::SumOverConstant {
            s += &format!(" N={}", h.normalizer as f32);
        }
        let valid = self.mask.iter().filter(|&&m| m != 0.0).count();
        s += &format!(" valid={valid}/{} cot={}", self.mask.len(), self.cotangent as f32);
        s
    }
}

fn f32_round(x: f64) -> f32 {
    x as f32
}

/// The log-prob of `y` in one row under the case's temperature convention.
fn row_logp(row: &[f32], y: usize, tau: f64, mode: TemperatureMode, x: &mut [f64], scratch: &mut [f64]) -> f64 {
    for (xv, &z) in x.iter_mut().zip(row) {
        *xv = match mode {
            TemperatureMode::Logits => z as f64 / tau,
            TemperatureMode::Logp => z as f64,
        };
    }
    let lse = row_softmax_stats(x, scratch).lse;
    match mode {
        TemperatureMode::Logits => x[y] - lse,
        TemperatureMode::Logp => (x[y] - lse) / tau,
    }
}

impl CaseSpec {
    pub fn materialize(&self) -> Case {
        let (b_, t_, v_) = (self.batch, self.time, self.vocab);
        let n = b_ * t_;
        // Every row and purpose has its own stream (`Prng::keyed`), so a
        // shrink step that drops rows or columns leaves the rest in place.
        let stream = |purpose: Stream, i: usize| Prng::keyed(self.seed, purpose as u64, i / t_, i % t_);
        let logits = self.draw_logits();
        let mask = self.draw_mask();
        let mut tokens = self.draw_tokens(&logits);
        let advantages = self.draw_advantages();
        let mut hparams = self.hparams;
        let valid = mask.iter().filter(|&&m| m != 0.0).count() as f64;
        hparams.normalizer = f32_round(match self.normalizer {
            NormalizerChoice::BatchTimesTime => n as f64,
            NormalizerChoice::ValidCount => valid.max(1.0),
            NormalizerChoice::GlobalCount => 3.0 * valid + 5.0,
            NormalizerChoice::Constant => 37.5,
        }) as f64;
        if !self.config.two_sided {
            hparams.delta = f64::INFINITY;
        }
        if !self.config.kl {
            hparams.beta = 0.0;
        }
        if !self.config.entropy_bonus {
            hparams.entropy_coef = 0.0;
        }

        let tau = hparams.temperature;
        let (mut x, mut scratch) = (vec![0.0; v_], vec![0.0; v_]);
        let logp: Vec<f64> = (0..n)
            .map(|i| {
                let y = tokens[i] as usize;
                row_logp(&logits[i * v_..(i + 1) * v_], y, tau, self.config.temperature_mode, &mut x, &mut scratch)
            })
            .collect();
        let old_logp = (!self.config.on_policy).then(|| {
            (0..n)
                .map(|i| f32_round(logp[i] - self.draw_log_ratio(&mut stream(Stream::Ratio, i), &hparams)))
                .collect::<Vec<f32>>()
        });
        let ref_logp = self
            .config
            .kl
            .then(|| (0..n).map(|i| f32_round(logp[i] + 0.5 * stream(Stream::Reference, i).normal())).collect::<Vec<f32>>());
        let (mut old_logp, mut ref_logp) = (old_logp, ref_logp);
        if self.masked_garbage {
            for i in (0..n).filter(|&i| mask[i] == 0.0) {
                let mut rng = stream(Stream::Garbage, i);
                tokens[i] = rng.pick(&[-100, v_ as i32 + 3, -1]);
                for arr in [old_logp.as_mut(), ref_logp.as_mut()].into_iter().flatten() {
                    arr[i] = rng.pick(&[1e9, -1e9, 0.0, 30.0, -30.0]);
                }
            }
        }
        Case {
            shape: ShapeJson { batch: b_, time: t_, vocab: v_ },
            dtype: self.dtype,
            config: self.config,
            hparams,
            cotangent: self.cotangent,
            logits,
            tokens,
            mask,
            advantages,
            old_logp,
            ref_logp,
        }
    }

    fn draw_logits(&self) -> Vec<f32> {
        let v_ = self.vocab;
        let mut out = Vec::with_capacity(self.batch * self.time * v_);
        let mut row = vec![0.0f64; v_];
        for i in 0..self.batch * self.time {
            let rng = &mut Prng::keyed(self.seed, Stream::Logits as u64, i / self.time, i % self.time);
            match self.logits {
                LogitPattern::Normal { scale } => row.iter_mut().for_each(|z| *z = scale * rng.normal()),
                LogitPattern::Zipf { scale } => {
                    for (rank, z) in row.iter_mut().enumerate() {
                        *z = -scale * ((rank + 1) as f64).ln();
                    }
                    for i in (1..v_).rev() {
                        row.swap(i, rng.below(i + 1));
                    }
                }
                LogitPattern::NearOneHot { scale } => {
                    row.iter_mut().for_each(|z| *z = scale * rng.normal());
                    row[rng.below(v_)] += 6.0 * scale + 8.0;
                }
                LogitPattern::Flat { value } => row.iter_mut().for_each(|z| *z = value),
                LogitPattern::AllNegative { scale, offset } => {
                    row.iter_mut().for_each(|z| *z = scale * rng.normal() - offset)
                }
                LogitPattern::TailMax { scale } => {
                    row.iter_mut().for_each(|z| *z = scale * rng.normal());
                    let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let tails = [1, (v_ % 128).max(1), (v_ % 2048).max(1)];
                    let tail = rng.pick(&tails);
                    let at = v_ - 1 - rng.below(tail);
                    row[at] = max + scale.max(1.0);
                }
            }
            out.extend(row.iter().map(|&z| self.dtype.round(z)));
        }
        out
    }

    fn draw_mask(&self) -> Vec<f32> {
        let (b_, t_) = (self.batch, self.time);
        let mut mask = vec![0.0f32; b_ * t_];
        let empty_row = Prng::keyed(self.seed, Stream::Mask as u64, usize::MAX, 0).below(b_);
        for b in 0..b_ {
            let rng = &mut Prng::keyed(self.seed, Stream::Mask as u64, b, 0);
            let (start, end) = match self.mask {
                MaskPattern::Full => (0, t_),
                MaskPattern::RightPadded => (0, rng.below(t_ + 1)),
                MaskPattern::PromptAndPadding => {
                    let start = rng.below(t_);
                    (start, start + rng.below(t_ - start + 1))
                }
                MaskPattern::FullyMaskedRow if b == empty_row => (0, 0),
                MaskPattern::FullyMaskedRow => (0, t_ - rng.below(t_.min(3))),
                MaskPattern::FullyMaskedBatch => (0, 0),
                MaskPattern::Random => (0, t_),
            };
            for t in start..end {
                let keep = self.mask != MaskPattern::Random || rng.uniform() < 0.7;
                mask[b * t_ + t] = if keep { 1.0 } else { 0.0 };
            }
        }
        mask
    }

    fn draw_tokens(&self, logits: &[f32]) -> Vec<i32> {
        let v_ = self.vocab;
        (0..self.batch * self.time)
            .map(|i| {
                let rng = &mut Prng::keyed(self.seed, Stream::Tokens as u64, i / self.time, i % self.time);
                let row = &logits[i * v_..(i + 1) * v_];
                let pattern = match self.tokens {
                    TokenPattern::Mixed => rng.pick(&[
                        TokenPattern::Random,
                        TokenPattern::Argmax,
                        TokenPattern::Argmin,
                        TokenPattern::Zero,
                        TokenPattern::Last,
                        TokenPattern::TileEdge,
                    ]),
                    p => p,
                };
                let y = match pattern {
                    TokenPattern::Random | TokenPattern::Mixed => rng.below(v_),
                    TokenPattern::Argmax => arg_by(row, |a, b| a > b),
                    TokenPattern::Argmin => arg_by(row, |a, b| a < b),
                    TokenPattern::Zero => 0,
                    TokenPattern::Last => v_ - 1,
                    TokenPattern::TileEdge => {
                        let block = rng.pick(&[128usize, 2048]);
                        let k = rng.below(v_ / block + 1);
                        (k * block + rng.pick(&[0usize, 1, 2])).saturating_sub(1).min(v_ - 1)
                    }
                };
                y as i32
            })
            .collect()
    }

    fn draw_advantages(&self) -> Vec<f32> {
        (0..self.batch)
            .map(|b| {
                let rng = &mut Prng::keyed(self.seed, Stream::Advantages as u64, b, 0);
                let a = match self.advantages {
                    AdvantagePattern::Mixed => match rng.below(6) {
                        0 => rng.normal(),
                        1 => rng.normal().abs() + 0.05,
                        2 => -rng.normal().abs() - 0.05,
                        3 => 0.0,
                        4 => 1.0,
                        _ => -1.0,
                    },
                    AdvantagePattern::Positive => rng.normal().abs() + 0.05,
                    AdvantagePattern::Negative => -rng.normal().abs() - 0.05,
                    AdvantagePattern::Zero => 0.0,
                };
                f32_round(a)
            })
            .collect()
    }

    /// A log-ratio logp - old in the region the pattern asks for.
    fn draw_log_ratio(&self, rng: &mut Prng, h: &Hparams) -> f64 {
        let (low, high) = (1.0 - h.eps_low, 1.0 + h.eps_high);
        let two_sided = self.config.two_sided;
        let edge = |rng: &mut Prng| -> f64 {
            if two_sided {
                rng.pick(&[low, high, h.delta])
            } else {
                rng.pick(&[low, high])
            }
        };
        let ratio = match self.ratios {
            RatioPattern::NearOne => return 0.01 * rng.normal(),
            RatioPattern::Wide => return 1.5 * rng.normal(),
            RatioPattern::OnEdges => edge(rng),
            RatioPattern::Mixed => {
                let above_cap = if two_sided { h.delta } else { 3.0 * high };
                match rng.below(if two_sided { 8 } else { 7 }) {
                    0 => low * rng.range(0.2, 0.97),
                    1 => low + (high - low) * rng.range(0.03, 0.97),
                    2 => high + (above_cap - high) * rng.range(0.03, 0.97),
                    3 => edge(rng),
                    4 => 1.0,
                    5 => return rng.pick(&[1.0, -1.0]) * rng.range(3.0, 12.0),
                    6 => edge(rng),
                    _ => h.delta * rng.range(1.03, 3.0),
                }
            }
        };
        ratio.ln()
    }
}

/// The purposes random streams are keyed by.
#[derive(Clone, Copy)]
enum Stream {
    Logits = 1,
    Mask,
    Tokens,
    Advantages,
    Ratio,
    Reference,
    Garbage,
}

fn arg_by(row: &[f32], better: impl Fn(f32, f32) -> bool) -> usize {
    let mut best = 0;
    for (i, &z) in row.iter().enumerate() {
        if better(z, row[best]) {
            best = i;
        }
    }
    best
}
