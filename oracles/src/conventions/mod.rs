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

/// One declared convention (the closed list of docs/conventions.md). How it
/// is written, and what the implementation that declares it does, is its row
/// of [`FORMS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Convention {
    /// The logits stored in bf16 before an f32 log-softmax, at `stages`
    /// stages in sequence (1 to 16): hidden @ lm_head's result, a logit
    /// transform's output, z / tau. Each stage moves x by at most
    /// [`BF16_UNIT`] of itself.
    Bf16Logits {
        /// How many bf16 roundings of the logits in sequence, 1 to 16.
        stages: u32,
    },
    /// The temperature rounded to bf16 (0.7 -> 0.69921875) before it
    /// divides: x moves by |tau / bf16(tau) - 1| of itself.
    Bf16Temperature,
    /// The log-softmax and the entropy evaluated in bf16 (their
    /// log-sum-exp, outputs and backward).
    Bf16Softmax,
    /// The gradient in the logits rounded to bf16 at `stages` stages in
    /// sequence before it is used or returned: what autodiff through a bf16
    /// stage does. Moves the gradients only.
    Bf16GradLogits {
        /// How many bf16 roundings of d logits in sequence, 1 to 16.
        stages: u32,
    },
    /// A fused gradient summed across chunks in bf16: each of the
    /// ceil(n / `chunk`) chunks' shares rounded to bf16, then added to a
    /// running bf16 sum.
    Bf16Accumulation {
        /// Which gradient is summed, and over chunks of what.
        gradient: AccumulatedGradient,
        /// Columns, sequences or tokens per chunk, >= 1.
        chunk: usize,
    },
    /// The fused kind's f32 products in TF32 (operands rounded to 11
    /// significant bits, [`TF32_UNIT`]; f32 accumulation), forward and backward.
    Tf32Matmul,
    /// The log-sum-exp formed online over vocabulary chunks of `columns`
    /// columns (a running max, its sums rescaled when it grows) and
    /// differentiated through that recurrence in f32: the terms that reach
    /// each chunk's running max cancel in exact arithmetic, and leave f32
    /// rounding on the columns that were it.
    OnlineLse {
        /// Vocabulary columns per chunk, >= 1.
        columns: usize,
    },
}

/// What follows a convention's name in its declaration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Argument {
    /// Nothing: `tf32_matmul`.
    None,
    /// `:K`, the number of bf16 stages in sequence, 1 to 16; 1 when absent:
    /// `bf16_logits`, `bf16_logits:2`.
    Stages,
    /// `:WHAT=C`, a chunk of C >= 1 (`online_lse:columns=128`).
    Chunk {
        /// What is chunked and in what unit: `columns`, `d_lm_head:tokens`.
        what: &'static str,
        /// A chunk a kernel uses, for the examples in messages.
        example: usize,
    },
}

/// The largest stage count `:K` takes.
const MAX_STAGES: usize = 16;

/// One form of the conventions' grammar: its name, what follows it, and what
/// the implementation that declares it does (docs/conventions.md, "The list").
#[derive(Debug)]
pub struct Form {
    /// The name before any `:`; several forms may share one (`bf16_accumulation`).
    pub name: &'static str,
    /// What follows the name.
    pub argument: Argument,
    /// What the implementation does, in docs/conventions.md's words.
    pub meaning: &'static str,
    /// The convention of this form with this number: stages or chunk, 1 for
    /// a form that takes none.
    convention: fn(usize) -> Convention,
}

/// The grammar, in docs/conventions.md's order: what `Convention::parse`,
/// its `Display`, its error messages and `--convention`'s help read.
pub static FORMS: [Form; 9] = [
    Form {
        name: "bf16_logits",
        argument: Argument::Stages,
        meaning: "the logits are stored in bf16 before an f32 log-softmax, at K stages in sequence \
                  (hidden @ lm_head's result, a logit transform's output, z / tau)",
        convention: |k| Convention::Bf16Logits { stages: k as u32 },
    },
    Form {
        name: "bf16_temperature",
        argument: Argument::None,
        meaning: "the temperature is rounded to bf16 (0.7 -> 0.69921875) before it divides",
        convention: |_| Convention::Bf16Temperature,
    },
    Form {
        name: "bf16_softmax",
        argument: Argument::None,
        meaning: "the log-softmax and the entropy are evaluated in bf16 (their log-sum-exp, outputs and backward)",
        convention: |_| Convention::Bf16Softmax,
    },
    Form {
        name: "bf16_grad_logits",
        argument: Argument::Stages,
        meaning: "the gradient in the logits is rounded to bf16 at K stages in sequence before it is used or \
                  returned: what autodiff through a bf16 stage does",
        convention: |k| Convention::Bf16GradLogits { stages: k as u32 },
    },
    Form {
        name: "bf16_accumulation",
        argument: Argument::Chunk { what: "d_hidden:columns", example: 128 },
        meaning: "d hidden is summed across vocabulary chunks of C columns in bf16, each chunk's share rounded to bf16 first",
        convention: |chunk| Convention::Bf16Accumulation { gradient: AccumulatedGradient::HiddenOverColumns, chunk },
    },
    Form {
        name: "bf16_accumulation",
        argument: Argument::Chunk { what: "d_lm_head:sequences", example: 1 },
        meaning: "d lm_head is summed across chunks of C sequences in bf16, each chunk's share rounded first",
        convention: |chunk| Convention::Bf16Accumulation { gradient: AccumulatedGradient::LmHeadOverSequences, chunk },
    },
    Form {
        name: "bf16_accumulation",
        argument: Argument::Chunk { what: "d_lm_head:tokens", example: 512 },
        meaning: "d lm_head is summed across chunks of C tokens of the flattened B*T in bf16, each chunk's share rounded first",
        convention: |chunk| Convention::Bf16Accumulation { gradient: AccumulatedGradient::LmHeadOverTokens, chunk },
    },
    Form {
        name: "tf32_matmul",
        argument: Argument::None,
        meaning: "the fused kind's f32 products run in TF32 (operands rounded to 11 significant bits, f32 \
                  accumulation), forward and backward",
        convention: |_| Convention::Tf32Matmul,
    },
    Form {
        name: "online_lse",
        argument: Argument::Chunk { what: "columns", example: 128 },
        meaning: "the log-sum-exp is formed online over vocabulary chunks of C columns and differentiated \
                  through that recurrence in f32",
        convention: |columns| Convention::OnlineLse { columns },
    },
];

impl Form {
    /// How it is written: `bf16_logits[:K]`, `tf32_matmul`, `online_lse:columns=C`.
    pub fn usage(&self) -> String {
        match self.argument {
            Argument::None => self.name.to_string(),
            Argument::Stages => format!("{}[:K]", self.name),
            Argument::Chunk { what, .. } => format!("{}:{what}=C", self.name),
        }
    }
}

/// `a, b or c`.
fn one_of(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [only] => only.clone(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

impl Convention {
    /// Every form's usage, in `FORMS`' order, for messages and help:
    /// `bf16_logits[:K], bf16_temperature, ...`.
    pub fn names() -> String {
        FORMS.iter().map(Form::usage).collect::<Vec<_>>().join(", ")
    }

    /// Parses one declaration (docs/conventions.md, "Declaring") by `FORMS`.
    pub fn parse(text: &str) -> Result<Convention, String> {
        let (name, rest) = match text.trim().split_once(':') {
            Some((name, rest)) => (name, Some(rest)),
            None => (text.trim(), None),
        };
        let forms: Vec<&Form> = FORMS.iter().filter(|form| form.name == name).collect();
        let Some(first) = forms.first() else {
            return Err(format!("unknown precision convention {text:?}: the declared conventions are {}", Convention::names()));
        };
        match (first.argument, rest) {
            (Argument::None, None) | (Argument::Stages, None) => Ok((first.convention)(1)),
            (Argument::None, Some(_)) => Err(format!("convention {text:?}: {name} takes no parameters")),
            (Argument::Stages, Some(k)) if k.contains(':') => {
                Err(format!("convention {text:?}: {name} takes one parameter, the number of stages ({name}:2)"))
            }
            (Argument::Stages, Some(k)) => match k.parse::<usize>() {
                Ok(k) if (1..=MAX_STAGES).contains(&k) => Ok((first.convention)(k)),
                _ => Err(format!("convention {text:?}: {name}:K takes the number of bf16 stages in sequence, 1 to {MAX_STAGES}, not {k:?}")),
            },
            (Argument::Chunk { .. }, rest) => {
                let chunks: Vec<(&str, usize)> = forms
                    .iter()
                    .filter_map(|form| match form.argument {
                        Argument::Chunk { what, example } => Some((what, example)),
                        _ => None,
                    })
                    .collect();
                let examples = one_of(&chunks.iter().map(|(what, example)| format!("{name}:{what}={example}")).collect::<Vec<_>>());
                let Some(rest) = rest else {
                    return Err(format!("convention {text:?}: {name} takes its chunk, e.g. {examples}"));
                };
                let (what, size) = rest.split_once('=').unwrap_or((rest, ""));
                let Some(form) = forms.iter().find(|form| matches!(form.argument, Argument::Chunk { what: w, .. } if w == what)) else {
                    let whats = one_of(&chunks.iter().map(|(what, _)| format!("{what}=C")).collect::<Vec<_>>());
                    return Err(format!("convention {text:?}: {name} takes {whats}, e.g. {examples}"));
                };
                match size.parse::<usize>() {
                    Ok(chunk) if chunk >= 1 => Ok((form.convention)(chunk)),
                    _ => Err(format!("convention {text:?}: the chunk must be an integer >= 1, not {size:?}")),
                }
            }
        }
    }

    /// Its row of `FORMS` and its number (stages or chunk; 1 where it has none).
    fn form(&self) -> (&'static Form, usize) {
        let n = match *self {
            Convention::Bf16Logits { stages } | Convention::Bf16GradLogits { stages } => stages as usize,
            Convention::Bf16Accumulation { chunk, .. } => chunk,
            Convention::OnlineLse { columns } => columns,
            Convention::Bf16Temperature | Convention::Bf16Softmax | Convention::Tf32Matmul => 1,
        };
        let form = FORMS.iter().find(|form| (form.convention)(n) == *self).expect("every convention has its form in FORMS");
        (form, n)
    }
}

impl fmt::Display for Convention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (form, n) = self.form();
        match form.argument {
            Argument::None => f.write_str(form.name),
            Argument::Stages if n == 1 => f.write_str(form.name),
            Argument::Stages => write!(f, "{}:{n}", form.name),
            Argument::Chunk { what, .. } => write!(f, "{}:{what}={n}", form.name),
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
    /// Every condition, in the order messages list them.
    const ALL: [Condition; 3] = [Condition::EntropyBonus, Condition::Kl, Condition::TemperatureNotOne];

    /// How it is written after `when`.
    fn name(self) -> &'static str {
        match self {
            Condition::EntropyBonus => "entropy_bonus",
            Condition::Kl => "kl",
            Condition::TemperatureNotOne => "temperature != 1",
        }
    }

    /// Every condition's name, for messages: `entropy_bonus, kl, temperature != 1`.
    pub fn names() -> String {
        Condition::ALL.map(Condition::name).join(", ")
    }

    /// The condition written `text`, its spaces collapsed (`temperature  !=  1`).
    fn parse(text: &str) -> Option<Condition> {
        let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
        Condition::ALL.into_iter().find(|c| c.name() == text)
    }

    /// Whether it holds on a case of these switches and temperature.
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
        f.write_str(self.name())
    }
}

/// One declaration: a convention, on every case or only where a condition holds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Declared {
    /// What the implementation rounds, and how (its row of [`FORMS`]).
    pub convention: Convention,
    /// The switch it holds under; None: on every case.
    pub when: Option<Condition>,
}

impl Declared {
    /// `CONVENTION` or `CONVENTION when CONDITION`.
    pub fn parse(text: &str) -> Result<Declared, String> {
        let (convention, when) = match text.split_once(" when ") {
            Some((c, w)) => {
                let condition = Condition::parse(w).ok_or_else(|| {
                    format!("convention {text:?}: the condition after `when` is one of {}, not {:?}", Condition::names(), w.trim())
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

    /// One of each convention, each variant and each accumulated gradient,
    /// with a number other than 1 where it takes one.
    fn one_of_each() -> [Convention; 9] {
        [
            Convention::Bf16Logits { stages: 3 },
            Convention::Bf16Temperature,
            Convention::Bf16Softmax,
            Convention::Bf16GradLogits { stages: 3 },
            Convention::Bf16Accumulation { gradient: AccumulatedGradient::HiddenOverColumns, chunk: 3 },
            Convention::Bf16Accumulation { gradient: AccumulatedGradient::LmHeadOverSequences, chunk: 3 },
            Convention::Bf16Accumulation { gradient: AccumulatedGradient::LmHeadOverTokens, chunk: 3 },
            Convention::Tf32Matmul,
            Convention::OnlineLse { columns: 3 },
        ]
    }

    /// Every convention has one form in `FORMS` and is written back as it
    /// was read; every form parses to its convention. Red when a form is
    /// dropped from the table (its convention has nothing to print by).
    #[test]
    fn every_convention_has_its_form_and_prints_back() {
        for convention in one_of_each() {
            let written = convention.to_string();
            assert_eq!(Convention::parse(&written), Ok(convention), "{written}");
            let forms = FORMS.iter().filter(|form| (form.convention)(3) == convention).count();
            assert_eq!(forms, 1, "{written} has {forms} forms");
        }
        for form in &FORMS {
            for n in [1, 3] {
                let convention = (form.convention)(n);
                assert_eq!(Convention::parse(&convention.to_string()), Ok(convention), "{}", form.usage());
                assert_eq!(convention.form().0.usage(), form.usage());
            }
        }
        assert_eq!(Convention::parse("bf16_logits:1").unwrap().to_string(), "bf16_logits");
        assert_eq!(Convention::parse(" bf16_accumulation:d_lm_head:tokens=512 ").unwrap().to_string(), "bf16_accumulation:d_lm_head:tokens=512");
    }

    /// A malformed declaration names what was wrong and what the form takes.
    #[test]
    fn malformed_declarations_say_what_the_form_takes() {
        for (text, says) in [
            ("bf16", "the declared conventions are bf16_logits[:K], bf16_temperature, bf16_softmax, bf16_grad_logits[:K]"),
            ("bf16", "tf32_matmul, online_lse:columns=C"),
            ("bf16_softmax:2", "bf16_softmax takes no parameters"),
            ("tf32_matmul:", "takes no parameters"),
            ("bf16_logits:17", "1 to 16, not \"17\""),
            ("bf16_logits:0", "1 to 16"),
            ("bf16_grad_logits:2:3", "takes one parameter, the number of stages (bf16_grad_logits:2)"),
            ("online_lse", "online_lse takes its chunk, e.g. online_lse:columns=128"),
            ("online_lse:rows=4", "online_lse takes columns=C, e.g. online_lse:columns=128"),
            ("online_lse:columns=0", "the chunk must be an integer >= 1, not \"0\""),
            ("bf16_accumulation", "e.g. bf16_accumulation:d_hidden:columns=128, bf16_accumulation:d_lm_head:sequences=1 or bf16_accumulation:d_lm_head:tokens=512"),
            ("bf16_accumulation:d_hidden:tokens=4", "takes d_hidden:columns=C, d_lm_head:sequences=C or d_lm_head:tokens=C"),
            ("bf16_accumulation:d_lm_head:tokens=x", "the chunk must be an integer >= 1, not \"x\""),
        ] {
            let e = Convention::parse(text).unwrap_err();
            assert!(e.contains(says), "{text}: {e}");
            assert!(e.contains(&format!("{text:?}")), "{text}: {e}");
        }
        assert!(Declared::parse("bf16_logits when  temperature  !=  1").is_ok());
        assert!(Declared::parse("bf16_logits when kl").is_ok());
    }
}
