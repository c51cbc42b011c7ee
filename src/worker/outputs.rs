//! Running one implementation on one case through the worker, and reading
//! its outputs back with their shapes checked.

use std::time::Duration;

use crate::case::{Case, Dtype};
use crate::worker::process::{Worker, WorkerError};
use crate::worker::protocol::{float_input_shape, run_request, Reply, WireArray};

/// What an implementation returned for one case.
#[derive(Clone, Debug)]
pub struct Outputs {
    pub loss: f64,
    /// cotangent * d loss / d logits [B*T*V] (logits kind) or d hidden
    /// [B*T*H] (fused kind), widened to f32.
    pub grad: Vec<f32>,
    /// cotangent * d loss / d lm_head [H*V] (fused kind).
    pub grad_lm_head: Option<Vec<f32>>,
    pub grad_dtype: Dtype,
    pub logp: Option<Vec<f32>>,
    pub per_token_loss: Option<Vec<f32>>,
    pub entropy: Option<Vec<f32>>,
    /// Wall time of the call, compilation included when `compiled`.
    pub seconds: f64,
    pub compiled: bool,
}

/// The outcome of one run.
#[derive(Debug)]
pub enum RunResult {
    Ok(Outputs),
    /// The implementation raised NotImplementedError while tracing.
    Unsupported(String),
    /// It raised, crashed, hung, or returned something malformed.
    Failed(String),
}

/// Runs `implementation` on `case`. A worker error of kind `load` or
/// `protocol`, or a worker that cannot start, is returned as `Err`: the run
/// cannot go on. Everything else is this case's result.
/// How the failure of an implementation that raised begins.
pub const RAISED: &str = "raised:";

pub fn run_case(worker: &mut Worker, implementation: &str, case: &Case, timeout: Duration) -> Result<RunResult, WorkerError> {
    let version = worker.spec_version(implementation).map_err(|e| WorkerError::Setup(format!("{e:#}")))?;
    if let (1, Some(switch)) = (version, case.config.v2_switch()) {
        // SPEC: a v1 implementation is never given a v2 configuration.
        return Ok(RunResult::Unsupported(format!(
            "{implementation} is a SPEC v1 implementation (no `grpo_loss.spec_version = 2`) and this case has {switch}"
        )));
    }
    let (header, arrays) = run_request(implementation, case, version >= 2);
    match worker.request(&header, &arrays, timeout) {
        Ok(reply) => Ok(match read_outputs(&reply, case) {
            Ok(out) => RunResult::Ok(out),
            Err(msg) => RunResult::Failed(msg),
        }),
        Err(WorkerError::Reply { kind, message, traceback }) => match kind.as_str() {
            "unsupported" => Ok(RunResult::Unsupported(message)),
            "impl" => Ok(RunResult::Failed(match traceback {
                Some(tb) => format!("{RAISED} {message}\n{tb}"),
                None => format!("{RAISED} {message}"),
            })),
            _ => Err(WorkerError::Reply { kind, message, traceback }),
        },
        Err(e @ (WorkerError::Crashed { .. } | WorkerError::Timeout { .. })) => Ok(RunResult::Failed(e.to_string())),
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
    Ok(Outputs {
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
