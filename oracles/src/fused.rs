//! The fused kind: logits = hidden @ lm_head (Flax layout, lm_head [H, V]),
//! formed in f64 from the already rounded inputs, then the logits-kind math.
//!
//! Everything that touches all of lm_head is a blocked matrix product
//! (`gemm.rs`) over token blocks and vocabulary chunks, so the oracle runs
//! at the machine's GEMM rate and never holds more than a token block x
//! vocabulary (the forward) or a token block x chunk (the sweep) of logits:
//!
//! - the forward ([`LogitRows::row_stats`]): Z = X W and the rounding
//!   magnitudes M = |X| |W| (f64, as everything: a row's scale can exceed f32's range) for a
//!   block of rows, then each row's softmax statistics;
//! - the sweep ([`FusedProblem::sweep`]): per vocabulary chunk c, Z_c = X W_c
//!   again, the logits gradient G_c, then d hidden += G_c W_c^T and the
//!   chunk's d lm_head_c = X^T G_c, handed to the caller and dropped; with
//!   the magnitudes the tolerance rule needs and the directions in which a
//!   kink token's coefficient moves its gradient.
//!
//! The products of f32 or bf16 inputs are exact in f64 and each sum of H
//! (or V, or B*T) of them is off by at most a few f64 ulps of the sum of
//! their magnitudes, as the row-by-row form was.

use std::ops::Range;

use rayon::prelude::*;

use crate::config::{Config, Hparams};
use crate::error::{input_error, InputError};
use crate::gemm::{matmul, Layout};
use crate::forward::Forward;
use crate::problem::{LogitRows, Real, RowStats, Shape, TokenInputs};
use crate::conventions::RoundingAllowances;
use crate::vector::{self, GradRow};

/// Vocabulary columns per chunk: lm_head's chunk in f64 is H x 4096 (50 MB
/// at H = 1536), and 151936 = 37 x 4096 + 384 leaves a short last chunk,
/// which the tests exercise too.
pub const VOCAB_CHUNK: usize = 4096;
/// Token rows per block of the sweep (GEMM-friendly; memory is per chunk).
const SWEEP_ROWS: usize = 512;
/// What the forward's block of full rows may hold: its logits in f64 and
/// magnitudes in f32, 12 bytes per element (512 rows at V = 151936: 0.93 GB;
/// smaller blocks make smaller, slower products, and widen lm_head once
/// more per block).
const FORWARD_BLOCK_BYTES: usize = 1 << 30;

/// The fused kind's inputs (docs/spec.md, "Shapes and inputs"): logits =
/// hidden @ lm_head, never stored whole.
pub struct FusedProblem<'a, L: Real> {
    /// B, T, V.
    pub shape: Shape,
    /// H, the hidden size (>= 1).
    pub hidden_dim: usize,
    /// [B, T, H].
    pub hidden: &'a [L],
    /// [H, V].
    pub lm_head: &'a [L],
    /// tokens, mask, advantages, old / ref log-probs, rollout-correction weights.
    pub per_token: TokenInputs<'a>,
    /// The static switches.
    pub config: Config,
    /// The runtime hyperparameters, as the f32 values an implementation receives.
    pub hparams: Hparams,
}

/// The floor under p in the rounding magnitudes: f32's unit roundoff u holds
/// for normal numbers only; below 2^-126 a value is off by up to 2^-126
/// absolute (XLA:CPU flushes subnormals to zero), the eta of the standard
/// model fl(x op y) = (x op y)(1 + delta) + eta. As a magnitude that is
/// 2^-126 / u = 2^-102, times 2^7 for what the entropy term multiplies an
/// underflowed p by (|log p| + H <= 88 + log V, against the O(1) factor
/// the row scale assumes). Without it, a d lm_head column whose every p
/// underflows is judged against an exact scale near 1e-30 and an f32 kernel
/// that flushes is a false alarm (found on the correct chunked base of the
/// mutant catalog: B=2 T=4 V=911 H=53, tau = 0.1, all logits at -30000 +- 10).
pub const UNDERFLOW_P: f64 = 1.0 / (1u128 << 95) as f64;

/// What a logits-gradient element's rounding scale is proportional to, at
/// softmax probability p: p, plus p |log p| when the entropy bonus is on
/// (the entropy gradient p (log p + H) carries log p, whose f32 error
/// scales with it; for small p that is tens of times p: at p = 1e-20 a
/// correct online-softmax kernel's d lm_head was 37 u of a scale without
/// it), plus the underflow floor.
pub fn rounding_weight(p: f64, entropy: bool) -> f64 {
    let entropy_term = if entropy && p > 0.0 { -p * p.ln() } else { 0.0 };
    p + entropy_term + UNDERFLOW_P
}

/// The rounding magnitudes the sweep accumulates beside the gradients (the
/// tolerance rule's scales; docs/tolerance.md): with e_iv = row_scale_i *
/// (rounding_weight(p_iv) + [v = y_i]),
///   s_hidden[i, h]  = sum_v |W_hv| (e_iv + g_weight_hidden |g_iv|)
///   s_lm_head[h, v] = sum_i |x_ih| (e_iv + g_weight_lm_head |g_iv|)
pub struct Magnitudes<'r> {
    /// Per swept row.
    pub row_scale: &'r [f64],
    /// What |g_iv| is weighted by in s_hidden: the error growth of a
    /// length-V sum (the harness passes sqrt(V)).
    pub g_weight_hidden: f64,
    /// ... and in s_lm_head: of a sum over the swept rows (sqrt(rows)).
    pub g_weight_lm_head: f64,
}

/// What to sweep: rows (indices into B*T) with their ppo coefficients.
pub struct Sweep<'r> {
    /// Row indices b * T + t into B*T, the live tokens to sweep.
    pub rows: &'r [usize],
    /// d ppo / d logp of each swept row.
    pub ppo_coef: &'r [f64],
    /// Positions in `rows` whose direction cot * w * (onehot - p) / tau (the
    /// move of the row's logits gradient per unit of its ppo coefficient) is
    /// wanted: its chunks go to the caller, lm_head @ it comes back.
    pub directions: &'r [usize],
    /// Accumulate the rounding magnitudes s_hidden, s_lm_head too (None: not wanted).
    pub magnitudes: Option<Magnitudes<'r>>,
    /// Compute d lm_head (and its magnitudes) chunk by chunk.
    pub lm_head: bool,
    /// Declared conventions' allowances ([`RoundingAllowances`]): their
    /// per-element allowance carried through |lm_head| and |hidden| like
    /// the magnitudes (None: not wanted).
    pub rounding: Option<&'r RoundingAllowances>,
}

/// One vocabulary chunk of the sweep, complete.
pub struct SweepChunk<'s> {
    /// Its vocabulary columns [start, end), C = end - start of them.
    pub cols: Range<usize>,
    /// [H, C]: sum over swept rows of x_i g_i[cols].
    pub d_lm_head: &'s [f64],
    /// [H, C] (empty without magnitudes or d lm_head).
    pub s_lm_head: &'s [f64],
    /// [directions, C]: each wanted direction's columns.
    pub directions: &'s [f64],
    /// [H, C]: the conventions' allowance of each d lm_head element (empty
    /// without `rounding` or d lm_head).
    pub a_lm_head: &'s [f64],
}

/// What the sweep accumulates over the whole vocabulary.
pub struct SweepResult {
    /// [rows, H]: lm_head @ g_i.
    pub d_hidden: Vec<f64>,
    /// [rows, H] (empty without magnitudes).
    pub s_hidden: Vec<f64>,
    /// [directions, H]: lm_head @ direction.
    pub along_hidden: Vec<f64>,
    /// [rows, H]: the conventions' allowance of each d hidden element
    /// (empty without `rounding`).
    pub a_hidden: Vec<f64>,
}

impl<L: Real> LogitRows for FusedProblem<'_, L> {
    fn shape(&self) -> Shape {
        self.shape
    }

    /// One row, as [`LogitRows::row_stats`] would form it (for callers that
    /// want a few rows; the forward and the sweep work in blocks).
    fn logit_row(&self, row: usize, out: &mut [f64], magnitude: Option<&mut [f64]>) {
        let (h_, v_) = (self.hidden_dim, self.shape.vocab);
        let x = &self.hidden[row * h_..(row + 1) * h_];
        out.iter_mut().for_each(|z| *z = 0.0);
        for (h, xh) in x.iter().enumerate() {
            L::axpy(out, xh.to_f64(), &self.lm_head[h * v_..(h + 1) * v_]);
        }
        if let Some(m) = magnitude {
            m.iter_mut().for_each(|m| *m = 0.0);
            for (h, xh) in x.iter().enumerate() {
                L::abs_axpy(m, xh.to_f64(), &self.lm_head[h * v_..(h + 1) * v_]);
            }
            finish_magnitudes(m, out, h_);
        }
    }

    fn abs_product_row(&self, row: usize, out: &mut [f64]) {
        let (h_, v_) = (self.hidden_dim, self.shape.vocab);
        out.iter_mut().for_each(|m| *m = 0.0);
        for (h, xh) in self.hidden[row * h_..(row + 1) * h_].iter().enumerate() {
            L::abs_axpy(out, xh.to_f64(), &self.lm_head[h * v_..(h + 1) * v_]);
        }
    }

    fn row_stats(&self, rows: &[usize], chosen: &[usize], divisor: f64) -> Vec<RowStats> {
        let (h_, v_) = (self.hidden_dim, self.shape.vocab);
        let block = (FORWARD_BLOCK_BYTES / (12 * v_)).clamp(8, 512).min(rows.len().max(1));
        let mut z = vec![0.0f64; block * v_];
        // The rounding magnitudes sum |x_h w_hv| in f32 (their operands are
        // bf16 or f32, exact in it; a scale needs no more than f32's
        // precision) at twice the f64 rate; a block whose sums overflow
        // f32's range is summed again in f64 (`m`).
        let mut m32 = vec![0.0f32; block * v_];
        let mut m: Vec<f64> = Vec::new();
        let mut stats = Vec::with_capacity(rows.len());
        let (mut w, mut w_abs, mut w_abs32) = (Vec::new(), Vec::new(), Vec::new());
        for (block_rows, block_chosen) in rows.chunks(block).zip(chosen.chunks(block)) {
            let nb = block_rows.len();
            let (x, x_abs) = self.hidden_block(block_rows);
            let x_abs32: Vec<f32> = x_abs.iter().map(|&a| a as f32).collect();
            for cols in vocab_chunks(v_) {
                let c = cols.len();
                self.lm_head_chunk_abs32(cols.clone(), &mut w, &mut w_abs32);
                let out = Layout::row_major(nb, c, v_, cols.start);
                matmul(&mut z, out, &x, Layout::dense(nb, h_), &w, Layout::dense(h_, c), false);
                matmul(&mut m32, out, &x_abs32, Layout::dense(nb, h_), &w_abs32, Layout::dense(h_, c), false);
            }
            let in_range = m32[..nb * v_].par_iter().all(|s| s.is_finite());
            if !in_range {
                reset(&mut m, block * v_);
                for cols in vocab_chunks(v_) {
                    let c = cols.len();
                    self.lm_head_chunk(cols.clone(), &mut w, &mut w_abs);
                    matmul(&mut m, Layout::row_major(nb, c, v_, cols.start), &x_abs, Layout::dense(nb, h_), &w_abs, Layout::dense(h_, c), false);
                }
            }
            let (m32, m) = (&m32[..nb * v_], &m);
            stats.par_extend(z[..nb * v_].par_chunks_mut(v_).zip(block_chosen).enumerate().map_init(
                || vec![0.0f64; v_],
                |mag, (i, (z, &y))| {
                    if in_range {
                        for (mv, &sum) in mag.iter_mut().zip(&m32[i * v_..(i + 1) * v_]) {
                            *mv = sum as f64;
                        }
                    } else {
                        mag.copy_from_slice(&m[i * v_..(i + 1) * v_]);
                    }
                    finish_magnitudes(mag, z, h_);
                    RowStats::of_row(z, mag, y, divisor)
                },
            ));
        }
        stats
    }
}

/// m_v = sqrt(H) sum_h |x_h w_hv| + |z_v| from the sum: the size of the
/// terms an f32 accumulation over H forms z_v from (its rounding grows
/// like sqrt(H) of them), plus z_v's own.
fn finish_magnitudes(m: &mut [f64], z: &[f64], hidden_dim: usize) {
    let growth = (hidden_dim as f64).sqrt();
    for (m, z) in m.iter_mut().zip(z) {
        *m = *m * growth + z.abs();
    }
}

/// `buffer` as `len` zeros, its allocation kept.
fn reset<T: Copy + Default>(buffer: &mut Vec<T>, len: usize) {
    buffer.clear();
    buffer.resize(len, T::default());
}

/// `buffer` as `rows` rows of `width`, or `rows` Nones when it is empty.
fn optional_rows(buffer: &mut [f64], width: usize, rows: usize) -> Vec<Option<&mut [f64]>> {
    if buffer.is_empty() {
        (0..rows).map(|_| None).collect()
    } else {
        buffer.chunks_mut(width).map(Some).collect()
    }
}

/// [0, V) in chunks of [`VOCAB_CHUNK`] columns.
pub fn vocab_chunks(vocab: usize) -> impl Iterator<Item = Range<usize>> {
    (0..vocab).step_by(VOCAB_CHUNK).map(move |start| start..(start + VOCAB_CHUNK).min(vocab))
}

impl<'a, L: Real> FusedProblem<'a, L> {
    /// Its per-token inputs (tokens, mask, advantages, old / ref log-probs, weights).
    pub fn token_inputs(&self) -> TokenInputs<'a> {
        self.per_token
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
        let first_bad = |arr: &[L]| arr.par_iter().position_first(|z| !z.to_f64().is_finite());
        if let Some(i) = first_bad(self.hidden) {
            let (b, t, h) = (i / (s.time * h_), (i / h_) % s.time, i % h_);
            return Err(input_error!("hidden[{b}, {t}, {h}] = {} is not finite", self.hidden[i].to_f64()));
        }
        if let Some(i) = first_bad(self.lm_head) {
            let (h, v) = (i / s.vocab, i % s.vocab);
            return Err(input_error!("lm_head[{h}, {v}] = {} is not finite", self.lm_head[i].to_f64()));
        }
        Forward::new(self, self.token_inputs(), self.config, self.hparams)
    }

    /// Rows `rows` of hidden as a dense [rows, H] f64 block, and their magnitudes.
    fn hidden_block(&self, rows: &[usize]) -> (Vec<f64>, Vec<f64>) {
        let h_ = self.hidden_dim;
        let mut x = vec![0.0f64; rows.len() * h_];
        let mut x_abs = vec![0.0f64; rows.len() * h_];
        for ((xr, ar), &i) in x.chunks_mut(h_).zip(x_abs.chunks_mut(h_)).zip(rows) {
            L::widen(&self.hidden[i * h_..(i + 1) * h_], xr);
            for (a, &v) in ar.iter_mut().zip(xr.iter()) {
                *a = v.abs();
            }
        }
        (x, x_abs)
    }

    /// lm_head[:, cols] as a dense [H, C] f64 block into `w`, and its
    /// magnitudes into `w_abs` (both reused across chunks: fresh
    /// pages cost more than the conversion).
    fn lm_head_chunk(&self, cols: Range<usize>, w: &mut Vec<f64>, w_abs: &mut Vec<f64>) {
        self.lm_head_chunk_with(cols, w, w_abs, f64::abs);
    }

    /// [`Self::lm_head_chunk`] with the magnitudes in f32 (exact: lm_head
    /// is bf16 or f32), for the forward's f32 magnitude products.
    fn lm_head_chunk_abs32(&self, cols: Range<usize>, w: &mut Vec<f64>, w_abs: &mut Vec<f32>) {
        self.lm_head_chunk_with(cols, w, w_abs, |v| v.abs() as f32);
    }

    fn lm_head_chunk_with<A: Copy + Default + Send>(&self, cols: Range<usize>, w: &mut Vec<f64>, w_abs: &mut Vec<A>, abs: impl Fn(f64) -> A + Sync) {
        let (h_, v_, c) = (self.hidden_dim, self.shape.vocab, cols.len());
        w.resize(h_ * c, 0.0);
        w_abs.resize(h_ * c, A::default());
        w.par_chunks_mut(c).zip(w_abs.par_chunks_mut(c)).enumerate().for_each(|(h, (wr, ar))| {
            L::widen(&self.lm_head[h * v_ + cols.start..h * v_ + cols.end], wr);
            for (a, &v) in ar.iter_mut().zip(wr.iter()) {
                *a = abs(v);
            }
        });
    }

    /// The logits z = hidden @ lm_head of rows `rows`, [rows, V] into `out`.
    pub fn logit_block(&self, rows: &[usize], out: &mut [f64]) {
        let (h_, v_, nb) = (self.hidden_dim, self.shape.vocab, rows.len());
        assert_eq!(out.len(), nb * v_, "logit block length");
        let (x, _) = self.hidden_block(rows);
        let (mut w, mut w_abs) = (Vec::new(), Vec::new());
        for cols in vocab_chunks(v_) {
            self.lm_head_chunk(cols.clone(), &mut w, &mut w_abs);
            matmul(out, Layout::row_major(nb, cols.len(), v_, cols.start), &x, Layout::dense(nb, h_), &w, Layout::dense(h_, cols.len()), false);
        }
    }

    /// Sweeps the logits gradient of `sweep.rows` over the vocabulary:
    /// `on_chunk` sees each chunk's d lm_head (when asked) as soon as it is
    /// complete; d hidden and the rest come back at the end. The gradient
    /// of row i is [`Forward::grad_row`]'s with `sweep.ppo_coef[i]`, times
    /// `cotangent`.
    pub fn sweep(&self, fwd: &Forward<'_>, cotangent: f64, sweep: &Sweep<'_>, mut on_chunk: impl FnMut(SweepChunk<'_>)) -> SweepResult {
        let (h_, v_, n) = (self.hidden_dim, self.shape.vocab, sweep.rows.len());
        let n_dir = sweep.directions.len();
        let mags = sweep.magnitudes.as_ref();
        let mut d_hidden = vec![0.0f64; n * h_];
        let mut s_hidden = vec![0.0f64; if mags.is_some() { n * h_ } else { 0 }];
        let mut along_hidden = vec![0.0f64; n_dir * h_];
        let rounding = sweep.rounding;
        let mut a_hidden = vec![0.0f64; if rounding.is_some() { n * h_ } else { 0 }];
        if n == 0 {
            return SweepResult { d_hidden, s_hidden, along_hidden, a_hidden };
        }
        let constants: Vec<Option<GradRow>> =
            sweep.rows.iter().zip(sweep.ppo_coef).map(|(&i, &c)| fwd.grad_constants(i, cotangent, Some(c))).collect();
        let tau = fwd.hparams.temperature;
        let entropy = fwd.config.entropy_bonus && fwd.hparams.entropy_coef != 0.0;
        let transform = fwd.logit_transform();
        // Where each swept row's direction goes (usize::MAX: none wanted).
        let mut direction_slot = vec![usize::MAX; n];
        for (slot, &k) in sweep.directions.iter().enumerate() {
            direction_slot[k] = slot;
        }
        let blocks: Vec<(Range<usize>, Vec<f64>, Vec<f64>)> = (0..n)
            .step_by(SWEEP_ROWS)
            .map(|start| {
                let r = start..(start + SWEEP_ROWS).min(n);
                let (x, x_abs) = self.hidden_block(&sweep.rows[r.clone()]);
                (r, x, x_abs)
            })
            .collect();
        let with_lm_head_mags = sweep.lm_head && mags.is_some();
        // Buffers reused across chunks and blocks (fresh pages cost more than the work).
        let (mut w, mut w_abs) = (Vec::new(), Vec::new());
        let (mut d_lm_head, mut s_lm_head, mut directions) = (Vec::new(), Vec::new(), Vec::new());
        let (mut g, mut e_hidden, mut e_lm_head) = (Vec::new(), Vec::new(), Vec::new());
        // The conventions' allowances: per element for d hidden and d
        // lm_head, the chunk's d lm_head allowance, and |X| |W| (TF32).
        let (mut r_hidden, mut r_lm_head, mut a_lm_head, mut products) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let with_products = rounding.is_some_and(RoundingAllowances::needs_products);
        for cols in vocab_chunks(v_) {
            let c = cols.len();
            self.lm_head_chunk(cols.clone(), &mut w, &mut w_abs);
            reset(&mut d_lm_head, if sweep.lm_head { h_ * c } else { 0 });
            reset(&mut s_lm_head, if with_lm_head_mags { h_ * c } else { 0 });
            reset(&mut directions, n_dir * c);
            reset(&mut a_lm_head, if rounding.is_some() && sweep.lm_head { h_ * c } else { 0 });
            for (rows, x, x_abs) in &blocks {
                let nb = rows.len();
                // G (in place of Z), and the magnitudes' E (hidden) and E' (lm_head).
                g.resize(nb * c, 0.0);
                matmul(&mut g, Layout::dense(nb, c), x, Layout::dense(nb, h_), &w, Layout::dense(h_, c), false);
                e_hidden.resize(if mags.is_some() { nb * c } else { 0 }, 0.0);
                e_lm_head.resize(if with_lm_head_mags { nb * c } else { 0 }, 0.0);
                r_hidden.resize(if rounding.is_some() { nb * c } else { 0 }, 0.0);
                r_lm_head.resize(if rounding.is_some() { nb * c } else { 0 }, 0.0);
                products.resize(if with_products { nb * c } else { 0 }, 0.0);
                if with_products {
                    matmul(&mut products, Layout::dense(nb, c), x_abs, Layout::dense(nb, h_), &w_abs, Layout::dense(h_, c), false);
                }
                let mut e_hidden_rows = optional_rows(&mut e_hidden, c, nb);
                let mut e_lm_head_rows = optional_rows(&mut e_lm_head, c, nb);
                let mut r_rows: Vec<Option<(&mut [f64], &mut [f64])>> = match rounding {
                    Some(_) => r_hidden.chunks_mut(c).zip(r_lm_head.chunks_mut(c)).map(Some).collect(),
                    None => (0..nb).map(|_| None).collect(),
                };
                let block_directions: Vec<(usize, Vec<f64>)> = g
                    .par_chunks_mut(c)
                    .zip(e_hidden_rows.par_iter_mut())
                    .zip(e_lm_head_rows.par_iter_mut())
                    .zip(r_rows.par_iter_mut())
                    .enumerate()
                    .filter_map(|(k, (((g, e_h), e_w), r_row))| {
                        let row = rows.start + k;
                        let Some(kc) = constants[row] else {
                            g.iter_mut().for_each(|v| *v = 0.0);
                            for e_row in [e_h, e_w] {
                                if let Some(e_row) = e_row.as_deref_mut() {
                                    e_row.iter_mut().for_each(|v| *v = 0.0);
                                }
                            }
                            if let Some((a, b)) = r_row.as_mut() {
                                a.iter_mut().chain(b.iter_mut()).for_each(|v| *v = 0.0);
                            }
                            return None;
                        };
                        // The raw logits, for the conventions' allowances.
                        let z_raw = rounding.map(|_| g.to_vec());
                        let st = &fwd.tokens[sweep.rows[row]];
                        let y = st.chosen.checked_sub(cols.start).filter(|&y| y < c);
                        let slot = direction_slot[row];
                        // With a logit transform: g holds z'' from here on, and
                        // the raw z is kept for dz''/dz.
                        let raw = transform.map(|t| {
                            let raw = g.to_vec();
                            g.iter_mut().for_each(|z| *z = t.apply(*z));
                            raw
                        });
                        let chain = |v: &mut [f64]| {
                            if let (Some(t), Some(raw)) = (transform, raw.as_ref()) {
                                for (x, &z) in v.iter_mut().zip(raw) {
                                    *x *= t.derivative(z);
                                }
                            }
                        };
                        // p (when wanted) from a copy of z, then g in place.
                        let p = (mags.is_some() || slot != usize::MAX).then(|| {
                            let mut p = g.to_vec();
                            vector::grad_pass(&mut p, &GradRow { scale: 1.0, c_logp: -1.0, c_ent: 0.0, ..kc });
                            p
                        });
                        vector::grad_pass(g, &kc);
                        if let Some(y) = y {
                            g[y] += kc.scale * kc.c_logp;
                        }
                        chain(g);
                        if let (Some(allowances), Some((a_h, a_w)), Some(z)) = (rounding, r_row.as_mut(), z_raw.as_ref()) {
                            let product = |v: usize| if with_products { products[k * c + v] } else { 0.0 };
                            for (v, (&zv, &gv)) in z.iter().zip(g.iter()).enumerate() {
                                (a_h[v], a_w[v]) = allowances.fused_element(fwd, sweep.rows[row], cols.start + v, zv, product(v), Some(v) == y, gv, &kc);
                            }
                        }
                        if let (Some(m), Some(p)) = (mags, p.as_ref()) {
                            // dz''/dz is at most the logit scale.
                            let s = m.row_scale[row] * fwd.transform_gain();
                            for (e_rows, weight) in [(e_h, m.g_weight_hidden), (e_w, m.g_weight_lm_head)] {
                                if let Some(e_row) = e_rows.as_deref_mut() {
                                    for ((ev, &pv), &gv) in e_row.iter_mut().zip(p).zip(g.iter()) {
                                        *ev = s * rounding_weight(pv, entropy) + weight * gv.abs();
                                    }
                                    if let Some(y) = y {
                                        e_row[y] += s;
                                    }
                                }
                            }
                        }
                        (slot != usize::MAX).then(|| {
                            let k = cotangent * st.weight / tau;
                            let mut d: Vec<f64> = p.expect("p is formed for direction rows").iter().map(|&pv| -k * pv).collect();
                            if let Some(y) = y {
                                d[y] += k;
                            }
                            chain(&mut d);
                            (slot, d)
                        })
                    })
                    .collect();
                let out_rows = Layout::row_major(nb, h_, h_, rows.start * h_);
                matmul(&mut d_hidden, out_rows, &g, Layout::dense(nb, c), &w, Layout::dense(h_, c).t(), true);
                if mags.is_some() {
                    matmul(&mut s_hidden, out_rows, &e_hidden, Layout::dense(nb, c), &w_abs, Layout::dense(h_, c).t(), true);
                }
                if rounding.is_some() {
                    matmul(&mut a_hidden, out_rows, &r_hidden, Layout::dense(nb, c), &w_abs, Layout::dense(h_, c).t(), true);
                    if sweep.lm_head {
                        matmul(&mut a_lm_head, Layout::dense(h_, c), x_abs, Layout::dense(nb, h_).t(), &r_lm_head, Layout::dense(nb, c), true);
                    }
                }
                if sweep.lm_head {
                    matmul(&mut d_lm_head, Layout::dense(h_, c), x, Layout::dense(nb, h_).t(), &g, Layout::dense(nb, c), true);
                    if with_lm_head_mags {
                        matmul(&mut s_lm_head, Layout::dense(h_, c), x_abs, Layout::dense(nb, h_).t(), &e_lm_head, Layout::dense(nb, c), true);
                    }
                }
                for (slot, d) in block_directions {
                    directions[slot * c..(slot + 1) * c].copy_from_slice(&d);
                }
            }
            if n_dir > 0 {
                matmul(&mut along_hidden, Layout::dense(n_dir, h_), &directions, Layout::dense(n_dir, c), &w, Layout::dense(h_, c).t(), true);
            }
            on_chunk(SweepChunk { cols, d_lm_head: &d_lm_head, s_lm_head: &s_lm_head, directions: &directions, a_lm_head: &a_lm_head });
        }
        SweepResult { d_hidden, s_hidden, along_hidden, a_hidden }
    }

    /// cotangent * (d loss / d hidden [B*T*H], d loss / d lm_head [H*V]) at
    /// each token's midpoint coefficient.
    pub fn grads(&self, fwd: &Forward<'_>, cotangent: f64) -> (Vec<f64>, Vec<f64>) {
        let (h_, v_) = (self.hidden_dim, self.shape.vocab);
        let rows: Vec<usize> = (0..self.shape.rows()).filter(|&i| !fwd.tokens[i].masked).collect();
        let coef: Vec<f64> = rows.iter().map(|&i| fwd.tokens[i].policy_interval.midpoint()).collect();
        let mut d_lm_head = vec![0.0; h_ * v_];
        let sweep = Sweep { rows: &rows, ppo_coef: &coef, directions: &[], magnitudes: None, lm_head: true, rounding: None };
        let result = self.sweep(fwd, cotangent, &sweep, |chunk| {
            let c = chunk.cols.len();
            for h in 0..h_ {
                d_lm_head[h * v_ + chunk.cols.start..h * v_ + chunk.cols.end].copy_from_slice(&chunk.d_lm_head[h * c..(h + 1) * c]);
            }
        });
        let mut d_hidden = vec![0.0; self.shape.rows() * h_];
        for (k, &i) in rows.iter().enumerate() {
            d_hidden[i * h_..(i + 1) * h_].copy_from_slice(&result.d_hidden[k * h_..(k + 1) * h_]);
        }
        (d_hidden, d_lm_head)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Config, Hparams, Shape, TokenInputs};

    /// The forward's rounding magnitudes, summed in f32, are the f64 sums
    /// rounded once; a row whose sums pass f32's range is summed again in
    /// f64 (in f32 they are inf, and a scale of inf passes anything).
    #[test]
    fn magnitudes_in_f32_fall_back_to_f64_past_its_range() {
        let (h_, v_) = (3usize, 5usize);
        for (big, name) in [(1.0f32, "in range"), (1e20f32, "past f32's range")] {
            let hidden: Vec<f32> = vec![0.5 * big, -1.25 * big, 2.0 * big, 0.75, -0.5, 1.5];
            let lm_head: Vec<f32> = (0..h_ * v_).map(|i| (i as f32 - 7.0) * 0.375 * big).collect();
            let (tokens, mask, advantages) = (vec![1i32, 4], vec![1.0f32, 1.0], vec![1.0f32]);
            let problem = FusedProblem {
                shape: Shape { batch: 1, time: 2, vocab: v_ },
                hidden_dim: h_,
                hidden: &hidden,
                lm_head: &lm_head,
                per_token: TokenInputs { tokens: &tokens, mask: &mask, advantages: &advantages, old_logp: None, ref_logp: None, is_weights: None },
                config: Config { on_policy: true, ..Config::default() },
                hparams: Hparams::default(),
            };
            let stats = problem.row_stats(&[0, 1], &[1, 4], 1.0);
            for (row, st) in stats.iter().enumerate() {
                let y = [1, 4][row];
                let x = &hidden[row * h_..(row + 1) * h_];
                let z: f64 = (0..h_).map(|h| x[h] as f64 * lm_head[h * v_ + y] as f64).sum();
                let sum: f64 = (0..h_).map(|h| (x[h] as f64 * lm_head[h * v_ + y] as f64).abs()).sum();
                let exact = sum * (h_ as f64).sqrt() + z.abs();
                let rel = (st.mag_chosen - exact).abs() / exact;
                assert!(st.mag_chosen.is_finite() && rel < 1e-6, "{name}, row {row}: magnitude {} against {exact}", st.mag_chosen);
            }
        }
    }
}
