//! The fused kind: logits = hidden @ lm_head (Flax layout, lm_head [H, V]),
//! formed in f64 from the already rounded inputs, then the logits-kind math.
//! The gradient w.r.t. logits, row by row, gives d hidden = dZ @ lm_head^T
//! and d lm_head = hidden^T @ dZ, accumulated without a [B*T, V] buffer.

use rayon::prelude::*;

use crate::config::{Config, Hparams};
use crate::error::{input_error, InputError};
use crate::problem::{Forward, LogitRows, Real, Shape, TokenInputs};

pub struct FusedProblem<'a, L: Real> {
    pub shape: Shape,
    pub hidden_dim: usize,
    /// [B, T, H].
    pub hidden: &'a [L],
    /// [H, V].
    pub lm_head: &'a [L],
    pub tokens: &'a [i32],
    pub mask: &'a [f32],
    pub advantages: &'a [f32],
    pub old_logp: Option<&'a [f32]>,
    pub ref_logp: Option<&'a [f32]>,
    pub config: Config,
    pub hparams: Hparams,
}

impl<L: Real> LogitRows for FusedProblem<'_, L> {
    fn shape(&self) -> Shape {
        self.shape
    }

    fn logit_row(&self, row: usize, out: &mut [f64], magnitude: Option<&mut [f64]>) {
        let (h_, v_) = (self.hidden_dim, self.shape.vocab);
        let x = &self.hidden[row * h_..(row + 1) * h_];
        out.iter_mut().for_each(|z| *z = 0.0);
        for (h, xh) in x.iter().enumerate() {
            L::axpy(out, xh.to_f64(), &self.lm_head[h * v_..(h + 1) * v_]);
        }
        if let Some(m) = magnitude {
            m.iter_mut().for_each(|m| *m = 0.0);
            // sqrt(H) sum_h |x_h w_hv|: an f32 accumulation over H terms.
            for (h, xh) in x.iter().enumerate() {
                L::abs_axpy(m, xh.to_f64(), &self.lm_head[h * v_..(h + 1) * v_]);
            }
            let growth = (h_ as f64).sqrt();
            for (m, z) in m.iter_mut().zip(out.iter()) {
                *m = *m * growth + z.abs();
            }
        }
    }
}

impl<'a, L: Real> FusedProblem<'a, L> {
    pub fn token_inputs(&self) -> TokenInputs<'a> {
        TokenInputs {
            tokens: self.tokens,
            mask: self.mask,
            advantages: self.advantages,
            old_logp: self.old_logp,
            ref_logp: self.ref_logp,
        }
    }

    /// Validates everything and runs the forward pass.
    pub fn forward(&self) -> Result<Forward<'_>, InputError> {
        let (s, h_) = (self.shape, self.hidden_dim);
        if h_ == 0 {
            return Err(input_error!("hidden size H = 0: it must be >= 1"));
        }
        if self.hidden.len() != s.rows() * h_ {
            return Err(input_error!(
                "hidden has {} elements, expected B*T*H = {}*{}*{h_} = {}",
                self.hidden.len(),
                s.batch,
                s.time,
                s.rows() * h_
            ));
        }
        if self.lm_head.len() != h_ * s.vocab {
            return Err(input_error!(
                "lm_head has {} elements, expected H*V = {h_}*{} = {} (the Flax layout [H, V])",
                self.lm_head.len(),
                s.vocab,
                h_ * s.vocab
            ));
        }
        for (name, arr, dims) in [("hidden", self.hidden, [s.time * h_, h_]), ("lm_head", self.lm_head, [s.vocab, 1])] {
            if let Some((i, z)) = arr.iter().enumerate().find(|(_, z)| !z.to_f64().is_finite()) {
                return Err(input_error!("{name} element {i} (of {:?} strides) = {} is not finite", dims, z.to_f64()));
            }
        }
        Forward::new(self, self.token_inputs(), self.config, self.hparams)
    }

    /// cotangent * (d loss / d hidden [B*T*H], d loss / d lm_head [H*V]).
    pub fn grads(&self, fwd: &Forward<'_>, cotangent: f64) -> (Vec<f64>, Vec<f64>) {
        let (h_, v_, rows) = (self.hidden_dim, self.shape.vocab, self.shape.rows());
        let mut d_hidden = vec![0.0; rows * h_];
        let threads = rayon::current_num_threads().max(1);
        let per = rows.div_ceil(threads).max(1);
        let partial: Vec<Vec<f64>> = d_hidden
            .par_chunks_mut(per * h_)
            .enumerate()
            .map(|(chunk, dh)| {
                let mut d_lm_head = vec![0.0; h_ * v_];
                let mut g = vec![0.0; v_];
                for (k, dh_row) in dh.chunks_mut(h_).enumerate() {
                    let row = chunk * per + k;
                    fwd.grad_row(row, cotangent, None, &mut g);
                    self.backprop_row(row, &g, dh_row, &mut d_lm_head);
                }
                d_lm_head
            })
            .collect();
        let mut d_lm_head = vec![0.0; h_ * v_];
        for p in partial {
            d_lm_head.iter_mut().zip(p).for_each(|(a, b)| *a += b);
        }
        (d_hidden, d_lm_head)
    }

    /// For one row's logits gradient g: writes lm_head @ g into `d_hidden_row`
    /// and adds hidden_row^T g into `d_lm_head`.
    pub fn backprop_row(&self, row: usize, g: &[f64], d_hidden_row: &mut [f64], d_lm_head: &mut [f64]) {
        let (h_, v_) = (self.hidden_dim, self.shape.vocab);
        let x = &self.hidden[row * h_..(row + 1) * h_];
        for h in 0..h_ {
            let w = &self.lm_head[h * v_..(h + 1) * v_];
            d_hidden_row[h] = w.iter().zip(g).map(|(w, g)| w.to_f64() * g).sum();
            let xh = x[h].to_f64();
            if xh != 0.0 {
                for (d, g) in d_lm_head[h * v_..(h + 1) * v_].iter_mut().zip(g) {
                    *d += xh * g;
                }
            }
        }
    }
}
