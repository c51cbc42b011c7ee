//! Planned signatures: the first groups of a run follow a
//! covering array over SPEC's switches, so that every value of every switch
//! and every pair of values of two switches is checked in a handful of
//! groups, where random draws would leave a rare value or pair to luck.
//!
//! A switch *exercises* a value only where it acts: the KL's estimator,
//! gradient and ratio factor only with the KL term on, the entropy's
//! aggregation only with the bonus on, `two_sided` (delta) only under the
//! ppo loss (SPEC v2: "delta belongs to ppo alone"), the per-row weights
//! only with rollout correction. A pair is *required* when some
//! configuration the run's objective admits exercises both of its values;
//! the plan covers the required pairs, and the coverage report
//! (`coverage`) counts what the checked cases exercised against them.
//!
//! The plan depends on the objective, the dtypes and `--seed` alone, so a
//! seed gives the same run for any `--jobs`.

use grpo_oracle::{Config, PolicyLoss, SwitchInfo, SWITCHES};
use serde_json::Value;

use crate::case::objective::Objective;
use crate::case::prng::Prng;
use crate::case::Dtype;

/// One switch of the plan: its name (docs/spec.md's, or the case field's for
/// the two that are not in `config`) and its values, the v1 value first.
#[derive(Clone, Debug)]
pub struct Factor {
    /// The switch's name (or `dtype`, `is_weights_per_row`).
    pub name: &'static str,
    /// Its values, in the schema's order (the first is v1's).
    pub levels: Vec<Value>,
}

/// What a planned group fixes of its signature.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// The switches.
    pub config: Config,
    /// The float inputs' dtype.
    pub dtype: Dtype,
    /// is_weights of shape [B, 1] rather than [B, T].
    pub is_weights_per_row: bool,
}

/// A value of a factor: (factor index, level index).
pub type Value1 = (usize, usize);
/// A pair of values of two factors, the lower factor index first.
pub type Pair = (Value1, Value1);

/// The factors of a run and what it requires of them.
#[derive(Clone, Debug)]
pub struct Space {
    /// Every factor a row sets.
    pub factors: Vec<Factor>,
    /// Per factor, the levels the objective admits.
    pub allowed: Vec<Vec<usize>>,
    /// Every value some admitted configuration exercises.
    pub values: Vec<Value1>,
    /// Every pair some admitted configuration exercises.
    pub pairs: Vec<Pair>,
    objective: Objective,
}

fn json<T: serde::Serialize>(x: T) -> Value {
    serde_json::to_value(x).expect("a switch value serialises")
}

/// Every switch and its values (the v1 value first). Only these two
/// pseudo-switches are not SPEC config keys: `dtype` and
/// `is_weights_per_row` (rollout weights of shape [B, 1]).
fn all_factors(v2: bool, dtypes: &[Dtype]) -> Vec<Factor> {
    let version = if v2 { 2 } else { 1 };
    let value = |switch: &SwitchInfo, name: &str| if switch.is_bool { json(name == "true") } else { json(name) };
    let mut factors: Vec<Factor> = SWITCHES
        .iter()
        .filter(|switch| switch.since <= version)
        .map(|switch| Factor { name: switch.name, levels: switch.values.iter().map(|v| value(switch, v.name)).collect() })
        .collect();
    if v2 {
        factors.push(Factor { name: "is_weights_per_row", levels: vec![json(false), json(true)] });
    }
    if dtypes.len() > 1 {
        factors.push(Factor { name: "dtype", levels: dtypes.iter().map(|&d| json(d)).collect() });
    }
    factors
}

/// Does switch `name` act in `config`? (See the module's first paragraph.)
pub fn active(name: &str, config: &Config) -> bool {
    match name {
        "kl_estimator" | "kl_gradient" | "kl_times_ratio" => config.kl,
        "entropy_aggregation" => config.entropy_bonus,
        "two_sided" => config.policy_loss == PolicyLoss::Ppo,
        "is_weights_per_row" => config.rollout_correction,
        _ => true,
    }
}

/// The switch whose value `name` needs to act, and that value.
fn enabler(name: &str) -> Option<(&'static str, Value)> {
    match name {
        "kl_estimator" | "kl_gradient" | "kl_times_ratio" => Some(("kl", json(true))),
        "entropy_aggregation" => Some(("entropy_bonus", json(true))),
        "two_sided" => Some(("policy_loss", json(PolicyLoss::Ppo))),
        "is_weights_per_row" => Some(("rollout_correction", json(true))),
        _ => None,
    }
}

impl Space {
    /// The factors of a run drawing `objective` in `dtypes`, and the values
    /// and pairs it requires.
    pub fn new(objective: &Objective, dtypes: &[Dtype]) -> Space {
        let factors = all_factors(objective.is_v2(), dtypes);
        let mut space = Space { factors, allowed: Vec::new(), values: Vec::new(), pairs: Vec::new(), objective: objective.clone() };
        let n = space.factors.len();
        // A level is allowed when the objective keeps it, with whatever it needs to act.
        space.allowed = (0..n)
            .map(|f| {
                (0..space.factors[f].levels.len())
                    .filter(|&l| {
                        let row = space.fitted(&space.forcing(&[(f, l)]));
                        space.exercised(&row).contains(&(f, l))
                    })
                    .collect()
            })
            .collect();
        space.values = (0..n).flat_map(|f| space.allowed[f].iter().map(move |&l| (f, l))).collect();
        for (i, &a) in space.values.iter().enumerate() {
            for &b in &space.values[i + 1..] {
                if a.0 == b.0 {
                    continue;
                }
                let row = space.fitted(&space.forcing(&[a, b]));
                let exercised = space.exercised(&row);
                if exercised.contains(&a) && exercised.contains(&b) {
                    space.pairs.push((a, b));
                }
            }
        }
        space
    }

    /// Levels (one per factor) with `fixed` set, the enablers they need, and v1's values elsewhere.
    fn forcing(&self, fixed: &[Value1]) -> Vec<usize> {
        let mut levels = vec![0; self.factors.len()];
        for &(f, _) in fixed {
            if let Some((name, value)) = enabler(self.factors[f].name) {
                if let Some(e) = self.index(name) {
                    if !fixed.iter().any(|&(g, _)| g == e) {
                        levels[e] = self.factors[e].levels.iter().position(|v| *v == value).unwrap_or(0);
                    }
                }
            }
        }
        for &(f, l) in fixed {
            levels[f] = l;
        }
        levels
    }

    fn index(&self, name: &str) -> Option<usize> {
        self.factors.iter().position(|f| f.name == name)
    }

    /// The row of these levels, fitted to the objective (its preset and pins).
    pub fn fitted(&self, levels: &[usize]) -> Row {
        let mut config = json(Config::default());
        let (mut dtype, mut per_row) = (None, false);
        for (f, &l) in self.factors.iter().zip(levels) {
            let value = f.levels[l].clone();
            match f.name {
                "dtype" => dtype = Some(serde_json::from_value(value).expect("a dtype")),
                "is_weights_per_row" => per_row = value == json(true),
                name => config[name] = value,
            }
        }
        // A space of one dtype has no dtype factor: its rows say f32 and the
        // signature takes the run's dtype (`group::planned_signature`).
        self.fit(config, dtype.unwrap_or(Dtype::F32), per_row)
    }

    /// The row of a configuration (as JSON), fitted to the objective's preset and pins.
    fn fit(&self, config: Value, dtype: Dtype, per_row: bool) -> Row {
        let config: Config = serde_json::from_value(config).expect("switch values");
        let config = self.objective.constrain_with(config, self.objective.preset());
        Row { config, dtype, is_weights_per_row: per_row && config.rollout_correction }
    }

    /// The values a row exercises.
    pub fn exercised(&self, row: &Row) -> Vec<Value1> {
        let config = json(row.config);
        let mut out = Vec::new();
        for (f, factor) in self.factors.iter().enumerate() {
            let value = match factor.name {
                "dtype" => json(row.dtype),
                "is_weights_per_row" => json(row.is_weights_per_row),
                name => config[name].clone(),
            };
            if !active(factor.name, &row.config) {
                continue;
            }
            // A v1 run's configs carry v2 switches at v1 values: they are not factors.
            if let Some(l) = factor.levels.iter().position(|v| *v == value) {
                out.push((f, l));
            }
        }
        out
    }

    /// The pairs a configuration exercises.
    pub fn exercised_pairs(&self, row: &Row) -> Vec<Pair> {
        let values = self.exercised(row);
        let mut out = Vec::new();
        for (i, &a) in values.iter().enumerate() {
            for &b in &values[i + 1..] {
                out.push((a, b));
            }
        }
        out
    }

    /// "name=value" of a value, as `--switch` spells it.
    pub fn name(&self, (f, l): Value1) -> String {
        let value = &self.factors[f].levels[l];
        let value = value.as_str().map(str::to_string).unwrap_or_else(|| value.to_string());
        format!("{}={value}", self.factors[f].name)
    }

    /// A planned row an implementation refused (`reason`: its
    /// NotImplementedError), made simpler: the switches the reason names
    /// (as whole words) back at their v1 value; where it names none that is
    /// off its v1 value, each switch off it goes back with probability 1/2
    /// (`coin` draws). The other values of the row stay planned.
    pub fn relax(&self, row: &Row, switch: Option<&str>, reason: &str, coin: &mut impl FnMut() -> bool) -> Row {
        let mut config = json(row.config);
        let mut per_row = row.is_weights_per_row;
        let defaults = json(Config::default());
        let names = |name: &str| refuses(switch, reason, name);
        let off: Vec<&str> = self
            .factors
            .iter()
            .map(|f| f.name)
            .filter(|&n| match n {
                "dtype" => false,
                "is_weights_per_row" => per_row,
                n => config[n] != defaults[n],
            })
            .collect();
        let named: Vec<&str> = off.iter().copied().filter(|n| names(n)).collect();
        for name in off {
            if (named.is_empty() && coin()) || named.contains(&name) {
                match name {
                    "is_weights_per_row" => per_row = false,
                    n => config[n] = defaults[n].clone(),
                }
            }
        }
        self.fit(config, row.dtype, per_row)
    }

    /// The covering array of a run: rows, each chosen (best of a few
    /// candidates built greedily) to exercise the most values not yet
    /// exercised, then the most pairs, until every required pair is in
    /// some row or `max_rows` is reached. Deterministic in `seed`.
    pub fn plan(&self, seed: u64, max_rows: usize) -> Vec<Row> {
        let mut rng = Prng::keyed(seed, 0x7061_6972, 0, 0);
        let mut values_left: std::collections::BTreeSet<Value1> = self.values.iter().copied().collect();
        let mut pairs_left: std::collections::BTreeSet<Pair> = self.pairs.iter().copied().collect();
        let mut rows = Vec::new();
        while rows.len() < max_rows && !pairs_left.is_empty() {
            let mut best: Option<(usize, Row)> = None;
            for _ in 0..CANDIDATES {
                let row = self.candidate(&mut rng, &values_left, &pairs_left);
                let values = self.exercised(&row);
                let score = 1000 * values.iter().filter(|v| values_left.contains(v)).count()
                    + self.exercised_pairs(&row).iter().filter(|p| pairs_left.contains(p)).count();
                if best.as_ref().is_none_or(|(s, _)| score > *s) {
                    best = Some((score, row));
                }
            }
            let (score, row) = best.expect("CANDIDATES > 0");
            if score == 0 {
                // What is left cannot be reached by a fitted row (a harness bug; never seen).
                break;
            }
            for v in self.exercised(&row) {
                values_left.remove(&v);
            }
            for p in self.exercised_pairs(&row) {
                pairs_left.remove(&p);
            }
            rows.push(row);
        }
        rows
    }

    /// One candidate row: a pair not yet covered (with its enablers), then
    /// each other factor in random order at the level that completes the
    /// most uncovered pairs with the factors already set.
    fn candidate(
        &self,
        rng: &mut Prng,
        values_left: &std::collections::BTreeSet<Value1>,
        pairs_left: &std::collections::BTreeSet<Pair>,
    ) -> Row {
        let n = self.factors.len();
        let seedpair = pairs_left.iter().nth(rng.below(pairs_left.len())).copied().expect("pairs left");
        let mut levels = self.forcing(&[seedpair.0, seedpair.1]);
        let mut set = vec![false; n];
        set[seedpair.0 .0] = true;
        set[seedpair.1 .0] = true;
        if let Some((name, _)) = enabler(self.factors[seedpair.0 .0].name).or(enabler(self.factors[seedpair.1 .0].name)) {
            if let Some(e) = self.index(name) {
                set[e] = true;
            }
        }
        let mut order: Vec<usize> = (0..n).filter(|&f| !set[f]).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i + 1));
        }
        for f in order {
            if self.allowed[f].is_empty() {
                continue; // the objective leaves it no level that acts (a preset's KL off): v1's value
            }
            let mut best = (0usize, self.allowed[f][rng.below(self.allowed[f].len())]);
            for &l in &self.allowed[f] {
                let gain = 1000 * usize::from(values_left.contains(&(f, l)))
                    + (0..n)
                        .filter(|&g| set[g])
                        .filter(|&g| {
                            let (a, b) = if g < f { ((g, levels[g]), (f, l)) } else { ((f, l), (g, levels[g])) };
                            pairs_left.contains(&(a, b))
                        })
                        .count();
                if gain > best.0 {
                    best = (gain, l);
                }
            }
            levels[f] = best.1;
            set[f] = true;
        }
        self.fitted(&levels)
    }
}

/// Does a refusal refuse the switch `name`? By its data when it gives the
/// switch (docs/spec.md, "Refusing a configuration"; `Some("")`: it says
/// no switch relaxes it, a hyperparameter's or a shape's refusal); for a
/// foreign kernel that raises a bare NotImplementedError, by its message
/// naming `name` as a whole word (the fallback: `coverage` counts the
/// refusals read so).
pub fn refuses(switch: Option<&str>, message: &str, name: &str) -> bool {
    match switch {
        Some(switch) => switch == name,
        None => names_word(message, name),
    }
}

/// Does `text` name `word` as a whole word (not inside `kl_estimator` for `kl`)?
fn names_word(text: &str, word: &str) -> bool {
    let part = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(word).any(|(i, _)| {
        let before = text[..i].chars().next_back().is_none_or(|c| !part(c));
        let after = text[i + word.len()..].chars().next().is_none_or(|c| !part(c));
        before && after
    })
}

/// Candidate rows per planned row: more find smaller arrays, each costs
/// factors x levels x factors look-ups.
const CANDIDATES: usize = 24;

#[cfg(test)]
mod tests {
    use super::*;
    use grpo_oracle::{KlEstimator, RatioLevel};

    fn space(objective: Option<&str>, dtypes: &[Dtype]) -> Space {
        Space::new(&Objective::parse(objective, &[], &[]).unwrap(), dtypes)
    }

    #[test]
    fn the_plan_covers_every_required_pair() {
        // Every scope a run can draw: v1, all, and each preset (a preset fixes
        // switches, so some factors have no level that acts), in one and two dtypes.
        let scopes = [None, Some("all")].into_iter().chain(crate::case::objective::PRESETS.iter().map(|p| Some(*p)));
        let both: &[Dtype] = &[Dtype::F32, Dtype::Bf16];
        for (objective, dtypes) in scopes.flat_map(|o| [(o, both), (o, &both[..1])]) {
            let s = space(objective, dtypes);
            let rows = s.plan(1, 200);
            let covered: std::collections::BTreeSet<Pair> = rows.iter().flat_map(|r| s.exercised_pairs(r)).collect();
            let missing: Vec<_> = s.pairs.iter().filter(|p| !covered.contains(p)).map(|&(a, b)| format!("{} & {}", s.name(a), s.name(b))).collect();
            assert!(missing.is_empty(), "{objective:?}: {} rows miss {missing:?}", rows.len());
            assert!(rows.len() <= 30, "{objective:?}: {} rows", rows.len());
            // Every value within the first rows a CI budget draws (60 cases, 4 per group).
            let early: std::collections::BTreeSet<Value1> = rows.iter().take(6).flat_map(|r| s.exercised(r)).collect();
            let missing: Vec<_> = s.values.iter().filter(|v| !early.contains(v)).map(|&v| s.name(v)).collect();
            assert!(missing.is_empty(), "{objective:?}: the first 6 rows miss {missing:?}");
        }
    }

    #[test]
    fn inert_values_are_not_required() {
        let s = space(Some("all"), &[Dtype::F32]);
        let names: Vec<(String, String)> = s.pairs.iter().map(|&(a, b)| (s.name(a), s.name(b))).collect();
        let has = |a: &str, b: &str| names.iter().any(|(x, y)| (x == a && y == b) || (x == b && y == a));
        assert!(has("kl=true", "kl_estimator=abs"));
        assert!(!has("kl=false", "kl_estimator=abs"), "an estimator with the KL off exercises nothing");
        assert!(!has("policy_loss=cispo", "two_sided=true"), "delta belongs to ppo alone");
        assert!(has("policy_loss=sapo", "kl_estimator=k2"));
        // A preset's fixed switch has one value: no pair varies it.
        let trl = space(Some("trl:grpo"), &[Dtype::F32]);
        assert!(trl.values.iter().all(|&v| trl.name(v) != "policy_loss=cispo"));
    }

    #[test]
    fn a_refusal_relaxes_the_switch_it_names() {
        let s = space(Some("all"), &[Dtype::F32]);
        let config = Config { logit_transform: true, ratio_level: RatioLevel::Sequence, kl: true, kl_estimator: KlEstimator::Abs, ..Config::default() };
        let row = Row { config, dtype: Dtype::F32, is_weights_per_row: false };
        let never = &mut || panic!("a named switch needs no coin");
        let reason = "fused_onepass: ratio_level='sequence' couples every token of a row; only 'token' is supported";
        let relaxed = s.relax(&row, None, reason, never);
        assert_eq!(relaxed.config, Config { ratio_level: RatioLevel::Token, ..config });
        // `kl` inside `kl_estimator` is not the switch `kl`.
        let relaxed = s.relax(&row, None, "kl_estimator='abs' is not supported", never);
        assert_eq!(relaxed.config, Config { kl_estimator: KlEstimator::K3, ..config });
        // The switch given as data wins over the words of the message.
        let relaxed = s.relax(&row, Some("logit_transform"), reason, never);
        assert_eq!(relaxed.config, Config { logit_transform: false, ..config });
        // A reason naming no switch: each off-v1 switch back on a coin's heads.
        let mut heads = [false, false, true, true].into_iter(); // kl, logit_transform, ratio_level, kl_estimator
        let relaxed = s.relax(&row, None, "unsupported", &mut || heads.next().unwrap());
        assert_eq!(relaxed.config, Config { ratio_level: RatioLevel::Token, kl_estimator: KlEstimator::K3, ..config });
    }

    #[test]
    fn a_seed_gives_one_plan() {
        let s = space(Some("all"), &[Dtype::F32, Dtype::Bf16]);
        assert_eq!(s.plan(7, 50), s.plan(7, 50));
        assert_ne!(s.plan(7, 50), s.plan(8, 50));
    }
}
