//! What each declared convention allows, element by element: the rounding
//! model of a case ([`Rounding`], from its declarations and [`CaseFacts`])
//! carried through the forward pass to every compared quantity
//! ([`RoundingAllowances`]).

use rayon::prelude::*;

use super::{AccumulatedGradient, Convention, BF16_UNIT, F32_EXP_MAX, TF32_UNIT};
use crate::config::{Config, TemperatureMode};
use crate::forward::Forward;
use crate::objective::KinkInterval;
use crate::vector::GradRow;

/// What the case is, as far as the conventions care.
#[derive(Clone, Copy, Debug)]
pub struct CaseFacts {
    /// The float inputs are bf16 (the bf16 conventions apply only then).
    pub bf16: bool,
    /// The fused kind (hidden @ lm_head is formed by the implementation).
    pub fused: bool,
    /// B, sequences.
    pub batch: usize,
    /// T, tokens per sequence.
    pub time: usize,
    /// V, vocabulary columns: the length of a log-softmax row and of d
    /// hidden's sum over columns.
    pub vocab: usize,
    /// Rows holding a valid token: the others add exact zeros to d lm_head.
    pub live_rows: usize,
    /// The gradients come back in bf16: the rounding of a sum held in one
    /// chunk is their output rounding, which the rule already exempts.
    pub bf16_gradients: bool,
}

/// f32's unit roundoff.
const F32_UNIT: f64 = 1.0 / 16_777_216.0;

/// (1 + u)^n - 1: n successive roundings, each by at most u of its result.
fn roundings(u: f64, n: u32) -> f64 {
    (1.0 + u).powi(n as i32) - 1.0
}

/// What a set of declared conventions does to one case: relative
/// perturbations of the softmax's argument and of the logits gradient
/// (all zero when none applies, e.g. bf16 conventions on f32 inputs).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Rounding {
    /// Each x_v moves by at most x_rel |x_v| (stored bf16 stages and, in
    /// logits mode, the temperature's rounding).
    pub x_rel: f64,
    /// ... plus product_rel times sum_h |hidden_h lm_head_hv| (TF32), in x's units.
    pub product_rel: f64,
    /// |tau / bf16(tau) - 1| (`bf16_temperature`), else 0.
    pub temperature_rel: f64,
    /// logp mode: log_softmax(z'')_y / bf16(tau) moves logp by this much of itself.
    pub logp_rel: f64,
    /// `bf16_softmax`: the row length V (its log-sum-exp's log is at most ln V).
    pub softmax: Option<usize>,
    /// The logits gradient moves by at most this much of its parts' size
    /// (bf16 d logits, the softmax's bf16 backward, 1/tau rounded).
    pub grad_rel: f64,
    /// d hidden's products (TF32, bf16 accumulation) move by at most this
    /// much per unit of sum_v |g_v| |lm_head_hv|.
    pub hidden_rel: f64,
    /// d lm_head's, per unit of sum_i |x_ih| |g_iv|.
    pub lm_head_rel: f64,
    /// The bf16 stages of x that lie at or before a softcap (its derivative
    /// is evaluated on the rounded value).
    pub raw_rel: f64,
    /// `online_lse`: the chunk's columns, where the case spans two chunks or
    /// more (with one there is no recurrence to differentiate).
    pub online_columns: Option<usize>,
    /// ... and how far the cancelling terms at a running max's column may
    /// be off, per unit of their size: f32 roundings of the recurrence (4
    /// per chunk, and 8 more for the sums' own).
    pub online_rel: f64,
}

impl Rounding {
    /// The model of `conventions` on a case with these facts and switches.
    pub fn of(conventions: &[Convention], facts: CaseFacts, config: &Config, temperature: f64) -> Rounding {
        let has = |c: Convention| conventions.contains(&c);
        let mut r = Rounding::default();
        let logits_mode = config.temperature_mode == TemperatureMode::Logits;
        if facts.bf16 {
            let stages_of = |logits: bool| {
                conventions.iter().find_map(|c| match *c {
                    Convention::Bf16Logits { stages } if logits => Some(stages),
                    Convention::Bf16GradLogits { stages } if !logits => Some(stages),
                    _ => None,
                })
            };
            if has(Convention::Bf16Temperature) {
                let rounded = half::bf16::from_f64(temperature).to_f64();
                r.temperature_rel = (temperature / rounded - 1.0).abs();
            }
            let stored = roundings(BF16_UNIT, stages_of(true).unwrap_or(0));
            // A stage before a softcap moves its derivative too.
            r.raw_rel = stored;
            r.x_rel = if logits_mode { (1.0 + stored) * (1.0 + r.temperature_rel) - 1.0 } else { stored };
            if !logits_mode {
                // log_softmax(z'') / tau: the temperature's rounding moves the log-prob itself.
                r.logp_rel = r.temperature_rel;
            }
            r.softmax = has(Convention::Bf16Softmax).then_some(facts.vocab);
            // 1/tau rounded, and the declared bf16 stages of d logits.
            r.grad_rel = (1.0 + r.temperature_rel) * (1.0 + roundings(BF16_UNIT, stages_of(false).unwrap_or(0))) - 1.0;
            for c in conventions {
                if let Convention::Bf16Accumulation { gradient, chunk } = *c {
                    // Each chunk's share rounded (1), then each of the K adds
                    // (K). Only the chunk boundaries the case's shape spans:
                    // a sum held in one chunk is rounded once, on output (none
                    // beyond the rule's own half ulp for a bf16 gradient).
                    if !facts.fused {
                        continue;
                    }
                    let adds = |n: usize| match n.div_ceil(chunk) {
                        0 | 1 if facts.bf16_gradients => 0.0,
                        0 | 1 => roundings(BF16_UNIT, 1),
                        k => roundings(BF16_UNIT, k as u32 + 1),
                    };
                    match gradient {
                        AccumulatedGradient::HiddenOverColumns => r.hidden_rel += adds(facts.vocab),
                        AccumulatedGradient::LmHeadOverSequences => r.lm_head_rel += adds(facts.live_rows),
                        AccumulatedGradient::LmHeadOverTokens => r.lm_head_rel += adds(facts.batch * facts.time),
                    }
                }
            }
        } else if facts.fused && has(Convention::Tf32Matmul) {
            // Both operands rounded to TF32: each product moves by 2 units of itself.
            r.product_rel = 2.0 * TF32_UNIT / if logits_mode { temperature } else { 1.0 };
            r.hidden_rel = 2.0 * TF32_UNIT;
            r.lm_head_rel = 2.0 * TF32_UNIT;
        }
        for c in conventions {
            if let Convention::OnlineLse { columns } = *c {
                let chunks = facts.vocab.div_ceil(columns);
                if chunks >= 2 {
                    r.online_columns = Some(columns);
                    r.online_rel = roundings(F32_UNIT, 4 * chunks as u32 + 8);
                }
            }
        }
        r
    }

    /// Does anything move at all?
    pub fn is_none(&self) -> bool {
        *self == Rounding::default()
    }

    /// How far x_v may move: its stored roundings and its products'.
    fn x_move(&self, x: f64, product: f64) -> f64 {
        self.x_rel * x.abs() + self.product_rel * product
    }

    /// A bound on ln s~, the log of a bf16 log-softmax's sum of
    /// exponentials on its argument x~ (a bf16 tensor within a_v of x):
    /// s~ <= s e^{2 a_max} (ln s = lse - max x) and s~ <= V. None: no bf16 softmax.
    fn softmax_sum_log(&self, ln_s: f64, a_max: f64) -> Option<f64> {
        self.softmax.map(|vocab| (ln_s + 2.0 * a_max).min((vocab as f64).ln()).max(0.0))
    }

    /// The row's part of a bf16 log-softmax's move of log p_v
    /// (docs/conventions.md, "What the oracle allows"), from L =
    /// [`Rounding::softmax_sum_log`]: rounding s~ to bf16 moves its log by
    /// at most -ln(1 - u), and by no more than ln s~ (1 is representable:
    /// nothing at V = 1); the log's rounding by u of itself; the
    /// log-sum-exp m + log's by u of itself, and by no more than the log
    /// (m, the largest element of a bf16 tensor, is representable).
    fn log_softmax_row(&self, ln_s: f64, lse: f64, a_max: f64) -> f64 {
        let Some(l) = self.softmax_sum_log(ln_s, a_max) else { return 0.0 };
        let u = BF16_UNIT;
        let sum = (-(1.0 - u).ln()).min(l);
        let log = u * (l + sum);
        let lse_rounding = (u * (lse.abs() + a_max + 2.0 * (l + sum))).min((l + sum) * (1.0 + u));
        sum + log + lse_rounding
    }

    /// How far log p_v may move beyond x_v's own: the row's part
    /// (`row`, [`Rounding::log_softmax_row`]) and the output's rounding, u
    /// of the computed log-prob (within `moved` + `row` of log p_v).
    fn log_softmax_move(&self, row: f64, log_p: f64, moved: f64) -> f64 {
        match self.softmax {
            Some(_) => row + BF16_UNIT * (log_p.abs() + moved + row),
            None => 0.0,
        }
    }
}

/// One token's allowances under a [`Rounding`].
#[derive(Clone, Copy, Debug, Default)]
pub struct TokenRounding {
    /// |logp_impl - logp| at most.
    pub logp: f64,
    /// |entropy_impl - entropy| at most, in nats.
    pub entropy: f64,
    /// |per_token_loss_impl - per_token_loss| at most: the policy and KL
    /// terms' steepest slope over `window` times it, plus entropy_coef times
    /// the entropy's allowance; +inf where an f32 ratio or KL exponent may
    /// overflow.
    pub per_token_loss: f64,
    /// ln sum_v p_v e^{a_v}: the most the log-sum-exp can rise.
    pub lse_rise: f64,
    /// A bf16 log-softmax's row part ([`Rounding::log_softmax_row`]).
    pub softmax_row: f64,
    /// ln sum_v exp(x_v - max x): how far the log-sum-exp lies above the max.
    pub ln_sum: f64,
    /// How far the token's kink variable (its log ratio, or the row's mean
    /// at the sequence levels) and d = ref - logp may move.
    pub window: f64,
    /// The largest |d loss / d logp| per unit weight within the window
    /// (policy and KL): what multiplies a moved softmax in the gradient.
    pub coef_max: f64,
    /// How far the coefficient itself can move smoothly within the window.
    pub coef_drift: f64,
}

/// Every token's allowances and the loss's, for one case and one set of
/// conventions.
#[derive(Clone, Debug, Default)]
pub struct RoundingAllowances {
    /// The rounding model they carry through.
    pub rounding: Rounding,
    /// One per token, row b * T + t (B*T of them); zero at masked tokens.
    pub tokens: Vec<TokenRounding>,
    /// |loss_impl - loss| at most: each token's per_token_loss allowance
    /// times its aggregation weight, summed; +inf when any token's is.
    pub loss: f64,
    /// `online_lse`: each token's columns that were (or tied, within
    /// rounding) its running max after some chunk, sorted; empty otherwise.
    pub records: Vec<Vec<u32>>,
}

impl RoundingAllowances {
    /// The allowance of the gradient element at row i, column v, in the
    /// softmax's argument x (before any chain to raw logits), from the
    /// element's x, log p and product magnitude (chained to z''), and the
    /// row's gradient constants `k` (see [`crate::vector`]'s grad pass):
    /// (what the moved softmax and coefficient give, what the relative
    /// roundings of the backward give, and the size of the element's parts).
    fn element_in_x(&self, fwd: &Forward<'_>, i: usize, x: f64, product: f64, onehot: bool, k: &GradRow) -> (f64, f64, f64) {
        let t = &self.tokens[i];
        let st = &fwd.tokens[i];
        let r = &self.rounding;
        let log_p = x - st.softmax.lse;
        let p = log_p.exp();
        let moved = r.x_move(x, product) + t.lse_rise;
        let s = moved + r.log_softmax_move(t.softmax_row, log_p, moved);
        let moved_p = (p * s.exp_m1()).min(1.0);
        let tau = fwd.hparams.temperature;
        let w = k.scale.abs();
        let onehot_minus_p = (if onehot { 1.0 } else { 0.0 }) - p;
        let (h, c_ent) = (st.entropy, k.c_ent.abs());
        // c~ (onehot - p~) - c (onehot - p) = c~ (p - p~) + (c~ - c)(onehot - p):
        // the moved softmax at the moved coefficient, and the move at the exact one.
        // The entropy's part p (log p + H) moves by
        // (p~ - p)(log p~ + H~) + p (log p~ - log p + H~ - H).
        let through_p = w
            * ((t.coef_max + t.coef_drift) / tau * moved_p
                + t.coef_drift / tau * onehot_minus_p.abs()
                + c_ent * (moved_p * ((log_p + h).abs() + s + t.entropy) + p * (s + t.entropy)));
        let logp_part = w * t.coef_max / tau * onehot_minus_p.abs();
        let entropy_part = w * c_ent * p * (log_p + h).abs();
        // A bf16 softmax's backward: the log-prob's cotangent cast and summed
        // in bf16 and its backward's output (3 roundings); the entropy's
        // cotangent, its products, softmax and log-sum-exp backward and
        // their bf16 sum (8).
        let softmax = if r.softmax.is_some() { roundings(BF16_UNIT, 3) * logp_part + roundings(BF16_UNIT, 8) * entropy_part } else { 0.0 };
        let parts = logp_part + entropy_part;
        (through_p, (parts + through_p) * r.grad_rel + softmax, parts)
    }

    /// `online_lse` at a column that was token i's running max: the terms
    /// that reach it through the max cancel in exact arithmetic (logp's
    /// -x_max, each rescale exp(m_old - m_new), each chunk's exp(x - m),
    /// and the entropy's sums), each about the row's coefficient times 1
    /// (policy and KL, over tau) or the entropy's terms in size; f32 leaves
    /// `online_rel` of them. 0 elsewhere.
    fn online_at_running_max(&self, fwd: &Forward<'_>, i: usize, column: usize, k: &GradRow) -> f64 {
        let on_record = self.records.get(i).is_some_and(|r| r.binary_search(&(column as u32)).is_ok());
        if !on_record {
            return 0.0;
        }
        let (t, st) = (&self.tokens[i], &fwd.tokens[i]);
        let terms = (t.coef_max + t.coef_drift) / fwd.hparams.temperature + k.c_ent.abs() * (2.0 + 3.0 * st.entropy + 2.0 * t.ln_sum);
        self.rounding.online_rel * k.scale.abs() * terms
    }

    /// The allowance of the element of the raw logits' gradient whose raw
    /// logit is `z` and product magnitude `product` (sum_h |hidden_h
    /// lm_head_hv|; 0 for stored logits): through a logit transform, with
    /// the gradient's own relative roundings.
    fn element(&self, fwd: &Forward<'_>, i: usize, column: usize, z: f64, product: f64, onehot: bool, k: &GradRow) -> f64 {
        let (x, gain, gain_rel) = match fwd.logit_transform() {
            Some(t) => (t.apply(z) * k.inv_tau, t.derivative(z).abs(), softcap_derivative_rel(t.scale, t.softcap, z, self.rounding.raw_rel)),
            None => (z * k.inv_tau, 1.0, 0.0),
        };
        let (through_p, rounded, parts) = self.element_in_x(fwd, i, x, product * gain, onehot, k);
        gain * (through_p + rounded + gain_rel * (parts + through_p + rounded)) + gain * self.online_at_running_max(fwd, i, column, k)
    }

    /// Writes row i's allowance per element of the logits gradient (the
    /// raw logits') into `out`: what the logits kind compares.
    pub fn grad_row(&self, fwd: &Forward<'_>, i: usize, cotangent: f64, out: &mut [f64]) {
        out.iter_mut().for_each(|a| *a = 0.0);
        let Some(k) = fwd.grad_constants(i, cotangent, None) else { return };
        let mut z = vec![0.0; out.len()];
        let mut product = vec![0.0; out.len()];
        let products = (self.rounding.product_rel != 0.0).then_some(&mut product[..]);
        fwd.raw_logit_row(i, &mut z, products);
        let chosen = fwd.tokens[i].chosen;
        for (v, a) in out.iter_mut().enumerate() {
            *a = self.element(fwd, i, v, z[v], product[v], v == chosen, &k);
        }
    }

    /// The fused sweep's allowance of one logits-gradient element (row i,
    /// raw logit `z`, product magnitude `product`, exact gradient `g`,
    /// the row's constants `k`): (for d hidden, for d lm_head), before the
    /// products with |lm_head| and |hidden|.
    #[allow(clippy::too_many_arguments)]
    pub fn fused_element(&self, fwd: &Forward<'_>, i: usize, column: usize, z: f64, product: f64, onehot: bool, g: f64, k: &GradRow) -> (f64, f64) {
        let own = self.element(fwd, i, column, z, product, onehot, k);
        let size = g.abs() + own;
        (own + self.rounding.hidden_rel * size, own + self.rounding.lm_head_rel * size)
    }

    /// Does the fused sweep need product magnitudes (TF32)?
    pub fn needs_products(&self) -> bool {
        self.rounding.product_rel != 0.0
    }
}

/// The relative move of a softcap's derivative s sech^2(s z / c) when z
/// moves by `raw_rel` of itself: 2 tanh(u) |u| raw_rel, u = s z / c.
fn softcap_derivative_rel(scale: f64, softcap: f64, z: f64, raw_rel: f64) -> f64 {
    if !softcap.is_finite() || raw_rel == 0.0 {
        return 0.0;
    }
    let u = (scale * z / softcap).abs();
    2.0 * u.tanh() * u * raw_rel
}

/// The columns that are a row's running max after some chunk of `columns`
/// (or tie it within rounding: 1e-5 of the row's largest |x|), sorted: where
/// autodiff of an online log-sum-exp sends the gradient through its max.
fn running_maxima(x: &[f64], columns: usize) -> Vec<u32> {
    let tie = 1e-5 * (1.0 + x.iter().fold(0.0f64, |m, v| m.max(v.abs())));
    let mut running = f64::NEG_INFINITY;
    let mut records = Vec::new();
    for (k, chunk) in x.chunks(columns).enumerate() {
        let chunk_max = chunk.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if chunk_max >= running - tie {
            running = running.max(chunk_max);
            let start = k * columns;
            records.extend(chunk.iter().enumerate().filter(|&(_, &v)| v >= running - tie).map(|(j, _)| (start + j) as u32));
        }
    }
    records
}

impl Forward<'_> {
    /// Can token i's ratio or KL exponent overflow f32 when its logp moves
    /// by `window` (after the log-ratio clamps)?
    fn may_overflow_f32(&self, i: usize, window: f64) -> bool {
        let st = &self.tokens[i];
        let h = &self.hparams;
        // On-policy the ratio is exp(logp - sg(logp)) = 1 whatever logp is.
        let ratio_exponent = if self.config.on_policy { 0.0 } else { (st.log_ratio + window).min(h.log_ratio_max) };
        let kl_exponent = if h.effective_beta(&self.config) != 0.0 { (st.kl_d + window).min(h.kl_log_ratio_clamp) } else { 0.0 };
        ratio_exponent > F32_EXP_MAX || kl_exponent > F32_EXP_MAX
    }

    /// Every token's and the loss's allowance under `rounding`. `slack[i]`
    /// is the window the tolerance already admits around token i's kink
    /// variable (its rounding distance); the convention's window is added.
    pub fn rounding_allowances(&self, rounding: Rounding, slack: &[f64]) -> RoundingAllowances {
        let n = self.tokens.len();
        if rounding.is_none() {
            return RoundingAllowances { rounding, tokens: vec![TokenRounding::default(); n], loss: 0.0, records: Vec::new() };
        }
        let tau = self.hparams.temperature;
        let logp_mode = self.config.temperature_mode == TemperatureMode::Logp;
        let v_ = self.shape.vocab;
        // Pass 1, per row: logp's and the entropy's allowances.
        let (mut tokens, records): (Vec<TokenRounding>, Vec<Vec<u32>>) = (0..n)
            .into_par_iter()
            .map_init(
                || (vec![0.0; v_], vec![0.0; v_], vec![0.0; v_]),
                |(x, raw, product), i| {
                    let st = &self.tokens[i];
                    if st.masked {
                        return (TokenRounding::default(), Vec::new());
                    }
                    let products = (rounding.product_rel != 0.0).then_some(&mut product[..]);
                    self.raw_logit_row(i, raw, products);
                    self.softmax_argument(raw, x, product);
                    let lse = st.softmax.lse;
                    let a: Vec<f64> = x.iter().zip(product.iter()).map(|(&xv, &pv)| rounding.x_move(xv, pv)).collect();
                    // ln sum_v p_v e^{a_v}, around the largest a.
                    let a_max = a.iter().copied().fold(0.0, f64::max);
                    let lse_rise = a_max + x.iter().zip(&a).map(|(&xv, &av)| (xv - lse + av - a_max).exp()).sum::<f64>().ln();
                    let lse_rise = lse_rise.clamp(0.0, a_max);
                    let ln_s = lse - x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let softmax_row = rounding.log_softmax_row(ln_s, lse, a_max);
                    let records = rounding.online_columns.map_or_else(Vec::new, |columns| running_maxima(x, columns));
                    // H~ - H = -sum_v (p~_v - p_v)(log p_v + H) - KL(p~ || p), and
                    // KL(p~ || p) <= sum_v (p~_v - p_v)^2 / p_v <= sum_v p_v (e^{s_v} - 1)^2,
                    // and <= max_v s_v (a log ratio p~_v / p_v bounds it): the
                    // entropy does not move with a shift of every x_v.
                    let (mut through_p, mut chi2, mut s_max, mut x_size) = (0.0, 0.0, 0.0f64, 0.0);
                    for (&xv, &av) in x.iter().zip(&a) {
                        let log_p = xv - lse;
                        let p = log_p.exp();
                        let moved = av + lse_rise;
                        let s = moved + rounding.log_softmax_move(softmax_row, log_p, moved);
                        through_p += (p * s.exp_m1()).min(1.0) * (log_p + st.entropy).abs();
                        chi2 += p * s.exp_m1().powi(2);
                        s_max = s_max.max(s);
                        x_size += p * xv.abs();
                    }
                    let mut entropy = through_p + chi2.min(s_max);
                    if let Some(l) = rounding.softmax_sum_log(ln_s, a_max) {
                        // Its own formula's roundings, every intermediate in bf16:
                        // lse - sum p x (a log-sum-exp chain, p, p x, the sum, the
                        // difference), or -sum p log p.
                        let lse_chain = 2.0 + l + lse.abs() + st.softmax.max_abs_x + x_size;
                        entropy += BF16_UNIT * (lse_chain + 3.0 * x_size + 3.0 * st.entropy);
                    }
                    let y = st.chosen;
                    let chosen = a[y] + lse_rise + rounding.log_softmax_move(softmax_row, x[y] - lse, a[y] + lse_rise);
                    let logp = if logp_mode {
                        chosen / tau * (1.0 + rounding.logp_rel) + rounding.logp_rel * st.logp.abs()
                    } else {
                        chosen
                    };
                    (TokenRounding { logp, entropy, lse_rise, softmax_row, ln_sum: ln_s, ..TokenRounding::default() }, records)
                },
            )
            .unzip();
        // The kink variable's window: the token's logp move, or at the
        // sequence levels the row's mean move (L_b is a mean).
        let t_ = self.shape.time;
        let row_window: Vec<f64> = (0..self.shape.batch)
            .map(|b| {
                let live: Vec<f64> = (b * t_..(b + 1) * t_).filter(|&i| !self.tokens[i].masked).map(|i| tokens[i].logp).collect();
                live.iter().sum::<f64>() / (live.len().max(1) as f64)
            })
            .collect();
        let sequence = self.config.ratio_level != crate::config::RatioLevel::Token;
        let entropy_coef = self.hparams.effective_entropy_coef(&self.config);
        let mut loss = 0.0;
        for (i, t) in tokens.iter_mut().enumerate() {
            let st = &self.tokens[i];
            if st.masked {
                continue;
            }
            let kink_move = if sequence { row_window[i / t_] } else { t.logp };
            t.window = kink_move.max(t.logp);
            if self.may_overflow_f32(i, t.window) {
                // The conventions move logp far enough that an f32 ratio or
                // KL exponent overflows (bf16 logits at an offset of -30000
                // are off by hundreds of nats): every quantity past the ratio
                // is unconstrained, the loss and d lm_head (a sum over every
                // row) with it.
                (t.per_token_loss, t.coef_max, t.coef_drift) = (f64::INFINITY, f64::INFINITY, f64::INFINITY);
                loss = f64::INFINITY;
                continue;
            }
            let widened = slack[i] + t.window;
            let iv: KinkInterval = self.coefficient_interval(i, st.log_ratio, widened);
            let (sensitivity, _) = self.coefficient_sensitivity(i, widened);
            t.coef_max = iv.max_abs() + st.kl_coef.abs();
            t.coef_drift = sensitivity * t.window;
            let value_slope = self.value_slope_bound(i, st.log_ratio, widened) + t.coef_drift + self.value_slope_excess(i, widened);
            t.per_token_loss = value_slope * t.window + entropy_coef * t.entropy;
            loss += st.weight * t.per_token_loss;
            if self.config.entropy_aggregation != crate::config::EntropyAggregation::Same {
                // loss = aggregate(policy + kl) - entropy_coef * token_mean(ent).
                loss += (st.weight + st.entropy_weight) * entropy_coef * t.entropy;
            }
        }
        RoundingAllowances { rounding, tokens, loss, records }
    }
}
