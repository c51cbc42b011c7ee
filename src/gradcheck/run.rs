//! Every implementation on the fixture's step, judged by the tolerance rule
//! on the oracle's one forward pass, with per-token diagnostics (clip
//! region, advantage sign, logit scale, logp and gradient-row errors).

use std::time::Instant;

use anyhow::{Context, Result};
use grpo_oracle::{Forward, Shape, TemperatureMode};
use serde::Serialize;

use crate::case::{Case, Kind};
use crate::compare::Errors;
use crate::evaluate::{CaseResult, Evaluator, Outcome};
use crate::gradcheck::cases::{logits_case, micro_batch, restore_lm_head, FixtureCases};
use crate::worker::outputs::Outputs;

/// Where a token sits in the PPO objective (docs/spec.md): the clip region of its
/// ratio and the sign of its advantage.
pub fn region(fwd: &Forward<'_>, row: usize) -> String {
    let st = &fwd.tokens[row];
    let r = st.log_ratio.exp();
    let (lo, hi) = (1.0 - fwd.hparams.eps_low, 1.0 + fwd.hparams.eps_high);
    let place = if st.policy_interval.lo != st.policy_interval.hi {
        "at a kink"
    } else if r <= lo {
        "r below the band"
    } else if r >= hi {
        "r above the band"
    } else {
        "r inside the band"
    };
    let sign = if st.advantage > 0.0 {
        "A>0"
    } else if st.advantage < 0.0 {
        "A<0"
    } else {
        "A=0"
    };
    format!("{place}, {sign}")
}

/// Per valid token: what the plots show.
#[derive(Clone, Debug, Serialize)]
pub struct TokenDiagnostic {
    /// The token's row.
    pub b: usize,
    /// The token's position in the row.
    pub t: usize,
    /// |logp_impl - logp_oracle| (nats); None when logp is not returned.
    pub logp_error: Option<f64>,
    /// max |grad_impl - grad_oracle| over the token's gradient row (logits
    /// row, or d hidden row for the fused kind) over the row's max |grad_oracle|.
    pub grad_row_error: f64,
    /// Where it sits in the PPO objective (`region`): clip region and advantage sign.
    pub region: String,
    /// max_v |z_v| of the token's logit row.
    pub logit_scale: f64,
}

/// The diagnostics of one implementation's outputs against the oracle
/// (its per-row gradient errors come from the comparison itself).
pub fn diagnostics(case: &Case, fwd: &Forward<'_>, out: &Outputs, errors: &Errors) -> Vec<TokenDiagnostic> {
    let shape: Shape = case.shape();
    let tau = fwd.hparams.temperature;
    let scale_of = |row: usize| {
        let st = &fwd.tokens[row];
        match fwd.config.temperature_mode {
            TemperatureMode::Logits => st.softmax.max_abs_x * tau,
            TemperatureMode::Logp => st.softmax.max_abs_x,
        }
    };
    (0..shape.rows())
        .filter(|&i| case.mask[i] != 0.0)
        .map(|row| TokenDiagnostic {
            b: row / shape.time,
            t: row % shape.time,
            logp_error: out.logp.as_ref().map(|l| (l[row] as f64 - fwd.tokens[row].logp).abs()),
            grad_row_error: errors.grad_row_errors[row],
            region: region(fwd, row),
            logit_scale: scale_of(row),
        })
        .collect()
}

/// One implementation's result on the fixture.
#[derive(Clone, Debug, Serialize)]
pub struct ImplGradcheck {
    /// As `--impl` names it.
    pub implementation: String,
    /// Its kind's name.
    pub kind: String,
    /// The tolerance rule's verdict on the fixture's step.
    pub result: CaseResult,
    /// Wall time of its run and its comparison.
    pub seconds: f64,
    /// Per valid token: what the plots show.
    #[serde(skip)]
    pub tokens: Vec<TokenDiagnostic>,
}

impl ImplGradcheck {
    /// It ran and every quantity passed.
    pub fn passed(&self) -> bool {
        self.result.outcome == Outcome::Pass
    }
}

/// Runs every implementation on the fixture's step (whole, or micro-batch
/// by micro-batch when `cases.token_block` says so).
pub fn run(eval: &mut Evaluator, cases: &mut FixtureCases, implementations: &[(String, Kind)]) -> Result<Vec<ImplGradcheck>> {
    let Some(tb) = cases.token_block else {
        return run_cases(eval, &cases.fused, cases.logits.as_ref(), implementations);
    };
    let need_logits = implementations.iter().any(|(_, k)| *k == Kind::Logits);
    let mut merged: Vec<ImplGradcheck> = Vec::new();
    for start in (0..cases.time).step_by(tb) {
        let range = start..(start + tb).min(cases.time);
        let micro = micro_batch(&mut cases.fused, range.clone());
        let logits = need_logits.then(|| logits_case(&micro));
        let results = run_cases(eval, &micro, logits.as_ref(), implementations);
        restore_lm_head(&mut cases.fused, micro);
        for mut r in results? {
            r.tokens.iter_mut().for_each(|t| t.t += range.start);
            let label = format!("positions {}..{}", range.start, range.end);
            match merged.iter_mut().find(|m| m.implementation == r.implementation) {
                Some(m) => m.absorb(r, &label),
                None => {
                    r.result.reason = labelled(&label, &r.result.reason);
                    merged.push(r)
                }
            }
        }
    }
    Ok(merged)
}

fn labelled(label: &str, reason: &str) -> String {
    if reason.is_empty() {
        String::new()
    } else {
        format!("{label}: {reason}")
    }
}

impl ImplGradcheck {
    /// Adds another micro-batch's result: any failure fails the whole, each
    /// quantity keeps its worst verdict (by error over bound).
    fn absorb(&mut self, other: ImplGradcheck, label: &str) {
        let (mine, theirs) = (&mut self.result, other.result);
        if theirs.outcome == Outcome::Fail || (theirs.outcome == Outcome::Unsupported && mine.outcome == Outcome::Pass) {
            mine.outcome = theirs.outcome.clone();
        }
        let reason = labelled(label, &theirs.reason);
        if !reason.is_empty() {
            mine.reason = if mine.reason.is_empty() { reason } else { format!("{}; {reason}", mine.reason) };
        }
        for v in theirs.verdicts {
            let ratio = |v: &crate::compare::Verdict| if v.bound > 0.0 { v.err / v.bound } else { v.err };
            match mine.verdicts.iter_mut().find(|m| m.quantity == v.quantity) {
                Some(m) if ratio(&v) > ratio(m) => *m = v,
                Some(_) => {}
                None => mine.verdicts.push(v),
            }
        }
        mine.seconds += theirs.seconds;
        mine.compiled |= theirs.compiled;
        self.seconds += other.seconds;
        self.tokens.extend(other.tokens);
    }
}

/// Runs every implementation on the case of its kind; the oracle's forward
/// pass of each case is made once.
fn run_cases(eval: &mut Evaluator, fused: &Case, logits: Option<&Case>, implementations: &[(String, Kind)]) -> Result<Vec<ImplGradcheck>> {
    let mut results = Vec::new();
    for kind in [Kind::Fused, Kind::Logits] {
        let wanted: Vec<&String> = implementations.iter().filter(|(_, k)| *k == kind).map(|(i, _)| i).collect();
        if wanted.is_empty() {
            continue;
        }
        let case = match kind {
            Kind::Fused => fused,
            Kind::Logits => logits.context("the logits case was not formed")?,
        };
        let problem = case.problem();
        let fwd = problem.forward().map_err(|e| anyhow::anyhow!("the fixture's {} case: {e}", kind.name()))?;
        for implementation in wanted {
            let started = Instant::now();
            let (result, out, errors) =
                eval.evaluate_on_baseline_when_needed(implementation, case, &fwd).map_err(|e| anyhow::anyhow!("{implementation}: {e}"))?;
            let tokens = match (&out, &errors) {
                (Some(out), Some(errors)) => diagnostics(case, &fwd, out, errors),
                _ => Vec::new(),
            };
            results.push(ImplGradcheck {
                implementation: implementation.clone(),
                kind: kind.name().to_string(),
                result,
                seconds: started.elapsed().as_secs_f64(),
                tokens,
            });
        }
    }
    // In the order asked for.
    results.sort_by_key(|r| implementations.iter().position(|(i, _)| *i == r.implementation));
    Ok(results)
}

/// Quantiles of a list (for the tables): (p50, p99, max).
pub fn quantiles(values: &mut [f64]) -> (f64, f64, f64) {
    if values.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    values.sort_by(f64::total_cmp);
    let at = |q: f64| values[((values.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99), values[values.len() - 1])
}

