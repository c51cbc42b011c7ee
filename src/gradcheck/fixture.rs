//! Hidden-state fixtures (fixtures/README.md): a directory with
//! `manifest.json` and `arrays.safetensors` (final-norm hidden states,
//! sampled tokens, mask, the sampler's log-probs, advantages). The LM head
//! they belong to is not stored: `python -m grpo_fixtures lm-head` fetches it
//! from the checkpoint (or regenerates a synthetic one) and checks its hash.
//!
//! Everything wrong with a fixture is an input error naming the file and
//! what is wrong (exit 2); a fixture whose checkpoint is absent is
//! [`LmHeadError::CheckpointAbsent`], which the tests turn into a skip.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use safetensors::{Dtype as StDtype, SafeTensors};
use serde_json::Value;

use crate::worker::pyenv::PythonEnv;

/// One tensor of a safetensors file, widened to f32 (i32 kept apart).
pub enum Tensor {
    /// An f32 or bf16 tensor.
    Float {
        /// Its dimensions, outermost first.
        shape: Vec<usize>,
        /// It was stored in bf16 (its values are exactly bf16).
        bf16: bool,
        /// Its elements, C order.
        values: Vec<f32>,
    },
    /// An integer tensor (token ids).
    Int {
        /// Its dimensions, outermost first.
        shape: Vec<usize>,
        /// Its elements, C order.
        values: Vec<i32>,
    },
}

impl Tensor {
    /// Its dimensions, outermost first.
    pub fn shape(&self) -> &[usize] {
        match self {
            Tensor::Float { shape, .. } | Tensor::Int { shape, .. } => shape,
        }
    }
}

/// Reads a safetensors file through the format's own implementation (the
/// `safetensors` crate), widening BF16 and F32 to f32 and keeping I32.
pub fn read_safetensors(path: &Path) -> Result<HashMap<String, Tensor>> {
    let bytes = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let bad = |what: String| anyhow::anyhow!("{} is not a valid safetensors file: {what}", path.display());
    let file = SafeTensors::deserialize(&bytes).map_err(|e| bad(e.to_string()))?;
    let mut tensors = HashMap::new();
    for (name, view) in file.tensors() {
        let (shape, raw) = (view.shape().to_vec(), view.data());
        let tensor = match view.dtype() {
            StDtype::BF16 => Tensor::Float {
                shape,
                bf16: true,
                values: raw.chunks_exact(2).map(|b| half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()).collect(),
            },
            StDtype::F32 => Tensor::Float { shape, bf16: false, values: raw.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect() },
            StDtype::I32 => Tensor::Int { shape, values: raw.chunks_exact(4).map(|b| i32::from_le_bytes(b.try_into().unwrap())).collect() },
            other => return Err(bad(format!("{name}: dtype {other:?} (fixtures use BF16, F32, I32)"))),
        };
        tensors.insert(name, tensor);
    }
    Ok(tensors)
}

/// A loaded fixture (the LM head comes separately: [`lm_head`]).
pub struct Fixture {
    /// The fixture's directory.
    pub dir: PathBuf,
    /// Its manifest.json (fixtures/README.md).
    pub manifest: Value,
    /// B.
    pub batch: usize,
    /// T.
    pub time: usize,
    /// H.
    pub hidden_dim: usize,
    /// V.
    pub vocab: usize,
    /// [B, T, H], values exactly bf16.
    pub hidden: Vec<f32>,
    /// [B, T] the sampled token ids.
    pub tokens: Vec<i32>,
    /// [B, T], 0 on prompt and padding.
    pub mask: Vec<f32>,
    /// [B, T] the sampler's log-probs of its tokens.
    pub old_logp: Vec<f32>,
    /// [B] one per sequence.
    pub advantages: Vec<f32>,
    /// The sampling temperature (logits temperature mode).
    pub temperature: f64,
    /// Made from a seed (`synthetic-*`, a preset), not from a model's rollout.
    pub synthetic: bool,
}

impl Fixture {
    /// Its directory's name.
    pub fn name(&self) -> String {
        self.dir.file_name().map_or_else(|| self.dir.display().to_string(), |n| n.to_string_lossy().into_owned())
    }
}

/// Loads and checks a fixture directory against its manifest.
pub fn load(dir: &Path) -> Result<Fixture> {
    let manifest_path = dir.join("manifest.json");
    let text = fs::read_to_string(&manifest_path)
        .with_context(|| format!("--fixture {}: no readable manifest.json (a fixture is a directory; see fixtures/README.md)", dir.display()))?;
    let manifest: Value = serde_json::from_str(&text).with_context(|| format!("{}: not valid JSON", manifest_path.display()))?;
    let bad = |what: String| anyhow::anyhow!("{}: {what}", manifest_path.display());
    if manifest["format"] != "grpo-fixture" || manifest["format_version"] != 1 {
        return Err(bad(format!("format {} version {}; expected grpo-fixture version 1", manifest["format"], manifest["format_version"])));
    }
    let dim = |k: &str| manifest["shapes"][k].as_u64().filter(|&d| d > 0).map(|d| d as usize).ok_or_else(|| bad(format!("shapes.{k} is not a positive integer")));
    let (b, t, h, v) = (dim("B")?, dim("T")?, dim("H")?, dim("V")?);
    let temperature = manifest["sampling"]["temperature"].as_f64().filter(|t| *t > 0.0 && t.is_finite()).ok_or_else(|| bad("sampling.temperature is not a number > 0".into()))?;
    if manifest["sampling"]["temperature_mode"] != "logits" {
        return Err(bad(format!("sampling.temperature_mode {}; fixtures are sampled in logits mode", manifest["sampling"]["temperature_mode"])));
    }
    let file = manifest["arrays"]["file"].as_str().unwrap_or("arrays.safetensors");
    let mut tensors = read_safetensors(&dir.join(file))?;
    let arrays_path = dir.join(file);
    let mut take = |name: &str, shape: &[usize]| -> Result<Tensor> {
        let t = tensors.remove(name).ok_or_else(|| anyhow::anyhow!("{}: no tensor {name}", arrays_path.display()))?;
        if t.shape() != shape {
            bail!("{}: {name} has shape {:?}; the manifest's shapes say {shape:?}", arrays_path.display(), t.shape());
        }
        Ok(t)
    };
    let float = |t: Tensor, name: &str, want_bf16: Option<bool>| -> Result<Vec<f32>> {
        match t {
            Tensor::Float { bf16, values, .. } if want_bf16.is_none_or(|w| w == bf16) => Ok(values),
            _ => bail!("{}: {name} has the wrong dtype (hidden is BF16; mask, old_logp, advantages F32)", dir.join(file).display()),
        }
    };
    let hidden = float(take("hidden", &[b, t, h])?, "hidden", Some(true))?;
    let tokens = match take("tokens", &[b, t])? {
        Tensor::Int { values, .. } => values,
        _ => bail!("{}: tokens must be I32", dir.join(file).display()),
    };
    let mask = float(take("mask", &[b, t])?, "mask", Some(false))?;
    let old_logp = float(take("old_logp", &[b, t])?, "old_logp", Some(false))?;
    let advantages = float(take("advantages", &[b])?, "advantages", Some(false))?;
    for (i, (&m, &y)) in mask.iter().zip(&tokens).enumerate() {
        let (row, col) = (i / t, i % t);
        if m != 0.0 && m != 1.0 {
            bail!("{}: mask[{row}, {col}] = {m}; must be 0 or 1", dir.join(file).display());
        }
        if m == 1.0 && (y < 0 || y as usize >= v) {
            bail!("{}: tokens[{row}, {col}] = {y} is outside the vocabulary [0, {v}) at an unmasked position", dir.join(file).display());
        }
        if m == 1.0 && !old_logp[i].is_finite() {
            bail!("{}: old_logp[{row}, {col}] = {} is not finite", dir.join(file).display(), old_logp[i]);
        }
    }
    if let Some((i, x)) = hidden.iter().enumerate().find(|(_, x)| !x.is_finite()) {
        bail!("{}: hidden element {i} = {x} is not finite", dir.join(file).display());
    }
    Ok(Fixture {
        dir: dir.to_path_buf(),
        synthetic: manifest["synthetic"].as_bool().unwrap_or(false),
        manifest,
        batch: b,
        time: t,
        hidden_dim: h,
        vocab: v,
        hidden,
        tokens,
        mask,
        old_logp,
        advantages,
        temperature,
    })
}

/// Why the LM head could not be had.
#[derive(Debug)]
pub enum LmHeadError {
    /// The fixture's checkpoint is not on this machine: the message names it
    /// and the command that makes the fixture (tests skip on this).
    CheckpointAbsent(String),
    /// Anything else: a malformed checkpoint, a failed conversion.
    Other(anyhow::Error),
}

impl std::fmt::Display for LmHeadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LmHeadError::CheckpointAbsent(m) => write!(f, "{m}"),
            LmHeadError::Other(e) => write!(f, "{e:#}"),
        }
    }
}

/// The fixture's LM head [H, V] (values exactly bf16), via `python -m
/// grpo_fixtures lm-head`, which checks it against the manifest's sha256.
pub fn lm_head(env: &PythonEnv, fixture: &Fixture, model_dir: Option<&Path>, scratch: &Path) -> Result<Vec<f32>, LmHeadError> {
    fs::create_dir_all(scratch).map_err(|e| LmHeadError::Other(anyhow::anyhow!("creating {}: {e}", scratch.display())))?;
    let out = scratch.join(format!("lm_head-{}.safetensors", std::process::id()));
    let mut cmd = env.command();
    cmd.args(["-m", "grpo_fixtures", "lm-head", "--fixture"]).arg(&fixture.dir).arg("--out").arg(&out);
    if let Some(dir) = model_dir {
        cmd.arg("--model-dir").arg(dir);
    }
    let output = cmd.output().map_err(|e| LmHeadError::Other(anyhow::anyhow!("starting {}: {e}", env.python.display())))?;
    let stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
    match output.status.code() {
        Some(0) => {}
        Some(3) => return Err(LmHeadError::CheckpointAbsent(stderr)),
        _ => return Err(LmHeadError::Other(anyhow::anyhow!("the LM head of {} could not be had ({}):\n{stderr}", fixture.dir.display(), output.status))),
    }
    let tensors = read_safetensors(&out).map_err(LmHeadError::Other);
    let _ = fs::remove_file(&out);
    let mut tensors = tensors?;
    match tensors.remove("lm_head") {
        Some(Tensor::Float { shape, values, .. }) if shape == [fixture.hidden_dim, fixture.vocab] => Ok(values),
        _ => Err(LmHeadError::Other(anyhow::anyhow!("lm-head wrote no [H, V] = [{}, {}] tensor lm_head", fixture.hidden_dim, fixture.vocab))),
    }
}

/// A production-shape fixture made from a seed at run time (never committed):
/// the seed team's row at Qwen2.5-1.5B's and at their own hidden size.
pub struct ProductionPreset {
    /// Its `--preset` name.
    pub name: &'static str,
    /// B.
    pub batch: usize,
    /// T.
    pub time: usize,
    /// H.
    pub hidden: usize,
    /// V.
    pub vocab: usize,
}

/// `gradcheck --preset` names (the fused ones `bench --preset` uses, plus Qwen2.5-1.5B's H).
pub const PRODUCTION_PRESETS: [ProductionPreset; 2] = [
    ProductionPreset { name: "qwen-fused-t8192", batch: 1, time: 8192, hidden: 1536, vocab: 151_936 },
    ProductionPreset { name: "seed-fused-t8192", batch: 1, time: 8192, hidden: 4096, vocab: 151_936 },
];

/// The preset named `name`, or an error listing them.
pub fn production_preset(name: &str) -> Result<&'static ProductionPreset> {
    PRODUCTION_PRESETS.iter().find(|p| p.name == name).with_context(|| {
        let names: Vec<&str> = PRODUCTION_PRESETS.iter().map(|p| p.name).collect();
        format!("--preset {name}: no such preset; the presets are {}", names.join(", "))
    })
}

/// The preset's fixture directory under `root`, made from `seed` on first
/// use (by `python -m grpo_fixtures preset`, into a scratch directory that
/// is renamed into place only when complete) and reused after.
pub fn preset_fixture(env: &PythonEnv, preset: &ProductionPreset, seed: u64, root: &Path) -> Result<PathBuf> {
    let dir = root.join(format!("{}-seed{seed}", preset.name));
    if dir.join("manifest.json").is_file() {
        return Ok(dir);
    }
    fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
    let scratch = root.join(format!(".{}-seed{seed}.{}", preset.name, std::process::id()));
    let _ = fs::remove_dir_all(&scratch);
    eprintln!("grpo-verify: making the {} fixture (seed {seed}) in {}", preset.name, dir.display());
    let output = env
        .command()
        .args(["-m", "grpo_fixtures", "preset", "--name", preset.name, "--seed", &seed.to_string(), "--out"])
        .arg(&scratch)
        .output()
        .with_context(|| format!("starting {}", env.python.display()))?;
    if !output.status.success() {
        let _ = fs::remove_dir_all(&scratch);
        bail!("making the {} fixture failed ({}):\n{}", preset.name, output.status, String::from_utf8_lossy(&output.stderr).trim());
    }
    fs::rename(&scratch, &dir).with_context(|| format!("moving {} to {}", scratch.display(), dir.display()))?;
    Ok(dir)
}
