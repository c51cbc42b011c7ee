//! The tolerance rule of docs/spec.md, "What correct means":
//!
//!   pass  iff  err_impl <= 2 * min(err_baseline, analytic) + floor
//!
//! and the baseline itself must stay within `analytic`. Errors are measured
//! element by element against the oracle and divided by that element's
//! *scale*: the magnitude through which f32 rounding can move it (the terms
//! it is computed from, the log-sum-exp it subtracts, the length of the sums
//! behind it). So one ill-conditioned row cannot loosen the gate elsewhere,
//! and a low-weight row is held to its own size. `floor` and `analytic` are
//! then plain multiples of the f32 unit roundoff u = 2^-24. A gradient
//! returned in bf16 is first allowed its own output rounding, element by
//! element (half a bf16 ulp at the returned value); only what lies beyond
//! is measured. docs/tolerance.md derives the scales.
//!
//! Gradients are compared kink-aware: a token whose ratio lies within its
//! rounding distance of a clip edge accepts any ppo coefficient in its Clarke
//! interval; the coefficient that fits the implementation best is used.

pub mod classify;
pub mod errors;
pub mod fused;
pub mod kink;
pub mod returned;
pub mod rule;
pub mod scales;

pub use errors::{errors, errors_many};
pub use returned::{Bf16Returned, Outputs};
pub use rule::{bf16_half_ulp, judge, Category, Class, Errors, Hypothesis, Quantity, QuantityError, Tolerance, Verdict, U32};
pub use scales::Scales;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::case::{Case, CaseProblem, Dtype};
    use grpo_oracle::{KinkInterval, Sweep};

    /// A bf16 row at a kink, returned as JAX does (the tie split in half:
    /// c = -0.75 A r) and rounded to bf16, is within its half ulps at that
    /// coefficient: the fit must find it. The least-squares fit measured this
    /// row (case #137 of `check --impl reference --dtype bf16 --cases 300
    /// --seed 7 --max-vocab 8 --max-time 8`, row b=0 t=1) at 498.4 u, here as
    /// on the reference's own returned row. A row whose coefficient lies
    /// outside the admissible interval still fails.
    #[test]
    fn kink_fit_finds_a_bf16_rounded_row_and_only_admissible_ones() {
        let case: Case = serde_json::from_value(serde_json::json!({
            "shape": {"batch": 1, "time": 1, "vocab": 5},
            "dtype": "bf16",
            "config": {"temperature_mode": "logp", "aggregation": "sum_over_constant", "on_policy": true,
                       "kl": false, "entropy_bonus": false, "two_sided": true},
            "hparams": {"eps_low": 0.0, "eps_high": 0.2800000011920929, "temperature": 1.0, "beta": 0.0,
                        "entropy_coef": 0.0, "delta": 1.9199999570846558, "normalizer": 47.0},
            "cotangent": 1.0,
            "inputs": {"kind": "logits", "logits": [-0.000457763671875, -0.1748046875, 1.0, -0.2099609375, -0.66015625]},
            "tokens": [4], "mask": [1.0], "advantages": [1.0], "old_logp": null, "ref_logp": null
        }))
        .unwrap();
        let problem = case.problem();
        let fwd = problem.forward().unwrap();
        let tol = Tolerance::default();
        let scales = Scales::new(&fwd, &case, &tol);
        // On-policy, eps_low = 0: r = 1 sits on the clip edge, c in [-1, 0].
        assert!(scales.intervals[0].lo <= -1.0 && scales.intervals[0].hi == 0.0);
        let err_at = |c: f64| {
            let mut row = vec![0.0; 5];
            fwd.grad_row(0, case.cotangent, Some(c), &mut row);
            let out = Outputs {
                loss: fwd.loss,
                grad: row.iter().map(|&g| Dtype::Bf16.round(g)).collect(),
                grad_lm_head: None,
                grad_dtype: Dtype::Bf16,
                logp: None,
                per_token_loss: None,
                entropy: None,
                seconds: 0.0,
                compiled: false,
                bf16_returned: Bf16Returned::default(),
            };
            errors(&fwd, &scales, &case, &out).grad.err / U32
        };
        assert!(err_at(-0.75) < 1.0, "JAX's coefficient, rounded to bf16: {} u", err_at(-0.75));
        assert!(err_at(-1.5) > 1e4, "a coefficient outside [-1, 0]: {} u", err_at(-1.5));
    }


    /// A loss, logp or entropy returned in bf16 keeps its own output
    /// rounding, half a bf16 ulp, as a bf16 gradient does (verl's fused
    /// path returns its f32 entropy in bf16): the oracle's values rounded
    /// to bf16 pass when they came back as bf16, fail when they claim f32,
    /// and one ulp off (twice the exemption) fails either way.
    #[test]
    fn a_returned_bf16_output_keeps_its_own_rounding() {
        let case: Case = serde_json::from_value(serde_json::json!({
            "shape": {"batch": 1, "time": 2, "vocab": 5},
            "dtype": "bf16",
            "config": {"temperature_mode": "logits", "aggregation": "token_mean", "on_policy": true,
                       "kl": false, "entropy_bonus": false, "two_sided": true},
            "hparams": {"eps_low": 0.2, "eps_high": 0.2, "temperature": 1.0, "beta": 0.0,
                        "entropy_coef": 0.0, "delta": 3.0, "normalizer": 2.0},
            "cotangent": 1.0,
            "inputs": {"kind": "logits", "logits": [0.5, -1.25, 2.0, 0.75, -3.0, 1.5, 0.25, -0.5, 3.0, -2.0]},
            "tokens": [1, 3], "mask": [1.0, 1.0], "advantages": [0.7], "old_logp": null, "ref_logp": null
        }))
        .unwrap();
        let problem = case.problem();
        let fwd = problem.forward().unwrap();
        let scales = Scales::new(&fwd, &case, &Tolerance::default());
        let mut grad = vec![0.0; 10];
        for i in 0..2 {
            fwd.grad_row(i, case.cotangent, None, &mut grad[i * 5..(i + 1) * 5]);
        }
        // The oracle's values rounded to bf16 and moved by `ulps` bf16 ulps.
        let bf16 = |x: f64, ulps: f64| {
            let r = Dtype::Bf16.round(x);
            (r as f64 + ulps * 2.0 * crate::compare::bf16_half_ulp(r)) as f32
        };
        let out = |ulps: f64, bf16_returned: Bf16Returned| Outputs {
            loss: bf16(fwd.loss, ulps) as f64,
            grad: grad.iter().map(|&g| Dtype::Bf16.round(g)).collect(),
            grad_lm_head: None,
            grad_dtype: Dtype::Bf16,
            logp: Some(fwd.tokens.iter().map(|t| bf16(t.logp, ulps)).collect()),
            per_token_loss: None,
            entropy: Some(fwd.tokens.iter().map(|t| bf16(t.entropy, ulps)).collect()),
            seconds: 0.0,
            compiled: false,
            bf16_returned,
        };
        let all = Bf16Returned { loss: true, logp: true, per_token_loss: true, entropy: true };
        let worst = |o: &Outputs| {
            let e = errors(&fwd, &scales, &case, o);
            [e.loss.err, e.logp.unwrap().err, e.entropy.unwrap().err].map(|x| x / U32)
        };
        for (q, e) in ["loss", "logp", "entropy"].iter().zip(worst(&out(0.0, all))) {
            assert!(e < 1.0, "{q} rounded to bf16 and returned as bf16: {e} u");
        }
        for (q, e) in ["loss", "logp", "entropy"].iter().zip(worst(&out(0.0, Bf16Returned::default()))) {
            assert!(e > 1000.0, "{q} rounded to bf16 but claiming f32: {e} u");
        }
        for (q, e) in ["loss", "logp", "entropy"].iter().zip(worst(&out(1.0, all))) {
            assert!(e > 1000.0, "{q} one bf16 ulp off: {e} u");
        }
    }

    /// The freedom at kinks cannot hide a bug (docs/tolerance.md, "Kinks
    /// in the fused kind"): with every token of a fused case on a clip edge,
    /// outputs built from the oracle at any admissible coefficients pass when
    /// d hidden and d lm_head use the same ones; a d lm_head that uses the
    /// other end of the interval than its own d hidden fails, and so does a
    /// d hidden moved past the interval along its own direction.
    #[test]
    fn kink_freedom_does_not_hide_a_bug() {
        use crate::case::Inputs;
        use grpo_oracle::Shape;
        let (b_, t_, v_, h_) = (2usize, 6usize, 300usize, 16usize);
        let mut state = 12345u64;
        let mut uniform = move || {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (state >> 11) as f64 / (1u64 << 53) as f64 - 0.5
        };
        let hidden: Vec<f32> = (0..b_ * t_ * h_).map(|_| (2.0 * uniform()) as f32).collect();
        let lm_head: Vec<f32> = (0..h_ * v_).map(|_| (uniform()) as f32).collect();
        let tokens: Vec<i32> = (0..b_ * t_).map(|i| (i * 37 % v_) as i32).collect();
        let (config, hparams) = crate::case::training_step(0.9);
        let mut case = Case {
            shape: Shape { batch: b_, time: t_, vocab: v_ },
            dtype: Dtype::F32,
            config,
            hparams,
            cotangent: 1.5,
            inputs: Inputs::Fused { hidden_dim: h_, hidden, lm_head },
            tokens,
            mask: vec![1.0; b_ * t_],
            advantages: vec![0.8, -1.1],
            old_logp: Some(vec![0.0; b_ * t_]),
            ref_logp: None,
            is_weights: None,
            mesh: None,
        };
        // Every ratio on an edge: old = logp - ln(edge), both edges, both advantage signs.
        let logp: Vec<f64> = case.problem().forward().unwrap().tokens.iter().map(|t| t.logp).collect();
        case.old_logp = Some(logp.iter().enumerate().map(|(i, l)| (l - if i % 2 == 0 { 1.28f64 } else { 0.8 }.ln()) as f32).collect());
        let problem = case.problem();
        let CaseProblem::Fused(fused) = &problem else { unreachable!() };
        let fwd = problem.forward().unwrap();
        let tol = Tolerance::default();
        let scales = Scales::new(&fwd, &case, &tol);
        let rows: Vec<usize> = (0..b_ * t_).collect();
        assert!(rows.iter().all(|&i| !scales.intervals[i].is_point()), "every token is at a kink");
        // Outputs whose d hidden uses coefficients `c_hidden` and d lm_head `c_lm_head`.
        let outputs = |c_hidden: &dyn Fn(KinkInterval) -> f64, c_lm_head: &dyn Fn(KinkInterval) -> f64| {
            let grads = |pick: &dyn Fn(KinkInterval) -> f64| {
                let coef: Vec<f64> = rows.iter().map(|&i| pick(scales.intervals[i])).collect();
                let mut d_lm_head = vec![0.0f32; h_ * v_];
                let sweep = Sweep { rows: &rows, ppo_coef: &coef, directions: &[], magnitudes: None, lm_head: true, rounding: None };
                let r = fused.sweep(&fwd, case.cotangent, &sweep, |chunk| {
                    let c = chunk.cols.len();
                    for h in 0..h_ {
                        for (k, v) in chunk.cols.clone().enumerate() {
                            d_lm_head[h * v_ + v] = chunk.d_lm_head[h * c + k] as f32;
                        }
                    }
                });
                (r.d_hidden.iter().map(|&x| x as f32).collect::<Vec<f32>>(), d_lm_head)
            };
            let (grad, _) = grads(c_hidden);
            let (_, grad_lm_head) = grads(c_lm_head);
            Outputs {
                loss: fwd.loss,
                grad,
                grad_lm_head: Some(grad_lm_head),
                grad_dtype: Dtype::F32,
                logp: None,
                per_token_loss: None,
                entropy: None,
                seconds: 0.0,
                compiled: false,
                bf16_returned: Bf16Returned::default(),
            }
        };
        let (lo, hi, mid) = (|iv: KinkInterval| iv.lo, |iv: KinkInterval| iv.hi, |iv: KinkInterval| iv.midpoint());
        let past = |iv: KinkInterval| iv.hi + (iv.hi - iv.lo);
        let candidates = [outputs(&mid, &mid), outputs(&lo, &lo), outputs(&hi, &hi), outputs(&lo, &hi), outputs(&past, &past)];
        let refs: Vec<&Outputs> = candidates.iter().collect();
        let measured = errors_many(&fwd, &scales, &case, &refs);
        let failing = |e: &Errors| -> Vec<Quantity> { judge(e, &measured[0], &tol).into_iter().filter(|v| !v.pass).map(|v| v.quantity).collect() };
        assert_eq!(failing(&measured[1]), Vec::<Quantity>::new(), "lower ends throughout are admissible");
        assert_eq!(failing(&measured[2]), Vec::<Quantity>::new(), "upper ends throughout are admissible");
        assert_eq!(failing(&measured[3]), vec![Quantity::GradLmHead], "d lm_head at other coefficients than d hidden");
        assert!(failing(&measured[4]).contains(&Quantity::GradHidden), "d hidden past the interval: {:?}", failing(&measured[4]));
        // One NaN in d lm_head fails it (its difference less the kink
        // slack was once max(NaN - slack, 0) = 0: a NaN passed).
        let mut nan = outputs(&mid, &mid);
        nan.grad_lm_head.as_mut().unwrap()[7] = f32::NAN;
        let e = errors(&fwd, &scales, &case, &nan);
        assert!(e.grad_lm_head.as_ref().unwrap().nonfinite, "{:?}", e.grad_lm_head);
        assert_eq!(failing(&e), vec![Quantity::GradLmHead]);
    }

    /// A ratio 1e-4 in log above 1 + eps_high (A > 0: clipped, slope 0) is
    /// within the analytic neighbourhood of the edge, so both branches are
    /// admissible on their own; an implementation that returns its logp
    /// (here the oracle's, to f32) shows which branch it is on, and a row
    /// at the unclipped slope then fails (`Scales::intervals_for`).
    #[test]
    fn an_implementations_own_logp_narrows_its_kink_interval() {
        let mut case: Case = serde_json::from_value(serde_json::json!({
            "shape": {"batch": 1, "time": 1, "vocab": 5},
            "dtype": "f32",
            "config": {"temperature_mode": "logits", "aggregation": "sum_over_constant", "on_policy": false,
                       "kl": false, "entropy_bonus": false, "two_sided": false},
            "hparams": {"eps_low": 0.2, "eps_high": 0.28, "temperature": 1.0, "beta": 0.0,
                        "entropy_coef": 0.0, "delta": 3.0, "normalizer": 1.0},
            "cotangent": 1.0,
            "inputs": {"kind": "logits", "logits": [0.5, -1.25, 2.0, 0.75, -0.5]},
            "tokens": [2], "mask": [1.0], "advantages": [1.5], "old_logp": [0.0], "ref_logp": null
        }))
        .unwrap();
        let logp = case.problem().forward().unwrap().tokens[0].logp;
        case.old_logp = Some(vec![(logp - (1.28f64.ln() + 1e-4)) as f32]);
        let problem = case.problem();
        let fwd = problem.forward().unwrap();
        let tol = Tolerance::default();
        let scales = Scales::new(&fwd, &case, &tol);
        let analytic = scales.intervals[0];
        // The unclipped slope -A r, at r = 1 + eps_high.
        let unclipped = -1.5 * 1.28;
        assert!(analytic.lo <= unclipped + 1e-12 && analytic.hi == 0.0, "both branches within the analytic slack: {analytic:?}");
        let out_at = |c: f64, returned: Option<f32>| {
            let mut row = vec![0.0; 5];
            fwd.grad_row(0, case.cotangent, Some(c), &mut row);
            Outputs {
                loss: fwd.loss,
                grad: row.iter().map(|&g| g as f32).collect(),
                grad_lm_head: None,
                grad_dtype: Dtype::F32,
                logp: returned.map(|l| vec![l]),
                per_token_loss: None,
                entropy: None,
                seconds: 0.0,
                compiled: false,
                bf16_returned: Bf16Returned::default(),
            }
        };
        let err = |out: &Outputs| errors(&fwd, &scales, &case, out).grad.err / U32;
        let own = Some(logp as f32);
        assert_eq!(scales.intervals_for(&fwd, &case, &out_at(0.0, own))[0], fwd.tokens[0].policy_interval);
        assert!(err(&out_at(0.0, own)) < 1.0, "the clipped slope, as its logp says: {} u", err(&out_at(0.0, own)));
        assert!(err(&out_at(unclipped, None)) < 1.0, "without a returned logp both branches stand");
        assert!(err(&out_at(unclipped, own)) > 1e4, "the unclipped slope against its own logp: {} u", err(&out_at(unclipped, own)));
        // A returned logp across the edge admits the unclipped slope again.
        let across = Some((logp - 2e-4) as f32);
        assert!(!scales.intervals_for(&fwd, &case, &out_at(0.0, across))[0].is_point());
    }

    /// Rounding any f32 to bf16 moves it by at most `bf16_half_ulp` of the
    /// result, and that allowance is tight (some value needs all of it).
    #[test]
    fn bf16_half_ulp_bounds_the_rounding_exactly() {
        let mut worst: f64 = 0.0;
        let mut x = 1.0e-38f32;
        while x < 1.0e38 {
            for f in [x, -x, x * 1.003_906_3, x * 1.996] {
                let g = Dtype::Bf16.round(f as f64);
                let moved = (g as f64 - f as f64).abs();
                assert!(moved <= bf16_half_ulp(g), "{f} -> {g}: moved {moved} > {}", bf16_half_ulp(g));
                worst = worst.max(moved / bf16_half_ulp(g));
            }
            x *= 1.37;
        }
        assert!(worst > 0.9, "the allowance is loose: worst use {worst}");
        assert_eq!(bf16_half_ulp(1.0), 1.0 / 256.0);
        assert_eq!(bf16_half_ulp(0.75), 1.0 / 512.0);
    }
}

