//! Static configuration and runtime hyperparameters (docs/spec.md, "Hyperparameters").

use crate::error::{input_error, InputError};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum TemperatureMode {
    /// softmax(z / tau): TRL, verl, Liger.
    Logits,
    /// log_softmax(z) / tau; entropy of softmax(z).
    Logp,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Aggregation {
    TokenMean,
    SeqMeanTokenMean,
    SumOverConstant,
    /// v2: sum_b [ sum_t(m * loss_t) / max(sum_t m, 1) ] / normalizer (verl's seq-mean modes).
    SeqMeanTokenMeanOverConstant,
}

/// v2: which ratio the policy loss sees (docs/spec.md, "Ratio level").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum RatioLevel {
    /// r_t = exp(clamp(logp_t - old_t)).
    #[default]
    Token,
    /// GSPO: r_t = s_b = exp(clamp(L_b)), L_b the row's mean log-ratio.
    Sequence,
    /// GSPO-token: the value of `Sequence`, gradient s_b per token.
    SequenceToken,
}

/// v2: the policy term (docs/spec.md, "Policy loss").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum PolicyLoss {
    #[default]
    Ppo,
    /// -sg(clip(r, 1 - eps_low, 1 + eps_high)) * A * logp.
    Cispo,
    /// -sigmoid(k (r - 1)) * (4 / k) * A.
    Sapo,
}

/// v2: the KL estimator of d = ref - logp (docs/spec.md, "KL estimators").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum KlEstimator {
    /// -d.
    K1,
    /// |d|.
    Abs,
    /// d^2 / 2.
    K2,
    /// exp(dc) - dc - 1 with dc = clamp(d), then clamped to [-kl_max, kl_max].
    #[default]
    K3,
}

/// v2: whose gradient the KL term has.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum KlGradient {
    /// The estimator's own (v1).
    #[default]
    Own,
    /// Straight-through: the estimator's value, k2's gradient on the unclamped d.
    K2,
}

/// v2: how the entropy bonus is averaged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum EntropyAggregation {
    /// Part of loss_t, aggregated with it (v1, verl).
    #[default]
    Same,
    /// TRL: a token mean of its own, whatever the loss's aggregation.
    TokenMean,
}

/// The static switches of docs/spec.md. The v2 ones default to v1's behaviour
/// (and a repro written before v2 reads with them off).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Config {
    pub temperature_mode: TemperatureMode,
    pub aggregation: Aggregation,
    pub on_policy: bool,
    pub kl: bool,
    pub entropy_bonus: bool,
    pub two_sided: bool,
    #[cfg_attr(feature = "serde", serde(default))]
    pub logit_transform: bool,
    #[cfg_attr(feature = "serde", serde(default))]
    pub ratio_level: RatioLevel,
    #[cfg_attr(feature = "serde", serde(default))]
    pub policy_loss: PolicyLoss,
    #[cfg_attr(feature = "serde", serde(default))]
    pub kl_estimator: KlEstimator,
    #[cfg_attr(feature = "serde", serde(default))]
    pub kl_gradient: KlGradient,
    #[cfg_attr(feature = "serde", serde(default))]
    pub kl_times_ratio: bool,
    #[cfg_attr(feature = "serde", serde(default))]
    pub entropy_aggregation: EntropyAggregation,
    /// True exactly when `is_weights` is given.
    #[cfg_attr(feature = "serde", serde(default))]
    pub rollout_correction: bool,
}

impl Default for Config {
    /// v1's defaults: logits mode, token mean, off-policy, every term off.
    fn default() -> Self {
        Config {
            temperature_mode: TemperatureMode::Logits,
            aggregation: Aggregation::TokenMean,
            on_policy: false,
            kl: false,
            entropy_bonus: false,
            two_sided: false,
            logit_transform: false,
            ratio_level: RatioLevel::Token,
            policy_loss: PolicyLoss::Ppo,
            kl_estimator: KlEstimator::K3,
            kl_gradient: KlGradient::Own,
            kl_times_ratio: false,
            entropy_aggregation: EntropyAggregation::Same,
            rollout_correction: false,
        }
    }
}

impl Config {
    /// The first SPEC v2 switch this configuration turns on (its name and
    /// value), or None for a v1 configuration: what a v1 implementation
    /// cannot be given.
    pub fn v2_switch(&self) -> Option<String> {
        let d = Config::default();
        let on = [
            (self.aggregation == Aggregation::SeqMeanTokenMeanOverConstant, "aggregation", format!("{:?}", self.aggregation)),
            (self.logit_transform, "logit_transform", "true".into()),
            (self.ratio_level != d.ratio_level, "ratio_level", format!("{:?}", self.ratio_level)),
            (self.policy_loss != d.policy_loss, "policy_loss", format!("{:?}", self.policy_loss)),
            (self.kl_estimator != d.kl_estimator, "kl_estimator", format!("{:?}", self.kl_estimator)),
            (self.kl_gradient != d.kl_gradient, "kl_gradient", format!("{:?}", self.kl_gradient)),
            (self.kl_times_ratio, "kl_times_ratio", "true".into()),
            (self.entropy_aggregation != d.entropy_aggregation, "entropy_aggregation", format!("{:?}", self.entropy_aggregation)),
            (self.rollout_correction, "rollout_correction", "true".into()),
        ];
        on.into_iter().find(|(is_on, _, _)| *is_on).map(|(_, name, value)| format!("{name} = {value}"))
    }
}

/// Runtime hyperparameters, as the f32 values an implementation receives.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Hparams {
    /// +inf for TRL's CISPO (no lower clip edge; null in JSON).
    #[cfg_attr(feature = "serde", serde(with = "infinite_as_null"))]
    pub eps_low: f64,
    pub eps_high: f64,
    pub temperature: f64,
    pub beta: f64,
    pub entropy_coef: f64,
    /// +inf when two-sided clipping is off (null in JSON).
    #[cfg_attr(feature = "serde", serde(with = "infinite_as_null"))]
    pub delta: f64,
    pub normalizer: f64,
    /// v2 (docs/spec.md "Version 2"); every default gives v1. Infinities travel as null.
    #[cfg_attr(feature = "serde", serde(default = "one"))]
    pub logit_scale: f64,
    #[cfg_attr(feature = "serde", serde(default = "inf", with = "infinite_as_null"))]
    pub logit_softcap: f64,
    #[cfg_attr(feature = "serde", serde(default = "neg_inf", with = "neg_infinite_as_null"))]
    pub log_ratio_min: f64,
    #[cfg_attr(feature = "serde", serde(default = "inf", with = "infinite_as_null"))]
    pub log_ratio_max: f64,
    #[cfg_attr(feature = "serde", serde(default = "one"))]
    pub sapo_tau_pos: f64,
    #[cfg_attr(feature = "serde", serde(default = "sapo_tau_neg"))]
    pub sapo_tau_neg: f64,
    #[cfg_attr(feature = "serde", serde(default = "inf", with = "infinite_as_null"))]
    pub kl_log_ratio_clamp: f64,
    #[cfg_attr(feature = "serde", serde(default = "inf", with = "infinite_as_null"))]
    pub kl_max: f64,
}

#[cfg(feature = "serde")]
fn one() -> f64 {
    1.0
}
#[cfg(feature = "serde")]
fn inf() -> f64 {
    f64::INFINITY
}
#[cfg(feature = "serde")]
fn neg_inf() -> f64 {
    f64::NEG_INFINITY
}
#[cfg(feature = "serde")]
fn sapo_tau_neg() -> f64 {
    Hparams::default().sapo_tau_neg
}

impl Default for Hparams {
    /// v1's neutral values (no clipping band, tau = 1, every term off) and
    /// v2's defaults (TRL's SAPO temperatures 1.0 and 1.05, as f32).
    fn default() -> Self {
        Hparams {
            eps_low: 0.0,
            eps_high: 0.0,
            temperature: 1.0,
            beta: 0.0,
            entropy_coef: 0.0,
            delta: f64::INFINITY,
            normalizer: 1.0,
            logit_scale: 1.0,
            logit_softcap: f64::INFINITY,
            log_ratio_min: f64::NEG_INFINITY,
            log_ratio_max: f64::INFINITY,
            sapo_tau_pos: 1.0,
            sapo_tau_neg: 1.05f32 as f64,
            kl_log_ratio_clamp: f64::INFINITY,
            kl_max: f64::INFINITY,
        }
    }
}

impl Hparams {
    /// Checks the ranges of docs/spec.md's hyperparameter table for this configuration.
    pub fn validate(&self, config: &Config) -> Result<(), InputError> {
        let finite_nonneg = |name: &str, v: f64| {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                Err(input_error!("{name} = {v} must be finite and >= 0"))
            }
        };
        if config.policy_loss == PolicyLoss::Cispo && self.eps_low == f64::INFINITY {
            // TRL's CISPO: only the upper cap applies (1 - eps_low = -inf).
        } else {
            finite_nonneg("eps_low", self.eps_low)?;
        }
        finite_nonneg("eps_high", self.eps_high)?;
        finite_nonneg("beta", self.beta)?;
        finite_nonneg("entropy_coef", self.entropy_coef)?;
        if !(self.temperature.is_finite() && self.temperature > 0.0) {
            return Err(input_error!(
                "temperature (tau) = {} must be finite and > 0",
                self.temperature
            ));
        }
        if config.two_sided && !(self.delta > 1.0 + self.eps_high) {
            return Err(input_error!(
                "delta = {} must be > 1 + eps_high = {} when two_sided is on",
                self.delta,
                1.0 + self.eps_high
            ));
        }
        if config.aggregation == Aggregation::SumOverConstant
            && !(self.normalizer.is_finite() && self.normalizer > 0.0)
        {
            return Err(input_error!(
                "normalizer = {} must be finite and > 0 for sum_over_constant",
                self.normalizer
            ));
        }
        if matches!(config.aggregation, Aggregation::SeqMeanTokenMeanOverConstant)
            && !(self.normalizer.is_finite() && self.normalizer > 0.0)
        {
            return Err(input_error!(
                "normalizer = {} must be finite and > 0 for seq_mean_token_mean_over_constant",
                self.normalizer
            ));
        }
        self.validate_v2(config)
    }

    fn validate_v2(&self, config: &Config) -> Result<(), InputError> {
        if config.logit_transform {
            if !(self.logit_scale.is_finite() && self.logit_scale > 0.0) {
                return Err(input_error!("logit_scale = {} must be finite and > 0", self.logit_scale));
            }
            if !(self.logit_softcap > 0.0) {
                return Err(input_error!("logit_softcap = {} must be > 0 (+inf = off)", self.logit_softcap));
            }
        }
        if self.log_ratio_min.is_nan() || self.log_ratio_max.is_nan() || self.log_ratio_min > self.log_ratio_max {
            return Err(input_error!(
                "log_ratio_min = {} must be <= log_ratio_max = {}",
                self.log_ratio_min,
                self.log_ratio_max
            ));
        }
        if !(self.kl_max > 0.0) {
            return Err(input_error!("kl_max = {} must be > 0 (+inf = off)", self.kl_max));
        }
        if !(self.kl_log_ratio_clamp > 0.0) {
            return Err(input_error!("kl_log_ratio_clamp = {} must be > 0 (+inf = off)", self.kl_log_ratio_clamp));
        }
        for (name, k) in [("sapo_tau_pos", self.sapo_tau_pos), ("sapo_tau_neg", self.sapo_tau_neg)] {
            if config.policy_loss == PolicyLoss::Sapo && !(k.is_finite() && k > 0.0) {
                return Err(input_error!("{name} = {k} must be finite and > 0"));
            }
        }
        Ok(())
    }

    /// The delta that applies: +inf unless two-sided clipping is on.
    pub fn effective_delta(&self, config: &Config) -> f64 {
        if config.two_sided && config.policy_loss == PolicyLoss::Ppo {
            self.delta
        } else {
            f64::INFINITY
        }
    }

    pub fn effective_beta(&self, config: &Config) -> f64 {
        if config.kl {
            self.beta
        } else {
            0.0
        }
    }

    pub fn effective_entropy_coef(&self, config: &Config) -> f64 {
        if config.entropy_bonus {
            self.entropy_coef
        } else {
            0.0
        }
    }
}

/// JSON has no infinity: +inf travels as null.
#[cfg(feature = "serde")]
mod infinite_as_null {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        if v.is_finite() {
            s.serialize_f64(*v)
        } else {
            s.serialize_none()
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::INFINITY))
    }
}

/// -inf travels as null (log_ratio_min).
#[cfg(feature = "serde")]
mod neg_infinite_as_null {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        super::infinite_as_null::serialize(v, s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NEG_INFINITY))
    }
}
