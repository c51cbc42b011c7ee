//! The worker's wire protocol (`docs/worker-protocol.md`), in one place:
//! the frame (a length-prefixed JSON header, then the raw bytes of its
//! arrays), the arrays, and the requests the harness sends (`run` with a
//! case's arrays; `lower` and `bench` with the arrays' shapes only).

use std::io::{Read, Write};

use serde_json::{json, Value};

use grpo_oracle::{Config, Hparams};

use crate::case::{Case, CaseSpec, Dtype, Inputs, Kind};

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

    pub fn entry(&self) -> Value {
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

/// The JSON of an op on a configuration (docs/worker-protocol.md): `run`,
/// `lower` and `bench` share it.
/// `v2`: the implementation declares SPEC v2 and gets its keys too
/// (infinite values as the strings "inf" / "-inf"); a v1 one gets v1's keys only.
pub fn op_header(op: &str, implementation: &str, config: &Config, h: &Hparams, v2: bool) -> Value {
    let mut header = json!({
        "op": op,
        "impl": implementation,
        "config": config,
        "hparams": {
            "eps_low": h.eps_low, "eps_high": h.eps_high, "temperature": h.temperature,
            "beta": h.beta, "entropy_coef": h.entropy_coef,
            "delta": if h.delta.is_finite() { h.delta } else { 3.0e38 },
            "normalizer": h.normalizer,
        },
    });
    if v2 {
        let number = |x: f64| {
            if x.is_finite() {
                json!(x)
            } else if x > 0.0 {
                json!("inf")
            } else {
                json!("-inf")
            }
        };
        let hp = &mut header["hparams"];
        hp["eps_low"] = number(h.eps_low);
        for (name, value) in [
            ("logit_scale", h.logit_scale),
            ("logit_softcap", h.logit_softcap),
            ("log_ratio_min", h.log_ratio_min),
            ("log_ratio_max", h.log_ratio_max),
            ("sapo_tau_pos", h.sapo_tau_pos),
            ("sapo_tau_neg", h.sapo_tau_neg),
            ("kl_log_ratio_clamp", h.kl_log_ratio_clamp),
            ("kl_max", h.kl_max),
        ] {
            hp[name] = number(value);
        }
    } else {
        let v1_keys = ["temperature_mode", "aggregation", "on_policy", "kl", "entropy_bonus", "two_sided"];
        if let Some(c) = header["config"].as_object_mut() {
            c.retain(|k, _| v1_keys.contains(&k.as_str()));
        }
    }
    header
}

/// The request header and arrays for a case (docs/worker-protocol.md, `run`).
pub fn run_request(implementation: &str, case: &Case, v2: bool) -> (Value, Vec<WireArray>) {
    let s = case.shape;
    let bt = [s.batch, s.time];
    let mut header = op_header("run", implementation, &case.config, &case.hparams, v2);
    header["cotangent"] = json!(case.cotangent);
    if let Some(m) = case.mesh {
        header["mesh"] = json!({"data": m.data, "model": m.model});
    }
    let mut arrays: Vec<WireArray> = case
        .float_inputs()
        .into_iter()
        .map(|(name, values)| {
            let shape = float_input_shape(case, name);
            match case.dtype {
                Dtype::F32 => WireArray::f32(name, &shape, values),
                Dtype::Bf16 => WireArray::bf16(name, &shape, values),
            }
        })
        .collect();
    arrays.push(WireArray::i32("tokens", &bt, &case.tokens));
    arrays.push(WireArray::f32("mask", &bt, &case.mask));
    arrays.push(WireArray::f32("advantages", &[s.batch], &case.advantages));
    if let Some(old) = &case.old_logp {
        arrays.push(WireArray::f32("old_logp", &bt, old));
    }
    if let Some(r) = &case.ref_logp {
        arrays.push(WireArray::f32("ref_logp", &bt, r));
    }
    if let Some(w) = &case.is_weights {
        arrays.push(WireArray::f32("is_weights", &[s.batch, w.len() / s.batch.max(1)], w));
    }
    (header, arrays)
}

/// The shape of a float input (and of its gradient).
pub fn float_input_shape(case: &Case, name: &str) -> Vec<usize> {
    let s = case.shape;
    let h = match &case.inputs {
        Inputs::Fused { hidden_dim, .. } => *hidden_dim,
        Inputs::Logits { .. } => 0,
    };
    match name {
        "hidden" => vec![s.batch, s.time, h],
        "lm_head" => vec![h, s.vocab],
        _ => vec![s.batch, s.time, s.vocab],
    }
}

/// A `lower` or `bench` request: the op on `spec`'s configuration, with the
/// (name, dtype, shape) of every input an implementation of `kind` takes and
/// no data (the worker makes its own).
pub fn shapes_request(op: &str, implementation: &str, spec: &CaseSpec, kind: Kind, v2: bool) -> Value {
    let mut header = op_header(op, implementation, &spec.config, &spec.resolved_hparams(&vec![1.0; spec.batch * spec.time]), v2);
    header["specs"] =
        Value::Array(spec.array_specs(kind).into_iter().map(|(n, d, s)| json!({"name": n, "dtype": d, "shape": s})).collect());
    header
}

/// Writes one request frame: the header's length (u32 LE), the header, the arrays' bytes.
pub fn write_frame(w: &mut impl Write, header: &Value, arrays: &[WireArray]) -> std::io::Result<()> {
    let text = serde_json::to_vec(header)?;
    w.write_all(&(text.len() as u32).to_le_bytes())?;
    w.write_all(&text)?;
    for a in arrays {
        w.write_all(&a.bytes)?;
    }
    w.flush()
}

/// Reads one reply frame (see [`write_frame`]).
pub fn read_frame(r: &mut impl Read) -> std::io::Result<Reply> {
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
