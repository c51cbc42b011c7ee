//! Which objectives a run draws (`check --objective NAME|all`): v1's switches
//! only (the default, and all a v1 implementation is given), every SPEC v2
//! switch freely plus the presets (`all`), or one preset of docs/spec.md's table
//! (`trl:dapo`, `verl:gspo`, `mllm-jax`, ...). A preset fixes some switches
//! and hyperparameters and leaves the rest to the generators; `--switch
//! NAME=VALUE` pins one more, and contradicting the preset is an error.

use anyhow::{bail, Result};
use grpo_oracle::{Aggregation, Config, EntropyAggregation, Hparams, KlEstimator, KlGradient, PolicyLoss, RatioLevel, TemperatureMode};
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
            let value: Value = serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.to_string()));
            // The pin must name a switch and a value of it.
            let mut probe = serde_json::to_value(Config::default())?;
            if probe.get(key).is_none() {
                let names: Vec<String> = probe.as_object().map(|o| o.keys().cloned().collect()).unwrap_or_default();
                bail!("--switch {s}: unknown switch {key:?}; the switches are {}", names.join(", "));
            }
            probe[key] = value.clone();
            if let Err(e) = serde_json::from_value::<Config>(probe) {
                bail!("--switch {s}: {e}");
            }
            pins.push((key.to_string(), value));
        }
        let mut hparam_pins = Vec::new();
        for s in hparams {
            let Some((key, value)) = s.split_once('=') else {
                bail!("--hparam {s}: expected NAME=VALUE, e.g. --hparam kl_max=10");
            };
            let names = hparam_names();
            if !names.contains(&key.to_string()) || key == "normalizer" {
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
            let every_other = Hparams {
                eps_low: 0.125,
                eps_high: 0.375,
                temperature: 0.5,
                beta: 0.25,
                entropy_coef: 0.125,
                delta: 7.0,
                normalizer: 3.0,
                logit_scale: 3.0,
                logit_softcap: 7.0,
                log_ratio_min: -3.0,
                log_ratio_max: 3.0,
                sapo_tau_pos: 2.0,
                sapo_tau_neg: 3.0,
                kl_log_ratio_clamp: 4.0,
                kl_max: 5.0,
            };
            let (other, _) = preset_hparams(name, every_other);
            let (fixed, other) = (serde_json::to_value(fixed)?, serde_json::to_value(other)?);
            for (key, value) in &objective.hparam_pins {
                let sign = if key == "log_ratio_min" { -1.0 } else { 1.0 };
                let fixed_value = fixed[key].as_f64().unwrap_or(sign * f64::INFINITY);
                if fixed[key] == other[key] && fixed_value != *value {
                    bail!("--hparam {key}={} contradicts --objective {name}, which fixes {key} = {}", *value as f32, fixed_value as f32);
                }
            }
        }
        if let Scope::Preset(name) = &objective.scope {
            let fixed = serde_json::to_value(preset_config(name, Config::default()))?;
            let free = serde_json::to_value(preset_config(name, flipped(Config::default())))?;
            for (key, value) in &objective.pins {
                if fixed[key] == free[key] && fixed[key] != *value {
                    bail!("--switch {key}={value} contradicts --objective {name}, which fixes {key} = {}", fixed[key]);
                }
            }
        }
        if objective.scope == Scope::V1 {
            if let Some(name) = objective.constrain(Config::default()).v2_switch() {
                bail!("--switch pins a SPEC v2 switch ({name}): add --objective all or a preset");
            }
            // A v1 implementation is never given v2 hyperparameters: the oracle must not use them either.
            const V1_HPARAMS: [&str; 6] = ["eps_low", "eps_high", "temperature", "beta", "entropy_coef", "delta"];
            if let Some((key, _)) = objective.hparam_pins.iter().find(|(k, _)| !V1_HPARAMS.contains(&k.as_str())) {
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
        if !self.pins.is_empty() {
            let mut v = serde_json::to_value(c).expect("a config serialises");
            for (key, value) in &self.pins {
                v[key] = value.clone();
            }
            c = serde_json::from_value(v).expect("pins were checked when parsed");
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
        // the 19th case (issue 28). Its hyperparameters come from the draw
        // then, and the draw's identity becomes the common softcap of 30.
        // Explicit `--hparam` pins still win (below; `parse` warns).
        if self.pins_on("logit_transform") && is_identity_transform(&h) {
            (h.logit_scale, h.logit_softcap) = (drawn.logit_scale, drawn.logit_softcap);
            if is_identity_transform(&h) {
                h.logit_softcap = 30.0;
            }
        }
        if !self.hparam_pins.is_empty() {
            let mut v = serde_json::to_value(h).expect("hparams serialise");
            for (key, value) in &self.hparam_pins {
                // JSON has no infinity: the serde form of +-inf is null.
                v[key] = if value.is_finite() { serde_json::json!(value) } else { Value::Null };
            }
            // (null reads back as each field's infinity: -inf for log_ratio_min.)
            h = serde_json::from_value(v).expect("pinned names were checked when parsed");
        }
        h
    }
}

fn is_identity_transform(h: &Hparams) -> bool {
    h.logit_scale == 1.0 && h.logit_softcap == f64::INFINITY
}

/// The hyperparameters' names (docs/spec.md's, v1 and v2).
fn hparam_names() -> Vec<String> {
    serde_json::to_value(Hparams::default()).ok().and_then(|v| v.as_object().map(|o| o.keys().cloned().collect())).unwrap_or_default()
}


/// Config with every v2 switch at its v1 value.
pub fn v1_only(c: Config) -> Config {
    let aggregation = if c.aggregation == Aggregation::SeqMeanTokenMeanOverConstant { Aggregation::SeqMeanTokenMean } else { c.aggregation };
    Config {
        temperature_mode: c.temperature_mode,
        aggregation,
        on_policy: c.on_policy,
        kl: c.kl,
        entropy_bonus: c.entropy_bonus,
        two_sided: c.two_sided,
        ..Config::default()
    }
}

/// Every switch of `c` changed (to tell the switches a preset fixes from
/// those it leaves free).
fn flipped(c: Config) -> Config {
    Config {
        temperature_mode: TemperatureMode::Logp,
        aggregation: Aggregation::SumOverConstant,
        on_policy: !c.on_policy,
        kl: !c.kl,
        entropy_bonus: !c.entropy_bonus,
        two_sided: !c.two_sided,
        logit_transform: !c.logit_transform,
        ratio_level: RatioLevel::SequenceToken,
        policy_loss: PolicyLoss::Sapo,
        kl_estimator: KlEstimator::Abs,
        kl_gradient: KlGradient::K2,
        kl_times_ratio: !c.kl_times_ratio,
        entropy_aggregation: EntropyAggregation::TokenMean,
        rollout_correction: !c.rollout_correction,
    }
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
