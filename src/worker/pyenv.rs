//! Which Python runs the worker: `GRPO_VERIFY_PYTHON` when set (say, a TPU
//! VM's environment with `jax[tpu]`), else the repository's `.venv`, created
//! on first use and installed from `python/requirements.txt` (JAX) and
//! `python/requirements-torch.txt` (the torch lock, with `--no-deps`: torch
//! and the libraries whose losses `examples/` checks).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context, Result};

/// Where the worker's interpreter and package live.
#[derive(Clone, Debug)]
pub struct PythonEnv {
    pub python: PathBuf,
    /// Prepended to PYTHONPATH: the repository's `python/` directory.
    pub package_dir: PathBuf,
    /// JAX's persistent compilation cache (None: off). Compiled steps are
    /// kept across worker processes and runs: a rerun, `replay`, the mutant
    /// gate and CI's suites reuse them.
    pub compile_cache: Option<PathBuf>,
    /// Small steps compile at XLA:CPU -O0 (the worker's `compiler_options`);
    /// false with `GRPO_VERIFY_FAST_COMPILE=0` (`--no-fast-compile`).
    pub fast_compile: bool,
}

fn fast_compile() -> bool {
    std::env::var_os("GRPO_VERIFY_FAST_COMPILE").map_or(true, |v| v != "0")
}

/// `GRPO_VERIFY_COMPILE_CACHE` (a directory, or "none"), else
/// `target/grpo-verify/jax-cache` in the repository.
fn compile_cache(root: &Path) -> Option<PathBuf> {
    match std::env::var_os("GRPO_VERIFY_COMPILE_CACHE") {
        Some(v) if v == "none" || v.is_empty() => None,
        Some(v) => Some(PathBuf::from(v)),
        None => Some(root.join("target/grpo-verify/jax-cache")),
    }
}

/// The repository this binary belongs to (`GRPO_VERIFY_HOME` overrides).
pub fn repo_root() -> PathBuf {
    std::env::var_os("GRPO_VERIFY_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

pub fn resolve() -> Result<PythonEnv> {
    let root = repo_root();
    let package_dir = root.join("python");
    if let Some(python) = std::env::var_os("GRPO_VERIFY_PYTHON") {
        let python = PathBuf::from(python);
        if !python.exists() && which(&python).is_none() {
            bail!("GRPO_VERIFY_PYTHON = {} does not exist: point it at a Python with jax installed", python.display());
        }
        return Ok(PythonEnv { python, package_dir, compile_cache: compile_cache(&root), fast_compile: fast_compile() });
    }
    let venv = root.join(".venv");
    ensure_venv(&venv, &package_dir.join("requirements.txt"), &package_dir.join("requirements-torch.txt"))?;
    Ok(PythonEnv { python: venv.join("bin").join("python"), package_dir, compile_cache: compile_cache(&root), fast_compile: fast_compile() })
}

fn which(name: &Path) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

/// The installer of the venv's pins (see `ensure_venv`).
const UV: &str = "uv==0.13.9";

/// FNV-1a of the requirements: the venv is reinstalled when they change.
fn fingerprint(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
    format!("{h:016x}")
}

fn ensure_venv(venv: &Path, requirements: &Path, torch_lock: &Path) -> Result<()> {
    let read = |path: &Path| fs::read_to_string(path).with_context(|| format!("reading {}", path.display()));
    let wanted = fingerprint(&(read(requirements)? + &read(torch_lock)? + UV));
    let marker = venv.join(".grpo-verify-installed");
    if fs::read_to_string(&marker).ok().as_deref() == Some(wanted.as_str()) {
        return Ok(());
    }
    let _lock = Lock::acquire(&venv.with_extension("lock"))?;
    if fs::read_to_string(&marker).ok().as_deref() == Some(wanted.as_str()) {
        return Ok(()); // another process finished it while we waited
    }
    let base = std::env::var("GRPO_VERIFY_BASE_PYTHON").ok().map(PathBuf::from).unwrap_or_else(|| {
        which(Path::new("python3.11")).unwrap_or_else(|| PathBuf::from("python3"))
    });
    eprintln!(
        "grpo-verify: setting up the Python environment {} with {} (first use only; a few minutes: \
         torch's wheel and its CUDA runtime packages are ~4 GB installed)",
        venv.display(),
        base.display()
    );
    let started = std::time::Instant::now();
    if !venv.join("bin").join("python").exists() {
        run(Command::new(&base).args(["-m", "venv"]).arg(venv), "creating the venv")?;
    }
    let python = venv.join("bin").join("python");
    // uv installs the pins (and torch's ~4 GB of CUDA wheels) with parallel
    // downloads and unpacking: the torch lock in ~20 s where pip took ~105 s
    // on the CI machine. It is itself a pinned wheel from PyPI, installed by pip.
    run(
        Command::new(&python).args(["-m", "pip", "install", "--disable-pip-version-check", "-q", UV]),
        "installing uv",
    )?;
    let pip = || {
        let mut cmd = Command::new(venv.join("bin").join("uv"));
        // --native-tls: the system's certificates, as pip uses them.
        cmd.args(["pip", "install", "--quiet", "--native-tls", "--python"]).arg(&python);
        cmd
    };
    run(pip().arg("-r").arg(requirements), "installing python/requirements.txt")?;
    let jax_done = started.elapsed().as_secs_f64();
    eprintln!("grpo-verify: {} installed in {jax_done:.0} s", requirements.display());
    // A complete lock: --no-deps keeps pip from resolving the libraries' training stacks.
    run(pip().args(["--no-deps", "-r"]).arg(torch_lock), "installing python/requirements-torch.txt")?;
    eprintln!(
        "grpo-verify: {} installed in {:.0} s",
        torch_lock.display(),
        started.elapsed().as_secs_f64() - jax_done
    );
    fs::write(&marker, wanted)?;
    eprintln!("grpo-verify: Python environment ready in {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

fn run(cmd: &mut Command, what: &str) -> Result<()> {
    let status = cmd.status().with_context(|| format!("{what}: could not start {cmd:?}"))?;
    if !status.success() {
        bail!("{what} failed ({status}): {cmd:?}. Set GRPO_VERIFY_PYTHON to an interpreter with jax installed, or fix the error above");
    }
    Ok(())
}

/// A lock file held while the venv is set up, so parallel tests wait.
struct Lock(PathBuf);

impl Lock {
    fn acquire(path: &Path) -> Result<Lock> {
        let deadline = SystemTime::now() + Duration::from_secs(1800);
        loop {
            match fs::OpenOptions::new().write(true).create_new(true).open(path) {
                Ok(_) => return Ok(Lock(path.to_path_buf())),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let stale = fs::metadata(path)
                        .and_then(|m| m.modified())
                        .map(|t| t.elapsed().unwrap_or_default() > Duration::from_secs(1800))
                        .unwrap_or(false);
                    if stale {
                        let _ = fs::remove_file(path);
                    } else if SystemTime::now() > deadline {
                        bail!("timed out waiting for {} (remove it if no setup is running)", path.display());
                    }
                    std::thread::sleep(Duration::from_millis(500));
                }
                Err(e) => return Err(e).with_context(|| format!("creating {}", path.display())),
            }
        }
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}
