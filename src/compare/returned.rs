//! What an implementation returned for one case, as plain arrays: what the
//! rule reads, whoever ran the implementation (the worker reads it off the
//! wire, `worker::outputs`).

use crate::case::Dtype;

/// What an implementation returned for one case.
#[derive(Clone, Debug)]
pub struct Outputs {
    /// The loss, widened to f64.
    pub loss: f64,
    /// cotangent * d loss / d logits [B*T*V] (logits kind) or d hidden
    /// [B*T*H] (fused kind), widened to f32.
    pub grad: Vec<f32>,
    /// cotangent * d loss / d lm_head [H*V] (fused kind).
    pub grad_lm_head: Option<Vec<f32>>,
    /// The dtype the gradients came back in.
    pub grad_dtype: Dtype,
    /// aux["logp"], [B*T] (None when not returned).
    pub logp: Option<Vec<f32>>,
    /// aux["per_token_loss"], [B*T] (None when not returned).
    pub per_token_loss: Option<Vec<f32>>,
    /// aux["entropy"], [B*T] (None when not returned).
    pub entropy: Option<Vec<f32>>,
    /// The loss and aux outputs that came back in bf16: each element's own
    /// output rounding (half a bf16 ulp) is exempt, as a bf16 gradient's is.
    pub bf16_returned: Bf16Returned,
    /// Wall time of the call, compilation included when `compiled`.
    pub seconds: f64,
    /// The call compiled a new step (`seconds` includes the compilation).
    pub compiled: bool,
}

/// Which of the loss and the aux outputs came back in bf16.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bf16Returned {
    /// The loss came back in bf16.
    pub loss: bool,
    /// aux["logp"] came back in bf16.
    pub logp: bool,
    /// aux["per_token_loss"] came back in bf16.
    pub per_token_loss: bool,
    /// aux["entropy"] came back in bf16.
    pub entropy: bool,
}
