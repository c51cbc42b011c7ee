//! Repro files: a failing case, shrunk, with everything needed to run it again
//! (`grpo-verify replay FILE`). The arrays are embedded, so a repro stays
//! exact even if the generators change.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use std::time::Duration;

use grpo_oracle::{Convention, Forward};

use crate::case::{Case, CaseProblem, CaseSpec, Kind};
use crate::evaluate::{Evaluator, Outcome};

/// The repro file's format tag; a file of another format is refused by name.
pub const FORMAT: &str = "grpo-verify-repro/1";

/// A minimal failing case as a file: the implementation, the case and what it came to (`replay` runs it again).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Repro {
    /// `FORMAT`.
    pub format: String,
    /// The implementation the case failed on, as `--impl` names it.
    pub implementation: String,
    /// One line: shape, dtype, switches, hyperparameters.
    pub summary: String,
    /// What failed on this case.
    pub failure: String,
    /// The `--seed` of the run that found it.
    pub run_seed: u64,
    /// How the case was generated (absent for hand-made cases).
    pub spec: Option<CaseSpec>,
    /// The case itself: shapes, switches, hyperparameters and every input (a hand-made case has no spec).
    pub case: Case,
    /// The one-line command that reproduces it.
    pub replay: String,
    /// Conventions the run tried on the implementation beside its own
    /// declaration (`check --convention`; docs/conventions.md): replay
    /// judges it under them again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conventions: Vec<String>,
    /// A variance found by `grpo-verify invariance`: replay measures that
    /// property again, rather than judging the case against the oracle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invariance: Option<crate::invariance::property::InvarianceRepro>,
}

/// A file-system-safe name for an implementation.
pub fn slug(implementation: &str) -> String {
    // The file's directory too: examples/liger/adapter.py:grpo_loss and
    // examples/unsloth/adapter.py:grpo_loss must not share a repro or a
    // regressions file.
    let mut parts = implementation.rsplit('/');
    let base = parts.next().unwrap_or(implementation);
    let name = match parts.next() {
        Some(dir) if !dir.is_empty() && dir != "." => format!("{dir}_{base}"),
        _ => base.to_string(),
    };
    let name: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
    // A file name has 255 bytes at most (`sensitivity`'s wrapped names are
    // hex-encoded specs): a long one keeps its start and an FNV-1a hash of all
    // of it, stable from run to run.
    if name.len() <= SLUG_MAX {
        return name;
    }
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3));
    format!("{}-{hash:016x}", &name[..SLUG_MAX - 17])
}

/// The longest slug: room in a 255-byte file name for `-worst-<property>.json`
/// and `.partial`.
const SLUG_MAX: usize = 160;

/// The repro file in `dir` of `implementation`'s `n`-th distinct
/// discrepancy (from 1): `<slug>.json` for the first (the only one without
/// `--keep-going`, the name scripts know), then `<slug>-2.json`, ...
pub fn repro_file(dir: &Path, implementation: &str, n: usize) -> PathBuf {
    let slug = slug(&canonical_impl(implementation));
    dir.join(if n <= 1 { format!("{slug}.json") } else { format!("{slug}-{n}.json") })
}

impl Repro {
    /// The repro of `implementation`'s minimal failing case `minimal`, found
    /// by a run seeded `run_seed`, to be written to `path`.
    pub fn of_failure(implementation: &str, minimal: &CaseSpec, kind: Kind, failure: String, run_seed: u64, path: &Path) -> Repro {
        let case = minimal.materialize(kind);
        let implementation = canonical_impl(implementation);
        let replay = replay_command(path);
        Repro {
            format: FORMAT.into(),
            implementation,
            summary: case.summary() + &crate::case::real::label(minimal),
            failure,
            run_seed,
            spec: Some(minimal.clone()),
            case,
            replay,
            conventions: Vec::new(),
            invariance: None,
        }
    }

    /// Writes `path` whole (or not at all).
    pub fn write(&self, path: &Path) -> Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        crate::report::write_atomic(path, &serde_json::to_string_pretty(self)?)
    }

    /// Reads a repro file: a clear error naming the file when it is missing, malformed or of another format.
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

/// Parses declared conventions (`--convention`, a repro's list).
pub fn parse_conventions(names: &[String]) -> Result<Vec<Convention>> {
    names.iter().map(|n| Convention::parse(n).map_err(|e| anyhow::anyhow!("{e}"))).collect()
}

/// The one-line command that replays a repro file: through cargo in a
/// repository checkout, the installed binary otherwise (the wheel).
pub fn replay_command(path: &Path) -> String {
    match crate::worker::pyenv::repo_root() {
        Some(_) => format!("cargo run --release -- replay {}", path.display()),
        None => format!("grpo-verify replay {}", path.display()),
    }
}

/// Resolves `path.py:function` to an absolute path so repro files work from
/// any directory; built-in names and `module:function` pass through.
pub fn canonical_impl(implementation: &str) -> String {
    if let Some((path, func)) = implementation.rsplit_once(':') {
        if path.ends_with(".py") {
            if let Ok(abs) = std::fs::canonicalize(path) {
                return format!("{}:{func}", abs.display());
            }
        }
    }
    implementation.to_string()
}

/// `grpo-verify replay FILE`: runs the repro's case on its implementation
/// (or `implementation`) and prints the verdict of every quantity. `Ok(false)`
/// is a verification failure; a repro whose inputs are invalid is bad input.
pub fn replay(file: &Path, implementation: Option<String>, tried: &[Convention], timeout: Duration) -> Result<bool> {
    replay_loaded(file, &Repro::load(file)?, implementation, tried, timeout)
}

/// [`replay`] of a repro already loaded from `file`. A repro of a variance
/// (`invariance` set) is `invariance::replay`'s: `grpo-verify replay`
/// dispatches on it. Invalid inputs are refused before a worker starts.
pub fn replay_loaded(file: &Path, repro: &Repro, implementation: Option<String>, tried: &[Convention], timeout: Duration) -> Result<bool> {
    let problem = repro.case.problem();
    let fwd = checked_forward(file, repro, &problem)?;
    let devices = repro.case.mesh.map_or(1, |m| m.devices());
    replay_with(&mut Evaluator::start(timeout, devices)?, file, repro, &fwd, implementation, tried)
}

/// [`replay_loaded`] on a running evaluator (its worker must see the
/// repro's mesh's devices): repros replayed one after another share one
/// worker start.
pub fn replay_on(eval: &mut Evaluator, file: &Path, repro: &Repro, implementation: Option<String>, tried: &[Convention]) -> Result<bool> {
    let problem = repro.case.problem();
    let fwd = checked_forward(file, repro, &problem)?;
    replay_with(eval, file, repro, &fwd, implementation, tried)
}

/// The oracle's forward pass of the repro's case: what refuses a repro that
/// is not the oracle's to judge, or whose inputs are invalid.
fn checked_forward<'p>(file: &Path, repro: &Repro, problem: &'p CaseProblem<'_>) -> Result<Forward<'p>> {
    if repro.invariance.is_some() {
        bail!("{} is a repro of `grpo-verify invariance`: it is not judged against the oracle (replay it with `grpo-verify replay`)", file.display());
    }
    parse_conventions(&repro.conventions).with_context(|| format!("{}: conventions", file.display()))?;
    problem.forward().map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))
}

fn replay_with(eval: &mut Evaluator, file: &Path, repro: &Repro, fwd: &Forward<'_>, implementation: Option<String>, tried: &[Convention]) -> Result<bool> {
    let mut conventions = parse_conventions(&repro.conventions).with_context(|| format!("{}: conventions", file.display()))?;
    conventions.extend(tried.iter().filter(|c| !repro.conventions.contains(&c.to_string())));
    let implementation = implementation.map(|i| canonical_impl(&i)).unwrap_or(repro.implementation.clone());
    eval.tried_conventions = conventions;
    let kind = eval.worker.load(&implementation)?;
    if kind != repro.case.kind() {
        bail!("--impl {implementation} is of the {} kind; the repro's case is {}", kind.name(), repro.case.kind().name());
    }
    println!("replaying {} on `{implementation}`", file.display());
    println!("case: {}", repro.case.summary());
    println!("{}", crate::report::contract_line(&eval.conventions(&implementation)?, repro.case.dtype));
    let (result, _, _) = eval.evaluate_on(&implementation, &repro.case, fwd).map_err(|e| anyhow::anyhow!("{e}"))?;
    println!("{:<16} {:>11} {:>11} {:>11}  verdict  where", "quantity", "error", "bound", "baseline");
    for v in &result.verdicts {
        let verdict = if v.not_covered { "n/a" } else if v.pass { "pass" } else { "FAIL" };
        println!("{:<16} {:>11.3e} {:>11.3e} {:>11.3e}  {:<7}  {}", v.quantity, v.err, v.bound, v.baseline_err, verdict, v.at);
    }
    match result.outcome {
        Outcome::Pass => println!("PASS"),
        Outcome::Unsupported => println!("UNSUPPORTED: {}", result.reason),
        Outcome::Fail => println!("FAIL: {}", result.reason),
    }
    Ok(result.outcome != Outcome::Fail)
}

#[cfg(test)]
mod tests {
    use super::slug;

    #[test]
    fn slugs_fit_a_file_name_and_stay_distinct() {
        assert_eq!(slug("examples/liger/adapter.py:grpo_loss"), "liger_adapter_py_grpo_loss");
        let long = |e: &str| format!("grpo_verify_worker.perturb:w_{}", format!("{{\"e\": {e}, \"impl\": \"/a/b/adapter.py:grpo_loss\"}}").bytes().map(|b| format!("{b:02x}")).collect::<String>().repeat(3));
        let (a, b) = (slug(&long("0.5")), slug(&long("0.25")));
        assert!(a.len() <= 160 && b.len() <= 160, "{} {}", a.len(), b.len());
        assert_ne!(a, b);
        assert_eq!(a, slug(&long("0.5")));
    }
}
