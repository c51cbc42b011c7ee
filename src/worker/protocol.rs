//! The worker's wire protocol (`docs/worker-protocol.md`), in one place:
//! the frame (a length-prefixed JSON header, then the raw bytes of its
//! arrays), the arrays, and the requests the harness sends (`run` with a
//! case's arrays; `lower` and `bench` with the arrays' shapes only).

use std::io::{Read, Write};

use serde_json::{json, Value};

use grpo_oracle::{Config, Hparams, HPARAMS, SWITCHES};

use crate::case::{Case, CaseSpec, Dtype, Inputs, Kind};

/// An array's element type on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireDtype {
    /// IEEE single precision.
    F32,
    /// bfloat16 (the top half of an f32).
    Bf16,
    /// Token ids.
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
    /// The adapter's argument or output it is (`logits`, `tokens`, `grad`, ...).
    pub name: String,
    /// Its element type.
    pub dtype: WireDtype,
    /// Its dimensions, outermost first.
    pub shape: Vec<usize>,
    /// Its elements, little-endian, C order.
    pub bytes: Vec<u8>,
}

impl WireArray {
    /// An f32 array.
    pub fn f32(name: &str, shape: &[usize], values: &[f32]) -> Self {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        WireArray { name: name.into(), dtype: WireDtype::F32, shape: shape.into(), bytes }
    }
    /// `values` must be exactly representable in bf16.
    pub fn bf16(name: &str, shape: &[usize], values: &[f32]) -> Self {
        let bytes = values.iter().flat_map(|&v| half::bf16::from_f32(v).to_bits().to_le_bytes()).collect();
        WireArray { name: name.into(), dtype: WireDtype::Bf16, shape: shape.into(), bytes }
    }
    /// An int32 array (token ids).
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

    /// Is it bf16 (an output returned in bf16 keeps its own rounding)?
    pub fn is_bf16(&self) -> bool {
        self.dtype == WireDtype::Bf16
    }

    /// Its entry in a message's header: name, dtype, shape and byte count.
    pub fn entry(&self) -> Value {
        json!({"name": self.name, "dtype": self.dtype.name(), "shape": self.shape})
    }
}

/// A reply: its JSON header and its arrays.
#[derive(Debug)]
pub struct Reply {
    /// The reply's JSON header (`ok`, `error`, timings, ...).
    pub header: Value,
    /// The arrays that followed the header, in its order.
    pub arrays: Vec<WireArray>,
}

impl Reply {
    /// The array named `name`, if the reply has one.
    pub fn array(&self, name: &str) -> Option<&WireArray> {
        self.arrays.iter().find(|a| a.name == name)
    }
}

/// The JSON of an op on a configuration (docs/worker-protocol.md): `run`,
/// `lower` and `bench` share it. An implementation of SPEC version `version`
/// gets the switches and hyperparameters of that version and before (the
/// schema's `since`), each infinity as the string "inf" or "-inf".
pub fn op_header(op: &str, implementation: &str, config: &Config, h: &Hparams, version: u8) -> Value {
    let config: serde_json::Map<String, Value> = SWITCHES
        .iter()
        .zip(config.switch_values())
        .filter(|(switch, _)| switch.since <= version)
        .map(|(switch, value)| {
            let value = if switch.is_bool { Value::Bool(value == "true") } else { Value::String(value.into()) };
            (switch.name.to_string(), value)
        })
        .collect();
    let hparams: serde_json::Map<String, Value> = HPARAMS
        .iter()
        .zip(h.values())
        .filter(|(info, _)| info.since <= version)
        .map(|(info, x)| (info.name.to_string(), serde_json::to_value(grpo_oracle::JsonNumber(x)).unwrap_or_default()))
        .collect();
    json!({"op": op, "impl": implementation, "config": config, "hparams": hparams})
}

/// The request header and arrays for a case (docs/worker-protocol.md, `run`).
pub fn run_request(implementation: &str, case: &Case, version: u8) -> (Value, Vec<WireArray>) {
    let s = case.shape;
    let bt = [s.batch, s.time];
    let mut header = op_header("run", implementation, &case.config, &case.hparams, version);
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
pub fn shapes_request(op: &str, implementation: &str, spec: &CaseSpec, kind: Kind, version: u8) -> Value {
    let mut header = op_header(op, implementation, &spec.config, &spec.resolved_hparams(&vec![1.0; spec.batch * spec.time]), version);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A v1 implementation gets the schema's v1 keys only, a v2 one every
    /// key; an infinity travels as "inf" / "-inf" to both.
    #[test]
    fn each_version_gets_its_keys_and_infinities_as_strings() {
        let (config, h) = (Config::default(), Hparams::default());
        let v1 = op_header("run", "x", &config, &h, 1);
        let v1_config: Vec<&str> = SWITCHES.iter().filter(|s| s.since == 1).map(|s| s.name).collect();
        let keys = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
        assert_eq!(keys(&v1["config"]).len(), v1_config.len());
        assert!(v1_config.iter().all(|k| v1["config"].get(*k).is_some()));
        assert_eq!(keys(&v1["hparams"]).len(), HPARAMS.iter().filter(|h| h.since == 1).count());
        assert_eq!(v1["hparams"]["delta"], json!("inf"));
        assert_eq!(v1["config"]["on_policy"], json!(false));
        let v2 = op_header("run", "x", &config, &h, 2);
        assert_eq!(keys(&v2["config"]).len(), SWITCHES.len());
        assert_eq!(keys(&v2["hparams"]).len(), HPARAMS.len());
        assert_eq!(v2["hparams"]["log_ratio_min"], json!("-inf"));
        assert_eq!(v2["config"]["kl_estimator"], json!("k3"));
    }

    /// Hparams in a repro: infinities written as strings read back; null,
    /// as files written before the schema have it, reads as the field's own
    /// infinity, and is an error for a field that has none.
    #[test]
    fn hparams_json_reads_back_and_reads_old_files() {
        let h = Hparams { eps_low: f64::INFINITY, ..Hparams::default() };
        let written = serde_json::to_value(h).unwrap();
        assert_eq!(written["log_ratio_min"], json!("-inf"));
        assert_eq!(serde_json::from_value::<Hparams>(written.clone()).unwrap(), h);
        let mut old = written.clone();
        old["log_ratio_min"] = Value::Null;
        old["kl_max"] = Value::Null;
        let read: Hparams = serde_json::from_value(old).unwrap();
        assert_eq!((read.log_ratio_min, read.kl_max), (f64::NEG_INFINITY, f64::INFINITY));
        let mut bad = written;
        bad["eps_high"] = Value::Null;
        let e = serde_json::from_value::<Hparams>(bad).unwrap_err().to_string();
        assert!(e.contains("eps_high"), "{e}");
    }
}
