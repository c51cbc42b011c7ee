//! The distinct discrepancies of one implementation (`check --keep-going`):
//! its failing groups, each shrunk to a minimal case, put together by what
//! the minimal case says the bug is, so that a user surveying a library
//! reads each of its problems once, with one repro, however many groups
//! found it.
//!
//! The key of a discrepancy is read off the minimal case alone: each failing
//! quantity with its [`FailureKind`] (`math` or `precision`, the category of
//! its verdict's class, `math` where a verdict has none; `nonfinite` for a
//! NaN or an infinity where the oracle is finite; `error`, on the quantity
//! `run`, when the case did not run at all: a crash, an exception, a hang, a
//! malformed output), and every switch its minimal case sets off v1's
//! defaults (`NAME=VALUE`), then `preset=NAME` when it has a preset and
//! `dtype=NAME` when its dtype is not the run's first. The shrinker walks every switch back to v1's defaults (and the
//! dtype to the run's first), so what is left is what the bug needs. The
//! baseline's failures are not the implementation's discrepancy: they are
//! keyed `baseline`, on `run` when the baseline did not run, and on each
//! quantity over its analytic bound only when nothing of the
//! implementation's own failed.
//!
//! Grouping is by first appearance in group order (remembered failures
//! first), and each discrepancy's minimal case is its smallest (B*T*V, then
//! group order), so a seed gives the same discrepancies for any `--jobs`.

use std::fmt::Write as _;
use std::path::PathBuf;

use grpo_oracle::Config;
use serde::Serialize;
use serde_json::Value;

use crate::case::{CaseSpec, Dtype};
use crate::compare::{Category, Quantity};
use crate::evaluate::{CaseResult, Unjudged};

/// One failing quantity of a minimal case and what kind of wrong it is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Failing {
    /// `loss`, `logp`, `grad`, `grad_zero_rows`, ...; `run` when the case did not run.
    pub quantity: Failed,
    /// What kind of wrong: math, precision, nonfinite, error or baseline.
    pub category: FailureKind,
}

/// What failed: a quantity the rule judged, or the run itself (nothing to judge).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failed {
    /// A quantity the rule judged.
    Quantity(Quantity),
    /// The run itself (it crashed, raised or hung).
    Run,
}

impl Failed {
    /// Its name in labels and report.json (`grad_lm_head`, `run`).
    pub fn name(self) -> &'static str {
        match self {
            Failed::Quantity(q) => q.name(),
            Failed::Run => "run",
        }
    }
}

/// report.json keeps the name: "grad_lm_head", "run".
impl Serialize for Failed {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

/// What kind of wrong a failing quantity of a minimal case is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// Its class's category (`classify`).
    Math,
    /// Within what a precision choice can do (its class's category).
    Precision,
    /// NaN or an infinity where the oracle is finite.
    Nonfinite,
    /// The case did not run at all: a crash, an exception, a hang, a malformed output.
    Error,
    /// The baseline did not run, or went over its analytic bound.
    Baseline,
}

impl FailureKind {
    /// Its name in labels and report.json.
    pub fn name(self) -> &'static str {
        match self {
            FailureKind::Math => "math",
            FailureKind::Precision => "precision",
            FailureKind::Nonfinite => "nonfinite",
            FailureKind::Error => "error",
            FailureKind::Baseline => "baseline",
        }
    }
}

/// What makes two failures the same discrepancy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DiscrepancyKey {
    /// In the order the rule judges the quantities.
    pub failing: Vec<Failing>,
    /// `NAME=VALUE` of every SPEC switch the minimal case turns on (the
    /// `--switch` syntax), then `preset=NAME` and `dtype=bf16` when it has them.
    pub switches: Vec<String>,
}

impl DiscrepancyKey {
    /// The key of a minimal failing case `minimal` judged `result`, in a run
    /// whose dtypes shrink towards `simplest_dtype`.
    pub fn of(minimal: &CaseSpec, result: &CaseResult, simplest_dtype: Dtype) -> DiscrepancyKey {
        DiscrepancyKey { failing: failing(result), switches: switches(minimal, simplest_dtype) }
    }

    /// One line: "math: loss, grad; precision: entropy | kl=true".
    pub fn label(&self) -> String {
        let mut categories: Vec<(FailureKind, Vec<&str>)> = Vec::new();
        for f in &self.failing {
            match categories.iter_mut().find(|(c, _)| *c == f.category) {
                Some((_, quantities)) => quantities.push(f.quantity.name()),
                None => categories.push((f.category, vec![f.quantity.name()])),
            }
        }
        let failing: Vec<String> = categories.iter().map(|(c, q)| format!("{}: {}", c.name(), q.join(", "))).collect();
        let switches = if self.switches.is_empty() { "v1 defaults".to_string() } else { self.switches.join(", ") };
        format!("{} | {switches}", failing.join("; "))
    }
}

fn failing(result: &CaseResult) -> Vec<Failing> {
    let entry = |quantity: Failed, category: FailureKind| Failing { quantity, category };
    if result.verdicts.is_empty() {
        let category = if result.unjudged == Some(Unjudged::Baseline) { FailureKind::Baseline } else { FailureKind::Error };
        return vec![entry(Failed::Run, category)];
    }
    let own: Vec<Failing> = result
        .verdicts
        .iter()
        .filter(|v| !v.pass)
        .map(|v| {
            // The same test as `classify`'s first: not finite where the oracle is.
            // A failing verdict always has its class (`Evaluator::result`);
            // without one it reads as math, what a reader must not miss.
            let category = if v.err.is_infinite() || v.abs_err.is_nan() {
                FailureKind::Nonfinite
            } else {
                match v.class.as_ref().map(|c| c.category) {
                    Some(Category::Precision) => FailureKind::Precision,
                    Some(Category::Math) | None => FailureKind::Math,
                }
            };
            entry(Failed::Quantity(v.quantity), category)
        })
        .collect();
    if !own.is_empty() {
        return own;
    }
    result.verdicts.iter().filter(|v| !v.baseline_pass && !v.not_covered).map(|v| entry(Failed::Quantity(v.quantity), FailureKind::Baseline)).collect()
}

fn switches(minimal: &CaseSpec, simplest_dtype: Dtype) -> Vec<String> {
    let on = serde_json::to_value(minimal.config).expect("a config serialises");
    let defaults = serde_json::to_value(Config::default()).expect("a config serialises");
    let mut switches: Vec<String> = on
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(name, value)| defaults.get(name.as_str()) != Some(value))
        .map(|(name, value)| match value {
            Value::String(s) => format!("{name}={s}"),
            other => format!("{name}={other}"),
        })
        .collect();
    if let Some(preset) = &minimal.preset {
        switches.push(format!("preset={preset}"));
    }
    if minimal.dtype != simplest_dtype {
        switches.push(format!("dtype={}", minimal.dtype.name()));
    }
    switches
}

/// One failing group's outcome (or a remembered failure's), in group order.
pub struct Failure {
    /// None: a failure remembered from an earlier run.
    pub group: Option<usize>,
    /// The failing case shrunk.
    pub minimal: CaseSpec,
    /// The minimal case judged in full.
    pub result: CaseResult,
}

/// The failures of one key: indices into the failures, in group order, and
/// the one whose minimal case stands for them all.
pub struct Distinct {
    /// What makes these failures one discrepancy.
    pub key: DiscrepancyKey,
    /// Indices into the failures, in group order.
    pub members: Vec<usize>,
    /// The member whose minimal case stands for them all (smallest B*T*V, ties to the earliest).
    pub smallest: usize,
}

/// The failures grouped by key, each group in the order of its first
/// failure; its smallest minimal case by B*T*V, ties to the earliest.
pub fn distinct(failures: &[Failure], simplest_dtype: Dtype) -> Vec<Distinct> {
    let mut found: Vec<Distinct> = Vec::new();
    for (n, f) in failures.iter().enumerate() {
        let key = DiscrepancyKey::of(&f.minimal, &f.result, simplest_dtype);
        match found.iter_mut().find(|d| d.key == key) {
            Some(d) => d.members.push(n),
            None => found.push(Distinct { key, members: vec![n], smallest: n }),
        }
    }
    let elements = |f: &Failure| f.minimal.batch * f.minimal.time * f.minimal.vocab;
    for d in &mut found {
        d.smallest = *d.members.iter().min_by_key(|&&n| (elements(&failures[n]), n)).expect("a discrepancy has a failure");
    }
    found
}

/// One distinct discrepancy in the report.
#[derive(Clone, Debug, Serialize)]
pub struct Discrepancy {
    /// `key.label()`.
    pub label: String,
    /// Its failing quantities, categories and switches.
    pub key: DiscrepancyKey,
    /// What failed on the minimal case: every failing quantity's error, bound and class.
    pub failure: String,
    /// Why the minimal case has no verdicts (None: the rule judged it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unjudged: Option<crate::evaluate::Unjudged>,
    /// Failures it covers: `groups.len()` failing groups plus `remembered` remembered ones.
    pub count: usize,
    /// The failing groups it covers.
    pub groups: Vec<usize>,
    /// Remembered failures it covers.
    pub remembered: usize,
    /// The minimal case, in one line.
    pub minimal_case: String,
    /// The group the minimal case was shrunk from (None: a remembered one).
    pub minimal_group: Option<usize>,
    /// Its repro file.
    pub repro: PathBuf,
    /// The one-line command that replays it.
    pub replay: String,
}

/// Every distinct discrepancy of one implementation, and whether the
/// budget cut its run short.
#[derive(Clone, Debug, Serialize)]
pub struct Discrepancies {
    /// `--max-failures`: failing groups shrunk at most.
    pub max_failures: usize,
    /// Failing groups shrunk (remembered failures not counted).
    pub failing_groups: usize,
    /// The group at which the budget was reached when groups after it were
    /// left unchecked: there may be more discrepancies.
    pub budget_reached_at: Option<usize>,
    /// Each distinct discrepancy, in the order of its first failure.
    pub distinct: Vec<Discrepancy>,
}

impl Discrepancies {
    /// One sentence: how many discrepancies in how many failures, and the budget.
    pub fn headline(&self) -> String {
        let remembered: usize = self.distinct.iter().map(|d| d.remembered).sum();
        let mut s = format!(
            "{} distinct discrepanc{} in {} failing group{}",
            self.distinct.len(),
            if self.distinct.len() == 1 { "y" } else { "ies" },
            self.failing_groups,
            if self.failing_groups == 1 { "" } else { "s" }
        );
        if remembered > 0 {
            let _ = write!(s, " and {remembered} remembered failure{}", if remembered == 1 { "" } else { "s" });
        }
        s
    }

    /// Said when the budget stopped the run: the user should know there may be more.
    pub fn budget_note(&self) -> Option<String> {
        self.budget_reached_at.map(|g| {
            format!(
                "budget reached: --max-failures {} failing groups were shrunk; groups after group {g} were not checked, \
                 so there may be more discrepancies (raise --max-failures to see them)",
                self.max_failures
            )
        })
    }

    /// The console lines after an implementation's FAIL line.
    pub fn print(&self) {
        for (n, d) in self.distinct.iter().enumerate() {
            println!("  {}. {} ({})", n + 1, d.label, covered(d));
            println!("     what: {}", d.failure);
            println!("     minimal case: {}", d.minimal_case);
            println!("     replay: {}", d.replay);
        }
        if let Some(note) = self.budget_note() {
            println!("     {note}");
        }
    }

    /// report.md's section on a failing implementation under --keep-going.
    pub fn markdown(&self, w: &mut String) {
        let _ = writeln!(w, "{} (at most {} shrunk: --max-failures).", self.headline(), self.max_failures);
        if let Some(note) = self.budget_note() {
            let _ = writeln!(w, "\n**{note}.**");
        }
        for (n, d) in self.distinct.iter().enumerate() {
            let _ = writeln!(w, "\n{}. **{}** ({})", n + 1, d.label, covered(d));
            let quantities: Vec<String> = d.key.failing.iter().map(|f| format!("{} ({})", f.quantity.name(), f.category.name())).collect();
            let _ = writeln!(w, "   - failing quantities: {}", quantities.join(", "));
            let _ = writeln!(w, "   - switches: {}", if d.key.switches.is_empty() { "none (v1 defaults)".to_string() } else { d.key.switches.join(", ") });
            let _ = writeln!(w, "   - what: {}", d.failure);
            let from = d.minimal_group.map_or("a remembered failure".to_string(), |g| format!("group {g}"));
            let _ = writeln!(w, "   - minimal case (from {from}): {}", d.minimal_case);
            let _ = writeln!(w, "   - repro: `{}`", d.repro.display());
            let _ = writeln!(w, "   - replay: `{}`", d.replay);
        }
    }
}

/// "3 failing groups: 0, 4, 7; 1 remembered".
fn covered(d: &Discrepancy) -> String {
    let groups: Vec<String> = d.groups.iter().map(usize::to_string).collect();
    let mut s = match groups.len() {
        0 => String::new(),
        1 => format!("1 failing group: {}", groups[0]),
        n => format!("{n} failing groups: {}", groups.join(", ")),
    };
    if d.remembered > 0 {
        let sep = if s.is_empty() { "" } else { "; " };
        let _ = write!(s, "{sep}{} remembered", d.remembered);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::{Class, Quantity, Verdict};
    use crate::evaluate::Outcome;

    fn spec(batch: usize, vocab: usize, dtype: &str, config: Value, preset: Option<&str>) -> CaseSpec {
        let mut spec = serde_json::json!({
            "batch": batch, "time": 1, "vocab": vocab, "hidden": 8, "dtype": dtype, "config": config,
            "hparams": {"eps_low": 0.2, "eps_high": 0.2, "temperature": 1.0, "beta": 0.04, "entropy_coef": 0.01, "delta": 1.8, "normalizer": 1.0},
            "normalizer": "valid_count", "logits": {"pattern": "normal", "scale": 1.0}, "tokens": "random", "mask": "full",
            "ratios": "mixed", "advantages": "positive", "masked_garbage": false, "cotangent": 1.0, "seed": 7
        });
        if let Some(p) = preset {
            spec["preset"] = p.into();
        }
        serde_json::from_value(spec).expect("a case spec")
    }

    fn v1(kl: bool, two_sided: bool) -> Value {
        serde_json::json!({"temperature_mode": "logits", "aggregation": "token_mean", "on_policy": false,
                           "kl": kl, "entropy_bonus": false, "two_sided": two_sided})
    }

    fn verdict(quantity: Quantity, pass: bool, err: f64, class: Option<Category>) -> Verdict {
        Verdict {
            quantity,
            err,
            abs_err: err,
            at: String::new(),
            want: 1.0,
            baseline_err: 0.0,
            floor: 0.0,
            analytic: 0.0,
            bound: 0.5,
            pass,
            baseline_pass: true,
            not_covered: false,
            class: class.map(|category| Class { category, hypothesis: None, phrase: "off".into() }),
            allowance_used: None,
        }
    }

    fn result(reason: &str, verdicts: Vec<Verdict>) -> CaseResult {
        CaseResult { outcome: Outcome::Fail, reason: reason.to_string(), verdicts, seconds: 0.0, compiled: false, conventions: vec![], unjudged: None, refused_switch: None }
    }

    fn math(quantity: Quantity) -> Verdict {
        verdict(quantity, false, 1.0, Some(Category::Math))
    }

    #[test]
    fn keys_name_each_failing_quantitys_category_and_the_switches_left_on() {
        let minimal = spec(1, 1, "bf16", v1(true, false), None);
        let judged = result("", vec![math(Quantity::Loss), verdict(Quantity::Logp, true, 0.0, None), verdict(Quantity::Grad, false, f64::INFINITY, Some(Category::Math))]);
        let key = DiscrepancyKey::of(&minimal, &judged, Dtype::F32);
        assert_eq!(key.label(), "math: loss; nonfinite: grad | kl=true, dtype=bf16");
        // bf16 is no trigger in a bf16-only run; a preset is named with its switches.
        let logp_mode = serde_json::json!({"temperature_mode": "logp", "aggregation": "token_mean", "on_policy": false,
                                           "kl": false, "entropy_bonus": false, "two_sided": false});
        let key = DiscrepancyKey::of(&spec(1, 1, "bf16", logp_mode, Some("grpo")), &result("", vec![math(Quantity::Grad)]), Dtype::Bf16);
        assert_eq!(key.switches, ["temperature_mode=logp", "preset=grpo"]);
        // A case that did not run, and one whose baseline did not.
        let mut crashed = result("the worker crashed (signal 11)", vec![]);
        crashed.unjudged = Some(Unjudged::Run(crate::worker::outputs::FailedRun::Crashed));
        let crashed = DiscrepancyKey::of(&minimal, &crashed, Dtype::F32);
        assert_eq!(crashed.label(), "error: run | kl=true, dtype=bf16");
        let mut baseline = result("the baseline `reference` failed on this case: raised", vec![]);
        baseline.unjudged = Some(Unjudged::Baseline);
        assert_eq!(DiscrepancyKey::of(&minimal, &baseline, Dtype::F32).failing[0].category, FailureKind::Baseline);
    }

    #[test]
    fn a_baseline_over_its_bound_is_not_the_implementations_discrepancy() {
        let minimal = spec(1, 1, "f32", v1(false, false), None);
        let mut over = verdict(Quantity::Entropy, true, 0.0, None);
        over.baseline_pass = false;
        let key = DiscrepancyKey::of(&minimal, &result("", vec![math(Quantity::Loss), over.clone()]), Dtype::F32);
        assert_eq!(key.label(), "math: loss | v1 defaults");
        let key = DiscrepancyKey::of(&minimal, &result("", vec![verdict(Quantity::Loss, true, 0.0, None), over]), Dtype::F32);
        assert_eq!(key.label(), "baseline: entropy | v1 defaults");
    }

    #[test]
    fn failures_group_by_key_in_order_with_the_smallest_minimal_case() {
        let failure = |group, batch, vocab, kl| Failure {
            group: Some(group),
            minimal: spec(batch, vocab, "f32", v1(kl, !kl), None),
            result: result("", vec![math(Quantity::Loss)]),
        };
        let failures = [failure(0, 2, 3, true), failure(2, 1, 5, false), failure(3, 1, 6, true), failure(5, 2, 2, true), failure(6, 1, 5, false)];
        let found = distinct(&failures, Dtype::F32);
        let summary: Vec<(Vec<usize>, usize)> = found.iter().map(|d| (d.members.clone(), d.smallest)).collect();
        // kl: B*T*V 6, 6, 4: the smallest; two_sided: 5, 5: the earliest.
        assert_eq!(summary, [(vec![0, 2, 3], 3), (vec![1, 4], 1)]);
        assert_eq!(found[0].key.switches, ["kl=true"]);
        assert_eq!(found[1].key.switches, ["two_sided=true"]);
    }
}
