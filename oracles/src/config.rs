//! Static configuration and runtime hyperparameters (SPEC.md, "Hyperparameters").

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
}

/// The static switches of SPEC.md.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Config {
    pub temperature_mode: TemperatureMode,
    pub aggregation: Aggregation,
    pub on_policy: bool,
    pub kl: bool,
    pub entropy_bonus: bool,
    pub two_sided: bool,
}

/// Runtime hyperparameters, as the f32 values an implementation receives.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Hparams {
    pub eps_low: f64,
    pub eps_high: f64,
    pub temperature: f64,
    pub beta: f64,
    pub entropy_coef: f64,
    /// +inf when two-sided clipping is off (null in JSON).
    #[cfg_attr(feature = "serde", serde(with = "infinite_as_null"))]
    pub delta: f64,
    pub normalizer: f64,
}

impl Hparams {
    /// Checks the ranges of SPEC.md's hyperparameter table for this configuration.
    pub fn validate(&self, config: &Config) -> Result<(), InputError> {
        let finite_nonneg = |name: &str, v: f64| {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                Err(input_error!("{name} = {v} must be finite and >= 0"))
            }
        };
        finite_nonneg("eps_low", self.eps_low)?;
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
        Ok(())
    }

    /// The delta that applies: +inf unless two-sided clipping is on.
    pub fn effective_delta(&self, config: &Config) -> f64 {
        if config.two_sided {
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
