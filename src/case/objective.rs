//! Which objectives a run draws (`check --objective NAME|all`): v1's switches
//! only (the default, and all a v1 implementation is given), every SPEC v2
//! switch freely plus the presets (`all`), or one preset of docs/spec.md's table
//! (`trl:dapo`, `verl:gspo`, `mllm-jax`, ...). A preset fixes some switches
//! and hyperparameters and leaves the rest to the generators; `--switch
//! NAME=VALUE` pins one more, and contradicting the preset is an error.

use anyhow::{bail, Result};
use grpo_oracle::{Aggregation, Config, EntropyAggregation, Hparams, KlEstimator, KlGradient, PolicyLoss, RatioLevel, TemperatureMode, HPARAMS, SWITCHES};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::case::vocabulary::NormalizerChoice;

/// docs/spec.md's presets, in its table's order.
pub const PRESETS: [&str; 12] = [
    "grpo",
    "trl:grpo",
    "trl:bnpo",
    "trl:dr_grpo",
    "trl:dapo",
    "trl:cispo",
    "trl:sapo",
    "trl:gspo",
    "verl:vanilla",
    "verl:gspo",
    "verl:cispo",
    "mllm-jax",
];

/// What a run draws.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Objective {
    pub scope: Scope,
    /// `--switch NAME=VALUE` pins, applied after the preset.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pins: Vec<(String, Value)>,
    /// `--hparam NAME=VALUE` pins of hyperparameters, applied after the preset.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hparam_pins: Vec<(String, f64)>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// SPEC v1's switches only.
    #[default]
    V1,
    /// Every v2 switch, free combinations and presets alike.
    All,
    Preset(String),
}

impl Objective {
    /// Parses `--objective` (None: v1) and `--switch` flags; an unknown
    /// name, a malformed or unknown switch, or a pin that contradicts the
    /// preset is an error naming it.
    pub fn parse(objective: Option<&str>, switches: &[String], hparams: &[String]) -> Result<Objective> {
        let scope = match objective {
            None | Some("v1") => Scope::V1,
            Some("all") => Scope::All,
            Some(name) if PRESETS.contains(&name) => Scope::Preset(name.to_string()),
            Some(name) => bail!("--objective {name}: unknown; expected all, v1 or a preset: {}", PRESETS.join(", ")),
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
        if let Scope::Preset(name) = &objective.scope {
            // A hyperparameter the preset fixes comes out the same from two
            // draws that differ in every hyperparameter.
            let (fixed, _) = preset_hparams(name, Hparams::default());
            let mut every_other = Hparams::default();
            for (i, info) in HPARAMS.iter().enumerate() {
                let x = every_other.field_mut(info.name).expect("a schema name");
                *x = if x.is_finite() { *x + 0.125 * (i + 1) as f64 } else { x.signum() * (2 + i) as f64 };
            }
            let (other, _) = preset_hparams(name, every_other);
            for (key, value) in &objective.hparam_pins {
                let (fixed_value, other_value) = (fixed.get(key), other.get(key));
                if fixed_value == other_value && fixed_value != Some(*value) {
                    bail!("--hparam {key}={} contradicts --objective {name}, which fixes {key} = {}", *value as f32, fixed_value.unwrap_or(f64::NAN) as f32);
                }
            }
        }
        if let Scope::Preset(name) = &objective.scope {
            let fixed = preset_config(name, Config::default());
            let free = preset_config(name, every_switch_changed());
            for (key, value) in &objective.pins {
                let (fixed, free) = (switch_value(&fixed, key), switch_value(&free, key));
                if fixed == free && fixed != pin_text(value) {
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
            Scope::Preset(p) => p.clone(),
        }
    }

    /// The preset the scope fixes (None for v1 and `all`).
    pub fn preset(&self) -> Option<&str> {
        match &self.scope {
            Scope::Preset(name) => Some(name.as_str()),
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
    pub fn constrain_with(&self, config: Config, preset: Option<&str>) -> Config {
        let mut c = match (&self.scope, preset) {
            (Scope::V1, _) => v1_only(config),
            (Scope::Preset(name), _) => preset_config(name, config),
            (Scope::All, Some(name)) => preset_config(name, config),
            (Scope::All, None) => config,
        };
        for (key, value) in &self.pins {
            let known = c.set_switch(key, pin_text(value));
            assert!(known, "pins were checked when parsed");
        }
        c
    }

    /// Could this run have drawn a case with this configuration and these
    /// hyperparameters (`preset`: the one the case was drawn under)? A
    /// remembered failure outside the run's objective is not replayed.
    pub fn admits(&self, config: Config, h: Hparams, preset: Option<&str>) -> bool {
        let preset = match &self.scope {
            Scope::V1 => None,
            Scope::All => preset,
            Scope::Preset(name) => Some(name.as_str()),
        };
        self.constrain_with(config, preset) == config && self.constrain_hparams(h, preset) == h
    }

    /// Does `--switch NAME=true` pin this switch on?
    pub fn pins_on(&self, name: &str) -> bool {
        self.pins.iter().any(|(key, value)| key == name && value == &Value::Bool(true))
    }

    pub fn constrain(&self, config: Config) -> Config {
        self.constrain_with(config, None)
    }

    /// Drawn hyperparameters with the preset's fixed values (and its
    /// normalizer, when it fixes one), then the pins.
    pub fn constrain_hparams(&self, h: Hparams, preset: Option<&str>) -> Hparams {
        let drawn = h;
        let mut h = match preset {
            Some(p) => preset_hparams(p, h).0,
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

/// The value of switch `name` in `c`, as the schema names it.
fn switch_value(c: &Config, name: &str) -> &'static str {
    SWITCHES.iter().zip(c.switch_values()).find(|(switch, _)| switch.name == name).map_or("", |(_, value)| value)
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

/// The switches preset `name` fixes, over a drawn `c` (docs/spec.md, "Presets";
/// TRL's `loss_type`s and verl's defaults as read in 2026).
pub fn preset_config(name: &str, c: Config) -> Config {
    // Both libraries: logits mode, no transform, k3 (verl's low_var_kl).
    let library = |aggregation, policy_loss, ratio_level| Config {
        temperature_mode: TemperatureMode::Logits,
        aggregation,
        logit_transform: false,
        ratio_level,
        policy_loss,
        kl_estimator: KlEstimator::K3,
        ..c
    };
    // TRL: k3 with its own gradient, the entropy as a token mean of its own.
    let trl = |aggregation, policy_loss, ratio_level| Config {
        kl_gradient: KlGradient::Own,
        entropy_aggregation: EntropyAggregation::TokenMean,
        two_sided: c.two_sided && policy_loss == PolicyLoss::Ppo,
        ..library(aggregation, policy_loss, ratio_level)
    };
    // verl: k3 or k3+ (straight-through), the entropy in loss_t, dual-clip as delta.
    let verl = |aggregation, policy_loss, ratio_level, two_sided| Config {
        kl_times_ratio: false,
        entropy_aggregation: EntropyAggregation::Same,
        two_sided,
        ..library(aggregation, policy_loss, ratio_level)
    };
    use Aggregation::*;
    match name {
        "grpo" => Config { temperature_mode: TemperatureMode::Logits, aggregation: TokenMean, ..v1_only(c) },
        "trl:grpo" => trl(SeqMeanTokenMean, PolicyLoss::Ppo, RatioLevel::Token),
        "trl:bnpo" => trl(TokenMean, PolicyLoss::Ppo, RatioLevel::Token),
        "trl:dr_grpo" => trl(SumOverConstant, PolicyLoss::Ppo, RatioLevel::Token),
        "trl:dapo" => trl(SumOverConstant, PolicyLoss::Ppo, RatioLevel::Token),
        "trl:cispo" => trl(SumOverConstant, PolicyLoss::Cispo, RatioLevel::Token),
        // TRL 1.15 aggregates SAPO as grpo (trl/trainer/grpo_trainer.py:3079,
        // `loss_type in ["grpo", "sapo"]`), found by examples/trl.
        "trl:sapo" => trl(SeqMeanTokenMean, PolicyLoss::Sapo, RatioLevel::Token),
        "trl:gspo" => trl(SeqMeanTokenMean, PolicyLoss::Ppo, RatioLevel::Sequence),
        "verl:vanilla" => verl(SeqMeanTokenMeanOverConstant, PolicyLoss::Ppo, RatioLevel::Token, true),
        "verl:gspo" => verl(SeqMeanTokenMean, PolicyLoss::Ppo, RatioLevel::SequenceToken, false),
        "verl:cispo" => verl(SeqMeanTokenMeanOverConstant, PolicyLoss::Cispo, RatioLevel::Token, false),
        "mllm-jax" => Config {
            temperature_mode: TemperatureMode::Logp,
            aggregation: SumOverConstant,
            kl: false,
            ..v1_only(c)
        },
        other => panic!("preset {other:?} is not in PRESETS"),
    }
}

/// The hyperparameters preset `name` fixes over drawn ones, and the
/// normalizer it divides by (None: drawn).
pub fn preset_hparams(name: &str, h: Hparams) -> (Hparams, Option<NormalizerChoice>) {
    let verl_kl = |h: Hparams| Hparams { kl_log_ratio_clamp: 20.0, kl_max: 10.0, ..h };
    let token_clamp = |h: Hparams| Hparams { log_ratio_min: -20.0, log_ratio_max: 20.0, ..h };
    let unclamped = Hparams { log_ratio_min: f64::NEG_INFINITY, log_ratio_max: f64::INFINITY, kl_log_ratio_clamp: f64::INFINITY, kl_max: f64::INFINITY, logit_scale: 1.0, logit_softcap: f64::INFINITY, ..h };
    match name {
        "grpo" | "mllm-jax" => (unclamped, (name == "mllm-jax").then_some(NormalizerChoice::GlobalCount)),
        "trl:dr_grpo" => (unclamped, Some(NormalizerChoice::BatchTimesTime)),
        "trl:dapo" => (unclamped, Some(NormalizerChoice::ValidCount)),
        // TRL's CISPO caps the ratio at epsilon_high, with no lower bound.
        "trl:cispo" => (Hparams { eps_low: f64::INFINITY, ..unclamped }, Some(NormalizerChoice::ValidCount)),
        // GSPO's paper band (TRL's docs): 3e-4 / 4e-4.
        "trl:gspo" => (Hparams { eps_low: 3e-4f32 as f64, eps_high: 4e-4f32 as f64, ..unclamped }, None),
        "trl:grpo" | "trl:bnpo" | "trl:sapo" => (unclamped, None),
        "verl:vanilla" => (verl_kl(token_clamp(Hparams { delta: 3.0, ..unclamped })), Some(NormalizerChoice::NonEmptyRows)),
        "verl:gspo" => (verl_kl(Hparams { log_ratio_max: 10.0, eps_low: 3e-4f32 as f64, eps_high: 4e-4f32 as f64, ..unclamped }), None),
        "verl:cispo" => (verl_kl(token_clamp(unclamped)), Some(NormalizerChoice::NonEmptyRows)),
        other => panic!("preset {other:?} is not in PRESETS"),
    }
}
