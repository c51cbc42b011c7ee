//! The properties `invariance` measures, and what a repro of a variance
//! records (`Repro.invariance`): apart from the measuring, so that the repro
//! file format does not depend on the run that writes it.

use anyhow::Result;
use serde::{Deserialize, Serialize};

/// What a variant changes around a token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Property {
    /// The same inputs again.
    Determinism,
    /// Each row as a batch of one.
    Alone,
    /// The rows in reverse order.
    Permuted,
    /// Row 0 beside other rows (another draw's).
    OthersChanged,
    /// T extended by ceil(T / 2) masked positions.
    Padded,
    /// The rows split in two micro-batches.
    MicroBatches,
}

/// Every property, in the order the report lists them.
pub const PROPERTIES: [Property; 6] =
    [Property::Determinism, Property::Alone, Property::Permuted, Property::OthersChanged, Property::Padded, Property::MicroBatches];

impl Property {
    /// The property named `name` (`--property`).
    pub fn parse(name: &str) -> Result<Property> {
        PROPERTIES.into_iter().find(|p| p.name() == name).ok_or_else(|| {
            anyhow::anyhow!("--property {name:?}: expected one of {}", PROPERTIES.map(Property::name).join(", "))
        })
    }

    /// Its `--property` name.
    pub fn name(self) -> &'static str {
        match self {
            Property::Determinism => "determinism",
            Property::Alone => "alone",
            Property::Permuted => "permuted",
            Property::OthersChanged => "others_changed",
            Property::Padded => "padded",
            Property::MicroBatches => "micro_batches",
        }
    }

    /// What the variant is, for a reader.
    pub fn says(self) -> &'static str {
        match self {
            Property::Determinism => "the same inputs twice",
            Property::Alone => "each row as a batch of one",
            Property::Permuted => "the rows in reverse order",
            Property::OthersChanged => "row 0 beside other rows",
            Property::Padded => "T extended with masked positions",
            Property::MicroBatches => "the rows split in two micro-batches",
        }
    }
}

/// What a repro of a variance replays: the property, and the ulps allowed.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct InvarianceRepro {
    /// The property found variant.
    pub property: Property,
    /// The ulps allowed when it was found.
    pub max_ulps: u64,
}
