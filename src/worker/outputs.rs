//! Running one implementation on one case through the worker, and reading
//! its outputs back with their shapes checked.

use std::time::Duration;

use crate::case::{Case, Dtype};
use crate::worker::process::{ReplyKind, Worker, WorkerError};
use crate::worker::protocol::{float_input_shape, run_request, Reply, WireArray};

pub use crate::compare::Outputs;

/// The outcome of one run.
#[derive(Debug)]
pub enum RunResult {
    /// What the implementation returned, read and widened.
    Ok(Outputs),
    /// The implementation raised NotImplementedError while tracing.
    Unsupported(Refusal),
    /// It raised, crashed, hung, or returned something malformed: which,
    /// and the message (a raised exception's with its traceback).
    Failed(FailedRun, String),
}

/// An implementation's refusal of a case: its message, and the switch it
/// refused when it says so as data (the exception's `switch` attribute,
/// docs/spec.md, "Refusing a configuration"). A foreign kernel that raises a
/// bare NotImplementedError gives only the message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The exception's type and message.
    pub message: String,
    /// The switch refused, as the exception's data says it; `Some("")`:
    /// none relaxes the refusal (a hyperparameter's value or a shape); None:
    /// the exception said nothing (its message is read instead).
    pub switch: Option<String>,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// How a run failed before there was anything to judge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FailedRun {
    /// The implementation raised (an exception other than NotImplementedError).
    Raised,
    /// Its process died (a signal, an abort, an out-of-memory kill).
    Crashed,
    /// No reply within the case timeout.
    TimedOut,
    /// It returned something malformed (an output missing or of the wrong shape).
    Malformed,
}

/// How the message of an implementation that raised begins.
const RAISED: &str = "raised:";

/// Runs `implementation` on `case`. A worker error of kind `load` or
/// `protocol`, or a worker that cannot start, is returned as `Err`: the run
/// cannot go on. Everything else is this case's result.
pub fn run_case(worker: &mut Worker, implementation: &str, case: &Case, timeout: Duration) -> Result<RunResult, WorkerError> {
    let version = worker.spec_version(implementation).map_err(|e| WorkerError::Setup(format!("{e:#}")))?;
    if let (1, Some(switch)) = (version, case.config.v2_switch()) {
        // SPEC: a v1 implementation is never given a v2 configuration.
        return Ok(RunResult::Unsupported(Refusal {
            message: format!("{implementation} is a SPEC v1 implementation (no `grpo_loss.spec_version = 2`) and this case has {switch}"),
            switch: switch.split(" = ").next().map(String::from),
        }));
    }
    let (header, arrays) = run_request(implementation, case, version);
    match worker.request(&header, &arrays, timeout) {
        Ok(reply) => Ok(match read_outputs(&reply, case) {
            Ok(out) => RunResult::Ok(out),
            Err(msg) => RunResult::Failed(FailedRun::Malformed, msg),
        }),
        Err(WorkerError::Reply { kind, message, traceback, switch }) => match kind {
            ReplyKind::Unsupported => Ok(RunResult::Unsupported(Refusal { message, switch })),
            ReplyKind::Impl => Ok(RunResult::Failed(
                FailedRun::Raised,
                match traceback {
                    Some(tb) => format!("{RAISED} {message}\n{tb}"),
                    None => format!("{RAISED} {message}"),
                },
            )),
            _ => Err(WorkerError::Reply { kind, message, traceback, switch }),
        },
        Err(e @ WorkerError::Crashed { .. }) => Ok(RunResult::Failed(FailedRun::Crashed, e.to_string())),
        Err(e @ WorkerError::Timeout { .. }) => Ok(RunResult::Failed(FailedRun::TimedOut, e.to_string())),
        Err(e) => Err(e),
    }
}

fn read_outputs(reply: &Reply, case: &Case) -> Result<Outputs, String> {
    let s = case.shape;
    let expect = |name: &str, shape: &[usize]| -> Result<Option<&WireArray>, String> {
        match reply.array(name) {
            None => Ok(None),
            Some(a) if a.shape == shape => Ok(Some(a)),
            Some(a) => Err(format!("{name} has shape {:?}, expected {:?}", a.shape, shape)),
        }
    };
    let loss = expect("loss", &[])?.ok_or("the implementation returned no loss")?;
    let mut grads = Vec::new();
    for (name, _) in case.float_inputs() {
        let key = format!("grad.{name}");
        let g = expect(&key, &float_input_shape(case, name))?.ok_or(format!("no gradient for {name}"))?;
        let dtype = if g.is_bf16() { Dtype::Bf16 } else { Dtype::F32 };
        if dtype != case.dtype {
            return Err(format!("{key} is {}, {name} was {}", dtype.name(), case.dtype.name()));
        }
        grads.push(g.to_f32());
    }
    let grad_lm_head = (grads.len() == 2).then(|| grads.pop().unwrap());
    let grad = grads.pop().unwrap();
    let grad_dtype = case.dtype;
    let aux = |name: &str| -> Result<Option<Vec<f32>>, String> {
        Ok(expect(&format!("aux.{name}"), &[s.batch, s.time])?.map(WireArray::to_f32))
    };
    let bf16 = |name: &str| reply.array(name).is_some_and(WireArray::is_bf16);
    let bf16_returned = crate::compare::Bf16Returned {
        loss: loss.is_bf16(),
        logp: bf16("aux.logp"),
        per_token_loss: bf16("aux.per_token_loss"),
        entropy: bf16("aux.entropy"),
    };
    Ok(Outputs {
        bf16_returned,
        loss: loss.to_f32()[0] as f64,
        grad,
        grad_lm_head,
        grad_dtype,
        logp: aux("logp")?,
        per_token_loss: aux("per_token_loss")?,
        entropy: aux("entropy")?,
        seconds: reply.header["seconds"].as_f64().unwrap_or(f64::NAN),
        compiled: reply.header["compiled"].as_bool().unwrap_or(false),
    })
}
