//! A head-loss case (docs/spec.md, "The other losses on the head"): its
//! switches and hyperparameters, its arrays, the proptest strategy that
//! draws it (shapes biased to tile edges, ignored rows and batches, both
//! distributions underflowing, softcap, non-uniform upstream weights), and
//! the `head_run` request that carries it to the worker.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::case::{Dtype, Kind};
use crate::worker::protocol::WireArray;

/// The loss a head-loss run checks (`check --objective cross_entropy|distillation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HeadObjective {
    /// SFT cross-entropy.
    CrossEntropy,
    /// A divergence from a teacher (forward KL, reverse KL, JSD(beta)).
    Distillation,
}

impl HeadObjective {
    /// Every head objective, in `--objective`'s order.
    pub const ALL: [HeadObjective; 2] = [HeadObjective::CrossEntropy, HeadObjective::Distillation];

    /// Its `--objective` and wire name.
    pub fn name(self) -> &'static str {
        match self {
            HeadObjective::CrossEntropy => "cross_entropy",
            HeadObjective::Distillation => "distillation",
        }
    }

    /// The objective `--objective NAME` names, if it is a head objective.
    pub fn named(name: &str) -> Option<HeadObjective> {
        HeadObjective::ALL.into_iter().find(|o| o.name() == name)
    }
}

/// docs/spec.md's reductions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HeadReduction {
    /// The per-row losses; the backward pulls back an upstream [N].
    None,
    /// Their sum.
    Sum,
    /// Over the (class-weighted) count of non-ignored rows.
    Mean,
    /// Over a given count (`num_items`).
    OverCount,
    /// Over the batch's B sequences.
    Batchmean,
}

impl HeadReduction {
    /// All five, in docs/spec.md's order.
    pub const ALL: [HeadReduction; 5] =
        [HeadReduction::None, HeadReduction::Sum, HeadReduction::Mean, HeadReduction::OverCount, HeadReduction::Batchmean];

    /// Its wire name.
    pub fn name(self) -> &'static str {
        match self {
            HeadReduction::None => "none",
            HeadReduction::Sum => "sum",
            HeadReduction::Mean => "mean",
            HeadReduction::OverCount => "over_count",
            HeadReduction::Batchmean => "batchmean",
        }
    }
}

/// A distillation's divergence (ignored by cross-entropy).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HeadDivergence {
    /// KL(p || q).
    ForwardKl,
    /// KL(q || p).
    ReverseKl,
    /// JSD(beta).
    Jsd,
}

impl HeadDivergence {
    /// All three.
    pub const ALL: [HeadDivergence; 3] = [HeadDivergence::ForwardKl, HeadDivergence::ReverseKl, HeadDivergence::Jsd];

    /// Its wire name.
    pub fn name(self) -> &'static str {
        match self {
            HeadDivergence::ForwardKl => "forward_kl",
            HeadDivergence::ReverseKl => "reverse_kl",
            HeadDivergence::Jsd => "jsd",
        }
    }
}

/// One head-loss case, whole: what a repro file holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HeadCase {
    /// Cross-entropy or distillation.
    pub objective: HeadObjective,
    /// Logits or fused (hidden @ lm_head + bias).
    pub kind: Kind,
    /// The float inputs' dtype.
    pub dtype: Dtype,
    /// B sequences of T tokens: N = B * T rows.
    pub batch: usize,
    /// T.
    pub time: usize,
    /// V.
    pub vocab: usize,
    /// H (fused kind; 0 for logits).
    pub hidden_dim: usize,
    /// The teacher's H_t (fused distillation; 0 otherwise).
    pub teacher_hidden_dim: usize,
    /// How the rows' losses are reduced.
    pub reduction: HeadReduction,
    /// The divergence (distillation).
    pub divergence: HeadDivergence,
    /// The label of an ignored row.
    pub ignore_index: i32,
    /// Cross-entropy's eps in [0, 1].
    pub label_smoothing: f64,
    /// Cross-entropy's lambda (lambda * lse^2 per row).
    pub z_loss: f64,
    /// s in s tanh(z / s); +inf: none (written "inf").
    #[serde(with = "softcap_json")]
    pub softcap: f64,
    /// tau > 0.
    pub temperature: f64,
    /// JSD's beta.
    pub beta: f64,
    /// over_count's n.
    pub num_items: f64,
    /// Labels [N]: a class or `ignore_index`.
    pub labels: Vec<i32>,
    /// Student logits [N, V] (logits kind).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub logits: Vec<f32>,
    /// hidden [N, H] (fused kind).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hidden: Vec<f32>,
    /// lm_head [H, V] (fused kind).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lm_head: Vec<f32>,
    /// bias [V] (fused kind, optional).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bias: Option<Vec<f32>>,
    /// Teacher logits [N, V] (logits-kind distillation).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub teacher_logits: Vec<f32>,
    /// Teacher hidden [N, H_t] (fused distillation).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub teacher_hidden: Vec<f32>,
    /// Teacher head [H_t, V] (fused distillation).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub teacher_lm_head: Vec<f32>,
    /// Class weights [V] (cross-entropy, optional; f32 whatever the dtype).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class_weights: Option<Vec<f32>>,
    /// The scalar cotangent pulled back through a scalar reduction.
    pub cotangent: f32,
    /// The upstream weights [N] pulled back through reduction "none".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<Vec<f32>>,
}

impl HeadCase {
    /// N = B * T.
    pub fn rows(&self) -> usize {
        self.batch * self.time
    }

    /// Is row i ignored?
    pub fn ignored(&self, i: usize) -> bool {
        self.labels[i] == self.ignore_index
    }

    /// One line a person reads: "cross_entropy fused bf16 B=2 T=3 V=129 H=8 mean softcap=30 ...".
    pub fn summary(&self) -> String {
        let mut s = format!(
            "{} {} {} B={} T={} V={}",
            self.objective.name(),
            self.kind.name(),
            match self.dtype {
                Dtype::F32 => "f32",
                Dtype::Bf16 => "bf16",
            },
            self.batch,
            self.time,
            self.vocab
        );
        if self.kind == Kind::Fused {
            s += &format!(" H={}{}", self.hidden_dim, if self.bias.is_some() { " bias" } else { "" });
        }
        s += &format!(" reduction={}", self.reduction.name());
        match self.objective {
            HeadObjective::CrossEntropy => {
                s += &format!(" smoothing={} z_loss={}", self.label_smoothing, self.z_loss);
                if self.class_weights.is_some() {
                    s += " class_weights";
                }
            }
            HeadObjective::Distillation => {
                s += &format!(" {}", self.divergence.name());
                if self.divergence == HeadDivergence::Jsd {
                    s += &format!("(beta={})", self.beta);
                }
            }
        }
        if self.softcap.is_finite() {
            s += &format!(" softcap={}", self.softcap);
        }
        let ignored = (0..self.rows()).filter(|&i| self.ignored(i)).count();
        s + &format!(" tau={} ignored={ignored}/{}", self.temperature, self.rows())
    }

    /// Bad input named: shapes that disagree, a label outside [0, V) that is
    /// not ignore_index, a hyperparameter outside docs/spec.md's range.
    pub fn validate(&self) -> Result<(), String> {
        let (n, v, h, ht) = (self.rows(), self.vocab, self.hidden_dim, self.teacher_hidden_dim);
        let want = |name: &str, got: usize, want: usize| {
            if got == want {
                Ok(())
            } else {
                Err(format!("{name} holds {got} values; expected {want} (B={} T={} V={v} H={h} H_t={ht})", self.batch, self.time))
            }
        };
        if n == 0 || v == 0 {
            return Err(format!("an empty case: N = {n} rows, V = {v}"));
        }
        want("labels", self.labels.len(), n)?;
        match self.kind {
            Kind::Logits => want("logits", self.logits.len(), n * v)?,
            Kind::Fused => {
                want("hidden", self.hidden.len(), n * h)?;
                want("lm_head", self.lm_head.len(), h * v)?;
                if let Some(b) = &self.bias {
                    want("bias", b.len(), v)?;
                }
            }
        }
        if self.objective == HeadObjective::Distillation {
            match self.kind {
                Kind::Logits => want("teacher_logits", self.teacher_logits.len(), n * v)?,
                Kind::Fused => {
                    want("teacher_hidden", self.teacher_hidden.len(), n * ht)?;
                    want("teacher_lm_head", self.teacher_lm_head.len(), ht * v)?;
                }
            }
        }
        if let Some(w) = &self.class_weights {
            want("class_weights", w.len(), v)?;
        }
        if let Some(u) = &self.upstream {
            want("upstream", u.len(), n)?;
        }
        if (self.reduction == HeadReduction::None) != self.upstream.is_some() {
            return Err("reduction none pulls back `upstream` [N]; the scalar reductions a `cotangent`, no upstream".into());
        }
        for (i, &y) in self.labels.iter().enumerate() {
            if y != self.ignore_index && !(0..v as i64).contains(&(y as i64)) {
                return Err(format!("label {y} of row {i} is outside the vocabulary [0, {v}) and is not ignore_index {}", self.ignore_index));
            }
        }
        if !(self.temperature > 0.0 && self.temperature.is_finite()) {
            return Err(format!("temperature {}: must be finite and > 0", self.temperature));
        }
        Ok(())
    }

    /// The `head_run` request: header and arrays (docs/worker-protocol.md).
    pub fn request(&self, implementation: &str) -> (Value, Vec<WireArray>) {
        let (n, v, h, ht) = (self.rows(), self.vocab, self.hidden_dim, self.teacher_hidden_dim);
        let float = |name: &str, shape: &[usize], values: &[f32]| match self.dtype {
            Dtype::F32 => WireArray::f32(name, shape, values),
            Dtype::Bf16 => WireArray::bf16(name, shape, values),
        };
        let mut arrays = vec![WireArray::i32("labels", &[n], &self.labels)];
        match self.kind {
            Kind::Logits => arrays.push(float("logits", &[n, v], &self.logits)),
            Kind::Fused => {
                arrays.push(float("hidden", &[n, h], &self.hidden));
                arrays.push(float("lm_head", &[h, v], &self.lm_head));
                if let Some(b) = &self.bias {
                    arrays.push(float("bias", &[v], b));
                }
            }
        }
        if self.objective == HeadObjective::Distillation {
            match self.kind {
                Kind::Logits => arrays.push(float("teacher_logits", &[n, v], &self.teacher_logits)),
                Kind::Fused => {
                    arrays.push(float("teacher_hidden", &[n, ht], &self.teacher_hidden));
                    arrays.push(float("teacher_lm_head", &[ht, v], &self.teacher_lm_head));
                }
            }
        }
        if let Some(w) = &self.class_weights {
            arrays.push(WireArray::f32("class_weights", &[v], w));
        }
        if let Some(u) = &self.upstream {
            arrays.push(WireArray::f32("cotangent", &[n], u));
        }
        let softcap = if self.softcap.is_finite() { json!(self.softcap) } else { json!("inf") };
        let header = json!({
            "op": "head_run",
            "impl": implementation,
            "objective": self.objective.name(),
            "config": {"reduction": self.reduction.name(), "divergence": self.divergence.name()},
            "hparams": {
                "ignore_index": self.ignore_index, "label_smoothing": self.label_smoothing, "z_loss": self.z_loss,
                "softcap": softcap, "temperature": self.temperature, "beta": self.beta,
                "num_items": self.num_items, "batch": self.batch,
            },
            "cotangent": self.cotangent,
        });
        (header, arrays)
    }
}

/// What an implementation declares it supports (its `supports` attribute,
/// docs/spec.md "The head-loss adapter"): the draws keep to it, so a
/// library that has one reduction is checked on that one, not refused on
/// four in five cases. Absent: everything.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Supports {
    /// The reductions it takes (None: all).
    #[serde(default)]
    pub reductions: Option<Vec<HeadReduction>>,
    /// Whether it takes a softcap (None: yes).
    #[serde(default)]
    pub softcap: Option<bool>,
    /// The ignore_index values it takes (None: any).
    #[serde(default)]
    pub ignore_index: Option<Vec<i32>>,
    /// Whether it takes a temperature other than 1 (None: yes).
    #[serde(default)]
    pub temperature: Option<bool>,
    /// Label smoothing (cross-entropy; None: yes).
    #[serde(default)]
    pub label_smoothing: Option<bool>,
    /// A z-loss (None: yes).
    #[serde(default)]
    pub z_loss: Option<bool>,
    /// Class weights (None: yes).
    #[serde(default)]
    pub class_weights: Option<bool>,
    /// The divergences it takes (distillation; None: all).
    #[serde(default)]
    pub divergences: Option<Vec<HeadDivergence>>,
    /// Whether it takes ignored rows (a label equal to ignore_index; None:
    /// yes). A library with no ignore_index is checked on batches without
    /// them instead of refusing every case that has one.
    #[serde(default)]
    pub ignored_rows: Option<bool>,
    /// Whether it takes an LM-head bias (fused kind; None: yes).
    #[serde(default)]
    pub bias: Option<bool>,
}

/// What a run draws from: the objective and kind fixed, the rest bounded.
#[derive(Clone, Debug)]
pub struct HeadBounds {
    /// What the implementation declares it supports.
    pub supports: Supports,
    /// The loss.
    pub objective: HeadObjective,
    /// The implementation's kind.
    pub kind: Kind,
    /// The dtypes drawn.
    pub dtypes: Vec<Dtype>,
    /// Largest B.
    pub max_batch: usize,
    /// Largest T.
    pub max_time: usize,
    /// Largest V.
    pub max_vocab: usize,
    /// Largest H (and H_t).
    pub max_hidden: usize,
}

/// The softcap in JSON: a number, or "inf" for none (JSON has no infinity).
mod softcap_json {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        if v.is_finite() {
            s.serialize_f64(*v)
        } else {
            s.serialize_str("inf")
        }
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Written {
        Number(f64),
        Text(String),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        match Written::deserialize(d)? {
            Written::Number(v) => Ok(v),
            Written::Text(t) if t == "inf" => Ok(f64::INFINITY),
            Written::Text(t) => Err(serde::de::Error::custom(format!("softcap: expected a number or \"inf\", got {t:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// The harness's objectives, switch values and hyperparameters are
    /// schema.json's "head_losses", the names the worker reads.
    #[test]
    fn the_head_names_are_the_schemas() {
        let schema: Value = serde_json::from_str(include_str!("../../python/grpo_kernels/schema.json")).unwrap();
        let head = &schema["head_losses"];
        let names = |list: &Value| -> BTreeSet<String> { list.as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap().to_string()).collect() };
        let ours = |list: &[&str]| -> BTreeSet<String> { list.iter().map(|s| s.to_string()).collect() };
        assert_eq!(names(&head["objectives"]), ours(&HeadObjective::ALL.map(HeadObjective::name)));
        let switch = |name: &str| head["switches"].as_array().unwrap().iter().find(|s| s["name"] == name).unwrap()["values"].clone();
        assert_eq!(names(&switch("reduction")), ours(&HeadReduction::ALL.map(HeadReduction::name)));
        assert_eq!(names(&switch("divergence")), ours(&HeadDivergence::ALL.map(HeadDivergence::name)));
        let case: HeadCase = serde_json::from_value(json!({
            "objective": "cross_entropy", "kind": "logits", "dtype": "f32", "batch": 1, "time": 1, "vocab": 2,
            "hidden_dim": 0, "teacher_hidden_dim": 0, "reduction": "sum", "divergence": "forward_kl",
            "ignore_index": -100, "label_smoothing": 0.0, "z_loss": 0.0, "softcap": "inf", "temperature": 1.0,
            "beta": 0.5, "num_items": 1.0, "labels": [1], "logits": [0.5, 1.0], "cotangent": 1.0
        }))
        .unwrap();
        let (header, _) = case.request("x");
        let sent: BTreeSet<String> = header["hparams"].as_object().unwrap().keys().cloned().collect();
        assert_eq!(names(&head["hparams"]), sent);
    }
}
