//! Declared precision conventions (docs/conventions.md): the roundings the
//! field does on purpose in bf16 training, and how far each can move every
//! quantity docs/spec.md compares, element by element, in f64.
//!
//! A convention is a rounding model. Each one perturbs the softmax's
//! argument x (the logits, after any logit transform and the temperature),
//! the log-softmax, or the logits gradient by at most a known relative
//! amount per element; this module carries that through to logp, the
//! entropy, per_token_loss, the loss and each gradient element. The bounds
//! are first order in the rounding where it is small and stay valid where
//! it is not: a perturbation of log p_v by at most s_v moves p_v by at most
//! p_v (e^{s_v} - 1), not p_v s_v (bf16 logits at an offset of -1000 move by
//! up to 4 nats, and the softmax with them).
//!
//! The allowance is what the tolerance rule subtracts from an element's
//! error before judging it, as it already does for a gradient returned in
//! bf16 (half an ulp): a convention widens exactly the quantities its
//! rounding moves, by exactly what it can move them, and nothing else.

use std::fmt;

use crate::config::Config;

mod allowances;

pub use allowances::{CaseFacts, Rounding, RoundingAllowances, TokenRounding};

/// bf16's unit roundoff: rounding to bf16 (8 significant bits, to nearest)
/// moves a value by at most this much of itself.
pub const BF16_UNIT: f64 = 1.0 / 256.0;
/// TF32's: 11 significant bits.
pub const TF32_UNIT: f64 = 1.0 / 2048.0;
/// ln of f32's largest finite value: exp of more overflows in f32.
const F32_EXP_MAX: f64 = 88.722_839;

/// Which fused gradient a chunked accumulation sums, over chunks of what.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AccumulatedGradient {
    /// d hidden, summed over vocabulary chunks of `chunk` columns.
    HiddenOverColumns,
    /// d lm_head, summed over chunks of `chunk` sequences (Liger's batch chunks).
    LmHeadOverSequences,
    /// d lm_head, summed over chunks of `chunk` tokens of the flattened B*T (verl's).
    LmHeadOverTokens,
}

impl AccumulatedGradient {
    fn name(&self) -> &'static str {
        match self {
            AccumulatedGradient::HiddenOverColumns => "d_hidden:columns",
            AccumulatedGradient::LmHeadOverSequences => "d_lm_head:sequences",
            AccumulatedGradient::LmHeadOverTokens => "d_lm_head:tokens",
        }
    }
}

/// One declared convention (the closed list of docs/conventions.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Convention {
    /// `bf16_logits` (`bf16_logits:K`): the logits are stored in bf16 before
    /// an f32 log-softmax, at K stages in sequence (default 1): hidden @
    /// lm_head's result, a logit transform's output, z / tau.
    Bf16Logits { stages: u32 },
    /// `bf16_temperature`: the temperature rounded to bf16 (0.7 ->
    /// 0.69921875) before it divides.
    Bf16Temperature,
    /// `bf16_softmax`: the log-softmax and the entropy evaluated in bf16
    /// (their log-sum-exp, outputs and backward).
    Bf16Softmax,
    /// `bf16_grad_logits` (`bf16_grad_logits:K`): the gradient in the
    /// logits rounded to bf16 at K stages in sequence (default 1) before it
    /// is used or returned: what autodiff through a bf16 stage does.
    Bf16GradLogits { stages: u32 },
    /// `bf16_accumulation:d_hidden:columns=C`,
    /// `bf16_accumulation:d_lm_head:sequences=C`, `...:d_lm_head:tokens=C`:
    /// a fused gradient summed across chunks in bf16, each chunk's share
    /// rounded to bf16 first.
    Bf16Accumulation { gradient: AccumulatedGradient, chunk: usize },
    /// `tf32_matmul`: the fused kind's f32 products in TF32 (operands
    /// rounded to 11 significant bits, f32 accumulation), forward and backward.
    Tf32Matmul,
    /// `online_lse:columns=C`: the log-sum-exp formed online over
    /// vocabulary chunks of C columns (a running max, its sums rescaled when
    /// it grows) and differentiated through that recurrence in f32: the
    /// terms that reach each chunk's running max cancel in exact
    /// arithmetic, and leave f32 rounding on the columns that were it.
    OnlineLse { columns: usize },
}

impl Convention {
    /// The closed list's names, for messages.
    pub const NAMES: &'static str = "bf16_logits[:K], bf16_temperature, bf16_softmax, bf16_grad_logits[:K], \
        bf16_accumulation:d_hidden:columns=C, bf16_accumulation:d_lm_head:sequences=C, \
        bf16_accumulation:d_lm_head:tokens=C, tf32_matmul, online_lse:columns=C";

    /// Parses one declaration (docs/conventions.md, "Declaring").
    pub fn parse(text: &str) -> Result<Convention, String> {
        let mut parts = text.trim().split(':');
        let name = parts.next().unwrap_or_default();
        let rest: Vec<&str> = parts.collect();
        let plain = |c: Convention| if rest.is_empty() { Ok(c) } else { Err(format!("convention {text:?}: {name} takes no parameters")) };
        let stages = || match rest.as_slice() {
            [] => Ok(1),
            [k] => k.parse::<u32>().ok().filter(|k| (1..=16).contains(k)).ok_or_else(|| {
                format!("convention {text:?}: {name}:K takes the number of bf16 stages in sequence, 1 to 16, not {k:?}")
            }),
            _ => Err(format!("convention {text:?}: {name} takes one parameter, the number of stages ({name}:2)")),
        };
        match name {
            "bf16_logits" => Ok(Convention::Bf16Logits { stages: stages()? }),
            "bf16_temperature" => plain(Convention::Bf16Temperature),
            "bf16_softmax" => plain(Convention::Bf16Softmax),
            "bf16_grad_logits" => Ok(Convention::Bf16GradLogits { stages: stages()? }),
            "tf32_matmul" => plain(Convention::Tf32Matmul),
            "online_lse" => match rest.as_slice() {
                [chunk] => match chunk.split_once('=') {
                    Some(("columns", size)) => match size.parse::<usize>() {
                        Ok(columns) if columns >= 1 => Ok(Convention::OnlineLse { columns }),
                        _ => Err(format!("convention {text:?}: the chunk must be an integer >= 1, not {size:?}")),
                    },
                    _ => Err(format!("convention {text:?}: online_lse takes columns=C, e.g. online_lse:columns=128")),
                },
                _ => Err(format!("convention {text:?}: online_lse takes its chunk, e.g. online_lse:columns=128")),
            },
            "bf16_accumulation" => {
                let usage = "e.g. bf16_accumulation:d_hidden:columns=128 (vocabulary columns per chunk), \
                             bf16_accumulation:d_lm_head:sequences=1 or bf16_accumulation:d_lm_head:tokens=512";
                let [gradient, chunk] = rest.as_slice() else {
                    return Err(format!("convention {text:?}: bf16_accumulation needs the gradient and its chunk, {usage}"));
                };
                let (unit, size) = chunk.split_once('=').unwrap_or((chunk, ""));
                let gradient = match (*gradient, unit) {
                    ("d_hidden", "columns") => AccumulatedGradient::HiddenOverColumns,
                    ("d_lm_head", "sequences") => AccumulatedGradient::LmHeadOverSequences,
                    ("d_lm_head", "tokens") => AccumulatedGradient::LmHeadOverTokens,
                    _ => return Err(format!("convention {text:?}: not a gradient and chunk unit this convention knows, {usage}")),
                };
                match size.parse::<usize>() {
                    Ok(chunk) if chunk >= 1 => Ok(Convention::Bf16Accumulation { gradient, chunk }),
                    _ => Err(format!("convention {text:?}: the chunk must be an integer >= 1, not {size:?}")),
                }
            }
            _ => Err(format!("unknown precision convention {text:?}: the declared conventions are {}", Convention::NAMES)),
        }
    }
}

impl fmt::Display for Convention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Convention::Bf16Logits { stages: 1 } => f.write_str("bf16_logits"),
            Convention::Bf16Logits { stages } => write!(f, "bf16_logits:{stages}"),
            Convention::Bf16Temperature => f.write_str("bf16_temperature"),
            Convention::Bf16Softmax => f.write_str("bf16_softmax"),
            Convention::Bf16GradLogits { stages: 1 } => f.write_str("bf16_grad_logits"),
            Convention::Bf16GradLogits { stages } => write!(f, "bf16_grad_logits:{stages}"),
            Convention::Tf32Matmul => f.write_str("tf32_matmul"),
            Convention::Bf16Accumulation { gradient, chunk } => write!(f, "bf16_accumulation:{}={chunk}", gradient.name()),
            Convention::OnlineLse { columns } => write!(f, "online_lse:columns={columns}"),
        }
    }
}

/// A switch of the case a declaration may hold under: `CONVENTION when
/// CONDITION` (docs/conventions.md, "Declaring"). A library rounds some
/// stages only with a term on (verl sums d logits' four parts in bf16 only
/// with the entropy bonus) or only at tau != 1 (a division by 1.0 is exact).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Condition {
    /// `entropy_bonus`: the entropy term is in the loss.
    EntropyBonus,
    /// `kl`: the KL term is in the loss.
    Kl,
    /// `temperature != 1`.
    TemperatureNotOne,
}

impl Condition {
    pub const NAMES: &'static str = "entropy_bonus, kl, temperature != 1";

    fn parse(text: &str) -> Option<Condition> {
        match text.split_whitespace().collect::<Vec<_>>().join(" ").as_str() {
            "entropy_bonus" => Some(Condition::EntropyBonus),
            "kl" => Some(Condition::Kl),
            "temperature != 1" => Some(Condition::TemperatureNotOne),
            _ => None,
        }
    }

    pub fn holds(self, config: &Config, temperature: f64) -> bool {
        match self {
            Condition::EntropyBonus => config.entropy_bonus,
            Condition::Kl => config.kl,
            Condition::TemperatureNotOne => temperature != 1.0,
        }
    }
}

impl fmt::Display for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Condition::EntropyBonus => "entropy_bonus",
            Condition::Kl => "kl",
            Condition::TemperatureNotOne => "temperature != 1",
        })
    }
}

/// One declaration: a convention, on every case or only where a condition holds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Declared {
    pub convention: Convention,
    pub when: Option<Condition>,
}

impl Declared {
    /// `CONVENTION` or `CONVENTION when CONDITION`.
    pub fn parse(text: &str) -> Result<Declared, String> {
        let (convention, when) = match text.split_once(" when ") {
            Some((c, w)) => {
                let condition = Condition::parse(w).ok_or_else(|| {
                    format!("convention {text:?}: the condition after `when` is one of {}, not {:?}", Condition::NAMES, w.trim())
                })?;
                (c, Some(condition))
            }
            None => (text, None),
        };
        Ok(Declared { convention: Convention::parse(convention)?, when })
    }

    /// Plain declarations (`--convention`): on every case.
    pub fn always(convention: Convention) -> Declared {
        Declared { convention, when: None }
    }
}

impl fmt::Display for Declared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.when {
            Some(c) => write!(f, "{} when {c}", self.convention),
            None => write!(f, "{}", self.convention),
        }
    }
}

/// The conventions that hold on a case of these switches and temperature:
/// the declarations whose condition holds, the stage counts of one
/// convention added up (`bf16_grad_logits:3 when entropy_bonus` and
/// `bf16_grad_logits when temperature != 1` are 4 stages with both).
pub fn applicable(declared: &[Declared], config: &Config, temperature: f64) -> Vec<Convention> {
    let mut out: Vec<Convention> = Vec::new();
    for d in declared.iter().filter(|d| d.when.is_none_or(|c| c.holds(config, temperature))) {
        let merged = out.iter_mut().find_map(|c| match (c, d.convention) {
            (Convention::Bf16Logits { stages }, Convention::Bf16Logits { stages: more })
            | (Convention::Bf16GradLogits { stages }, Convention::Bf16GradLogits { stages: more }) => {
                *stages += more;
                Some(())
            }
            (c, d) if *c == d => Some(()),
            _ => None,
        });
        if merged.is_none() {
            out.push(d.convention);
        }
    }
    out
}

#[cfg(test)]
mod declared_tests {
    use super::*;

    /// verl's logits declarations: 4 d logits stages with the entropy bonus
    /// at tau != 1, 3 at tau = 1, 1 without the bonus, none at neither.
    #[test]
    fn declarations_apply_under_their_conditions_and_add_up() {
        let declared: Vec<Declared> = ["bf16_softmax", "bf16_grad_logits:3 when entropy_bonus", "bf16_grad_logits when temperature != 1"]
            .iter()
            .map(|t| Declared::parse(t).unwrap())
            .collect();
        let config = |entropy_bonus| Config { entropy_bonus, ..Config::default() };
        let grad = |c: &[Convention]| c.iter().find_map(|c| match c {
            Convention::Bf16GradLogits { stages } => Some(*stages),
            _ => None,
        });
        assert_eq!(grad(&applicable(&declared, &config(true), 0.7)), Some(4));
        assert_eq!(grad(&applicable(&declared, &config(true), 1.0)), Some(3));
        assert_eq!(grad(&applicable(&declared, &config(false), 0.7)), Some(1));
        assert_eq!(applicable(&declared, &config(false), 1.0), vec![Convention::Bf16Softmax]);
        assert_eq!(declared[1].to_string(), "bf16_grad_logits:3 when entropy_bonus");
        let e = Declared::parse("bf16_logits when tau < 1").unwrap_err();
        assert!(e.contains("temperature != 1"), "{e}");
    }
}
