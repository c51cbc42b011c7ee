//! Running one implementation on one case through the worker, and reading
//! its outputs back with their shapes checked.

use std::time::Duration;

use serde_json::{json, Value};

use crate::case::{Case, Dtype};
use crate::host::{WireArray, Worker, WorkerError};

/// What an implementation returned for one case.
#[derive(Clone, Debug)]
pub struct Outputs {
    pub loss: f64,
    /// cotangent * d loss / d logits, [B*T*V], widened to f32.
    pub grad: Vec<f32>,
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

/// The request header and arrays for a case (docs/worker-protocol.md, `run`).
pub fn run_request(implementation: &str, case: &Case) -> (Value, Vec<WireArray>) {
    let s = case.shape;
    let (bt, btv) = ([s.batch, s.time], [s.batch, s.time, s.vocab]);
    let h = &case.hparams;
    let header = json!({
        "op": "run",
        "impl": implementation,
        "config": case.config,
        "hparams": {
            "eps_low": h.eps_low, "eps_high": h.eps_high, "temperature": h.temperature,
            "beta": h.beta, "entropy_coef": h.entropy_coef,
            "delta": if h.delta.is_finite() { h.delta } else { 3.0e38 },
            "normalizer": h.normalizer,
        },
        "cotangent": case.cotangent,
    });
    let mut arrays = vec![
        match case.dtype {
            Dtype::F32 => WireArray::f32("logits", &btv, &case.logits),
            Dtype::Bf16 => WireArray::bf16("logits", &btv, &case.logits),
        },
        WireArray::i32("tokens", &bt, &case.tokens),
        WireArray::f32("mask", &bt, &case.mask),
        WireArray::f32("advantages", &[s.batch], &case.advantages),
    ];
    if let Some(old) = &case.old_logp {
        arrays.push(WireArray::f32("old_logp", &bt, old));
    }
    if let Some(r) = &case.ref_logp {
        arrays.push(WireArray::f32("ref_logp", &bt, r));
    }
    (header, arrays)
}

/// Runs `implementation` on `case`. A worker error of kind `load` or
/// `protocol`, or a worker that cannot start, is returned as `Err`: the run
/// cannot go on. Everything else is this case's result.
pub fn run_case(worker: &mut Worker, implementation: &str, case: &Case, timeout: Duration) -> Result<RunResult, WorkerError> {
    let (header, arrays) = run_request(implementation, case);
    match worker.request(&header, &arrays, timeout) {
        Ok(reply) => Ok(match read_outputs(&reply, case) {
            Ok(out) => RunResult::Ok(out),
            Err(msg) => RunResult::Failed(msg),
        }),
        Err(WorkerError::Reply { kind, message, traceback }) => match kind.as_str() {
            "unsupported" => Ok(RunResult::Unsupported(message)),
            "impl" => Ok(RunResult::Failed(match traceback {
                Some(tb) => format!("raised: {message}\n{tb}"),
                None => format!("raised: {message}"),
            })),
            _ => Err(WorkerError::Reply { kind, message, traceback }),
        },
        Err(e @ (WorkerError::Crashed { .. } | WorkerError::Timeout { .. })) => Ok(RunResult::Failed(e.to_string())),
        Err(e) => Err(e),
    }
}

fn read_outputs(reply: &crate::host::Reply, case: &Case) -> Result<Outputs, String> {
    let s = case.shape;
    let expect = |name: &str, shape: &[usize]| -> Result<Option<&WireArray>, String> {
        match reply.array(name) {
            None => Ok(None),
            Some(a) if a.shape == shape => Ok(Some(a)),
            Some(a) => Err(format!("{name} has shape {:?}, expected {:?}", a.shape, shape)),
        }
    };
    let loss = expect("loss", &[])?.ok_or("the implementation returned no loss")?;
    let grad = expect("grad.logits", &[s.batch, s.time, s.vocab])?.ok_or("no gradient for logits")?;
    let grad_dtype = if grad.is_bf16() { Dtype::Bf16 } else { Dtype::F32 };
    if grad_dtype != case.dtype {
        return Err(format!("grad.logits is {}, the logits were {}", grad_dtype.name(), case.dtype.name()));
    }
    let aux = |name: &str| -> Result<Option<Vec<f32>>, String> {
        Ok(expect(&format!("aux.{name}"), &[s.batch, s.time])?.map(WireArray::to_f32))
    };
    Ok(Outputs {
        loss: loss.to_f32()[0] as f64,
        grad: grad.to_f32(),
        grad_dtype,
        logp: aux("logp")?,
        per_token_loss: aux("per_token_loss")?,
        entropy: aux("entropy")?,
        seconds: reply.header["seconds"].as_f64().unwrap_or(f64::NAN),
        compiled: reply.header["compiled"].as_bool().unwrap_or(false),
    })
}
