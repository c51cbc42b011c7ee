//! What a run covered, per implementation, over its supported
//! cases (generated and remembered, not shrink steps): which switch values
//! and which pairs of values of two switches it exercised (`plan::Space`:
//! a value counts only where its switch acts), which values it refused
//! (NotImplementedError on every draw that had them), and which numeric
//! edges its cases reached, measured on the materialised inputs. A user
//! reads from it what a green run proves, and what it does not.

use std::collections::BTreeSet;

use grpo_oracle::pieces::Variable;
use grpo_oracle::{PolicyLoss, RatioLevel};
use serde::{Deserialize, Serialize};

use crate::case::plan::{refuses, Pair, Row, Space, Value1};
use crate::case::{Case, CaseSpec};

/// f32's exp overflows past this (ln of f32::MAX).
pub const EXP_OVERFLOW: f64 = 88.72;

/// The edges one case can reach (`applicable`: its switches and
/// hyperparameters allow it) and those it reached.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CaseEdges {
    /// The edges this case's switches and hyperparameters allow it to reach.
    pub applicable: Vec<String>,
    /// The edges its inputs reached.
    pub reached: Vec<String>,
}

fn level_name(level: RatioLevel) -> &'static str {
    match level {
        RatioLevel::Token => "token",
        RatioLevel::Sequence => "sequence",
        RatioLevel::SequenceToken => "sequence_token",
    }
}

/// The edges of one materialised case.
pub fn edges(case: &Case) -> CaseEdges {
    let (c, h) = (&case.config, &case.hparams);
    let mut e = CaseEdges::default();
    let mut edge = |name: String, applicable: bool, reached: bool| {
        if applicable {
            if reached {
                e.reached.push(name.clone());
            }
            e.applicable.push(name);
        }
    };
    let positions = case.valid_positions();
    let (b_, t_) = (case.shape.batch, case.shape.time);
    let valid: Vec<usize> = (0..b_ * t_).filter(|&i| positions[i].is_some()).collect();
    let logp = |i: usize| positions[i].map_or(f64::NAN, |p| p.0);

    // Masks: an empty row beside non-empty ones, an empty batch.
    let row_valid = |b: usize| (0..t_).any(|t| case.mask[b * t_ + t] != 0.0);
    let empty_rows = (0..b_).filter(|&b| !row_valid(b)).count();
    edge("mask: an empty row beside others".into(), true, empty_rows > 0 && empty_rows < b_);
    edge("mask: an empty batch".into(), true, empty_rows == b_);
    // Logits: exp under- and overflow without the row maximum taken out first.
    edge("logits: a row all below -88.7".into(), true, valid.iter().any(|&i| positions[i].is_some_and(|p| p.2 < -EXP_OVERFLOW)));
    edge("logits: a row all above +88.7".into(), true, valid.iter().any(|&i| positions[i].is_some_and(|p| p.1 > EXP_OVERFLOW)));

    // The objective's piecewise points (grpo_oracle::pieces: each clamp,
    // clip edge and kink, and each exp that can leave f32's range, under
    // its guards' state), on each row's own values: the log-ratio before
    // the clamp (L_b at the sequence levels) and the ratio after it, and
    // the KL's d = ref - logp. The policy term's points depend on the
    // row's advantage.
    let level = level_name(c.ratio_level);
    for b in 0..b_ {
        let row: Vec<usize> = valid.iter().copied().filter(|&i| i / t_ == b).collect();
        let n = (0..t_).filter(|&t| case.mask[b * t_ + t] != 0.0).count();
        let log_ratio: Vec<f64> = match &case.old_logp {
            None => Vec::new(),
            Some(old) => match c.ratio_level {
                RatioLevel::Token => row.iter().map(|&i| logp(i) - old[i] as f64).collect(),
                _ if !row.is_empty() && row.len() == n => vec![row.iter().map(|&i| logp(i) - old[i] as f64).sum::<f64>() / n as f64],
                _ => Vec::new(),
            },
        };
        let ratio: Vec<f64> = log_ratio.iter().map(|&l| l.clamp(h.log_ratio_min, h.log_ratio_max).exp()).collect();
        let d: Vec<f64> = match &case.ref_logp {
            Some(reference) => row.iter().map(|&i| reference[i] as f64 - logp(i)).collect(),
            None => Vec::new(),
        };
        let advantage = case.advantages[b] as f64;
        for piece in grpo_oracle::pieces::pieces(c, h, advantage) {
            let (values, at_level) = match piece.variable {
                Variable::LogRatio => (&log_ratio, format!(" at ratio_level={level}")),
                Variable::Ratio => (&ratio, format!(" at ratio_level={level}")),
                Variable::KlD => (&d, String::new()),
            };
            for &relation in piece.relations() {
                let reached = values.iter().any(|&x| if relation == "on" { piece.on(x) } else { piece.past(x) });
                edge(format!("{}{at_level}", piece.edge(relation)), true, reached);
            }
        }
        if case.old_logp.is_some() && c.policy_loss == PolicyLoss::Sapo && !row.is_empty() {
            edge("sapo: a zero advantage at a valid token".into(), true, advantage == 0.0);
        }
    }

    // Rollout-correction weights at valid positions.
    if let Some(w) = &case.is_weights {
        let weight = |i: usize| if w.len() == b_ * t_ { w[i] } else { w[i / t_] };
        edge("is_weights: 0 at a valid token".into(), true, valid.iter().any(|&i| weight(i) == 0.0));
        edge("is_weights: 10 or more at a valid token".into(), true, valid.iter().any(|&i| weight(i) >= 10.0));
    }
    for names in [&mut e.applicable, &mut e.reached] {
        names.sort();
        names.dedup();
    }
    e
}

/// The row a case's signature is, for `Space::exercised`.
pub fn row_of(spec: &CaseSpec) -> Row {
    Row { config: spec.config, dtype: spec.dtype, is_weights_per_row: spec.is_weights_per_row }
}

/// What an implementation's run covered.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Coverage {
    /// Switch values ("name=value") exercised, of those the objective admits.
    pub values_exercised: usize,
    /// Switch values the objective admits (each where its switch acts).
    pub values_required: usize,
    /// Values never exercised that no refusal explains, as "name=value".
    pub values_missing: Vec<String>,
    /// Values never exercised whose switch the implementation's refusals name.
    pub values_refused: Vec<String>,
    /// Of those, the ones a built-in declares refused (its registry entry).
    pub values_refused_as_declared: Vec<String>,
    /// Pairs of values of two switches exercised together.
    pub pairs_exercised: usize,
    /// Pairs the objective admits (both values acting in one case).
    pub pairs_required: usize,
    /// Pairs not exercised that involve no refused value.
    pub pairs_missing: Vec<String>,
    /// Pairs not exercised that involve a refused value.
    pub pairs_refused: usize,
    /// Refusals that gave no switch as data (a bare NotImplementedError):
    /// their switch was read from the message's words, the fallback.
    pub refusals_read_from_message: usize,
    /// Edges the run's cases reached, and those they could have (their
    /// switches and hyperparameters allowed it) and did not.
    pub edges_reached: Vec<String>,
    /// Edges some case could have reached and none did.
    pub edges_missing: Vec<String>,
    /// Checked cases, and those of them drawn from a real model's numbers (`case::real`).
    pub cases: usize,
    /// Supported cases drawn from a real model's numbers (`case::real`).
    pub real_cases: usize,
}

/// Coverage from the supported cases (`checked`: spec and its edges) and
/// the refused ones (`refused`: specs of unsupported draws, the switch the
/// refusal gave as data if any, and its message). A value is refused when it
/// was never exercised and a refusal of a draw that had it names its switch
/// (a draw refused for another switch says nothing about the values beside
/// it). A built-in's `declared` refusals (its registry entry's switch
/// values, which `check` holds it to) count as refused whether or not a
/// draw met them.
pub fn coverage(
    space: &Space,
    checked: &[(&CaseSpec, &CaseEdges)],
    refused: &[(&CaseSpec, Option<&str>, &str)],
    declared: &[(String, serde_json::Value)],
) -> Coverage {
    let values: BTreeSet<Value1> = checked.iter().flat_map(|(s, _)| space.exercised(&row_of(s))).collect();
    let pairs: BTreeSet<Pair> = checked.iter().flat_map(|(s, _)| space.exercised_pairs(&row_of(s))).collect();
    let tried: BTreeSet<Value1> = refused
        .iter()
        .flat_map(|&(s, switch, reason)| space.exercised(&row_of(s)).into_iter().filter(move |&(f, _)| refuses(switch, reason, space.factors[f].name)))
        .collect();
    let as_declared: BTreeSet<Value1> = space
        .values
        .iter()
        .copied()
        .filter(|&(f, l)| !values.contains(&(f, l)) && declared.iter().any(|(switch, value)| space.factors[f].name == switch && space.factors[f].levels[l] == *value))
        .collect();
    let refused_values: BTreeSet<Value1> =
        tried.difference(&values).copied().filter(|v| space.values.contains(v)).chain(as_declared.iter().copied()).collect();
    let missing_values: Vec<String> = space.values.iter().filter(|v| !values.contains(v) && !refused_values.contains(v)).map(|&v| space.name(v)).collect();
    let (mut pairs_missing, mut pairs_refused) = (Vec::new(), 0);
    for &(a, b) in space.pairs.iter().filter(|p| !pairs.contains(p)) {
        if refused_values.contains(&a) || refused_values.contains(&b) {
            pairs_refused += 1;
        } else {
            pairs_missing.push(format!("{} & {}", space.name(a), space.name(b)));
        }
    }
    let applicable: BTreeSet<&String> = checked.iter().flat_map(|(_, e)| &e.applicable).collect();
    let reached: BTreeSet<&String> = checked.iter().flat_map(|(_, e)| &e.reached).collect();
    Coverage {
        values_exercised: space.values.iter().filter(|v| values.contains(v)).count(),
        values_required: space.values.len(),
        values_missing: missing_values,
        values_refused: refused_values.iter().map(|&v| space.name(v)).collect(),
        values_refused_as_declared: as_declared.iter().map(|&v| space.name(v)).collect(),
        pairs_exercised: space.pairs.iter().filter(|p| pairs.contains(p)).count(),
        pairs_required: space.pairs.len(),
        pairs_missing,
        pairs_refused,
        refusals_read_from_message: refused.iter().filter(|(_, switch, _)| switch.is_none()).count(),
        edges_reached: reached.iter().map(|s| s.to_string()).collect(),
        edges_missing: applicable.difference(&reached).map(|s| s.to_string()).collect(),
        cases: checked.len(),
        real_cases: checked.iter().filter(|(s, _)| s.real).count(),
    }
}

impl Coverage {
    /// One line: "switch values 38/38, pairs 612/657, edges 21/23, real-model cases 12/112".
    pub fn line(&self) -> String {
        let refused = if self.values_refused.is_empty() { String::new() } else { format!(" ({} refused)", self.values_refused.len()) };
        format!(
            "switch values {}/{}{refused}, pairs {}/{}, edges {}/{}, real-model cases {}/{}",
            self.values_exercised,
            self.values_required,
            self.pairs_exercised,
            self.pairs_required,
            self.edges_reached.len(),
            self.edges_reached.len() + self.edges_missing.len(),
            self.real_cases,
            self.cases
        )
    }
}

/// How many missing items report.md lists before "and N more" (report.json has all).
const LISTED: usize = 12;

fn listed(items: &[String]) -> String {
    let mut out: Vec<String> = items.iter().take(LISTED).map(|s| format!("`{s}`")).collect();
    if items.len() > LISTED {
        out.push(format!("and {} more (report.json)", items.len() - LISTED));
    }
    out.join(", ")
}

impl Coverage {
    /// report.md's lines for one implementation.
    pub fn markdown(&self, implementation: &str, w: &mut String) {
        use std::fmt::Write as _;
        let _ = writeln!(w, "\n### `{implementation}`: {}\n", self.line());
        if !self.values_refused.is_empty() {
            let _ = writeln!(
                w,
                "- **refused by the implementation** (NotImplementedError on every draw with it; {} pairs with them unexercised): {}",
                self.pairs_refused,
                listed(&self.values_refused)
            );
            if !self.values_refused_as_declared.is_empty() {
                let _ = writeln!(w, "  - declared refused in its registry entry (and held to it): {}", listed(&self.values_refused_as_declared));
            }
        }
        if self.refusals_read_from_message > 0 {
            let _ = writeln!(
                w,
                "- {} refusals gave no switch as data (a bare NotImplementedError): which switch each refused was read from its message's words (docs/spec.md, \"Refusing a configuration\")",
                self.refusals_read_from_message
            );
        }
        if !self.values_missing.is_empty() {
            let _ = writeln!(w, "- switch values never exercised: {}", listed(&self.values_missing));
        }
        if !self.pairs_missing.is_empty() {
            let _ = writeln!(w, "- pairs never exercised ({}): {}", self.pairs_missing.len(), listed(&self.pairs_missing));
        }
        if !self.edges_missing.is_empty() {
            let _ = writeln!(w, "- edges its switches allowed and no case reached: {}", listed(&self.edges_missing));
        }
        let _ = writeln!(w, "- edges reached: {}", if self.edges_reached.is_empty() { "none".into() } else { self.edges_reached.join("; ") });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::case::Kind;

    fn spec(ratios: &str, kl_pattern: &str, clamps: f64) -> CaseSpec {
        let inf_or = |x: f64| if clamps.is_finite() { serde_json::json!(x) } else { serde_json::Value::Null };
        serde_json::from_value(serde_json::json!({
            "batch": 4, "time": 16, "vocab": 64, "hidden": 8, "dtype": "f32",
            "config": {"temperature_mode": "logits", "aggregation": "token_mean", "on_policy": false, "kl": true,
                       "entropy_bonus": false, "two_sided": false, "kl_estimator": "k3"},
            "hparams": {"eps_low": 0.2, "eps_high": 0.2, "temperature": 1.0, "beta": 0.04, "entropy_coef": 0.01, "delta": 1.8,
                        "normalizer": 1.0, "log_ratio_min": inf_or(-clamps), "log_ratio_max": inf_or(clamps),
                        "kl_log_ratio_clamp": inf_or(clamps), "kl_max": inf_or(10.0)},
            "normalizer": "valid_count", "logits": {"pattern": "normal", "scale": 1.0}, "tokens": "random", "mask": "full",
            "ratios": ratios, "advantages": "mixed", "masked_garbage": false, "cotangent": 1.0, "seed": 11, "kl_pattern": kl_pattern
        }))
        .expect("a case spec")
    }

    /// A refusal's switch given as data counts its value refused whatever
    /// its message says; a bare message is read for the switch's name and
    /// counted as read so. Red when coverage searches the message first.
    #[test]
    fn a_refusal_counts_the_switch_it_gives_as_data() {
        let space = Space::new(&crate::case::objective::Objective::parse(Some("all"), &[], &[]).unwrap(), &[crate::case::Dtype::F32]);
        let mut s = spec("near_one", "near", 20.0);
        s.config.ratio_level = grpo_oracle::RatioLevel::Sequence;
        let named_other = "fused_onepass: kl_estimator and kl are fine; only one row at a time";
        let by_data = coverage(&space, &[], &[(&s, Some("ratio_level"), named_other)], &[]);
        assert!(by_data.values_refused.iter().any(|v| v == "ratio_level=sequence"), "{:?}", by_data.values_refused);
        assert!(by_data.values_refused.iter().all(|v| !v.starts_with("kl")), "the message's words count only without data: {:?}", by_data.values_refused);
        assert_eq!(by_data.refusals_read_from_message, 0);
        let by_words = coverage(&space, &[], &[(&s, None, "ratio_level='sequence' is not supported")], &[]);
        assert!(by_words.values_refused.iter().any(|v| v == "ratio_level=sequence"), "{:?}", by_words.values_refused);
        assert_eq!(by_words.refusals_read_from_message, 1);
        // A refusal that says no switch relaxes it ("") refuses no value and is not read.
        let of_a_hyperparameter = coverage(&space, &[], &[(&s, Some(""), "ratio_level clamp [-1, 1] is not this library's")], &[]);
        assert!(of_a_hyperparameter.values_refused.is_empty(), "{:?}", of_a_hyperparameter.values_refused);
        assert_eq!(of_a_hyperparameter.refusals_read_from_message, 0);
        // A built-in's declared refusal counts though no draw met it.
        let declared = [("logit_transform".to_string(), serde_json::json!(true))];
        let by_declaration = coverage(&space, &[], &[], &declared);
        assert_eq!(by_declaration.values_refused, ["logit_transform=true"]);
        assert_eq!(by_declaration.values_refused_as_declared, ["logit_transform=true"]);
    }

    #[test]
    fn edges_are_measured_on_the_inputs() {
        let steered = edges(&spec("past_clamps", "overflow", 20.0).materialize(Kind::Logits));
        let has = |e: &CaseEdges, prefix: &str| e.reached.iter().any(|r| r.starts_with(prefix));
        for e in [
            "kl d: past exp(d)'s f32 overflow at 88.7 (kl_log_ratio_clamp finite before, kl_max finite after)",
            "log-ratio: past exp's f32 overflow at 88.7 (log_ratio_max finite before) at ratio_level=token",
            "log-ratio: on clamp log_ratio_m",
            "kl d: past k3 = kl_max, above (kl_log_ratio_clamp finite before)",
        ] {
            assert!(has(&steered, e), "{e} not in {:?}", steered.reached);
        }
        // The same patterns without a finite clamp stay within f32 (an
        // overflow there would be f32's, not a bug): no overflow edge applies.
        let free = edges(&spec("past_clamps", "overflow", f64::INFINITY).materialize(Kind::Logits));
        assert!(free.reached.iter().all(|r| !r.contains("overflow")), "{:?}", free.reached);
        assert!(free.applicable.iter().all(|r| !r.contains("overflow")), "{:?}", free.applicable);
        // No clamp before k3's exp, a finite kl_max after: the overflow is
        // steered there too, and named by its guards (a kernel that forms
        // exp of the uncapped d passed while the coverage said the clamped
        // edge was reached).
        let mut only_kl_max = spec("past_clamps", "overflow", f64::INFINITY);
        only_kl_max.hparams.kl_max = 10.0;
        let after = edges(&only_kl_max.materialize(Kind::Logits));
        let e = "kl d: past exp(d)'s f32 overflow at 88.7 (kl_log_ratio_clamp infinite before, kl_max finite after)";
        assert!(after.reached.iter().any(|r| r == e), "{e} not in {:?}", after.reached);
        assert!(after.reached.iter().all(|r| !r.contains("kl_log_ratio_clamp finite")), "{:?}", after.reached);
        // Drawn near the ratio 1, a finite clamp is applicable and not reached.
        let near = edges(&spec("near_one", "near", 20.0).materialize(Kind::Logits));
        assert!(near.applicable.iter().any(|r| r.starts_with("kl d: past exp(d)")));
        let clamped = |r: &String| r.contains("overflow") || r.contains(": on clamp") || r.contains(": past clamp") || r.contains("k3's clamp");
        assert!(!near.reached.iter().any(clamped), "{:?}", near.reached);
    }
}
