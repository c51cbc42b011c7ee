//! Cases drawn from a real model's numbers: the rows of a real
//! rollout and the real LM head's columns, at the small shapes `check` can
//! afford.
//!
//! A bank (`python -m grpo_fixtures bank`, python/grpo_fixtures/bank.py)
//! holds, for some valid positions of a real fixture, the final-norm hidden
//! state, the sampled token and the ids of the largest logits there, and
//! the LM head's columns of every id it names plus a uniform sample of
//! others. A real case ([`CaseSpec::real`]) takes its B*T positions from
//! one bank (each position's own stream picks it, so dropping rows in a
//! shrink keeps the rest) and a vocabulary subset of V ids in ascending id
//! order that holds, first, every sampled token and every position's
//! largest logit, then the runner-up logits, then the uniform sample. The
//! logits kind gets hidden @ lm_head over that subset (exact products of
//! the bf16 values summed in f64, rounded to the dtype); the fused kind the
//! hidden rows and the columns themselves (H = the model's). Everything
//! else of the case (mask, ratios, advantages, switches) is drawn as for
//! any case.
//!
//! The bank is loaded once per process ([`install`]) by the command that
//! draws real cases; a repro embeds its arrays, so replaying one needs no
//! bank.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{bail, Context, Result};
use safetensors::{Dtype as StDtype, SafeTensors};

use crate::case::prng::Prng;

/// One bank: the positions of one real fixture and the columns around them.
pub struct Bank {
    /// The fixture it came from (its directory name).
    pub fixture: String,
    /// H of the fixture's model.
    pub hidden_dim: usize,
    /// [N, H], values exactly bf16.
    hidden: Vec<f32>,
    /// [N] sampled vocabulary ids.
    tokens: Vec<u32>,
    /// [N, K] ids of the K largest logits, largest first.
    top: Vec<u32>,
    top_k: usize,
    /// [U] ids held, ascending, and [H, U] their LM head columns (exactly bf16).
    columns: Vec<u32>,
    lm_head: Vec<f32>,
}

/// Every bank of the run, in the order the fixtures were given.
pub struct Banks(pub Vec<Bank>);

static BANKS: OnceLock<Banks> = OnceLock::new();

/// Makes `banks` the process's source of real cases (once: a second call is an error).
pub fn install(banks: Banks) -> Result<()> {
    BANKS.set(banks).map_err(|_| anyhow::anyhow!("the real banks are installed once per process"))
}

/// The installed banks, if any.
pub fn installed() -> Option<&'static Banks> {
    BANKS.get()
}

impl Banks {
    /// The hidden size every bank shares (the model's H).
    pub fn hidden_dim(&self) -> usize {
        self.0[0].hidden_dim
    }

    /// The fewest columns a bank holds: a real case's V is at most this.
    pub fn max_vocab(&self) -> usize {
        self.0.iter().map(|b| b.columns.len()).min().unwrap_or(0)
    }

    /// The fixtures the installed banks came from (directory names).
    pub fn fixtures(&self) -> Vec<String> {
        self.0.iter().map(|b| b.fixture.clone()).collect()
    }
}

/// What a report says of a real case beside its summary: " real(FIXTURE)".
pub fn label(spec: &crate::case::CaseSpec) -> String {
    match (spec.real, installed()) {
        (true, Some(banks)) => format!(" real({})", banks.bank_of(spec.seed).fixture),
        (true, None) => " real".into(),
        (false, _) => String::new(),
    }
}

/// The vocabulary a real case of B*T positions needs at least: one sampled
/// token and one largest logit per position.
pub fn needed_vocab(batch: usize, time: usize) -> usize {
    2 * batch * time
}

fn tensor<'a>(file: &'a SafeTensors<'a>, path: &Path, name: &str, dtype: StDtype, rank: usize) -> Result<(Vec<usize>, &'a [u8])> {
    let view = file.tensor(name).with_context(|| format!("{}: no tensor {name} (not a real bank?)", path.display()))?;
    if view.dtype() != dtype || view.shape().len() != rank {
        bail!("{}: {name} is {:?} {:?}; a bank's is {dtype:?} of rank {rank}", path.display(), view.dtype(), view.shape());
    }
    Ok((view.shape().to_vec(), view.data()))
}

fn bf16s(raw: &[u8]) -> Vec<f32> {
    raw.chunks_exact(2).map(|b| half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()).collect()
}

fn ids(raw: &[u8], vocab_hint: &Path) -> Result<Vec<u32>> {
    raw.chunks_exact(4)
        .map(|b| {
            let id = i32::from_le_bytes(b.try_into().unwrap());
            u32::try_from(id).map_err(|_| anyhow::anyhow!("{}: a negative vocabulary id {id}", vocab_hint.display()))
        })
        .collect()
}

impl Bank {
    /// Reads a bank file (bank.py's format), checking its shapes agree.
    pub fn load(path: &Path, fixture: &str) -> Result<Bank> {
        let bytes = std::fs::read(path).with_context(|| format!("reading the real bank {}", path.display()))?;
        let file = SafeTensors::deserialize(&bytes).map_err(|e| anyhow::anyhow!("{} is not a safetensors file: {e}", path.display()))?;
        let (hs, hidden) = tensor(&file, path, "hidden", StDtype::BF16, 2)?;
        let (ts, tokens) = tensor(&file, path, "tokens", StDtype::I32, 1)?;
        let (ks, top) = tensor(&file, path, "top", StDtype::I32, 2)?;
        let (cs, columns) = tensor(&file, path, "columns", StDtype::I32, 1)?;
        let (ls, lm_head) = tensor(&file, path, "lm_head", StDtype::BF16, 2)?;
        let (n, h, u) = (hs[0], hs[1], cs[0]);
        if n == 0 || ts != [n] || ks[0] != n || ks[1] == 0 || ls != [h, u] {
            bail!("{}: shapes hidden {hs:?}, tokens {ts:?}, top {ks:?}, columns {cs:?}, lm_head {ls:?} do not agree", path.display());
        }
        let bank = Bank {
            fixture: fixture.to_string(),
            hidden_dim: h,
            hidden: bf16s(hidden),
            tokens: ids(tokens, path)?,
            top: ids(top, path)?,
            top_k: ks[1],
            columns: ids(columns, path)?,
            lm_head: bf16s(lm_head),
        };
        if bank.columns.windows(2).any(|w| w[0] >= w[1]) {
            bail!("{}: columns are not strictly ascending", path.display());
        }
        let held: BTreeSet<u32> = bank.columns.iter().copied().collect();
        if let Some(id) = bank.tokens.iter().chain(&bank.top).find(|id| !held.contains(id)) {
            bail!("{}: id {id} is named but its column is not held", path.display());
        }
        Ok(bank)
    }

    fn positions(&self) -> usize {
        self.tokens.len()
    }

    fn column_index(&self, id: u32) -> usize {
        self.columns.binary_search(&id).expect("a held id")
    }
}

/// What a real case is made of, before the kind decides its float inputs.
pub struct RealDraw {
    /// [B*T, H] hidden rows (exactly bf16).
    pub hidden: Vec<f32>,
    /// [H, V] the subset's LM head columns (exactly bf16), ascending ids.
    pub lm_head: Vec<f32>,
    /// [B*T] each position's sampled token as an index into the subset.
    pub tokens: Vec<i32>,
    /// H.
    pub hidden_dim: usize,
}

/// The streams of a real case's picks (apart from materialise's).
const BANK_STREAM: u64 = 101;
const POSITION_STREAM: u64 = 102;
const TAIL_STREAM: u64 = 103;

impl Banks {
    fn bank_of(&self, seed: u64) -> &Bank {
        &self.0[Prng::keyed(seed, BANK_STREAM, 0, 0).below(self.0.len())]
    }

    /// The B*T positions and V columns of a real case drawn from `seed`.
    pub fn draw(&self, seed: u64, batch: usize, time: usize, vocab: usize) -> RealDraw {
        let bank = self.bank_of(seed);
        let rows: Vec<usize> =
            (0..batch * time).map(|i| Prng::keyed(seed, POSITION_STREAM, i / time, i % time).below(bank.positions())).collect();
        // The subset: every sampled token and largest logit, then runners-up
        // rank by rank, then the bank's other ids in a seeded order.
        let mut chosen: BTreeSet<u32> = BTreeSet::new();
        let vocab = vocab.min(bank.columns.len());
        let offer = |id: u32, chosen: &mut BTreeSet<u32>| {
            if chosen.len() < vocab {
                chosen.insert(id);
            }
        };
        for &r in &rows {
            offer(bank.tokens[r], &mut chosen);
        }
        for k in 0..bank.top_k {
            for &r in &rows {
                offer(bank.top[r * bank.top_k + k], &mut chosen);
            }
        }
        let mut rest: Vec<u32> = bank.columns.iter().copied().filter(|id| !chosen.contains(id)).collect();
        let mut rng = Prng::keyed(seed, TAIL_STREAM, 0, 0);
        for i in (1..rest.len()).rev() {
            rest.swap(i, rng.below(i + 1));
        }
        for id in rest {
            offer(id, &mut chosen);
        }
        let subset: Vec<u32> = chosen.into_iter().collect();
        let h_ = bank.hidden_dim;
        let mut hidden = Vec::with_capacity(rows.len() * h_);
        for &r in &rows {
            hidden.extend_from_slice(&bank.hidden[r * h_..(r + 1) * h_]);
        }
        let (u, at): (usize, Vec<usize>) = (bank.columns.len(), subset.iter().map(|&id| bank.column_index(id)).collect());
        let mut lm_head = Vec::with_capacity(h_ * subset.len());
        for h in 0..h_ {
            lm_head.extend(at.iter().map(|&c| bank.lm_head[h * u + c]));
        }
        let tokens = rows.iter().map(|&r| subset.binary_search(&bank.tokens[r]).expect("every sampled token is in the subset") as i32).collect();
        RealDraw { hidden, lm_head, tokens, hidden_dim: h_ }
    }
}

impl RealDraw {
    /// The logits [B*T, V] over the subset: each an exact sum in f64 of the
    /// bf16 products (as close to the sampler's f32 logits as f64 allows).
    pub fn logits(&self) -> Vec<f64> {
        let h_ = self.hidden_dim;
        let v_ = self.lm_head.len() / h_;
        let mut out = vec![0.0f64; self.tokens.len() * v_];
        for (row, hidden) in out.chunks_mut(v_).zip(self.hidden.chunks(h_)) {
            for (h, &x) in hidden.iter().enumerate() {
                let w = &self.lm_head[h * v_..(h + 1) * v_];
                for (z, &w) in row.iter_mut().zip(w) {
                    *z += x as f64 * w as f64;
                }
            }
        }
        out
    }
}

/// The banks of `fixtures`, made (or found in the cache) by `python -m
/// grpo_fixtures bank`, which fetches the model's LM head on first use.
pub fn load_banks(env: &crate::worker::pyenv::PythonEnv, fixtures: &[PathBuf]) -> Result<Banks> {
    if fixtures.is_empty() {
        bail!("no real fixture to draw real-model cases from");
    }
    let mut command = env.command();
    command.args(["-m", "grpo_fixtures", "bank"]);
    for dir in fixtures {
        command.arg("--fixture").arg(dir);
    }
    let output = command.output().with_context(|| format!("starting {}", env.python.display()))?;
    let named: Vec<String> = fixtures.iter().map(|d| d.display().to_string()).collect();
    if !output.status.success() {
        bail!(
            "the banks of real positions of {} could not be made ({}):\n{}\n(check --real-cases 0 runs without real-model cases)",
            named.join(", "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let paths: Vec<PathBuf> = String::from_utf8_lossy(&output.stdout).lines().map(|l| PathBuf::from(l.trim())).collect();
    if paths.len() != fixtures.len() {
        bail!("python -m grpo_fixtures bank named {} banks for {} fixtures", paths.len(), fixtures.len());
    }
    let mut banks = Vec::new();
    for (dir, path) in fixtures.iter().zip(&paths) {
        let name = dir.file_name().map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into_owned());
        banks.push(Bank::load(path, &name)?);
    }
    let h = banks[0].hidden_dim;
    if let Some(other) = banks.iter().find(|b| b.hidden_dim != h) {
        bail!("real fixtures of two hidden sizes ({h} and {}: {}); give fixtures of one model", other.hidden_dim, other.fixture);
    }
    Ok(Banks(banks))
}

/// The real fixtures under `dir` (each a subdirectory whose manifest says
/// `"synthetic": false`), in name order.
pub fn committed_real_fixtures(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            std::fs::read_to_string(p.join("manifest.json"))
                .ok()
                .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                .is_some_and(|m| m["synthetic"] == false && m["lm_head"]["source"]["kind"] == "registry")
        })
        .collect();
    found.sort();
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bank of 6 positions, H = 3, over ids 0..40 step 2 (20 columns).
    fn bank() -> Bank {
        let columns: Vec<u32> = (0..20).map(|c| 2 * c).collect();
        let h_ = 3;
        // Every column and every hidden row distinct, so a test can tell which one it got.
        let lm_head: Vec<f32> = (0..h_ * columns.len()).map(|i| ((i % 20 + 1) * (i / 20 + 1)) as f32 / 8.0).collect();
        let hidden: Vec<f32> = (0..6 * h_).map(|i| [1.0, -1.0, 0.5][i % 3] * (i / 3 + 1) as f32).collect();
        Bank {
            fixture: "toy".into(),
            hidden_dim: h_,
            hidden,
            tokens: vec![2, 10, 38, 0, 2, 24],
            top: vec![4, 6, 12, 14, 30, 32, 0, 8, 4, 20, 26, 28],
            top_k: 2,
            columns,
            lm_head,
        }
    }

    #[test]
    fn a_draw_holds_the_tokens_and_largest_logits_in_id_order() {
        let banks = Banks(vec![bank()]);
        let b = &banks.0[0];
        for seed in 0..50u64 {
            let (batch, time) = (2, 3);
            let vocab = needed_vocab(batch, time) + (seed as usize % 5);
            let draw = banks.draw(seed, batch, time, vocab);
            assert_eq!(draw.lm_head.len(), 3 * vocab, "V = {vocab} columns");
            // Which bank position each case position took, found from its hidden row.
            for i in 0..batch * time {
                let row = &draw.hidden[i * 3..(i + 1) * 3];
                let r = (0..6).find(|&r| &b.hidden[r * 3..(r + 1) * 3] == row).expect("a bank row");
                let subset_id = |k: usize| {
                    // The subset's ids, recovered from the columns' values.
                    let col: Vec<f32> = (0..3).map(|h| draw.lm_head[h * vocab + k]).collect();
                    (0..20).find(|&c| (0..3).all(|h| b.lm_head[h * 20 + c] == col[h])).map(|c| b.columns[c])
                };
                assert_eq!(subset_id(draw.tokens[i] as usize), Some(b.tokens[r]), "the token's column");
                let ids: Vec<u32> = (0..vocab).filter_map(subset_id).collect();
                assert!(ids.windows(2).all(|w| w[0] < w[1]), "ascending ids {ids:?}");
                assert!(ids.contains(&b.top[r * 2]), "the largest logit's id {} in {ids:?}", b.top[r * 2]);
            }
            // The logits are the exact products summed.
            let z = draw.logits();
            for (i, row) in z.chunks(vocab).enumerate() {
                for (j, &zj) in row.iter().enumerate() {
                    let exact: f64 = (0..3).map(|h| draw.hidden[i * 3 + h] as f64 * draw.lm_head[h * vocab + j] as f64).sum();
                    assert_eq!(zj, exact);
                }
            }
        }
    }

    #[test]
    fn a_draw_keeps_each_position_when_others_are_dropped() {
        let banks = Banks(vec![bank()]);
        let wide = banks.draw(9, 2, 3, 12);
        let narrow = banks.draw(9, 1, 3, 12);
        assert_eq!(&wide.hidden[..9], &narrow.hidden[..9], "row 0's positions stay when row 1 goes");
    }
}
