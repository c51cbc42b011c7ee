//! `grpo-verify invariance`: is a token's result the same
//! whatever shares its batch? On-policy GRPO assumes the trainer's log-prob
//! of a token equals the one recorded as `old_logp`, so that the ratio is
//! exactly 1; that holds only if the kernel's per-token outputs do not
//! depend on the micro-batch size, the padded length or the other rows.
//!
//! Each generated case (B >= 2; the loss summed over a constant, so that a
//! token's gradient row depends on nothing else in the batch: docs/spec.md's
//! micro-batch identity) is run as it is and then in variants, and every
//! valid token's outputs in the variant are compared with the same token's
//! in the base run, in units in the last place of the dtype they came back
//! in (f32 for logp, per-token loss and entropy; the gradient's dtype for
//! its rows) at the scale of what each is formed from (`compare`):
//!
//! - `determinism`: the same case again;
//! - `alone`: each row as a batch of one;
//! - `permuted`: the rows in reverse order;
//! - `others_changed`: row 0 beside other rows (another draw's);
//! - `padded`: T extended with masked positions;
//! - `micro_batches`: the rows split in two micro-batches; the loss and
//!   d lm_head summed over them are also compared with the whole's (a
//!   figure: those sums are formed in another order, so they need not be
//!   bitwise).
//!
//! An implementation is bitwise invariant under a property (0 ulps),
//! invariant within `--max-ulps K`, or variant; a variance shrinks (the
//! generators' shrinking, as `check`'s) to the smallest case that shows it
//! and is written as a repro whose replay measures that property again.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use grpo_oracle::Aggregation;
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config as ProptestConfig, RngAlgorithm, TestRng, TestRunner};
use serde::Serialize;

use crate::case::strategy::{case_spec, Bounds};
use crate::case::vocabulary::NormalizerChoice;
use crate::case::{Case, CaseSpec, Dtype, Inputs, Kind};
use crate::compare::classify::ulp;
use crate::compare::{Outputs, Quantity, Scales, Tolerance};
use crate::repro::{canonical_impl, repro_file, slug, Repro};
use crate::worker::outputs::{run_case, RunResult};
use crate::worker::process::Worker;

pub mod property;
mod report;

pub use property::{InvarianceRepro, Property, PROPERTIES};
use report::{report_json, report_md, summary_line};

/// The largest difference one property met, and where.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Measure {
    /// Units in the last place of the output's dtype at its scale (`compare`;
    /// u64::MAX: a non-finite one where the other is finite).
    pub max_ulps: u64,
    /// The quantity and element of `max_ulps` (empty while 0).
    pub at: String,
    /// The largest difference in logp alone, in ulps at its scale (the
    /// gradient's can be far larger: a token within rounding of a clip edge
    /// takes the other branch at a logp one ulp away).
    pub logp_ulps: u64,
    /// max |logp difference|: how far an on-policy ratio exp(logp - old) moves from 1.
    pub max_logp_diff: f64,
    /// Micro-batches only: the loss (and d lm_head) summed over them against the whole's, in ulps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sums_ulps: Option<u64>,
    /// Cases measured.
    pub cases: usize,
    /// The case of `max_ulps` (written as a repro when variant, unshrunk).
    #[serde(skip)]
    pub worst: Option<CaseSpec>,
    /// Its repro file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worst_repro: Option<PathBuf>,
}

impl Measure {
    fn merge(&mut self, other: &Measure) {
        if other.max_ulps > self.max_ulps || self.cases == 0 && !other.at.is_empty() {
            self.max_ulps = other.max_ulps;
            self.at = other.at.clone();
            self.worst = other.worst.clone();
        }
        self.max_logp_diff = self.max_logp_diff.max(other.max_logp_diff);
        self.logp_ulps = self.logp_ulps.max(other.logp_ulps);
        self.sums_ulps = match (self.sums_ulps, other.sums_ulps) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        self.cases += other.cases;
    }

    /// "bitwise", "within 3 ulps" or "variant: 12 ulps".
    pub fn verdict(&self, max_ulps: u64) -> String {
        match self.max_ulps {
            0 => "bitwise".into(),
            k if k <= max_ulps => format!("within {k} ulps"),
            u64::MAX => "variant: non-finite".into(),
            k => format!("variant: {k} ulps"),
        }
    }
}

/// The distance in ulps of two values of `dtype` (widened to f32): how many
/// representable values apart they are; 0 for two NaNs.
pub fn ulps(a: f32, b: f32, dtype: Dtype) -> u64 {
    if a.is_nan() && b.is_nan() || a == b {
        return 0;
    }
    if !a.is_finite() || !b.is_finite() {
        return u64::MAX;
    }
    // Sign-magnitude to a monotone integer line.
    let key = |x: f32| -> i64 {
        let bits = x.to_bits() as i64;
        if bits < 0x8000_0000 { bits } else { 0x8000_0000 - bits }
    };
    let d = (key(a) - key(b)).unsigned_abs();
    match dtype {
        Dtype::F32 => d,
        // bf16 values widened to f32 have 16 zero low bits.
        Dtype::Bf16 => d >> 16,
    }
}

/// One variant of a base case: the case, and for each of its tokens the
/// base token it stands for (None: padding, or a row not compared).
struct Variant {
    case: Case,
    tokens: Vec<Option<usize>>,
}

/// A case of `rows.len()` rows, each row copied from `(source, row)`, every
/// row extended by `pad` masked positions; lm_head and everything not per
/// row from `base`.
fn assemble(base: &Case, rows: &[(&Case, usize)], pad: usize) -> Case {
    let (t_, v_) = (base.shape.time, base.shape.vocab);
    let t2 = t_ + pad;
    let per_row_weights = |c: &Case| c.is_weights.as_ref().is_some_and(|w| w.len() == c.shape.batch && t_ != 1);
    let mut tokens = Vec::new();
    let mut mask = Vec::new();
    let mut advantages = Vec::new();
    let mut old = base.old_logp.as_ref().map(|_| Vec::new());
    let mut reference = base.ref_logp.as_ref().map(|_| Vec::new());
    let mut weights = base.is_weights.as_ref().map(|_| Vec::new());
    let width = match &base.inputs {
        Inputs::Logits { .. } => v_,
        Inputs::Fused { hidden_dim, .. } => *hidden_dim,
    };
    let mut floats = Vec::new();
    for &(src, b) in rows {
        let row = b * t_..(b + 1) * t_;
        tokens.extend_from_slice(&src.tokens[row.clone()]);
        tokens.extend(std::iter::repeat(0).take(pad));
        mask.extend_from_slice(&src.mask[row.clone()]);
        mask.extend(std::iter::repeat(0.0).take(pad));
        advantages.push(src.advantages[b]);
        for (out, input) in [(&mut old, &src.old_logp), (&mut reference, &src.ref_logp)] {
            if let (Some(out), Some(input)) = (out.as_mut(), input) {
                out.extend_from_slice(&input[row.clone()]);
                out.extend(std::iter::repeat(0.0).take(pad));
            }
        }
        if let (Some(out), Some(w)) = (weights.as_mut(), &src.is_weights) {
            if per_row_weights(src) {
                out.push(w[b]);
            } else {
                out.extend_from_slice(&w[row.clone()]);
                out.extend(std::iter::repeat(1.0).take(pad));
            }
        }
        let values = match &src.inputs {
            Inputs::Logits { logits } => logits,
            Inputs::Fused { hidden, .. } => hidden,
        };
        let row_values = &values[b * t_ * width..(b + 1) * t_ * width];
        floats.extend_from_slice(row_values);
        // Padding repeats the row's last position (masked: it must carry nothing).
        for _ in 0..pad {
            floats.extend_from_slice(&row_values[(t_ - 1) * width..]);
        }
    }
    let inputs = match &base.inputs {
        Inputs::Logits { .. } => Inputs::Logits { logits: floats },
        Inputs::Fused { hidden_dim, lm_head, .. } => Inputs::Fused { hidden_dim: *hidden_dim, hidden: floats, lm_head: lm_head.clone() },
    };
    let mut case = base.with_inputs(inputs);
    case.shape.batch = rows.len();
    case.shape.time = t2;
    case.tokens = tokens;
    case.mask = mask;
    case.advantages = advantages;
    case.old_logp = old;
    case.ref_logp = reference;
    case.is_weights = weights;
    case.mesh = None;
    case
}

/// The variants of `base` for `property` (`other`: another draw of the same
/// signature, for `others_changed`).
fn variants(base: &Case, other: &Case, property: Property) -> Vec<Variant> {
    let (b_, t_) = (base.shape.batch, base.shape.time);
    let all = |rows: &[usize], pad: usize| -> Vec<Option<usize>> {
        rows.iter().flat_map(|&b| (0..t_).map(move |t| Some(b * t_ + t)).chain(std::iter::repeat(None).take(pad))).collect()
    };
    let whole: Vec<usize> = (0..b_).collect();
    match property {
        Property::Determinism => vec![Variant { case: base.clone(), tokens: all(&whole, 0) }],
        Property::Alone => whole.iter().map(|&b| Variant { case: assemble(base, &[(base, b)], 0), tokens: all(&[b], 0) }).collect(),
        Property::Permuted => {
            let reversed: Vec<usize> = whole.iter().rev().copied().collect();
            let rows: Vec<(&Case, usize)> = reversed.iter().map(|&b| (base, b)).collect();
            vec![Variant { case: assemble(base, &rows, 0), tokens: all(&reversed, 0) }]
        }
        Property::OthersChanged => {
            let rows: Vec<(&Case, usize)> = (0..b_).map(|b| if b == 0 { (base, 0) } else { (other, b) }).collect();
            let mut tokens = all(&whole, 0);
            tokens[t_..].iter_mut().for_each(|t| *t = None);
            vec![Variant { case: assemble(base, &rows, 0), tokens }]
        }
        Property::Padded => {
            let pad = t_.div_ceil(2);
            let rows: Vec<(&Case, usize)> = whole.iter().map(|&b| (base, b)).collect();
            vec![Variant { case: assemble(base, &rows, pad), tokens: all(&whole, pad) }]
        }
        Property::MicroBatches => {
            let half = b_.div_ceil(2);
            [&whole[..half], &whole[half..]]
                .into_iter()
                .map(|part| {
                    let rows: Vec<(&Case, usize)> = part.iter().map(|&b| (base, b)).collect();
                    Variant { case: assemble(base, &rows, 0), tokens: all(part, 0) }
                })
                .collect()
        }
    }
}

/// Compares every compared token's outputs in `variant` with the base's,
/// in ulps at the scale of what each is formed from, so that one rounding
/// counts about one ulp (a value that cancels to near zero, an entropy of
/// 3e-6 from terms of size 10, would otherwise count thousands of its own
/// ulps for one rounding of its terms): logp, per-token loss and entropy
/// in f32 ulps at their scale (the tolerance's, `Scales::of_token`); a
/// gradient element in ulps of its dtype at the larger of its row's largest
/// |value| and its terms (`Scales::grad_row`, times sum_v |lm_head[h, v]|
/// for a d hidden column h, `column_weight`). Any difference counts at
/// least 1: 0 is bitwise.
fn compare(
    base: &Outputs,
    variant: &Outputs,
    tokens: &[Option<usize>],
    mask: &[f32],
    column_weight: &[f64],
    scales: &Scales,
    m: &mut Measure,
) {
    let width = column_weight.len();
    let mut note = |q: Quantity, d: u64, at: String| {
        if d > m.max_ulps {
            m.max_ulps = d;
            m.at = format!("{q} at {at}");
        }
    };
    for (j, i) in tokens.iter().enumerate() {
        // Masked tokens carry nothing: SPEC leaves their outputs free.
        let Some(i) = i.filter(|&i| mask[i] != 0.0) else { continue };
        for (q, a, b) in [
            (Quantity::Logp, &base.logp, &variant.logp),
            (Quantity::PerTokenLoss, &base.per_token_loss, &variant.per_token_loss),
            (Quantity::Entropy, &base.entropy, &variant.entropy),
        ] {
            if let (Some(a), Some(b)) = (a, b) {
                let unit = ulp(Dtype::F32, scales.of_token(q, i).unwrap_or(a[i] as f64));
                let d = units_apart(a[i], b[j], unit);
                if q == Quantity::Logp {
                    m.max_logp_diff = m.max_logp_diff.max((a[i] as f64 - b[j] as f64).abs());
                    m.logp_ulps = m.logp_ulps.max(d);
                }
                note(q, d, format!("token {i}: {:e} against {:e}", a[i], b[j]));
            }
        }
        let grad = if base.grad_lm_head.is_some() { Quantity::GradHidden } else { Quantity::Grad };
        let (ra, rb) = (&base.grad[i * width..(i + 1) * width], &variant.grad[j * width..(j + 1) * width]);
        let row_max = ra.iter().filter(|x| x.is_finite()).fold(0.0f64, |s, &x| s.max((x as f64).abs()));
        for (k, (&x, &y)) in ra.iter().zip(rb).enumerate() {
            let unit = ulp(base.grad_dtype, row_max.max(scales.grad_row(i) * column_weight[k]));
            note(grad, units_apart(x, y, unit), format!("token {i} column {k}: {x:e} against {y:e}"));
        }
    }
}

/// The largest difference between two rows in ulps of `dtype` at the
/// first's largest |value|, and its column: 0 when bit-identical (NaNs
/// alike), u64::MAX where one is finite and the other not.
fn row_ulps(a: &[f32], b: &[f32], dtype: Dtype) -> (usize, u64) {
    let scale = a.iter().filter(|x| x.is_finite()).fold(0.0f64, |s, &x| s.max((x as f64).abs()));
    let unit = ulp(dtype, scale);
    let mut worst = (0, 0);
    for (k, (&x, &y)) in a.iter().zip(b).enumerate() {
        let d = units_apart(x, y, unit);
        if d > worst.1 {
            worst = (k, d);
        }
    }
    worst
}

/// |x - y| in `unit`s, rounded up (any difference is at least 1): 0 when
/// bit-identical or both NaN, u64::MAX where one is finite and the other not.
fn units_apart(x: f32, y: f32, unit: f64) -> u64 {
    if x.to_bits() == y.to_bits() || x.is_nan() && y.is_nan() {
        0
    } else if !x.is_finite() || !y.is_finite() {
        u64::MAX
    } else {
        ((x as f64 - y as f64).abs() / unit).ceil().max(1.0) as u64
    }
}

/// A base case and what every property compares against: its outputs, the
/// tolerance's scales of it, each gradient column's weight, and the other
/// draw `others_changed` takes its rows from. Made once per case.
struct Base {
    case: Case,
    out: Outputs,
    scales: Scales,
    /// What each gradient column is summed from, per unit of d logits:
    /// d logits itself (1), or d hidden's sum_v |lm_head[h, v]|.
    column_weight: Vec<f64>,
    other: Case,
}

impl Base {
    fn new(case: Case, out: Outputs, other: Case) -> Result<Base, String> {
        let column_weight = match &case.inputs {
            Inputs::Logits { .. } => vec![1.0; case.shape.vocab],
            Inputs::Fused { lm_head, .. } => lm_head.chunks(case.shape.vocab).map(|row| row.iter().map(|&w| (w as f64).abs()).sum()).collect(),
        };
        let problem = case.problem();
        let fwd = problem.forward().map_err(|e| format!("the case is invalid (a harness bug): {e}"))?;
        let scales = Scales::new(&fwd, &case, &Tolerance::default());
        Ok(Base { case, out, scales, column_weight, other })
    }
}

/// The base case's outputs against its variants' for one property.
fn measure(worker: &mut Worker, implementation: &str, base: &Base, property: Property, timeout: Duration) -> Result<Measure, String> {
    let mut m = Measure { cases: 1, ..Measure::default() };
    let mut loss_sum = 0.0f64;
    let mut lm_head_sum: Option<Vec<f64>> = None;
    for v in variants(&base.case, &base.other, property) {
        let out = run(worker, implementation, &v.case, timeout).map_err(|e| format!("{} ({}): {e}", property.name(), v.case.summary()))?;
        compare(&base.out, &out, &v.tokens, &base.case.mask, &base.column_weight, &base.scales, &mut m);
        loss_sum += out.loss;
        if let Some(dw) = &out.grad_lm_head {
            let sum = lm_head_sum.get_or_insert_with(|| vec![0.0; dw.len()]);
            sum.iter_mut().zip(dw).for_each(|(s, &d)| *s += d as f64);
        }
    }
    if property == Property::MicroBatches {
        let whole = &base.out;
        let mut sums = ulps(whole.loss as f32, loss_sum as f32, Dtype::F32);
        if let (Some(dw), Some(sum)) = (&whole.grad_lm_head, &lm_head_sum) {
            let summed: Vec<f32> = sum.iter().map(|&s| whole.grad_dtype.round(s)).collect();
            sums = sums.max(row_ulps(dw, &summed, whole.grad_dtype).1);
        }
        m.sums_ulps = Some(sums);
    }
    Ok(m)
}

/// Why a run gave no outputs.
enum NotRun {
    /// NotImplementedError.
    Refused(String),
    /// It raised, crashed, hung or returned something malformed; or the worker could not serve.
    Failed(String),
}

impl std::fmt::Display for NotRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotRun::Refused(m) => write!(f, "refused (NotImplementedError): {m}"),
            NotRun::Failed(m) => f.write_str(m),
        }
    }
}

/// Runs one case.
fn run(worker: &mut Worker, implementation: &str, case: &Case, timeout: Duration) -> Result<Outputs, NotRun> {
    match run_case(worker, implementation, case, timeout).map_err(|e| NotRun::Failed(e.to_string()))? {
        RunResult::Ok(out) => Ok(out),
        RunResult::Unsupported(refusal) => Err(NotRun::Refused(refusal.message)),
        RunResult::Failed(_, m) => Err(NotRun::Failed(m)),
    }
}

/// The case drawn for the invariance run: at least two rows, and the loss
/// summed over a constant (37.5), with the entropy term in loss_t: then a
/// token's gradient row depends on nothing else in the batch.
pub fn for_invariance(mut spec: CaseSpec) -> CaseSpec {
    spec.batch = spec.batch.max(2);
    spec.config.aggregation = Aggregation::SumOverConstant;
    spec.config.entropy_aggregation = grpo_oracle::EntropyAggregation::Same;
    spec.normalizer = NormalizerChoice::Constant;
    spec.mesh = None;
    spec
}

/// The other draw `others_changed` takes its rows from: the same signature, another seed.
fn other_draw(spec: &CaseSpec, kind: Kind) -> Case {
    CaseSpec { seed: spec.seed ^ 0x9e37_79b9_7f4a_7c15, ..spec.clone() }.materialize(kind)
}

/// What one `invariance` run measures (docs/cli.md, `invariance`; docs/invariance.md).
pub struct InvarianceOptions {
    /// Empty: every built-in that runs on one device.
    pub implementations: Vec<String>,
    /// The properties measured (`--property`; default all, in `PROPERTIES` order).
    pub properties: Vec<Property>,
    /// Cases drawn per implementation.
    pub cases: u32,
    /// The run's seed.
    pub seed: u64,
    /// Shapes, dtypes and objective drawn (at least two rows).
    pub bounds: Bounds,
    /// The differences allowed, in ulps of the output's dtype at its scale (0: bitwise).
    pub max_ulps: u64,
    /// Where report.json, report.md and the repro files go.
    pub report_dir: PathBuf,
    /// Wall time the shrinker may spend on one variance.
    pub shrink_time: Duration,
    /// How long one run of a case may take.
    pub timeout: Duration,
    /// The part of the implementations this run measures (`--partition K/N`).
    pub partition: crate::partition::Partition,
}

/// One implementation's result.
#[derive(Clone, Debug, Serialize)]
pub struct ImplInvariance {
    /// As `--impl` names it.
    pub implementation: String,
    /// Logits or fused.
    pub kind: Kind,
    /// Each property's largest difference over the cases, where it was and on which case.
    pub measures: Vec<(Property, Measure)>,
    /// The first property found variant, its minimal case and repro.
    pub variant: Option<Property>,
    /// The minimal case of the variance, in one line.
    pub minimal_case: Option<String>,
    /// Its repro file.
    pub repro: Option<PathBuf>,
    /// The one-line command that replays it.
    pub replay: Option<String>,
    /// A variant that did not run (refused, raised): the property and why.
    pub refused: Option<String>,
    /// Wall time of the implementation's measures.
    pub seconds: f64,
}

/// `grpo-verify invariance`: Ok(true) when every implementation is
/// invariant within `max_ulps` under every property.
pub fn command(opts: InvarianceOptions) -> Result<bool> {
    if opts.bounds.max_batch < 2 {
        bail!("--max-batch {}: batch invariance needs two rows (alone, permuted, others changed, micro-batches); use at least 2", opts.bounds.max_batch);
    }
    std::fs::create_dir_all(&opts.report_dir).with_context(|| format!("creating the report directory {}", opts.report_dir.display()))?;
    let env = crate::worker::pyenv::resolve()?;
    let mut worker = Worker::start(&env).map_err(|e| anyhow::anyhow!("{e}"))?;
    let implementations = match opts.implementations.is_empty() {
        // Every built-in that runs on one device.
        true => worker.builtins().into_iter().filter(|b| !b.sharded).map(|b| b.name).collect(),
        false => opts.implementations.clone(),
    };
    let all = implementations.len();
    let implementations = opts.partition.keep(implementations);
    if implementations.is_empty() {
        bail!("--partition {}: the run's {all} implementations make at most {all} parts, and this one would hold none", opts.partition);
    }
    let mut results = Vec::new();
    for implementation in &implementations {
        let kind = worker.load(implementation)?;
        let result = run_implementation(&mut worker, implementation, kind, &opts)?;
        println!("{}", summary_line(&result, opts.max_ulps));
        results.push(result);
    }
    let text = report_md(&results, &opts);
    crate::report::write_atomic(&opts.report_dir.join("report.json"), &serde_json::to_string_pretty(&report_json(&results, &opts))?)?;
    crate::report::write_atomic(&opts.report_dir.join("report.md"), &text)?;
    println!("report: {}", opts.report_dir.join("report.md").display());
    if let Some(r) = results.iter().find(|r| r.refused.is_some()) {
        bail!("{}: {} (its invariance is not measured: report {})", r.implementation, r.refused.as_deref().unwrap_or_default(), opts.report_dir.display());
    }
    Ok(results.iter().all(|r| r.variant.is_none()))
}

/// How one drawn case measured: every property's measure, or why it did not run.
enum Drawn {
    /// NotImplementedError on the base case (its message): draw another.
    Refused(String),
    Measured(Vec<(Property, Measure)>),
    /// The base case or a variant did not run (raised, crashed, refused a split).
    NotRun(String),
}

/// Measures `properties` on the case of `spec` (all of them: no early stop).
fn measure_case(worker: &mut Worker, implementation: &str, kind: Kind, spec: &CaseSpec, properties: &[Property], timeout: Duration) -> Drawn {
    let case = spec.materialize(kind);
    let out = match run(worker, implementation, &case, timeout) {
        Ok(out) => out,
        Err(NotRun::Refused(why)) => return Drawn::Refused(why),
        Err(m) => return Drawn::NotRun(format!("the base case ({}) did not run: {m}", case.summary())),
    };
    let base = match Base::new(case, out, other_draw(spec, kind)) {
        Ok(base) => base,
        Err(why) => return Drawn::NotRun(why),
    };
    let mut measures = Vec::new();
    for &property in properties {
        match measure(worker, implementation, &base, property, timeout) {
            Ok(mut m) => {
                if m.max_ulps > 0 {
                    m.at = format!("{} (case {})", m.at, base.case.summary());
                    m.worst = Some(spec.clone());
                }
                measures.push((property, m))
            }
            Err(why) => return Drawn::NotRun(why),
        }
    }
    Drawn::Measured(measures)
}

fn run_implementation(worker: &mut Worker, implementation: &str, kind: Kind, opts: &InvarianceOptions) -> Result<ImplInvariance> {
    let started = Instant::now();
    let mut totals: Vec<(Property, Measure)> = opts.properties.iter().map(|&p| (p, Measure::default())).collect();
    let mut seed = [0u8; 32];
    seed[..8].copy_from_slice(&opts.seed.to_le_bytes());
    let config = ProptestConfig { failure_persistence: None, ..ProptestConfig::default() };
    let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &seed));
    let strategy = case_spec(&opts.bounds).prop_map(for_invariance);
    let mut result = ImplInvariance {
        implementation: implementation.to_string(),
        kind,
        measures: Vec::new(),
        variant: None,
        minimal_case: None,
        repro: None,
        replay: None,
        refused: None,
        seconds: 0.0,
    };
    // Every case measures every property; the first variant one is kept to shrink.
    let mut first_variant = None;
    let (mut measured, mut draws) = (0, 0);
    let mut refusal = String::new();
    while measured < opts.cases && draws < 16 * opts.cases {
        draws += 1;
        let tree = strategy.new_tree(&mut runner).map_err(|e| anyhow::anyhow!("drawing a case: {e}"))?;
        match measure_case(worker, implementation, kind, &tree.current(), &opts.properties, opts.timeout) {
            Drawn::Refused(why) => {
                refusal = why;
                continue;
            }
            Drawn::NotRun(why) => {
                result.refused = Some(why);
                break;
            }
            Drawn::Measured(ms) => {
                measured += 1;
                for ((_, total), (_, m)) in totals.iter_mut().zip(&ms) {
                    total.merge(m);
                }
                if first_variant.is_none() {
                    if let Some((property, _)) = ms.iter().find(|(_, m)| m.max_ulps > opts.max_ulps) {
                        first_variant = Some((*property, tree));
                    }
                }
            }
        }
    }
    if measured == 0 && result.refused.is_none() {
        result.refused = Some(format!("every one of {draws} draws was refused (NotImplementedError; the last: {refusal}): nothing was measured"));
    }
    if let Some((property, tree)) = first_variant {
        let minimal = shrink(worker, implementation, kind, property, tree, opts);
        let failure = match measure_case(worker, implementation, kind, &minimal, &[property], opts.timeout) {
            Drawn::Measured(ms) => format!("variant under {}: {} ({})", property.name(), ms[0].1.verdict(opts.max_ulps), ms[0].1.at),
            _ => format!("variant under {}", property.name()),
        };
        let path = repro_file(&opts.report_dir.join("repro"), implementation, 1);
        let mut repro = Repro::of_failure(implementation, &minimal, kind, failure, opts.seed, &path);
        repro.invariance = Some(InvarianceRepro { property, max_ulps: opts.max_ulps });
        repro.write(&path)?;
        result.variant = Some(property);
        result.minimal_case = Some(repro.summary.clone());
        result.replay = Some(repro.replay.clone());
        result.repro = Some(path);
    }
    // The largest variance of each variant property, unshrunk, for replay.
    for (property, m) in totals.iter_mut() {
        if let (true, Some(worst)) = (m.max_ulps > opts.max_ulps, &m.worst) {
            let path = opts.report_dir.join("repro").join(format!("{}-worst-{}.json", slug(&canonical_impl(implementation)), property.name()));
            let failure = format!("the largest variance under {} in the run: {} ({})", property.name(), m.verdict(opts.max_ulps), m.at);
            let mut repro = Repro::of_failure(implementation, worst, kind, failure, opts.seed, &path);
            repro.invariance = Some(InvarianceRepro { property: *property, max_ulps: opts.max_ulps });
            repro.write(&path)?;
            m.worst_repro = Some(path);
        }
    }
    result.measures = totals;
    result.seconds = started.elapsed().as_secs_f64();
    Ok(result)
}

/// Shrinks a case variant under `property` as proptest shrinks a failure
/// (simplify while it stays variant, complicate when a step is not), within
/// `--shrink-time`; a step that does not run counts as not variant.
fn shrink<T: ValueTree<Value = CaseSpec>>(worker: &mut Worker, implementation: &str, kind: Kind, property: Property, mut tree: T, opts: &InvarianceOptions) -> CaseSpec {
    let started = Instant::now();
    let mut minimal = tree.current();
    let mut variant = |spec: &CaseSpec| match measure_case(worker, implementation, kind, spec, &[property], opts.timeout) {
        Drawn::Measured(ms) => ms[0].1.max_ulps > opts.max_ulps,
        Drawn::Refused(_) | Drawn::NotRun(_) => false,
    };
    if !tree.simplify() {
        return minimal;
    }
    while started.elapsed() < opts.shrink_time {
        let candidate = tree.current();
        if variant(&candidate) {
            minimal = candidate;
            if !tree.simplify() {
                break;
            }
        } else if !tree.complicate() {
            break;
        }
    }
    minimal
}

/// `replay` of an invariance repro: measures its property again on its
/// case; Ok(false) when it is still variant.
pub fn replay(file: &Path, repro: &Repro, what: InvarianceRepro, implementation: Option<String>, timeout: Duration) -> Result<bool> {
    let implementation = implementation.map(|i| canonical_impl(&i)).unwrap_or(repro.implementation.clone());
    let env = crate::worker::pyenv::resolve()?;
    let mut worker = Worker::start(&env).map_err(|e| anyhow::anyhow!("{e}"))?;
    let kind = worker.load(&implementation)?;
    if kind != repro.case.kind() {
        bail!("--impl {implementation} is of the {} kind; the repro's case is {}", kind.name(), repro.case.kind().name());
    }
    let spec = repro.spec.as_ref().ok_or_else(|| anyhow::anyhow!("{}: an invariance repro needs its spec (for the other rows)", file.display()))?;
    println!("replaying {} on `{implementation}`: {} ({})", file.display(), what.property.name(), what.property.says());
    println!("case: {}", repro.case.summary());
    let out = run(&mut worker, &implementation, &repro.case, timeout).map_err(|e| anyhow::anyhow!("{e}"))?;
    let base = Base::new(repro.case.clone(), out, other_draw(spec, kind)).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    let m = measure(&mut worker, &implementation, &base, what.property, timeout).map_err(|e| anyhow::anyhow!("{e}"))?;
    let verdict = m.verdict(what.max_ulps);
    println!("{}: {verdict}{}; max |logp difference| {:.3e}", what.property.name(), if m.at.is_empty() { String::new() } else { format!(" ({})", m.at) }, m.max_logp_diff);
    let invariant = m.max_ulps <= what.max_ulps;
    println!("{}", if invariant { "INVARIANT" } else { "VARIANT" });
    Ok(invariant)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ulps_count_representable_values_between() {
        assert_eq!(ulps(1.0, 1.0, Dtype::F32), 0);
        assert_eq!(ulps(1.0, f32::from_bits(1.0f32.to_bits() + 3), Dtype::F32), 3);
        assert_eq!(ulps(-0.0, 0.0, Dtype::F32), 0);
        assert_eq!(ulps(-f32::from_bits(1), f32::from_bits(1), Dtype::F32), 2);
        assert_eq!(ulps(4.044_356_3, 4.044_357, Dtype::F32), 1);
        assert_eq!(ulps(1.0, 1.0 + 1.0 / 128.0, Dtype::Bf16), 1);
        assert_eq!(ulps(f32::NAN, f32::NAN, Dtype::F32), 0);
        assert_eq!(ulps(1.0, f32::INFINITY, Dtype::F32), u64::MAX);
        // A row: ulps at its largest value.
        assert_eq!(row_ulps(&[1.0, 1e-9], &[1.0, 2e-9], Dtype::F32), (1, 1));
    }
}
