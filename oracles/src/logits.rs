//! The logits kind: its inputs over a stored [B, T, V] array, as a row
//! source for the forward pass (`forward.rs`), and their validation.

use rayon::prelude::*;

use crate::config::{Config, Hparams};
use crate::error::{input_error, InputError};
use crate::forward::Forward;
use crate::problem::{LogitRows, Real, Shape, TokenInputs};
use crate::softmax::RowSoftmax;
use crate::vector::{self, GradRow};

/// The logits kind's inputs (docs/spec.md, "Shapes and inputs").
pub struct LogitsProblem<'a, L: Real> {
    /// B, T, V.
    pub shape: Shape,
    /// [B, T, V], row-major: the raw logits z as the implementation got them.
    pub logits: &'a [L],
    /// tokens, mask, advantages, old / ref log-probs, rollout-correction weights.
    pub per_token: TokenInputs<'a>,
    /// The static switches.
    pub config: Config,
    /// The runtime hyperparameters, as the f32 values an implementation receives.
    pub hparams: Hparams,
}

impl<L: Real> LogitRows for LogitsProblem<'_, L> {
    fn shape(&self) -> Shape {
        self.shape
    }
    fn logit_row(&self, row: usize, out: &mut [f64], magnitude: Option<&mut [f64]>) {
        let v = self.shape.vocab;
        L::widen(&self.logits[row * v..(row + 1) * v], out);
        if let Some(m) = magnitude {
            vector::abs(out, m);
        }
    }
    fn stored_stats(&self, row: usize, at: usize, divisor: f64, scratch: &mut Vec<f64>) -> Option<(RowSoftmax, f64)> {
        let v = self.shape.vocab;
        let values = &self.logits[row * v..(row + 1) * v];
        let x_at = if divisor == 1.0 { values[at].to_f64() } else { values[at].to_f64() / divisor };
        Some((L::softmax_stats(values, divisor, scratch), x_at))
    }
    fn grad_row_pass(&self, row: usize, chosen: usize, out: &mut [f64], k: &GradRow) {
        let v = self.shape.vocab;
        L::grad_pass(&self.logits[row * v..(row + 1) * v], out, k);
        out[chosen] += k.scale * k.c_logp;
    }
}

impl<'a, L: Real> LogitsProblem<'a, L> {
    /// Its per-token inputs (tokens, mask, advantages, old / ref log-probs, weights).
    pub fn token_inputs(&self) -> TokenInputs<'a> {
        self.per_token
    }

    /// Validates everything and runs the forward pass.
    pub fn forward(&self) -> Result<Forward<'_>, InputError> {
        let s = self.shape;
        if self.logits.len() != s.rows() * s.vocab {
            return Err(input_error!(
                "logits has {} elements, expected B*T*V = {}*{}*{} = {}",
                self.logits.len(),
                s.batch,
                s.time,
                s.vocab,
                s.rows() * s.vocab
            ));
        }
        // Rows in parallel, each in one branch-free (vectorised) read; the
        // first bad element is then looked up in the first bad row.
        let bad_row = self
            .logits
            .par_chunks(s.vocab.max(1))
            .position_first(|row| row.iter().fold(false, |bad, z| bad | !z.to_f64().is_finite()));
        let first_bad = bad_row.and_then(|r| {
            let start = r * s.vocab;
            self.logits[start..].iter().position(|z| !z.to_f64().is_finite()).map(|v| (start + v, self.logits[start + v]))
        });
        if let Some((i, z)) = first_bad {
            let (b, t, v) = (i / (s.time * s.vocab), (i / s.vocab) % s.time, i % s.vocab);
            return Err(input_error!("logits[{b}, {t}, {v}] = {} is not finite", z.to_f64()));
        }
        Forward::new(self, self.token_inputs(), self.config, self.hparams)
    }
}
