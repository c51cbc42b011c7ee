//! SPEC v2's metamorphic identities: each switch against what it reduces
//! to (one token per row, k2, verl's dual clip, unit weights, a far
//! softcap, ...), and a fully masked batch.

use crate::common;
use super::helpers::*;
use super::v2::*;


use std::sync::atomic::{AtomicU32, Ordering};

use grpo_oracle::{
    Aggregation, EntropyAggregation, Forward, KlEstimator, KlGradient, PolicyLoss, RatioLevel,
    TemperatureMode,
};
use grpo_verify::case::strategy::case_spec;
use grpo_verify::case::{CaseSpec, MaskPattern};
use libtest_mimic::{Failed, Trial};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
/// Keeps exactly one valid token per row (mask Full first, so every
/// position holds a real token).
pub(super) fn one_token_per_row(spec: &CaseSpec, v2: &V2) -> Owned {
    let mut spec = spec.clone();
    spec.mask = MaskPattern::Full;
    let mut a = Owned::new(&spec, v2);
    let t_ = a.case.shape.time;
    for (b, row) in a.case.mask.chunks_mut(t_).enumerate() {
        let keep = (b * 5 + spec.seed as usize % 7) % t_;
        row.iter_mut().enumerate().for_each(|(t, m)| *m = if t == keep { 1.0 } else { 0.0 });
    }
    a
}

/// ratio_level sequence (and sequence_token) equals token, loss and
/// gradient, when every row has exactly one valid token: L_b is then that
/// token's log-ratio, and s_b's coupling is the token itself.
pub(super) fn sequence_is_token_with_one_token_per_row(spec: &CaseSpec, v2: &V2) -> Outcome {
    let mut token = one_token_per_row(spec, v2);
    token.case.config.ratio_level = RatioLevel::Token;
    let want = token.outputs()?;
    for level in [RatioLevel::Sequence, RatioLevel::SequenceToken] {
        let mut other = token.clone();
        other.case.config.ratio_level = level;
        same_outputs(&want, &other.outputs()?, 1e-12, &format!("{level:?} vs Token"))?;
    }
    Ok(true)
}

/// sequence_token has the loss value (and per-token losses and ratios) of
/// sequence.
pub(super) fn sequence_token_has_the_value_of_sequence(spec: &CaseSpec, v2: &V2) -> Outcome {
    let mut seq = Owned::new(spec, v2);
    seq.case.config.ratio_level = RatioLevel::Sequence;
    let mut st = seq.clone();
    st.case.config.ratio_level = RatioLevel::SequenceToken;
    let (a, b) = (seq.outputs()?, st.outputs()?);
    close(a.loss, b.loss, 1e-14, a.loss_scale, "loss")?;
    for (i, (x, y)) in a.per_token.iter().zip(&b.per_token).enumerate() {
        close(*x, *y, 1e-14, a.loss_scale, &format!("per_token_loss[{i}]"))?;
    }
    let ratios = |o: &Owned| o.with(|f| f.tokens.iter().map(|t| if t.masked { 0.0 } else { t.ratio }).collect::<Vec<_>>());
    for (i, (x, y)) in ratios(&seq)?.iter().zip(&ratios(&st)?).enumerate() {
        close(*x, *y, 1e-14, 0.0, &format!("ratio[{i}]"))?;
    }
    Ok(true)
}

/// kl_gradient k2 (straight-through): the loss value of the chosen
/// estimator, the gradient of kl_estimator k2, each against a separate
/// forward. With kl_times_ratio, kl_t r_t's gradient is r_t dk2 + kX dr_t,
/// so row by row (r_t the row's ratio):
///   g(X, st, times) = g(X, own, times) + r_t (g(k2, own) - g(X, own)),
/// the last two without the ratio factor (policy and entropy parts cancel).
pub(super) fn straight_through_is_k2_gradient(spec: &CaseSpec, v2: &V2) -> Outcome {
    let mut spec = spec.clone();
    spec.config.kl = true;
    let mut st = Owned::new(&spec, v2);
    st.case.config.kl_gradient = KlGradient::K2;
    let with = |estimator: KlEstimator, gradient: KlGradient, times: bool| {
        let mut o = st.clone();
        o.case.config.kl_estimator = estimator;
        o.case.config.kl_gradient = gradient;
        o.case.config.kl_times_ratio = times;
        o.outputs()
    };
    let (x, times) = (st.case.config.kl_estimator, st.case.config.kl_times_ratio);
    let a = st.outputs()?;
    let own = with(x, KlGradient::Own, times)?;
    close(a.loss, own.loss, 1e-14, a.loss_scale, "loss vs the estimator's own")?;
    for (i, (p, q)) in a.per_token.iter().zip(&own.per_token).enumerate() {
        close(*p, *q, 1e-14, a.loss_scale, &format!("per_token_loss[{i}]"))?;
    }
    let k2 = with(KlEstimator::K2, KlGradient::Own, false)?;
    if !times {
        for (i, (p, q)) in a.grad.iter().zip(&k2.grad).enumerate() {
            close(*p, *q, 1e-12, a.natural.max(k2.natural), &format!("grad element {i} vs kl_estimator k2"))?;
        }
        return Ok(true);
    }
    let plain = with(x, KlGradient::Own, false)?;
    let ratios = st.with(|f| f.tokens.iter().map(|t| if t.masked { 0.0 } else { t.ratio }).collect::<Vec<_>>())?;
    let v_ = st.case.shape.vocab;
    for (row, &r) in ratios.iter().enumerate() {
        let scale = a.natural.max(own.natural) + r * k2.natural.max(plain.natural);
        for i in row * v_..(row + 1) * v_ {
            let want = own.grad[i] + r * (k2.grad[i] - plain.grad[i]);
            close(a.grad[i], want, 1e-11, scale, &format!("grad element {i} (row {row}, r = {r:e})"))?;
        }
    }
    Ok(true)
}

/// verl's dual-clip policy loss (core_algos.compute_policy_loss), verbatim.
pub(super) fn verl_dual_clip(r: f64, a: f64, eps_low: f64, eps_high: f64, c: f64) -> f64 {
    let pg_losses1 = -a * r;
    let pg_losses2 = -a * r.max(1.0 - eps_low).min(1.0 + eps_high);
    let clip_pg_losses1 = pg_losses1.max(pg_losses2);
    let pg_losses3 = -a * c;
    let clip_pg_losses2 = pg_losses3.min(clip_pg_losses1);
    if a < 0.0 {
        clip_pg_losses2
    } else {
        clip_pg_losses1
    }
}

/// ppo with two_sided and delta = c is verl's dual-clip (with its token
/// log-ratio clamp [-20, 20]): per-token losses on every row (for A < 0 the
/// dual clip binds; for A >= 0 delta never does), and each token's
/// coefficient is the derivative of verl's formula in x = log r (a central
/// difference of the scalar formula) where x is off its edges.
pub(super) fn two_sided_is_verl_dual_clip(spec: &CaseSpec, v2: &V2) -> Outcome {
    let mut spec = spec.clone();
    spec.config.kl = false;
    spec.config.entropy_bonus = false;
    spec.config.two_sided = true;
    let mut v2 = v2.clone();
    v2.policy_loss = PolicyLoss::Ppo;
    v2.force_kl = false;
    v2.ratio_level = RatioLevel::Token;
    v2.weights = Weights::Absent;
    v2.log_ratio_min = -20.0;
    v2.log_ratio_max = 20.0;
    let a = Owned::new(&spec, &v2);
    let h = a.case.hparams;
    let c = h.delta;
    let (el, eh) = (h.eps_low, h.eps_high);
    let verl = |x: f64, adv: f64| verl_dual_clip(x.clamp(-20.0, 20.0).exp(), adv, el, eh, c);
    a.with(|f| {
        let mut negative = false;
        for (i, t) in f.tokens.iter().enumerate().filter(|(_, t)| !t.masked) {
            let want = verl(t.log_ratio, t.advantage);
            let scale = t.advantage.abs() * (1.0 + t.ratio.min(c));
            close(t.per_token_loss, want, 1e-13, scale, &format!("per-token loss {i} (A = {}, r = {:e})", t.advantage, t.ratio))?;
            negative |= t.advantage < 0.0;
            let x = t.log_ratio;
            let edges = [(1.0 - el).ln(), (1.0 + eh).ln(), c.ln(), -20.0, 20.0];
            if edges.iter().all(|&e| !((x - e).abs() < 1e-4)) {
                let dx = 1e-7;
                let slope = (verl(x + dx, t.advantage) - verl(x - dx, t.advantage)) / (2.0 * dx);
                if !t.policy_interval.is_point() {
                    return Err(TestCaseError::fail(format!("token {i} off the edges has interval {:?}", t.policy_interval)));
                }
                close(t.policy_interval.lo, slope, 1e-6, scale, &format!("d loss / d logp at token {i}"))?;
            }
        }
        Ok(negative)
    })?
}

/// is_weights all 1 ([B, T] or [B, 1]) equals no weights.
pub(super) fn unit_weights_are_no_weights(spec: &CaseSpec, v2: &V2) -> Outcome {
    let mut none = Owned::new(spec, v2);
    none.set_weights(Weights::Absent, 0);
    let want = none.outputs()?;
    for w in [Weights::PerToken(WeightValues::Ones), Weights::PerRow(WeightValues::Ones)] {
        let mut ones = none.clone();
        ones.set_weights(w, 0);
        same_outputs(&want, &ones.outputs()?, 1e-14, &format!("{w:?} vs none"))?;
    }
    Ok(true)
}

/// In logits mode, logit_scale s with temperature tau is scale 1 with
/// temperature tau / s: softmax(s z / tau) either way, so loss, logp and
/// entropy agree, and so does d/dz (the chain rule's s from the scale is
/// the 1/(tau/s) = s/tau of the other: the factor between them is 1).
pub(super) fn logit_scale_is_a_temperature(spec: &CaseSpec, v2: &V2) -> Outcome {
    let mut spec = spec.clone();
    spec.config.temperature_mode = TemperatureMode::Logits;
    let mut v2 = v2.clone();
    v2.logit_transform = true;
    v2.logit_softcap = INF;
    if v2.logit_scale == 1.0 {
        v2.logit_scale = 2.5;
    }
    let scaled = Owned::new(&spec, &v2);
    let s = v2.logit_scale;
    let mut plain = scaled.clone();
    plain.case.config.logit_transform = false;
    plain.case.hparams.temperature = scaled.case.hparams.temperature / s;
    let (a, b) = (scaled.outputs()?, plain.outputs()?);
    // s z / tau and z / (tau / s) differ by roundings of x: relative ones of
    // up to 3e5 (logits 3e4 at tau = 0.1), which move p (and the gradient) by
    // a few eps |x| relative.
    let max_x = scaled.logits.iter().fold(0.0f64, |m, z| m.max((s * z).abs())) / scaled.case.hparams.temperature;
    let rel = 1e-12 + 16.0 * f64::EPSILON * max_x;
    if kinked(&scaled, 1e-9)? || kinked(&plain, 1e-9)? {
        same_values(&a, &b, rel, "scale s, tau vs scale 1, tau / s")?;
    } else {
        same_outputs(&a, &b, rel, "scale s, tau vs scale 1, tau / s")?;
    }
    let stats = |o: &Owned| o.with(|f| f.tokens.iter().filter(|t| !t.masked).map(|t| (t.logp, t.entropy, t.softmax.lse.abs() + t.x_chosen.abs())).collect::<Vec<_>>());
    for ((lp_a, ent_a, size), (lp_b, ent_b, _)) in stats(&scaled)?.into_iter().zip(stats(&plain)?) {
        close(lp_a, lp_b, 1e-12, 1.0 + size, "logp")?;
        close(ent_a, ent_b, 1e-10, 1.0 + size, "entropy")?;
    }
    Ok(true)
}

/// A softcap far above every scaled logit changes nothing, to 1e-9
/// relative: c tanh(z / c) = z (1 - (z/c)^2 / 3 + ...) moves the softmax's
/// argument x = z / tau by |x| (z/c)^2 / 3, and logits up to 3e4 at tau =
/// 0.1 make |x| 3e5: c = 1e6 max|z| sqrt(max(1, max|x|)) keeps that move
/// below 1e-12 absolute, and the slope sech^2 within 1e-12 of 1.
pub(super) fn far_softcap_changes_nothing(spec: &CaseSpec, v2: &V2) -> Outcome {
    let mut v2 = v2.clone();
    v2.logit_transform = true;
    v2.logit_softcap = INF;
    let off = Owned::new(spec, &v2);
    let max_z = off.logits.iter().fold(0.0f64, |m, z| m.max((v2.logit_scale * z).abs())).max(1.0);
    let max_x = max_z / off.case.hparams.temperature;
    let mut capped = off.clone();
    capped.case.hparams.logit_softcap = 1e6 * max_z * max_x.max(1.0).sqrt();
    let (a, b) = (off.outputs()?, capped.outputs()?);
    if kinked(&off, 1e-9)? || kinked(&capped, 1e-9)? {
        same_values(&a, &b, 1e-9, "far softcap vs none")?;
        return Ok(false);
    }
    same_outputs(&a, &b, 1e-9, "far softcap vs none")?;
    Ok(true)
}

/// log_ratio_min/max that bind nowhere (finite, beyond every kink
/// variable) equal the ±inf defaults; a clamp that binds everywhere makes
/// the ratio the constant exp(edge): the policy term then has no gradient
/// (the gradient is that of the same case with every advantage 0, which
/// keeps the KL and entropy, and the KL's ratio factor) and its value is
/// is_t * policy(exp(edge)) by the SPEC's formula. CISPO draws use SAPO
/// here (its gradient does not go through r; see `cispo_coefficient`).
pub(super) fn log_ratio_clamps(spec: &CaseSpec, v2: &V2) -> Outcome {
    let mut v2 = v2.clone();
    v2.log_ratio_min = -INF;
    v2.log_ratio_max = INF;
    if v2.policy_loss == PolicyLoss::Cispo {
        v2.policy_loss = PolicyLoss::Sapo;
    }
    let free = Owned::new(spec, &v2);
    let xs = free.with(|f| f.tokens.iter().filter(|t| !t.masked).map(|t| t.log_ratio).collect::<Vec<_>>())?;
    let (min_x, max_x) = xs.iter().fold((0.0f64, 0.0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
    let want = free.outputs()?;
    let mut wide = free.clone();
    wide.case.hparams.log_ratio_min = min_x - 1.5;
    wide.case.hparams.log_ratio_max = max_x + 0.5;
    same_outputs(&want, &wide.outputs()?, 1e-14, "a clamp beyond every log-ratio vs none")?;
    // Binding everywhere: above every x or below it, by the seed.
    let mut bound = free.clone();
    let (lo, hi) = if spec.seed % 2 == 0 { (max_x + 0.5, max_x + 1.0) } else { (min_x - 1.0, min_x - 0.5) };
    bound.case.hparams.log_ratio_min = lo;
    bound.case.hparams.log_ratio_max = hi;
    let edge = if spec.seed % 2 == 0 { lo } else { hi };
    let mut no_advantage = bound.clone();
    no_advantage.case.advantages.iter_mut().for_each(|a| *a = 0.0);
    let (b, z) = (bound.outputs()?, no_advantage.outputs()?);
    let scale = b.natural.max(z.natural);
    for (i, (x, y)) in b.grad.iter().zip(&z.grad).enumerate() {
        close(*x, *y, 1e-13, scale, &format!("grad element {i}: binding clamp vs A = 0"))?;
    }
    let h = bound.case.hparams;
    let r = edge.exp();
    let per_token = bound.with(|f| f.tokens.iter().map(|t| (t.masked, t.ratio, t.is_weight, t.advantage)).collect::<Vec<_>>())?;
    for (i, &(masked, ratio, is_weight, adv)) in per_token.iter().enumerate().filter(|(_, t)| !t.0) {
        let _ = masked;
        close(ratio, r, 1e-15, 0.0, &format!("ratio of token {i}"))?;
        let policy = match v2.policy_loss {
            PolicyLoss::Sapo => {
                let k = if adv > 0.0 { h.sapo_tau_pos } else { h.sapo_tau_neg };
                -(4.0 / k) * adv / (1.0 + (-k * (r - 1.0)).exp())
            }
            _ => {
                let delta = if bound.case.config.two_sided { h.delta } else { INF };
                -(r.min(delta) * adv).min(clip(r, h.eps_low, h.eps_high) * adv)
            }
        };
        let got = b.per_token[i] - z.per_token[i];
        close(got, is_weight * policy, 1e-12, b.loss_scale, &format!("policy term of token {i} at r = exp(edge)"))?;
    }
    Ok(true)
}

/// seq_mean_token_mean_over_constant with normalizer = B equals
/// seq_mean_token_mean.
pub(super) fn over_constant_b_is_seq_mean(spec: &CaseSpec, v2: &V2) -> Outcome {
    let mut a = Owned::new(spec, v2);
    a.case.config.aggregation = Aggregation::SeqMeanTokenMean;
    let mut b = a.clone();
    b.case.config.aggregation = Aggregation::SeqMeanTokenMeanOverConstant;
    b.case.hparams.normalizer = a.case.shape.batch as f64;
    same_outputs(&a.outputs()?, &b.outputs()?, 1e-13, "over constant B vs seq_mean_token_mean")?;
    Ok(true)
}

/// entropy_aggregation token_mean equals same when the aggregation is token_mean.
pub(super) fn entropy_token_mean_is_same_under_token_mean(spec: &CaseSpec, v2: &V2) -> Outcome {
    let mut spec = spec.clone();
    spec.config.entropy_bonus = true;
    let mut a = Owned::new(&spec, v2);
    a.case.config.aggregation = Aggregation::TokenMean;
    a.case.config.entropy_aggregation = EntropyAggregation::Same;
    let mut b = a.clone();
    b.case.config.entropy_aggregation = EntropyAggregation::TokenMean;
    same_outputs(&a.outputs()?, &b.outputs()?, 1e-13, "entropy token_mean vs same")?;
    Ok(true)
}

/// CISPO's coefficient d loss_t / d logp_t is -is_t clip(r_t) A per token
/// (r_t recomputed here from logp and old_logp, per ratio level and clamp),
/// and the gradient row is cot w_t times it times d logp / d logits.
pub(super) fn cispo_coefficient(spec: &CaseSpec, v2: &V2) -> Outcome {
    let mut spec = spec.clone();
    spec.config.kl = false;
    spec.config.entropy_bonus = false;
    let mut v2 = v2.clone();
    v2.policy_loss = PolicyLoss::Cispo;
    v2.force_kl = false;
    let a = Owned::new(&spec, &v2);
    let (t_, v_) = (a.case.shape.time, a.case.shape.vocab);
    let h = a.case.hparams;
    let cot = a.case.cotangent;
    let mask = &a.case.mask;
    a.with(|f| {
        let x_token = |i: usize| a.case.old_logp.as_ref().map_or(0.0, |old| f.tokens[i].logp - old[i] as f64);
        let natural = natural_scale(f, cot);
        let (mut g, mut dir) = (f.grad(cot), vec![0.0; v_]);
        for i in (0..f.tokens.len()).filter(|&i| mask[i] != 0.0) {
            let b = i / t_;
            let x = match f.config.ratio_level {
                RatioLevel::Token => x_token(i),
                _ => {
                    let live: Vec<usize> = (b * t_..(b + 1) * t_).filter(|&j| mask[j] != 0.0).collect();
                    live.iter().map(|&j| x_token(j)).sum::<f64>() / live.len() as f64
                }
            };
            let r = x.clamp(h.log_ratio_min, h.log_ratio_max).exp();
            let st = &f.tokens[i];
            let want = -st.is_weight * clip(r, h.eps_low, h.eps_high) * st.advantage;
            let iv = st.policy_interval;
            let scale = st.is_weight * st.advantage.abs() * (1.0 + r.min(1.0 + h.eps_high));
            if !iv.is_point() {
                return Err(TestCaseError::fail(format!("token {i}: CISPO is smooth in logp, interval {iv:?}")));
            }
            close(iv.lo, want, 1e-9, scale, &format!("CISPO coefficient of token {i} (r = {r:e})"))?;
            f.dlogp_dlogits_row(i, &mut dir);
            for (k, d) in dir.iter().enumerate() {
                let want = cot * st.weight * iv.lo * d;
                close(g[i * v_ + k], want, 1e-12, natural, &format!("grad[{i}, {k}]"))?;
                g[i * v_ + k] = 0.0;
            }
        }
        if let Some(k) = g.iter().position(|&x| x != 0.0) {
            return Err(TestCaseError::fail(format!("masked row element {k} has gradient {}", g[k])));
        }
        Ok(true)
    })?
}

/// SAPO's term -sigmoid(k (r - 1)) (4 / k) A is odd in A once k is fixed;
/// k depends on sign(A) alone. So negating every advantage and swapping
/// the two temperatures negates the policy part of everything:
///   L(A; tau_pos, tau_neg) + L(-A; tau_neg, tau_pos) = 2 L(0)
/// for the loss, the per-token losses and the gradient (L(0) keeps the KL,
/// its ratio factor and the entropy; the policy term is 0 at A = 0).
pub(super) fn sapo_is_odd_in_a_through_k(spec: &CaseSpec, v2: &V2) -> Outcome {
    let mut v2 = v2.clone();
    v2.policy_loss = PolicyLoss::Sapo;
    let a = Owned::new(spec, &v2);
    let mut neg = a.clone();
    neg.case.advantages.iter_mut().for_each(|x| *x = -*x);
    neg.case.hparams.sapo_tau_pos = a.case.hparams.sapo_tau_neg;
    neg.case.hparams.sapo_tau_neg = a.case.hparams.sapo_tau_pos;
    let mut zero = a.clone();
    zero.case.advantages.iter_mut().for_each(|x| *x = 0.0);
    let (pa, pn, pz) = (a.outputs()?, neg.outputs()?, zero.outputs()?);
    let sum = Outputs {
        loss: pa.loss + pn.loss,
        per_token: pa.per_token.iter().zip(&pn.per_token).map(|(x, y)| x + y).collect(),
        grad: pa.grad.iter().zip(&pn.grad).map(|(x, y)| x + y).collect(),
        natural: pa.natural.max(pn.natural),
        loss_scale: pa.loss_scale.max(pn.loss_scale),
    };
    let twice = Outputs {
        loss: 2.0 * pz.loss,
        per_token: pz.per_token.iter().map(|x| 2.0 * x).collect(),
        grad: pz.grad.iter().map(|x| 2.0 * x).collect(),
        natural: pz.natural,
        loss_scale: pz.loss_scale,
    };
    same_outputs(&sum, &twice, 1e-12, "L(A; a, b) + L(-A; b, a) vs 2 L(0)")?;
    Ok(true)
}

/// Property 3: a fully masked batch gives loss 0 and an all-zero gradient
/// for every v2 switch, whatever the masked positions hold (the materialised
/// garbage, and is_weights up to f32::MAX there).
pub(super) fn fully_masked_batch_is_zero(spec: &CaseSpec, v2: &V2) -> Outcome {
    let mut spec = spec.clone();
    spec.mask = MaskPattern::FullyMaskedBatch;
    let mut a = Owned::new(&spec, v2);
    if let Some(w) = a.case.is_weights.as_mut() {
        for (k, x) in w.iter_mut().enumerate() {
            *x = [f32::MAX, 0.0, 1e30, -5.0][k % 4];
        }
    }
    a.with(|f| {
        if f.loss != 0.0 || f.grad(a.case.cotangent).iter().any(|&g| g != 0.0) {
            return Err(TestCaseError::fail(format!("loss {} or a gradient is not exactly 0", f.loss)));
        }
        Ok(true)
    })?
}

/// The per-token loss's extra value slope (`Forward::value_slope_excess`)
/// is added only where the value moves faster than the coefficient says: a
/// KL times the ratio off policy has a coefficient equal to its value's
/// slope (beta r (kl - kl'(d))) and gets none, on policy (r exactly 1) the
/// KL's own slope. Red when the excess is not gated on `on_policy` (it
/// loosened the per-token loss by beta r |kl'| off policy).
pub(super) fn kl_times_ratio_excess_only_on_policy(spec: &CaseSpec, v2: &V2) -> Outcome {
    // The excess's other sources off: a straight-through KL, CISPO, the sequence levels.
    let v2 = V2 {
        kl_gradient: KlGradient::Own,
        ratio_level: RatioLevel::Token,
        policy_loss: if v2.policy_loss == PolicyLoss::Cispo { PolicyLoss::Ppo } else { v2.policy_loss },
        ..v2.clone()
    };
    let mut spec = spec.clone();
    (spec.config.kl, spec.config.on_policy) = (true, false); // before materialising: old_logp and ref_logp are drawn then
    let mut o = Owned::new(&spec, &v2);
    o.case.config.kl_times_ratio = true;
    let live = |f: &Forward<'_>| (0..f.tokens.len()).filter(|&i| !f.tokens[i].masked).collect::<Vec<_>>();
    let beta = o.case.hparams.beta;
    if beta == 0.0 {
        return Ok(false);
    }
    for (i, e) in o.with(|f| live(f).into_iter().map(|i| (i, f.value_slope_excess(i, 1e-3))).collect::<Vec<_>>())? {
        prop_assert!(e == 0.0, "off policy, token {i}: excess {e} where the coefficient is the value's slope");
    }
    // On policy some token's KL has a slope (not every d is 0 or past a
    // clamp); a case where none has checks nothing.
    (o.case.config.on_policy, o.case.old_logp) = (true, None);
    let on = o.with(|f| live(f).into_iter().filter(|&i| f.value_slope_excess(i, 1e-3) > 0.0).count())?;
    Ok(on > 0)
}

/// A window across a log-ratio clamp edge admits the slope at every point
/// of its unclamped part (where an implementation's rounded x may lie) and
/// 0 (beyond the edge), not just the slope at the part's middle. Found by
/// verl's GSPO-token at log_ratio_max = 10 (examples/verl/repros/
/// harness-gspo-clamp-edge-false-alarm.json): its slope at x = 9.999 lay
/// outside the interval [0, e^9.93] the middle gave.
pub(super) fn clamp_window_admits_every_unclamped_slope() -> Trial {
    crate::common::trial("oracle_v2::clamp_window_admits_every_unclamped_slope", || {
        let mut runner = common::runner(common::cases(512));
        let edge = prop_oneof![Just(f64::INFINITY), -5.0..20.0f64];
        runner
            .run(&(-30.0..30.0f64, 0.0..0.5f64, edge, 0.0..1.0f64), |(x, slack, hi, at)| {
                let lo = hi - 10.0;
                let iv = grpo_oracle::clamped_interval(x, slack, lo, hi, |x, _| grpo_oracle::KinkInterval { lo: x.exp(), hi: x.exp() });
                let (a, b) = ((x - slack).max(lo), (x + slack).min(hi));
                if a <= b && hi.is_finite() && (x - slack < lo || x + slack > hi) {
                    let xp = a + at * (b - a);
                    let slope = xp.exp();
                    prop_assert!(iv.lo <= slope * (1.0 + 1e-12) && slope <= iv.hi * (1.0 + 1e-12), "x {x} slack {slack} [{lo}, {hi}]: e^{xp} = {slope} outside [{}, {}]", iv.lo, iv.hi);
                    prop_assert!(iv.lo <= 0.0, "a window across an edge admits 0: [{}, {}]", iv.lo, iv.hi);
                }
                Ok(())
            })
            .map_err(|e| Failed::from(format!("{e}")))
    })
}

/// A switch pinned on is exercised: with `--switch
/// logit_transform=true` every generated case, preset draws included (the
/// presets know no transform and set the identity), carries a scale other
/// than 1 or a finite softcap, and the softcap is not always the fallback's.
/// Red without `Objective::constrain_hparams`'s activation: most preset
/// draws ran the transform as the identity.
pub(super) fn a_pinned_switch_is_exercised() -> Trial {
    crate::common::trial("oracle_v2::a_pinned_switch_is_exercised", || {
        use grpo_verify::case::objective::Objective;
        for objective in ["all"] {
            let mut bounds = common::small_bounds();
            bounds.objective = Objective::parse(Some(objective), &["logit_transform=true".to_string()], &[]).map_err(|e| format!("{e:#}"))?;
            let (cases, presets, drawn_transforms) = (AtomicU32::new(0), AtomicU32::new(0), AtomicU32::new(0));
            let mut runner = common::runner(300);
            runner
                .run(&case_spec(&bounds), |spec| {
                    let h = &spec.hparams;
                    prop_assert!(spec.config.logit_transform, "--objective {objective}: the pin did not hold");
                    prop_assert!(
                        h.logit_scale != 1.0 || h.logit_softcap.is_finite(),
                        "--objective {objective}: an identity transform under the pin ({:?}, preset {:?})",
                        (h.logit_scale, h.logit_softcap),
                        spec.preset
                    );
                    cases.fetch_add(1, Ordering::Relaxed);
                    presets.fetch_add(u32::from(spec.preset.is_some()), Ordering::Relaxed);
                    drawn_transforms.fetch_add(u32::from(h.logit_softcap != 30.0 || h.logit_scale != 1.0), Ordering::Relaxed);
                    Ok(())
                })
                .map_err(|e| Failed::from(format!("{e}")))?;
            let (cases, presets, drawn_transforms) = (cases.into_inner(), presets.into_inner(), drawn_transforms.into_inner());
            if presets * 5 < cases || drawn_transforms * 2 < cases {
                return Err(format!("--objective {objective}: {cases} cases, {presets} preset draws, {drawn_transforms} with a drawn transform").into());
            }
        }
        Ok(())
    })
}
