//! The worker: one persistent Python process spoken to over its pipes in
//! the framed protocol of `docs/worker-protocol.md`. A crash or a reply past
//! its time limit is that request's error; the process is killed and started
//! again on the next request, so the run goes on.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use grpo_oracle::Declared;

use crate::case::Kind;
use crate::worker::protocol::{read_frame, write_frame, Reply, WireArray};
use crate::worker::pyenv::PythonEnv;

/// The `error` of an `ok: false` reply (docs/worker-protocol.md), parsed
/// once where the reply is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyKind {
    /// The implementation could not be found, imported or classified.
    Load,
    /// NotImplementedError while tracing: the configuration is unsupported.
    Unsupported,
    /// Any other exception of the implementation.
    Impl,
    /// A malformed request: a harness bug.
    Protocol,
    /// `lower` could not export the step.
    Lowering,
    /// The worker's environment cannot serve.
    Setup,
    /// A kind this harness does not know (a newer worker).
    Unknown,
}

impl ReplyKind {
    /// The kind of an error reply's `"error"` field (docs/worker-protocol.md); an unknown one is `Unknown`.
    pub fn parse(text: &str) -> ReplyKind {
        match text {
            "load" => ReplyKind::Load,
            "unsupported" => ReplyKind::Unsupported,
            "impl" => ReplyKind::Impl,
            "protocol" => ReplyKind::Protocol,
            "lowering" => ReplyKind::Lowering,
            "setup" => ReplyKind::Setup,
            _ => ReplyKind::Unknown,
        }
    }

    /// Its name on the wire.
    pub fn name(self) -> &'static str {
        match self {
            ReplyKind::Load => "load",
            ReplyKind::Unsupported => "unsupported",
            ReplyKind::Impl => "impl",
            ReplyKind::Protocol => "protocol",
            ReplyKind::Lowering => "lowering",
            ReplyKind::Setup => "setup",
            ReplyKind::Unknown => "unknown",
        }
    }
}

impl std::fmt::Display for ReplyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a request got no successful reply.
#[derive(Debug)]
pub enum WorkerError {
    /// The worker answered `ok: false`. `switch`: the SPEC switch an
    /// `unsupported` reply names as data (docs/spec.md, "Refusing a
    /// configuration"), if the implementation gave one.
    Reply {
        /// The reply's `error` kind.
        kind: ReplyKind,
        /// Its message (an implementation's exception, type first).
        message: String,
        /// The Python traceback, when there is one.
        traceback: Option<String>,
        /// The refused switch (`Some("")`: none relaxes the refusal).
        switch: Option<String>,
    },
    /// The process exited or closed its pipes; it will be restarted.
    Crashed {
        /// The last lines the process wrote to stderr.
        stderr_tail: String,
    },
    /// No reply within the limit; the process was killed and will be restarted.
    Timeout {
        /// The limit that passed.
        seconds: f64,
        /// The last lines the process wrote to stderr.
        stderr_tail: String,
    },
    /// The worker cannot be started at all.
    Setup(String),
}

impl std::fmt::Display for WorkerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WorkerError::Reply { kind, message, .. } => write!(f, "{kind} error: {message}"),
            WorkerError::Crashed { stderr_tail } => {
                write!(f, "the worker crashed (restarted); {stderr_tail}")
            }
            WorkerError::Timeout { seconds, stderr_tail } => write!(
                f,
                "no reply within {seconds:.0} s: the worker was killed and restarted; {stderr_tail}"
            ),
            WorkerError::Setup(m) => write!(f, "{m}"),
        }
    }
}

struct Process {
    child: Child,
    stdin: ChildStdin,
    replies: Receiver<std::io::Result<Reply>>,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
}

const STDERR_LINES: usize = 40;

/// A built-in implementation as the worker's `hello` announces it.
#[derive(Clone, Debug)]
pub struct Builtin {
    /// Its stable name (reports, repros and `--impl` use it).
    pub name: String,
    /// Logits or fused (docs/spec.md, "Implementation adapter").
    pub kind: Kind,
    /// It runs on a device mesh (`--devices`), not one device.
    pub sharded: bool,
    /// `gradcheck` checks it when no `--impl` is given.
    pub gradcheck_default: bool,
    /// The switch values it declares it refuses (its registry entry's
    /// `refuses`, schema names): `check` holds it to them.
    pub refuses: Vec<(String, Vec<serde_json::Value>)>,
}

impl Builtin {
    /// The first declared refusal `config` meets, as (switch, value); None
    /// when the built-in declares it supported.
    pub fn refused(&self, config: &grpo_oracle::Config) -> Option<(String, serde_json::Value)> {
        let config = serde_json::to_value(config).expect("a config serialises");
        self.refuses.iter().find_map(|(switch, values)| values.contains(&config[switch]).then(|| (switch.clone(), config[switch].clone())))
    }
}

/// The worker's reply to `load` (python/grpo_verify_worker/server.py): every
/// field required, so a worker of another version fails loudly here.
#[derive(serde::Deserialize)]
struct LoadReply {
    kind: String,
    spec_version: u8,
    framework: String,
    precision_conventions: Vec<String>,
    /// torch's version, for a PyTorch implementation.
    #[serde(default)]
    torch: Option<String>,
}

/// The persistent worker process, restarted on demand.
pub struct Worker {
    env: PythonEnv,
    process: Option<Process>,
    /// The `hello` reply of the current process.
    pub hello: Value,
    /// Times the process was restarted (after a crash or a hang).
    pub restarts: usize,
    /// JAX devices the worker must have (simulated host devices on CPU).
    devices: usize,
    /// What the `load` reply said of each implementation loaded, by name.
    loaded: std::collections::HashMap<String, Loaded>,
}

/// What a `load` reply says of an implementation beyond its kind.
#[derive(Clone, Debug)]
struct Loaded {
    /// 1 or 2 (`grpo_loss.spec_version`).
    spec_version: u8,
    /// "jax", or "torch 2.14.1" (`grpo_loss.framework` and the worker's torch).
    framework: String,
    /// `grpo_loss.precision_conventions` (docs/conventions.md), parsed:
    /// each on every case or under its condition.
    conventions: Vec<Declared>,
}

impl Worker {
    /// Starts a worker on one device.
    pub fn start(env: &PythonEnv) -> Result<Worker, WorkerError> {
        Worker::start_with_devices(env, 1)
    }

    /// A worker with at least `devices` JAX devices: on the CPU backend XLA
    /// simulates them (`--xla_force_host_platform_device_count`); on an
    /// accelerator they must exist.
    pub fn start_with_devices(env: &PythonEnv, devices: usize) -> Result<Worker, WorkerError> {
        let mut w = Worker {
            env: env.clone(),
            process: None,
            hello: Value::Null,
            restarts: 0,
            devices: devices.max(1),
            loaded: Default::default(),
        };
        w.ensure_running()?;
        let have = w.hello["device_count"]
            .as_u64()
            .ok_or_else(|| WorkerError::Setup(format!("the worker's hello has no device_count: {}", w.hello)))? as usize;
        if have < w.devices {
            return Err(WorkerError::Setup(format!(
                "--devices {}: the JAX backend ({}) has {have} device(s)",
                w.devices,
                w.hello["backend"].as_str().unwrap_or("?")
            )));
        }
        Ok(w)
    }

    fn ensure_running(&mut self) -> Result<(), WorkerError> {
        if self.process.is_some() {
            return Ok(());
        }
        let mut command = self.env.command();
        if self.devices > 1 {
            let mut flags = std::env::var("XLA_FLAGS").unwrap_or_default();
            flags += &format!(" --xla_force_host_platform_device_count={}", self.devices);
            command.env("XLA_FLAGS", flags.trim());
        }
        match &self.env.compile_cache {
            Some(dir) => command.env("GRPO_VERIFY_COMPILE_CACHE", dir),
            None => command.env_remove("GRPO_VERIFY_COMPILE_CACHE"),
        };
        command.env("GRPO_VERIFY_FAST_COMPILE", if self.env.fast_compile { "1" } else { "0" });
        // `check --jobs N` runs N workers on one device: JAX's GPU client
        // otherwise claims 75% of the device's memory in each, and the
        // second worker's first allocation fails. Memory is taken as needed
        // instead (a user's own setting wins; nothing changes on CPU).
        if std::env::var_os("XLA_PYTHON_CLIENT_PREALLOCATE").is_none() {
            command.env("XLA_PYTHON_CLIENT_PREALLOCATE", "false");
        }
        let mut child = command
            .args(["-u", "-m", "grpo_verify_worker"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| WorkerError::Setup(format!("could not start {}: {e}", self.env.python.display())))?;
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, replies) = mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            loop {
                let frame = read_frame(&mut r);
                let stop = frame.is_err();
                if tx.send(frame).is_err() || stop {
                    break;
                }
            }
        });
        let stderr_tail = Arc::new(Mutex::new(VecDeque::new()));
        let tail = stderr_tail.clone();
        let echo = std::env::var_os("GRPO_VERIFY_WORKER_STDERR").is_some();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if echo {
                    eprintln!("[worker] {line}");
                }
                let mut t = tail.lock().unwrap();
                if t.len() == STDERR_LINES {
                    t.pop_front();
                }
                t.push_back(line);
            }
        });
        self.process = Some(Process { child, stdin, replies, stderr_tail });
        match self.request(&json!({"op": "hello"}), &[], Duration::from_secs(300)) {
            Ok(reply) => {
                self.hello = reply.header;
                Ok(())
            }
            // The worker's own check of its environment (environment.py): the
            // message names the package and the version found.
            Err(WorkerError::Reply { kind: ReplyKind::Setup, message, .. }) => {
                self.kill(true);
                Err(WorkerError::Setup(format!("the worker's Python cannot serve: {message}")))
            }
            Err(e) => Err(WorkerError::Setup(format!(
                "the worker ({} -m grpo_verify_worker) did not start: {e}",
                self.env.python.display()
            ))),
        }
    }

    /// Sends one request and waits up to `timeout` for its reply.
    pub fn request(&mut self, header: &Value, arrays: &[WireArray], timeout: Duration) -> Result<Reply, WorkerError> {
        self.ensure_running()?;
        let mut header = header.clone();
        header["arrays"] = Value::Array(arrays.iter().map(WireArray::entry).collect());
        let p = self.process.as_mut().unwrap();
        let sent = write_frame(&mut p.stdin, &header, arrays);
        let start = Instant::now();
        let outcome = match sent {
            Err(_) => Err(None),
            Ok(()) => match p.replies.recv_timeout(timeout) {
                Ok(Ok(reply)) => Ok(reply),
                Ok(Err(_)) | Err(RecvTimeoutError::Disconnected) => Err(None),
                Err(RecvTimeoutError::Timeout) => Err(Some(start.elapsed().as_secs_f64())),
            },
        };
        match outcome {
            Ok(reply) => {
                if reply.header["ok"].as_bool() == Some(true) {
                    Ok(reply)
                } else {
                    Err(WorkerError::Reply {
                        kind: ReplyKind::parse(reply.header["error"].as_str().unwrap_or("unknown")),
                        message: reply.header["message"].as_str().unwrap_or("").to_string(),
                        traceback: reply.header["traceback"].as_str().map(String::from),
                        switch: reply.header["switch"].as_str().map(String::from),
                    })
                }
            }
            Err(timed_out) => {
                let stderr_tail = self.kill(timed_out.is_none());
                Err(match timed_out {
                    Some(seconds) => WorkerError::Timeout { seconds, stderr_tail },
                    None => WorkerError::Crashed { stderr_tail },
                })
            }
        }
    }

    /// Loads an implementation (`--impl` syntax) and returns its kind. The
    /// error names the implementation.
    pub fn load(&mut self, implementation: &str) -> anyhow::Result<Kind> {
        match self.request(&json!({"op": "load", "impl": implementation}), &[], Duration::from_secs(300)) {
            Ok(reply) => {
                let load: LoadReply = serde_json::from_value(reply.header)
                    .map_err(|e| anyhow::anyhow!("--impl {implementation}: the worker's load reply is malformed ({e}): a worker of another version?"))?;
                let framework = match (load.framework.as_str(), load.torch) {
                    ("torch", Some(version)) => format!("torch {version}"),
                    (name, _) => name.to_string(),
                };
                let conventions = load
                    .precision_conventions
                    .iter()
                    .map(|c| Declared::parse(c))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| anyhow::anyhow!("--impl {implementation}: grpo_loss.precision_conventions: {e}"))?;
                self.loaded.insert(implementation.to_string(), Loaded { spec_version: load.spec_version, framework, conventions });
                Kind::parse(&load.kind).ok_or_else(|| anyhow::anyhow!("--impl {implementation}: the worker says its kind is {:?}", load.kind))
            }
            Err(WorkerError::Reply { message, .. }) => anyhow::bail!("--impl {implementation}: {message}"),
            Err(e) => anyhow::bail!("--impl {implementation}: {e}"),
        }
    }

    /// The SPEC version an implementation declares (`grpo_loss.spec_version`;
    /// 1 without it), loading it first if needed.
    pub fn spec_version(&mut self, implementation: &str) -> anyhow::Result<u8> {
        Ok(self.loaded(implementation)?.spec_version)
    }

    /// "jax", or "torch" and its version (`grpo_loss.framework = "torch"`),
    /// loading the implementation first if needed.
    pub fn framework(&mut self, implementation: &str) -> anyhow::Result<String> {
        Ok(self.loaded(implementation)?.framework.clone())
    }

    /// The precision conventions an implementation declares
    /// (`grpo_loss.precision_conventions`; none without it), loading it first
    /// if needed.
    pub fn conventions(&mut self, implementation: &str) -> anyhow::Result<Vec<Declared>> {
        Ok(self.loaded(implementation)?.conventions.clone())
    }

    fn loaded(&mut self, implementation: &str) -> anyhow::Result<&Loaded> {
        if !self.loaded.contains_key(implementation) {
            self.load(implementation)?;
        }
        Ok(&self.loaded[implementation])
    }

    /// [`Worker::load`] for each of `implementations`, in order.
    pub fn load_all(&mut self, implementations: &[String]) -> anyhow::Result<Vec<Kind>> {
        implementations.iter().map(|i| self.load(i)).collect()
    }

    /// The built-in implementations, as the worker's `hello` announces them
    /// (`python/grpo_kernels/registry.py` is the one list).
    pub fn builtins(&self) -> Vec<Builtin> {
        let listed = self.hello["builtins"].as_array().map(Vec::as_slice).unwrap_or_default();
        listed
            .iter()
            .filter_map(|b| {
                Some(Builtin {
                    name: b["name"].as_str()?.to_string(),
                    kind: Kind::parse(b["kind"].as_str()?)?,
                    sharded: b["sharded"].as_bool().unwrap_or(false),
                    gradcheck_default: b["gradcheck_default"].as_bool().unwrap_or(false),
                    refuses: b["refuses"]
                        .as_object()
                        .map(|r| r.iter().map(|(switch, values)| (switch.clone(), values.as_array().cloned().unwrap_or_default())).collect())
                        .unwrap_or_default(),
                })
            })
            .collect()
    }

    /// The plain-JAX baseline of the tolerance rule for `kind`, as `hello`
    /// announces it.
    pub fn baseline(&self, kind: Kind) -> anyhow::Result<String> {
        self.hello["baselines"][kind.name()]
            .as_str()
            .map(String::from)
            .ok_or_else(|| anyhow::anyhow!("the worker's hello names no baseline for the {} kind", kind.name()))
    }

    /// Kills the process (it restarts on the next request) and returns the
    /// last lines it wrote to stderr.
    /// Ends the process (`crashed`: it closed its pipe and is exiting by
    /// itself) and says how it ended and what it last wrote to stderr.
    fn kill(&mut self, crashed: bool) -> String {
        let Some(mut p) = self.process.take() else { return String::new() };
        // A crashed process is exiting: wait (briefly) for its status, which
        // names the signal (SIGSEGV, ...). The same crash must give the same
        // words every time (reports are compared across --jobs).
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut exited = p.child.try_wait().ok().flatten();
        while crashed && exited.is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
            exited = p.child.try_wait().ok().flatten();
        }
        let _ = p.child.kill();
        let _ = p.child.wait();
        self.restarts += 1;
        // Give the stderr thread a moment to drain what the process wrote last.
        std::thread::sleep(Duration::from_millis(100));
        let tail = p.stderr_tail.lock().unwrap();
        let lines = tail.iter().cloned().collect::<Vec<_>>().join("\n");
        match exited {
            Some(status) => format!("it exited with {status}; its last stderr lines:\n{lines}"),
            None => format!("its last stderr lines:\n{lines}"),
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Some(p) = self.process.as_mut() {
            let _ = write_frame(&mut p.stdin, &json!({"op": "shutdown", "arrays": []}), &[]);
            let deadline = Instant::now() + Duration::from_secs(2);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = p.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }
}
