//! Measuring an implementation's outputs against the oracle: every quantity's
//! worst error in units of its scale (the logits kind's gradient here, the
//! fused kind's in `fused`).

use grpo_oracle::{Forward, TokenRounding};
use rayon::prelude::*;

use crate::case::{Case, CaseProblem, Dtype};
use crate::compare::Outputs;
use crate::compare::fused::fused_grad_errors;
use crate::compare::kink::{exact_zero_row, kink_fitted_row, row_relative_error};
use crate::compare::rule::{Errors, QuantityError, gradient_diff};
use crate::compare::scales::Scales;

/// Measures `out` against the oracle.
pub fn errors(fwd: &Forward<'_>, scales: &Scales, case: &Case, out: &Outputs) -> Errors {
    errors_many(fwd, scales, case, &[out]).pop().expect("one result per output")
}

/// Measures several implementations' outputs against the oracle on one
/// case (the fused kind's oracle sweep is shared between them).
pub fn errors_many(fwd: &Forward<'_>, scales: &Scales, case: &Case, outs: &[&Outputs]) -> Vec<Errors> {
    let s = case.shape;
    let loc = |i: usize| format!("b={} t={}", i / s.time, i % s.time);
    // A declared convention's allowance is taken off each element's
    // difference (docs/conventions.md), as a bf16 gradient's half ulp is.
    let rounding = scales.rounding();
    let allowed = |of: fn(&TokenRounding) -> f64, i: usize| rounding.map_or(0.0, |r| of(&r.tokens[i]));
    // An output returned in bf16 keeps its own rounding (`gradient_diff`).
    let per_token = |values: &Option<Vec<f32>>, bf16: bool, oracle: &dyn Fn(usize) -> f64, scale: &[f64], of: fn(&TokenRounding) -> f64| {
        values.as_ref().map(|v| {
            let mut q = QuantityError::default();
            for (i, st) in fwd.tokens.iter().enumerate() {
                if !st.masked {
                    q.consider_allowed(gradient_diff(v[i], oracle(i), bf16), allowed(of, i), scale[i], oracle(i), || loc(i));
                }
            }
            q
        })
    };
    let grads: Vec<(QuantityError, Option<QuantityError>, QuantityError, Vec<f64>)> = match case.problem() {
        CaseProblem::Logits(_) => outs
            .iter()
            .map(|out| {
                let (grad, zero, rows) = grad_errors(fwd, scales, case, out);
                (grad, None, zero, rows)
            })
            .collect(),
        CaseProblem::Fused(problem) => fused_grad_errors(fwd, &problem, scales, case, outs)
            .into_iter()
            .map(|e| (e.d_hidden, Some(e.d_lm_head), e.zero_rows, e.row_errors))
            .collect(),
    };
    outs.iter()
        .zip(grads)
        .map(|(out, (grad, grad_lm_head, grad_zero_rows, grad_row_errors))| {
            let mut loss = QuantityError::default();
            let b = out.bf16_returned;
            let loss_diff = gradient_diff(out.loss as f32, fwd.loss, b.loss);
            loss.consider_allowed(loss_diff, rounding.map_or(0.0, |r| r.loss), scales.loss, fwd.loss, String::new);
            Errors {
                loss,
                logp: per_token(&out.logp, b.logp, &|i| fwd.tokens[i].logp, &scales.logp, |t| t.logp),
                per_token_loss: per_token(&out.per_token_loss, b.per_token_loss, &|i| fwd.tokens[i].per_token_loss, &scales.per_token_loss, |t| t.per_token_loss),
                entropy: per_token(&out.entropy, b.entropy, &|i| fwd.tokens[i].entropy, &scales.entropy, |t| t.entropy),
                grad,
                grad_lm_head,
                grad_zero_rows,
                grad_row_errors,
            }
        })
        .collect()
}

/// The logits kind's gradient: (nonzero rows, exact-zero rows, each row's relative error).
fn grad_errors(fwd: &Forward<'_>, scales: &Scales, case: &Case, out: &Outputs) -> (QuantityError, QuantityError, Vec<f64>) {
    let s = case.shape;
    let v_ = s.vocab;
    let bf16 = out.grad_dtype == Dtype::Bf16;
    let intervals = scales.intervals_for(fwd, case, out);
    let rounding = scales.rounding();
    let per_row: Vec<(QuantityError, QuantityError, f64)> = (0..s.batch * s.time)
        .into_par_iter()
        .map_init(
            || (vec![0.0f64; v_], vec![0.0f64; v_], vec![0.0f64; if rounding.is_some() { v_ } else { 0 }]),
            |(oracle_row, direction, allowance), i| {
                let got = &out.grad[i * v_..(i + 1) * v_];
                let at = |v: usize| format!("b={} t={} v={v}", i / s.time, i % s.time);
                let (mut nonzero, mut zero) = (QuantityError::default(), QuantityError::default());
                if exact_zero_row(fwd, scales, i) {
                    for (v, &g) in got.iter().enumerate() {
                        zero.consider((g as f64).abs(), scales.grad_global, 0.0, || at(v));
                    }
                    let rel = if fwd.tokens[i].masked { 0.0 } else { row_relative_error(got, std::iter::repeat(0.0)) };
                    return (nonzero, zero, rel);
                }
                if let Some(r) = rounding {
                    r.grad_row(fwd, i, case.cotangent, allowance);
                }
                kink_fitted_row(fwd, scales, case, out, i, intervals[i], oracle_row, direction, allowance);
                for (v, (&g, &o)) in got.iter().zip(oracle_row.iter()).enumerate() {
                    nonzero.consider_allowed(gradient_diff(g, o, bf16), allowance.get(v).copied().unwrap_or(0.0), scales.grad_row[i], o, || at(v));
                }
                (nonzero, zero, row_relative_error(got, oracle_row.iter().copied()))
            },
        )
        .collect();
    let mut rows = Vec::with_capacity(per_row.len());
    let (mut nonzero, mut zero) = (QuantityError::default(), QuantityError::default());
    for (n, z, r) in per_row {
        nonzero = nonzero.merge(n);
        zero = zero.merge(z);
        rows.push(r);
    }
    (nonzero, zero, rows)
}
