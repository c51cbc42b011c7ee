//! Which objectives a run draws (`check --objective NAME|all`): v1's switches
//! only (the default, and all a v1 implementation is given), every SPEC v2
//! switch freely plus the presets (`all`), or one preset of docs/spec.md's table
//! (`trl:dapo`, `verl:gspo`, `mllm-jax`, ...; `PRESET_TABLE` below, the one
//! list of them the code, `--help` and `grpo-verify presets` read). A preset
//! fixes some switches and hyperparameters and leaves the rest to the
//! generators; `--switch NAME=VALUE` pins one more, and contradicting the
//! preset is an error.

use anyhow::{bail, Result};
use grpo_oracle::{Aggregation, Config, EntropyAggregation, Hparams, KlEstimator, KlGradient, PolicyLoss, RatioLevel, TemperatureMode, HPARAMS, SWITCHES};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::case::vocabulary::NormalizerChoice;

/// What a run draws.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Objective {
    /// v1, all, or one preset.
    pub scope: Scope,
    /// `--switch NAME=VALUE` pins, applied after the preset.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pins: Vec<(String, Value)>,
    /// `--hparam NAME=VALUE` pins of hyperparameters, applied after the preset.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hparam_pins: Vec<(String, f64)>,
}

/// Which switches a run draws from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// SPEC v1's switches only.
    #[default]
    V1,
    /// Every v2 switch, free combinations and presets alike.
    All,
    /// One preset of `PRESET_TABLE` (in JSON, its name).
    #[serde(with = "by_name")]
    Preset(&'static Preset),
}

impl Objective {
    /// Parses `--objective` (None: v1) and `--switch` flags; an unknown
    /// name, a malformed or unknown switch, or a pin that contradicts the
    /// preset is an error naming it.
    pub fn parse(objective: Option<&str>, switches: &[String], hparams: &[String]) -> Result<Objective> {
        let scope = match objective {
            None | Some("v1") => Scope::V1,
            Some("all") => Scope::All,
            Some(name) => match Preset::named(name) {
                Some(preset) => Scope::Preset(preset),
                None => bail!("--objective {name}: unknown; expected all, v1 or a preset: {}", PRESETS.join(", ")),
            },
        };
        let mut pins = Vec::new();
        for s in switches {
            let Some((key, value)) = s.split_once('=') else {
                bail!("--switch {s}: expected NAME=VALUE, e.g. --switch ratio_level=sequence");
            };
            // The pin must name a switch and a value of it.
            let Some(switch) = SWITCHES.iter().find(|switch| switch.name == key) else {
                let names: Vec<&str> = SWITCHES.iter().map(|switch| switch.name).collect();
                bail!("--switch {s}: unknown switch {key:?}; the switches are {}", names.join(", "));
            };
            if !Config::default().set_switch(key, value) {
                let values: Vec<&str> = switch.values.iter().map(|v| v.name).collect();
                bail!("--switch {s}: {key} is one of {}", values.join(", "));
            }
            let value = if switch.is_bool { Value::Bool(value == "true") } else { Value::String(value.to_string()) };
            pins.push((key.to_string(), value));
        }
        let mut hparam_pins = Vec::new();
        for s in hparams {
            let Some((key, value)) = s.split_once('=') else {
                bail!("--hparam {s}: expected NAME=VALUE, e.g. --hparam kl_max=10");
            };
            let names: Vec<&str> = HPARAMS.iter().map(|info| info.name).filter(|&name| name != "normalizer").collect();
            if !names.contains(&key) {
                bail!("--hparam {s}: unknown hyperparameter {key:?}; the pinnable ones are {}", names.join(", "));
            }
            let Ok(v) = value.parse::<f64>() else {
                bail!("--hparam {s}: {value:?} is not a number (inf and -inf are)");
            };
            hparam_pins.push((key.to_string(), v as f32 as f64));
        }
        let objective = Objective { scope, pins, hparam_pins };
        // The pinned values alone must make sense (every switch that reads them on).
        let pinned = objective.constrain_hparams(Hparams::default(), None);
        let probe = Config {
            logit_transform: true,
            two_sided: pinned.delta.is_finite(),
            policy_loss: if pinned.eps_low.is_infinite() { PolicyLoss::Cispo } else { PolicyLoss::Ppo },
            ..Config::default()
        };
        if let Err(e) = pinned.validate(&probe) {
            bail!("--hparam: {e}");
        }
        if objective.pins_on("logit_transform") && is_identity_transform(&pinned) {
            eprintln!(
                "warning: --switch logit_transform=true with --hparam logit_scale=1 and logit_softcap=inf: \
                 the transform is the identity in every case (inert)"
            );
        }
        if let Scope::Preset(preset) = objective.scope {
            let name = preset.name;
            let fixed = preset.fixed_hparams();
            for (key, value) in &objective.hparam_pins {
                if let Some(&(_, fixed)) = fixed.iter().find(|(k, v)| k == key && v != value) {
                    bail!("--hparam {key}={} contradicts --objective {name}, which fixes {key} = {}", *value as f32, fixed as f32);
                }
            }
            let fixed = preset.fixed_switches();
            for (key, value) in &objective.pins {
                if let Some(&(_, fixed)) = fixed.iter().find(|&&(k, v)| k == key && v != pin_text(value)) {
                    bail!("--switch {key}={value} contradicts --objective {name}, which fixes {key} = {fixed}");
                }
            }
        }
        if objective.scope == Scope::V1 {
            if let Some(name) = objective.constrain(Config::default()).v2_switch() {
                bail!("--switch pins a SPEC v2 switch ({name}): add --objective all or a preset");
            }
            // A v1 implementation is never given v2 hyperparameters: the oracle must not use them either.
            let v2 = |key: &str| HPARAMS.iter().any(|info| info.name == key && info.since >= 2);
            if let Some((key, _)) = objective.hparam_pins.iter().find(|(k, _)| v2(k)) {
                bail!("--hparam {key} is a SPEC v2 hyperparameter: add --objective all or a preset");
            }
        }
        Ok(objective)
    }

    /// A name for reports: "v1", "all" or the preset's.
    pub fn name(&self) -> String {
        match &self.scope {
            Scope::V1 => "v1".into(),
            Scope::All => "all".into(),
            Scope::Preset(p) => p.name.to_string(),
        }
    }

    /// The preset the scope fixes (None for v1 and `all`).
    pub fn preset(&self) -> Option<&'static Preset> {
        match self.scope {
            Scope::Preset(preset) => Some(preset),
            _ => None,
        }
    }

    /// Does the run draw v2 configurations at all?
    pub fn is_v2(&self) -> bool {
        self.scope != Scope::V1
    }

    /// A drawn configuration made to fit: v1 switches only, or the
    /// preset's (`preset` picks one when the scope is `all`: None = free),
    /// then the pins.
    pub fn constrain_with(&self, config: Config, preset: Option<&Preset>) -> Config {
        let mut c = match (self.scope, preset) {
            (Scope::V1, _) => v1_only(config),
            (Scope::Preset(preset), _) | (Scope::All, Some(preset)) => preset.config(config),
            (Scope::All, None) => config,
        };
        for (key, value) in &self.pins {
            let known = c.set_switch(key, pin_text(value));
            assert!(known, "pins were checked when parsed");
        }
        c
    }

    /// Could this run have drawn a case with this configuration and these
    /// hyperparameters (`preset`: the name of the one the case was drawn
    /// under)? A remembered failure outside the run's objective (a preset
    /// no longer in the table among them) is not replayed.
    pub fn admits(&self, config: Config, h: Hparams, preset: Option<&str>) -> bool {
        let preset = match (self.scope, preset) {
            (Scope::V1, _) | (Scope::All, None) => None,
            (Scope::All, Some(name)) => match Preset::named(name) {
                Some(preset) => Some(preset),
                None => return false,
            },
            (Scope::Preset(preset), _) => Some(preset),
        };
        self.constrain_with(config, preset) == config && self.constrain_hparams(h, preset) == h
    }

    /// Does `--switch NAME=true` pin this switch on?
    pub fn pins_on(&self, name: &str) -> bool {
        self.pins.iter().any(|(key, value)| key == name && value == &Value::Bool(true))
    }

    /// A drawn configuration fitted to the run's objective, with no preset drawn (`constrain_with(config, None)`).
    pub fn constrain(&self, config: Config) -> Config {
        self.constrain_with(config, None)
    }

    /// Drawn hyperparameters with the preset's fixed values, then the pins.
    pub fn constrain_hparams(&self, h: Hparams, preset: Option<&Preset>) -> Hparams {
        let drawn = h;
        let mut h = match preset {
            Some(p) => p.hparams(h),
            None => h,
        };
        // A switch the user pins on is exercised: a preset that knows no logit
        // transform sets the identity (scale 1, softcap inf), and free draws
        // give it 1 time in 25; with `--switch logit_transform=true` most
        // cases ran the transform inert and a real softcap bug was caught at
        // the 19th case. Its hyperparameters come from the draw
        // then, and the draw's identity becomes the common softcap of 30.
        // Explicit `--hparam` pins still win (below; `parse` warns).
        if self.pins_on("logit_transform") && is_identity_transform(&h) {
            (h.logit_scale, h.logit_softcap) = (drawn.logit_scale, drawn.logit_softcap);
            if is_identity_transform(&h) {
                h.logit_softcap = 30.0;
            }
        }
        for (key, value) in &self.hparam_pins {
            *h.field_mut(key).expect("pinned names were checked when parsed") = *value;
        }
        h
    }
}

fn is_identity_transform(h: &Hparams) -> bool {
    h.logit_scale == 1.0 && h.logit_softcap == f64::INFINITY
}

/// A switch pin's value as the schema names it ("true", "sequence").
fn pin_text(value: &Value) -> &str {
    match value {
        Value::Bool(true) => "true",
        Value::Bool(false) => "false",
        Value::String(s) => s,
        _ => "",
    }
}

/// Config with every v2 switch at its v1 value.
pub fn v1_only(c: Config) -> Config {
    let mut v1 = c;
    for switch in SWITCHES.iter().filter(|switch| switch.since >= 2) {
        let known = v1.set_switch(switch.name, switch.values[0].name);
        assert!(known, "a schema value");
    }
    // v2's value of a v1 switch: verl's seq-mean over a count is, in v1, a seq-mean.
    if v1.aggregation == Aggregation::SeqMeanTokenMeanOverConstant {
        v1.aggregation = Aggregation::SeqMeanTokenMean;
    }
    v1
}

/// Every switch of `c` changed (to tell the switches a preset fixes from
/// those it leaves free).
fn every_switch_changed() -> Config {
    let mut c = Config::default();
    for switch in &SWITCHES {
        let last = switch.values[switch.values.len() - 1].name;
        let known = c.set_switch(switch.name, last);
        assert!(known, "a schema value");
    }
    c
}

/// One of docs/spec.md's presets: the switches and hyperparameters it fixes
/// over drawn ones, and the normalizer it divides by (None: drawn).
#[derive(Debug)]
pub struct Preset {
    /// Its `--objective` name (`trl:dapo`).
    pub name: &'static str,
    config: fn(Config) -> Config,
    hparams: fn(Hparams) -> Hparams,
    /// The normalizer it divides by (None: drawn).
    pub normalizer: Option<NormalizerChoice>,
}

/// docs/spec.md's presets, in its table's order (TRL's `loss_type`s and
/// verl's defaults as read in 2026): the one list that `--objective`, its
/// help, `grpo-verify presets` and the draws of `--objective all` read.
pub static PRESET_TABLE: [Preset; 12] = [
    Preset {
        name: "grpo",
        config: |c| Config { temperature_mode: TemperatureMode::Logits, aggregation: Aggregation::TokenMean, ..v1_only(c) },
        hparams: unclamped,
        normalizer: None,
    },
    Preset { name: "trl:grpo", config: |c| trl(c, Aggregation::SeqMeanTokenMean, PolicyLoss::Ppo, RatioLevel::Token), hparams: unclamped, normalizer: None },
    Preset { name: "trl:bnpo", config: |c| trl(c, Aggregation::TokenMean, PolicyLoss::Ppo, RatioLevel::Token), hparams: unclamped, normalizer: None },
    Preset {
        name: "trl:dr_grpo",
        config: |c| trl(c, Aggregation::SumOverConstant, PolicyLoss::Ppo, RatioLevel::Token),
        hparams: unclamped,
        normalizer: Some(NormalizerChoice::BatchTimesTime),
    },
    Preset {
        name: "trl:dapo",
        config: |c| trl(c, Aggregation::SumOverConstant, PolicyLoss::Ppo, RatioLevel::Token),
        hparams: unclamped,
        normalizer: Some(NormalizerChoice::ValidCount),
    },
    Preset {
        name: "trl:cispo",
        config: |c| trl(c, Aggregation::SumOverConstant, PolicyLoss::Cispo, RatioLevel::Token),
        // TRL's CISPO caps the ratio at epsilon_high, with no lower bound.
        hparams: |h| Hparams { eps_low: f64::INFINITY, ..unclamped(h) },
        normalizer: Some(NormalizerChoice::ValidCount),
    },
    // TRL 1.15 aggregates SAPO as grpo (trl/trainer/grpo_trainer.py:3079,
    // `loss_type in ["grpo", "sapo"]`), found by examples/trl.
    Preset { name: "trl:sapo", config: |c| trl(c, Aggregation::SeqMeanTokenMean, PolicyLoss::Sapo, RatioLevel::Token), hparams: unclamped, normalizer: None },
    Preset {
        name: "trl:gspo",
        config: |c| trl(c, Aggregation::SeqMeanTokenMean, PolicyLoss::Ppo, RatioLevel::Sequence),
        hparams: |h| gspo_band(unclamped(h)),
        normalizer: None,
    },
    Preset {
        name: "verl:vanilla",
        config: |c| verl(c, Aggregation::SeqMeanTokenMeanOverConstant, PolicyLoss::Ppo, RatioLevel::Token, true),
        hparams: |h| verl_kl(token_clamp(Hparams { delta: 3.0, ..unclamped(h) })),
        normalizer: Some(NormalizerChoice::NonEmptyRows),
    },
    Preset {
        name: "verl:gspo",
        config: |c| verl(c, Aggregation::SeqMeanTokenMean, PolicyLoss::Ppo, RatioLevel::SequenceToken, false),
        hparams: |h| verl_kl(gspo_band(Hparams { log_ratio_max: 10.0, ..unclamped(h) })),
        normalizer: None,
    },
    Preset {
        name: "verl:cispo",
        config: |c| verl(c, Aggregation::SeqMeanTokenMeanOverConstant, PolicyLoss::Cispo, RatioLevel::Token, false),
        hparams: |h| verl_kl(token_clamp(unclamped(h))),
        normalizer: Some(NormalizerChoice::NonEmptyRows),
    },
    Preset {
        name: "mllm-jax",
        config: |c| Config { temperature_mode: TemperatureMode::Logp, aggregation: Aggregation::SumOverConstant, kl: false, ..v1_only(c) },
        hparams: unclamped,
        normalizer: Some(NormalizerChoice::GlobalCount),
    },
];

/// The presets' names, in the table's order.
pub const PRESETS: [&str; PRESET_TABLE.len()] = {
    let mut names = [""; PRESET_TABLE.len()];
    let mut i = 0;
    while i < names.len() {
        names[i] = PRESET_TABLE[i].name;
        i += 1;
    }
    names
};

impl Preset {
    /// The preset of this name, if there is one.
    pub fn named(name: &str) -> Option<&'static Preset> {
        PRESET_TABLE.iter().find(|p| p.name == name)
    }

    /// The preset of `--objective NAME` (`flag`), or an error naming the flag and the presets.
    pub fn parse(flag: &str, name: &str) -> Result<&'static Preset> {
        match Preset::named(name) {
            Some(p) => Ok(p),
            None => bail!("{flag} {name}: not a preset; the presets are {}", PRESETS.join(", ")),
        }
    }

    /// The switches this preset fixes, over a drawn `c`.
    pub fn config(&self, c: Config) -> Config {
        (self.config)(c)
    }

    /// The hyperparameters this preset fixes, over drawn `h` (the normalizer's choice is `normalizer`).
    pub fn hparams(&self, h: Hparams) -> Hparams {
        (self.hparams)(h)
    }

    /// The switches it fixes, as the schema names them (switch, value): those
    /// that come out the same from two draws that differ in every switch.
    pub fn fixed_switches(&self) -> Vec<(&'static str, &'static str)> {
        let (fixed, free) = (self.config(Config::default()).switch_values(), self.config(every_switch_changed()).switch_values());
        SWITCHES.iter().zip(fixed.into_iter().zip(free)).filter(|(_, (a, b))| a == b).map(|(switch, (value, _))| (switch.name, value)).collect()
    }

    /// The hyperparameters it fixes (name, value): those that come out the
    /// same from two draws that differ in every hyperparameter.
    pub fn fixed_hparams(&self) -> Vec<(&'static str, f64)> {
        let mut every_other = Hparams::default();
        for (i, info) in HPARAMS.iter().enumerate() {
            let x = every_other.field_mut(info.name).expect("a schema name");
            *x = if x.is_finite() { *x + 0.125 * (i + 1) as f64 } else { x.signum() * (2 + i) as f64 };
        }
        let (fixed, free) = (self.hparams(Hparams::default()), self.hparams(every_other));
        HPARAMS.iter().map(|info| (info.name, fixed.get(info.name), free.get(info.name))).filter(|(_, a, b)| a == b).map(|(name, a, _)| (name, a.expect("a schema name"))).collect()
    }
}

impl PartialEq for Preset {
    fn eq(&self, other: &Preset) -> bool {
        self.name == other.name
    }
}

impl Eq for Preset {}

/// A preset in JSON (reports, repro files): its name.
mod by_name {
    use super::Preset;
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(preset: &&'static Preset, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(preset.name)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<&'static Preset, D::Error> {
        let name = String::deserialize(d)?;
        Preset::named(&name).ok_or_else(|| D::Error::custom(format!("{name:?} is not a preset; the presets are {}", super::PRESETS.join(", "))))
    }
}

/// Both libraries: logits mode, no transform, k3 (verl's low_var_kl).
fn library(c: Config, aggregation: Aggregation, policy_loss: PolicyLoss, ratio_level: RatioLevel) -> Config {
    Config { temperature_mode: TemperatureMode::Logits, aggregation, logit_transform: false, ratio_level, policy_loss, kl_estimator: KlEstimator::K3, ..c }
}

/// TRL: k3 with its own gradient, the entropy as a token mean of its own.
fn trl(c: Config, aggregation: Aggregation, policy_loss: PolicyLoss, ratio_level: RatioLevel) -> Config {
    Config {
        kl_gradient: KlGradient::Own,
        entropy_aggregation: EntropyAggregation::TokenMean,
        two_sided: c.two_sided && policy_loss == PolicyLoss::Ppo,
        ..library(c, aggregation, policy_loss, ratio_level)
    }
}

/// verl: k3 or k3+ (straight-through), the entropy in loss_t, dual-clip as delta.
fn verl(c: Config, aggregation: Aggregation, policy_loss: PolicyLoss, ratio_level: RatioLevel, two_sided: bool) -> Config {
    Config { kl_times_ratio: false, entropy_aggregation: EntropyAggregation::Same, two_sided, ..library(c, aggregation, policy_loss, ratio_level) }
}

/// No log-ratio or KL clamp, no logit transform.
fn unclamped(h: Hparams) -> Hparams {
    Hparams {
        log_ratio_min: f64::NEG_INFINITY,
        log_ratio_max: f64::INFINITY,
        kl_log_ratio_clamp: f64::INFINITY,
        kl_max: f64::INFINITY,
        logit_scale: 1.0,
        logit_softcap: f64::INFINITY,
        ..h
    }
}

/// verl's low_var_kl: k3 with its log-ratio clamped at 20 and capped at 10.
fn verl_kl(h: Hparams) -> Hparams {
    Hparams { kl_log_ratio_clamp: 20.0, kl_max: 10.0, ..h }
}

/// verl's token log-ratio clamp, [-20, 20].
fn token_clamp(h: Hparams) -> Hparams {
    Hparams { log_ratio_min: -20.0, log_ratio_max: 20.0, ..h }
}

/// GSPO's paper band (TRL's docs): 3e-4 / 4e-4.
fn gspo_band(h: Hparams) -> Hparams {
    Hparams { eps_low: 3e-4f32 as f64, eps_high: 4e-4f32 as f64, ..h }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A preset is a row of the table: an unknown name is an error where it
    /// is read (a flag, a report), never a panic where it is used.
    #[test]
    fn a_preset_is_a_row_of_the_table() {
        assert!(Preset::named("trl:nope").is_none());
        let e = Objective::parse(Some("trl:nope"), &[], &[]).unwrap_err().to_string();
        assert!(e.contains("--objective trl:nope: unknown") && e.contains("verl:vanilla"), "{e}");
        let e = serde_json::from_str::<Objective>(r#"{"scope": {"preset": "trl:nope"}}"#).unwrap_err().to_string();
        assert!(e.contains("\"trl:nope\" is not a preset"), "{e}");
        let dapo: Objective = serde_json::from_str(r#"{"scope": {"preset": "trl:dapo"}}"#).unwrap();
        assert_eq!(dapo.preset().map(|p| p.name), Some("trl:dapo"));
        assert_eq!(serde_json::to_value(&dapo).unwrap()["scope"]["preset"], "trl:dapo");
        // A remembered case of a preset the table no longer has is outside any run.
        let all = Objective::parse(Some("all"), &[], &[]).unwrap();
        assert!(!all.admits(Config::default(), Hparams::default(), Some("trl:nope")));
        // What a preset fixes: TRL's CISPO has no lower clip edge and is one-sided; DAPO leaves two_sided to the draw.
        let cispo = Preset::named("trl:cispo").unwrap();
        assert!(cispo.fixed_switches().contains(&("two_sided", "false")));
        assert!(cispo.fixed_hparams().contains(&("eps_low", f64::INFINITY)));
        assert!(!Preset::named("trl:dapo").unwrap().fixed_switches().iter().any(|&(name, _)| name == "two_sided"));
        assert_eq!(PRESETS.len(), PRESET_TABLE.len());
    }

    /// docs/spec.md's table of presets says what each fixes as the code
    /// fixes it: its aggregation, its policy loss (v1's ppo where the row
    /// says "v1"), a ratio level other than token, and the normalizer it
    /// divides by, each a whole word of its row.
    #[test]
    fn the_spec_table_says_what_each_preset_fixes() {
        let spec = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/spec.md")).expect("docs/spec.md");
        for preset in &PRESET_TABLE {
            let row = spec
                .lines()
                .find(|line| line.starts_with(&format!("| `{}` |", preset.name)))
                .unwrap_or_else(|| panic!("docs/spec.md has no row for preset {}", preset.name));
            let words: Vec<&str> = row.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).collect();
            let fixed = preset.fixed_switches();
            let value = |switch: &str| fixed.iter().find(|(name, _)| *name == switch).map(|&(_, v)| v);
            let aggregation = value("aggregation").expect("every preset fixes its aggregation");
            assert!(words.contains(&aggregation), "docs/spec.md's row for {} does not name its aggregation {aggregation}:\n{row}", preset.name);
            let policy = value("policy_loss").expect("every preset fixes its policy loss");
            assert!(words.contains(&policy) || (policy == "ppo" && words.contains(&"v1")), "{}'s row does not name {policy}:\n{row}", preset.name);
            if let Some(level) = value("ratio_level").filter(|&level| level != "token") {
                assert!(words.contains(&level), "{}'s row does not name ratio level {level}:\n{row}", preset.name);
            }
            let phrase = match preset.normalizer {
                None | Some(NormalizerChoice::Constant) => None,
                Some(NormalizerChoice::BatchTimesTime) => Some("B * T"),
                Some(NormalizerChoice::ValidCount) => Some("the valid-token count"),
                Some(NormalizerChoice::GlobalCount) => Some("the global valid count"),
                Some(NormalizerChoice::NonEmptyRows) => Some("the non-empty rows"),
            };
            if let Some(phrase) = phrase {
                assert!(row.contains(phrase), "{}'s row does not say its normalizer ({phrase}):\n{row}", preset.name);
            }
        }
    }
}
