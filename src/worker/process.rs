//! The JAX worker: one persistent Python process spoken to over its pipes in
//! the framed protocol of `docs/worker-protocol.md`. A crash or a reply past
//! its time limit is that request's error; the process is killed and started
//! again on the next request, so the run goes on.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::worker::pyenv::PythonEnv;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireDtype {
    F32,
    Bf16,
    I32,
}

impl WireDtype {
    fn name(self) -> &'static str {
        match self {
            WireDtype::F32 => "f32",
            WireDtype::Bf16 => "bf16",
            WireDtype::I32 => "i32",
        }
    }
    fn parse(s: &str) -> Option<Self> {
        match s {
            "f32" => Some(WireDtype::F32),
            "bf16" => Some(WireDtype::Bf16),
            "i32" => Some(WireDtype::I32),
            _ => None,
        }
    }
    fn itemsize(self) -> usize {
        match self {
            WireDtype::Bf16 => 2,
            _ => 4,
        }
    }
}

/// One array on the wire: little-endian, C order.
#[derive(Clone, Debug)]
pub struct WireArray {
    pub name: String,
    pub dtype: WireDtype,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

impl WireArray {
    pub fn f32(name: &str, shape: &[usize], values: &[f32]) -> Self {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        WireArray { name: name.into(), dtype: WireDtype::F32, shape: shape.into(), bytes }
    }
    /// `values` must be exactly representable in bf16.
    pub fn bf16(name: &str, shape: &[usize], values: &[f32]) -> Self {
        let bytes = values.iter().flat_map(|&v| half::bf16::from_f32(v).to_bits().to_le_bytes()).collect();
        WireArray { name: name.into(), dtype: WireDtype::Bf16, shape: shape.into(), bytes }
    }
    pub fn i32(name: &str, shape: &[usize], values: &[i32]) -> Self {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        WireArray { name: name.into(), dtype: WireDtype::I32, shape: shape.into(), bytes }
    }

    /// The values widened to f32 (exact for f32 and bf16).
    pub fn to_f32(&self) -> Vec<f32> {
        match self.dtype {
            WireDtype::F32 => self.bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect(),
            WireDtype::Bf16 => self
                .bytes
                .chunks_exact(2)
                .map(|c| half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
                .collect(),
            WireDtype::I32 => {
                self.bytes.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap()) as f32).collect()
            }
        }
    }

    pub fn is_bf16(&self) -> bool {
        self.dtype == WireDtype::Bf16
    }

    fn entry(&self) -> Value {
        json!({"name": self.name, "dtype": self.dtype.name(), "shape": self.shape})
    }
}

/// A reply: its JSON header and its arrays.
#[derive(Debug)]
pub struct Reply {
    pub header: Value,
    pub arrays: Vec<WireArray>,
}

impl Reply {
    pub fn array(&self, name: &str) -> Option<&WireArray> {
        self.arrays.iter().find(|a| a.name == name)
    }
}

/// Why a request got no successful reply.
#[derive(Debug)]
pub enum WorkerError {
    /// The worker answered `ok: false`.
    Reply { kind: String, message: String, traceback: Option<String> },
    /// The process exited or closed its pipes; it will be restarted.
    Crashed { stderr_tail: String },
    /// No reply within the limit; the process was killed and will be restarted.
    Timeout { seconds: f64, stderr_tail: String },
    /// The worker cannot be started at all.
    Setup(String),
}

impl std::fmt::Display for WorkerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WorkerError::Reply { kind, message, .. } => write!(f, "{kind} error: {message}"),
            WorkerError::Crashed { stderr_tail } => {
                write!(f, "the JAX worker crashed (restarted); its last stderr lines:\n{stderr_tail}")
            }
            WorkerError::Timeout { seconds, stderr_tail } => write!(
                f,
                "no reply within {seconds:.0} s: the JAX worker was killed and restarted; its last stderr lines:\n{stderr_tail}"
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

/// The persistent worker process, restarted on demand.
pub struct Worker {
    env: PythonEnv,
    process: Option<Process>,
    /// The `hello` reply of the current process.
    pub hello: Value,
    pub restarts: usize,
    /// JAX devices the worker must have (simulated host devices on CPU).
    devices: usize,
}

impl Worker {
    pub fn start(env: &PythonEnv) -> Result<Worker, WorkerError> {
        Worker::start_with_devices(env, 1)
    }

    /// A worker with at least `devices` JAX devices: on the CPU backend XLA
    /// simulates them (`--xla_force_host_platform_device_count`); on an
    /// accelerator they must exist.
    pub fn start_with_devices(env: &PythonEnv, devices: usize) -> Result<Worker, WorkerError> {
        let mut w = Worker { env: env.clone(), process: None, hello: Value::Null, restarts: 0, devices: devices.max(1) };
        w.ensure_running()?;
        let have = w.hello["device_count"].as_u64().unwrap_or(1) as usize;
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
        let mut pythonpath = self.env.package_dir.clone().into_os_string();
        if let Some(existing) = std::env::var_os("PYTHONPATH") {
            pythonpath.push(":");
            pythonpath.push(existing);
        }
        let mut command = Command::new(&self.env.python);
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
        let mut child = command
            .args(["-u", "-m", "grpo_verify_worker"])
            .env("PYTHONPATH", pythonpath)
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
            Err(e) => Err(WorkerError::Setup(format!(
                "the JAX worker ({} -m grpo_verify_worker) did not start: {e}",
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
                        kind: reply.header["error"].as_str().unwrap_or("unknown").to_string(),
                        message: reply.header["message"].as_str().unwrap_or("").to_string(),
                        traceback: reply.header["traceback"].as_str().map(String::from),
                    })
                }
            }
            Err(timed_out) => {
                let stderr_tail = self.kill();
                Err(match timed_out {
                    Some(seconds) => WorkerError::Timeout { seconds, stderr_tail },
                    None => WorkerError::Crashed { stderr_tail },
                })
            }
        }
    }

    /// Loads an implementation (`--impl` syntax) and returns its kind, "logits"
    /// or "fused". The error names the implementation.
    pub fn load(&mut self, implementation: &str) -> anyhow::Result<String> {
        match self.request(&serde_json::json!({"op": "load", "impl": implementation}), &[], Duration::from_secs(300)) {
            Ok(reply) => Ok(reply.header["kind"].as_str().unwrap_or("?").to_string()),
            Err(WorkerError::Reply { message, .. }) => anyhow::bail!("--impl {implementation}: {message}"),
            Err(e) => anyhow::bail!("--impl {implementation}: {e}"),
        }
    }

    /// Kills the process (it restarts on the next request) and returns the
    /// last lines it wrote to stderr.
    fn kill(&mut self) -> String {
        let Some(mut p) = self.process.take() else { return String::new() };
        let _ = p.child.kill();
        let _ = p.child.wait();
        self.restarts += 1;
        // Give the stderr thread a moment to drain what the process wrote last.
        std::thread::sleep(Duration::from_millis(100));
        let tail = p.stderr_tail.lock().unwrap();
        tail.iter().cloned().collect::<Vec<_>>().join("\n")
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

fn write_frame(w: &mut impl Write, header: &Value, arrays: &[WireArray]) -> std::io::Result<()> {
    let text = serde_json::to_vec(header)?;
    w.write_all(&(text.len() as u32).to_le_bytes())?;
    w.write_all(&text)?;
    for a in arrays {
        w.write_all(&a.bytes)?;
    }
    w.flush()
}

fn read_frame(r: &mut impl Read) -> std::io::Result<Reply> {
    let bad = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidData, m);
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let mut text = vec![0u8; u32::from_le_bytes(len) as usize];
    r.read_exact(&mut text)?;
    let header: Value = serde_json::from_slice(&text).map_err(|e| bad(format!("bad frame header: {e}")))?;
    let mut arrays = Vec::new();
    for entry in header["arrays"].as_array().cloned().unwrap_or_default() {
        let name = entry["name"].as_str().unwrap_or("").to_string();
        let dtype = WireDtype::parse(entry["dtype"].as_str().unwrap_or(""))
            .ok_or_else(|| bad(format!("array {name}: unknown dtype {}", entry["dtype"])))?;
        let shape: Vec<usize> = entry["shape"]
            .as_array()
            .ok_or_else(|| bad(format!("array {name}: no shape")))?
            .iter()
            .map(|d| d.as_u64().map(|d| d as usize).ok_or_else(|| bad(format!("array {name}: bad shape"))))
            .collect::<Result<_, _>>()?;
        let mut bytes = vec![0u8; shape.iter().product::<usize>() * dtype.itemsize()];
        r.read_exact(&mut bytes)?;
        arrays.push(WireArray { name, dtype, shape, bytes });
    }
    Ok(Reply { header, arrays })
}
