//! [`Case`]: the arrays a [`CaseSpec`](crate::case::CaseSpec) materialises into (drawn in `arrays`), already rounded to
//! the implementation's dtype so the oracle sees exactly the values the
//! implementation sees, and the oracle problem over them.

use grpo_oracle::{
    row_softmax_stats, Config, Forward, FusedProblem, Hparams, HPARAMS, SWITCHES, InputError, LogitRows, LogitTransform, LogitsProblem,
    Real, Shape, TemperatureMode, TokenInputs,
};
use serde::{Deserialize, Serialize};

use crate::case::vocabulary::{Dtype, Kind, Mesh};


/// A materialised case: the exact inputs every implementation and the oracle see.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Case {
    /// B, T, V.
    pub shape: Shape,
    /// The float inputs' dtype.
    pub dtype: Dtype,
    /// The static switches (docs/spec.md).
    pub config: Config,
    /// The hyperparameters, the normalizer formed.
    pub hparams: Hparams,
    /// The loss's cotangent in the VJP.
    pub cotangent: f64,
    /// The float inputs, values exactly representable in `dtype`.
    pub inputs: Inputs,
    /// [B, T] token ids, in [0, V) where mask = 1.
    pub tokens: Vec<i32>,
    /// [B, T], each 0 or 1.
    pub mask: Vec<f32>,
    /// [B], one per sequence.
    pub advantages: Vec<f32>,
    /// [B, T] the behaviour policy's log-probs; None on policy.
    pub old_logp: Option<Vec<f32>>,
    /// [B, T] the reference policy's log-probs; Some exactly with `kl`.
    pub ref_logp: Option<Vec<f32>>,
    /// v2 rollout-correction weights: B*T values ([B, T]) or B ([B, 1]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_weights: Option<Vec<f32>>,
    /// The device mesh the implementation runs under (None: one device).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mesh: Option<Mesh>,
}

/// The float inputs of a case, by kind.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Inputs {
    /// logits [B, T, V].
    Logits {
        /// [B, T, V], C order.
        logits: Vec<f32>,
    },
    /// hidden [B, T, H], lm_head [H, V].
    Fused {
        /// H.
        hidden_dim: usize,
        /// [B, T, H], C order.
        hidden: Vec<f32>,
        /// [H, V], C order.
        lm_head: Vec<f32>,
    },
}

/// A case's inputs as an oracle problem of its kind.
pub enum CaseProblem<'a> {
    /// The logits kind's problem.
    Logits(LogitsProblem<'a, f32>),
    /// The fused kind's problem.
    Fused(FusedProblem<'a, f32>),
}

impl CaseProblem<'_> {
    /// The oracle's forward pass of the case (an error names an input the oracle refuses).
    pub fn forward(&self) -> Result<Forward<'_>, InputError> {
        match self {
            CaseProblem::Logits(p) => p.forward(),
            CaseProblem::Fused(p) => p.forward(),
        }
    }
    /// Its logit rows, as the oracle reads them (stored, or formed from hidden @ lm_head).
    pub fn rows(&self) -> &dyn LogitRows {
        match self {
            CaseProblem::Logits(p) => p,
            CaseProblem::Fused(p) => p,
        }
    }
}

impl Case {
    /// B, T, V.
    pub fn shape(&self) -> Shape {
        self.shape
    }

    /// Logits or fused, from its inputs.
    pub fn kind(&self) -> Kind {
        match self.inputs {
            Inputs::Logits { .. } => Kind::Logits,
            Inputs::Fused { .. } => Kind::Fused,
        }
    }

    fn token_inputs(&self) -> TokenInputs<'_> {
        TokenInputs {
            tokens: &self.tokens,
            mask: &self.mask,
            advantages: &self.advantages,
            old_logp: self.old_logp.as_deref(),
            ref_logp: self.ref_logp.as_deref(),
            is_weights: self.is_weights.as_deref(),
        }
    }

    /// The case as the oracle's problem of its kind, borrowing its arrays.
    pub fn problem(&self) -> CaseProblem<'_> {
        problem_of(&self.inputs, self.shape(), self.token_inputs(), self.config, self.hparams)
    }

    /// The logits-kind problem of this case's token inputs over other
    /// logits [B, T, V] (say widened to f64 and perturbed, as the oracle's
    /// self-checks do).
    pub fn logits_problem<'a, L: Real>(&'a self, logits: &'a [L]) -> LogitsProblem<'a, L> {
        LogitsProblem { shape: self.shape(), logits, per_token: self.token_inputs(), config: self.config, hparams: self.hparams }
    }

    /// The same case with other float inputs (the rest copied; the old
    /// inputs, GBs at production shapes, are not).
    pub fn with_inputs(&self, inputs: Inputs) -> Case {
        Case {
            shape: self.shape,
            dtype: self.dtype,
            config: self.config,
            hparams: self.hparams,
            cotangent: self.cotangent,
            inputs,
            tokens: self.tokens.clone(),
            mask: self.mask.clone(),
            advantages: self.advantages.clone(),
            old_logp: self.old_logp.clone(),
            ref_logp: self.ref_logp.clone(),
            is_weights: self.is_weights.clone(),
            mesh: self.mesh,
        }
    }

    /// Every float input, by name.
    pub fn float_inputs(&self) -> Vec<(&'static str, &[f32])> {
        match &self.inputs {
            Inputs::Logits { logits } => vec![("logits", logits)],
            Inputs::Fused { hidden, lm_head, .. } => vec![("hidden", hidden), ("lm_head", lm_head)],
        }
    }

    /// Every logit must be exactly representable in the case's dtype (a
    /// hand-edited repro may not be).
    pub fn check_dtype(&self) -> Result<(), InputError> {
        for (name, values) in self.float_inputs() {
            if let Some((i, z)) = values.iter().enumerate().find(|(_, &z)| self.dtype.round(z as f64) != z) {
                return Err(InputError(format!("{name} element {i} = {z} is not representable in {}", self.dtype.name())));
            }
        }
        Ok(())
    }

    /// A one-line description for reports.
    pub fn summary(&self) -> String {
        let c = &self.config;
        let h = &self.hparams;
        let hidden = match &self.inputs {
            Inputs::Fused { hidden_dim, .. } => format!(" H={hidden_dim}"),
            Inputs::Logits { .. } => String::new(),
        };
        let mut s = format!(
            "B={} T={} V={}{hidden} {} {:?}-mode {:?} {} eps={}/{} tau={}",
            self.shape.batch,
            self.shape.time,
            self.shape.vocab,
            self.dtype.name(),
            c.temperature_mode,
            c.aggregation,
            if c.on_policy { "on-policy" } else { "off-policy" },
            h.eps_low as f32,
            h.eps_high as f32,
            h.temperature as f32,
        );
        if c.kl {
            s += &format!(" kl(beta={})", h.beta as f32);
        }
        if c.entropy_bonus {
            s += &format!(" entropy({})", h.entropy_coef as f32);
        }
        if c.two_sided {
            s += &format!(" delta={}", h.delta as f32);
        }
        if c.aggregation == grpo_oracle::Aggregation::SumOverConstant {
            s += &format!(" N={}", h.normalizer as f32);
        }
        s += &v2_summary(c, h);
        let valid = self.mask.iter().filter(|&&m| m != 0.0).count();
        s += &format!(" valid={valid}/{} cot={}", self.mask.len(), self.cotangent as f32);
        if let Some(m) = self.mesh {
            s += &format!(" mesh={}x{}", m.data, m.model);
        }
        s
    }
}

/// The v2 switches and hyperparameters that differ from their defaults, " key=value" each.
fn v2_summary(c: &Config, h: &Hparams) -> String {
    let switches = SWITCHES.iter().zip(c.switch_values()).filter(|(switch, value)| switch.since >= 2 && *value != switch.values[0].name);
    let hparams = HPARAMS.iter().zip(h.values()).filter(|(info, x)| info.since >= 2 && *x != info.default);
    let mut s: String = switches.map(|(switch, value)| format!(" {}={value}", switch.name)).collect();
    s.extend(hparams.map(|(info, x)| format!(" {}={}", info.name, x as f32)));
    s
}

/// The oracle problem of some inputs.
fn problem_of<'a>(inputs: &'a Inputs, shape: Shape, per_token: TokenInputs<'a>, config: Config, hparams: Hparams) -> CaseProblem<'a> {
    match inputs {
        Inputs::Logits { logits } => CaseProblem::Logits(LogitsProblem { shape, logits, per_token, config, hparams }),
        Inputs::Fused { hidden_dim, hidden, lm_head } => {
            CaseProblem::Fused(FusedProblem { shape, hidden_dim: *hidden_dim, hidden, lm_head, per_token, config, hparams })
        }
    }
}

/// A row source for inputs alone (the token inputs are not read).
pub(super) fn row_source(inputs: &Inputs, shape: Shape) -> CaseProblem<'_> {
    let config = Config { on_policy: true, ..Config::default() };
    let none = TokenInputs { tokens: &[], mask: &[], advantages: &[], old_logp: None, ref_logp: None, is_weights: None };
    problem_of(inputs, shape, none, config, Hparams::default())
}

impl Case {
    /// At each valid position (mask on, token in the vocabulary): the
    /// token's logp as the oracle forms it, and the least and greatest of
    /// its row's transformed logits; None elsewhere. (The coverage report's
    /// edges are measured on these.)
    pub fn valid_positions(&self) -> Vec<Option<(f64, f64, f64)>> {
        let (shape, v_) = (self.shape(), self.shape.vocab);
        let rows = row_source(&self.inputs, shape);
        let t = LogitTransform { scale: self.hparams.logit_scale, softcap: self.hparams.logit_softcap };
        let (mut z, mut x) = (vec![0.0; v_], vec![0.0; v_]);
        (0..self.tokens.len())
            .map(|i| {
                let y = usize::try_from(self.tokens[i]).ok().filter(|&y| y < v_ && self.mask[i] != 0.0)?;
                rows.rows().logit_row(i, &mut z, None);
                if self.config.logit_transform {
                    z.iter_mut().for_each(|v| *v = t.apply(*v));
                }
                let (lo, hi) = z.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &v| (lo.min(v), hi.max(v)));
                Some((row_logp(&z, y, self.hparams.temperature, self.config.temperature_mode, &mut x), lo, hi))
            })
            .collect()
    }
}

/// The log-prob of `y` in one row under the case's temperature convention.
pub(super) fn row_logp(row: &[f64], y: usize, tau: f64, mode: TemperatureMode, x: &mut [f64]) -> f64 {
    for (xv, &z) in x.iter_mut().zip(row) {
        *xv = match mode {
            TemperatureMode::Logits => z / tau,
            TemperatureMode::Logp => z,
        };
    }
    let lse = row_softmax_stats(x, None).lse;
    match mode {
        TemperatureMode::Logits => x[y] - lse,
        TemperatureMode::Logp => (x[y] - lse) / tau,
    }
}
