//! Repro files: a failing case, shrunk, with everything needed to run it again
//! (`grpo-verify replay FILE`). The arrays are embedded, so a repro stays
//! exact even if the generators change.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::case::{Case, CaseSpec};

pub const FORMAT: &str = "grpo-verify-repro/1";

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Repro {
    pub format: String,
    pub implementation: String,
    /// One line: shape, dtype, switches, hyperparameters.
    pub summary: String,
    /// What failed on this case.
    pub failure: String,
    /// The `--seed` of the run that found it.
    pub run_seed: u64,
    /// How the case was generated (absent for hand-made cases).
    pub spec: Option<CaseSpec>,
    pub case: Case,
    /// The one-line command that reproduces it.
    pub replay: String,
}

/// A file-system-safe name for an implementation.
pub fn slug(implementation: &str) -> String {
    let base = implementation.rsplit('/').next().unwrap_or(implementation);
    base.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect()
}

impl Repro {
    pub fn write(&self, dir: &Path) -> Result<PathBuf> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join(format!("{}.json", slug(&self.implementation)));
        let text = serde_json::to_string_pretty(self)?;
        let tmp = path.with_extension("json.partial");
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, &path)?;
        Ok(path)
    }

    pub fn load(path: &Path) -> Result<Repro> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading repro file {}", path.display()))?;
        let repro: Repro = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a grpo-verify repro file", path.display()))?;
        if repro.format != FORMAT {
            bail!("{}: format {:?}, expected {FORMAT:?}", path.display(), repro.format);
        }
        repro.case.check_dtype().map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        Ok(repro)
    }
}
