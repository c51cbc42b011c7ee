//! Which Python runs the worker, and where its packages are.
//!
//! - `GRPO_VERIFY_PYTHON` when set (say, a TPU VM's environment with
//!   `jax[tpu]`): that interpreter, whatever the layout below.
//! - In a repository checkout (`GRPO_VERIFY_HOME`, else the directory this
//!   binary was built from, when it holds `python/grpo_verify_worker`): the
//!   repository's `.venv`, created on first use and installed from
//!   `python/requirements.txt` (the pinned JAX). The torch lock
//!   (`python/requirements-torch.txt`, with `--no-deps`: torch and the
//!   libraries whose losses `examples/` checks, 5.8 GiB) is installed only on
//!   request: `grpo-verify setup --torch`, or the suites that run torch.
//! - Installed from the wheel (built with the `wheel` feature, or no
//!   repository beside the binary): the interpreter of the environment the
//!   binary is installed in (`bin/python3` beside it), else `python3` on
//!   PATH; the worker's packages are installed there too.
//!
//! Either way the worker checks its own environment first
//! (`grpo_verify_worker/environment.py`) and refuses, naming the package
//! and version, one that is missing or too old.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context, Result};

/// Where the worker's interpreter and package live.
#[derive(Clone, Debug)]
pub struct PythonEnv {
    /// The interpreter the worker runs on.
    pub python: PathBuf,
    /// Prepended to PYTHONPATH: the repository's `python/` directory (None:
    /// the packages are installed in the interpreter's environment).
    pub package_dir: Option<PathBuf>,
    /// JAX's persistent compilation cache (None: off). Compiled steps are
    /// kept across worker processes and runs: a rerun, `replay`, the mutant
    /// gate and CI's suites reuse them.
    pub compile_cache: Option<PathBuf>,
    /// Small steps compile at XLA:CPU -O0 without its fusion emitters (the worker's `compiler_options`);
    /// false with `GRPO_VERIFY_FAST_COMPILE=0` (`--no-fast-compile`).
    pub fast_compile: bool,
    /// Where this environment's processes cache the bytecode of what they
    /// import: the repository's own `.venv` only (`.venv/pycache`), even
    /// where PYTHONDONTWRITEBYTECODE is set (None: the interpreter's own
    /// settings). uv installs no bytecode and this project's CI machines set
    /// PYTHONDONTWRITEBYTECODE: every worker compiled JAX's sources again at
    /// import, 1.1 of its 2.2 s of CPU (torch: 2.1 of 4.3 s), on the 2-core
    /// CI machine. Compiling the whole venv at setup instead took 39 to 57 s
    /// for its 17,005 files (the torch lock), most of which no process
    /// imports (ray, verl, ...); the first process to import a module
    /// now compiles it, once.
    pub bytecode_cache: Option<PathBuf>,
}

impl PythonEnv {
    /// `PYTHONPATH` for a Python process of this environment: the package
    /// directory (if any) before what the user set.
    pub fn pythonpath(&self) -> std::ffi::OsString {
        let mut parts: Vec<PathBuf> = self.package_dir.iter().cloned().collect();
        if let Some(existing) = std::env::var_os("PYTHONPATH") {
            parts.extend(std::env::split_paths(&existing));
        }
        std::env::join_paths(parts).unwrap_or_default()
    }

    /// A command running this environment's interpreter: `pythonpath`, and
    /// the bytecode cache where there is one.
    pub fn command(&self) -> Command {
        let mut command = Command::new(&self.python);
        command.env("PYTHONPATH", self.pythonpath());
        if let Some(dir) = &self.bytecode_cache {
            command.env("PYTHONPYCACHEPREFIX", dir).env_remove("PYTHONDONTWRITEBYTECODE");
        }
        command
    }
}

fn fast_compile() -> bool {
    std::env::var_os("GRPO_VERIFY_FAST_COMPILE").map_or(true, |v| v != "0")
}

/// `GRPO_VERIFY_COMPILE_CACHE` (a directory, or "none"), else `default`.
fn compile_cache(default: PathBuf) -> Option<PathBuf> {
    match std::env::var_os("GRPO_VERIFY_COMPILE_CACHE") {
        Some(v) if v == "none" || v.is_empty() => None,
        Some(v) => Some(PathBuf::from(v)),
        None => Some(default),
    }
}

/// The repository this binary belongs to, if it runs from one:
/// `GRPO_VERIFY_HOME`, else (not in a wheel) the directory it was built from
/// while that still holds the worker's package.
pub fn repo_root() -> Option<PathBuf> {
    if let Some(home) = std::env::var_os("GRPO_VERIFY_HOME") {
        return Some(PathBuf::from(home));
    }
    let built_from = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let is_repo = !cfg!(feature = "wheel") && built_from.join("python/grpo_verify_worker").is_dir();
    is_repo.then_some(built_from)
}

/// The worker's environment, with JAX; no torch is installed for it.
pub fn resolve() -> Result<PythonEnv> {
    setup(false)
}

/// The worker's environment; in the repository's `.venv`, with the torch
/// lock too when `torch` (PyTorch implementations, the torch suites).
pub fn setup(torch: bool) -> Result<PythonEnv> {
    let fast_compile = fast_compile();
    let Some(root) = repo_root() else { return installed(fast_compile) };
    let package_dir = root.join("python");
    let compile_cache = compile_cache(root.join("target/grpo-verify/jax-cache"));
    if let Some(python) = user_python()? {
        return Ok(PythonEnv { python, package_dir: Some(package_dir), compile_cache, fast_compile, bytecode_cache: None });
    }
    let venv = root.join(".venv");
    let torch_lock = package_dir.join("requirements-torch.txt");
    ensure_venv(&venv, &package_dir.join("requirements.txt"), torch.then_some(torch_lock.as_path()))?;
    let bytecode_cache = Some(venv.join("pycache"));
    Ok(PythonEnv { python: venv.join("bin").join("python"), package_dir: Some(package_dir), compile_cache, fast_compile, bytecode_cache })
}

/// `GRPO_VERIFY_PYTHON`, checked to exist.
fn user_python() -> Result<Option<PathBuf>> {
    let Some(python) = std::env::var_os("GRPO_VERIFY_PYTHON") else { return Ok(None) };
    let python = PathBuf::from(python);
    if !python.exists() && which(&python).is_none() {
        bail!("GRPO_VERIFY_PYTHON = {} does not exist: point it at a Python with jax installed", python.display());
    }
    Ok(Some(python))
}

/// Installed from the wheel: the interpreter of the environment the binary
/// is in, whose site-packages hold the worker's packages.
fn installed(fast_compile: bool) -> Result<PythonEnv> {
    let cache_home = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("target"));
    let compile_cache = compile_cache(cache_home.join("grpo-verify/jax-cache"));
    let python = match user_python()? {
        Some(python) => python,
        None => {
            let exe = std::env::current_exe().context("locating the grpo-verify executable")?;
            let beside = exe.parent().map(|bin| ["python3", "python"].map(|name| bin.join(name)));
            match beside.into_iter().flatten().find(|p| p.is_file()) {
                Some(python) => python,
                None => which(Path::new("python3")).ok_or_else(|| {
                    anyhow::anyhow!(
                        "no Python beside {} and no python3 on PATH: set GRPO_VERIFY_PYTHON to the \
                         interpreter of the environment grpo-verify is installed in",
                        exe.display()
                    )
                })?,
            }
        }
    };
    Ok(PythonEnv { python, package_dir: None, compile_cache, fast_compile, bytecode_cache: None })
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

/// The markers of what the venv has: the JAX pins, and the torch lock on top.
const JAX_MARKER: &str = ".grpo-verify-installed";
const TORCH_MARKER: &str = ".grpo-verify-torch-installed";

fn ensure_venv(venv: &Path, requirements: &Path, torch_lock: Option<&Path>) -> Result<()> {
    let read = |path: &Path| fs::read_to_string(path).with_context(|| format!("reading {}", path.display()));
    let jax_wanted = fingerprint(&(read(requirements)? + UV));
    let torch_wanted = match torch_lock {
        Some(lock) => Some(fingerprint(&(read(requirements)? + &read(lock)? + UV))),
        None => None,
    };
    let has = |marker: &str, wanted: &str| fs::read_to_string(venv.join(marker)).ok().as_deref() == Some(wanted);
    let done = || has(JAX_MARKER, &jax_wanted) && torch_wanted.as_deref().map_or(true, |t| has(TORCH_MARKER, t));
    if done() {
        return Ok(());
    }
    let _lock = Lock::acquire(&venv.with_extension("lock"))?;
    if done() {
        return Ok(()); // another process finished it while we waited
    }
    let base = std::env::var("GRPO_VERIFY_BASE_PYTHON").ok().map(PathBuf::from).unwrap_or_else(|| {
        which(Path::new("python3.11")).unwrap_or_else(|| PathBuf::from("python3"))
    });
    let python = venv.join("bin").join("python");
    let uv = || {
        let mut cmd = Command::new(venv.join("bin").join("uv"));
        // --native-tls: the system's certificates, as pip uses them.
        cmd.args(["pip", "install", "--quiet", "--native-tls", "--python"]).arg(&python);
        cmd
    };
    let started = std::time::Instant::now();
    if !has(JAX_MARKER, &jax_wanted) {
        eprintln!(
            "grpo-verify: setting up the Python environment {} with {} (first use only: the pinned JAX)",
            venv.display(),
            base.display()
        );
        if !python.exists() {
            run(Command::new(&base).args(["-m", "venv"]).arg(venv), "creating the venv")?;
        }
        // uv installs the pins with parallel downloads and unpacking (torch's
        // lock in ~20 s where pip took ~105 s on the CI machine). It is itself
        // a pinned wheel from PyPI, installed by pip.
        run(
            Command::new(&python).args(["-m", "pip", "install", "--disable-pip-version-check", "-q", UV]),
            "installing uv",
        )?;
        run(uv().arg("-r").arg(requirements), "installing python/requirements.txt")?;
        let _ = fs::remove_file(venv.join(TORCH_MARKER)); // the torch lock sits on these pins
        fs::write(venv.join(JAX_MARKER), &jax_wanted)?;
        eprintln!("grpo-verify: {} installed in {:.0} s", requirements.display(), started.elapsed().as_secs_f64());
    }
    if let (Some(lock), Some(wanted)) = (torch_lock, torch_wanted) {
        if !has(TORCH_MARKER, &wanted) {
            let torch_started = std::time::Instant::now();
            eprintln!(
                "grpo-verify: installing the torch lock {} into {} (torch and its CUDA runtime wheels: 5.8 GiB installed)",
                lock.display(),
                venv.display()
            );
            // A complete lock: --no-deps keeps the resolver from pulling the libraries' training stacks.
            run(uv().args(["--no-deps", "-r"]).arg(lock), "installing python/requirements-torch.txt")?;
            fs::write(venv.join(TORCH_MARKER), wanted)?;
            eprintln!("grpo-verify: {} installed in {:.0} s", lock.display(), torch_started.elapsed().as_secs_f64());
        }
    }
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
