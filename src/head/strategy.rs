//! How head-loss cases are drawn: the plan whose rows the cases cycle
//! through (every reduction with every divergence or with and without class
//! weights, then each edge), the edges forced (both distributions
//! underflowing, every label ignored, one sequence ignored, a softcap on an
//! odd vocabulary, non-uniform upstream weights), shapes biased to the tile
//! edges, and the arrays from a seed.

use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, RngAlgorithm, TestRng, TestRunner};

use super::case::{HeadBounds, HeadCase, HeadDivergence, HeadObjective, HeadReduction, Supports};
use crate::case::{Dtype, Kind};

/// The vocabulary sizes a kernel's tiles get wrong: one either side of the
/// powers of two and the 128-lane multiples, and small odd ones.
const VOCAB_EDGES: [usize; 14] = [2, 3, 7, 127, 128, 129, 255, 256, 257, 511, 513, 1023, 1024, 1025];

/// The choices a case is drawn from; the arrays follow from `seed`, so
/// shrinking moves the shape and the switches, and keeps the numbers' law.
#[derive(Clone, Debug)]
struct Draw {
    dtype: Dtype,
    batch: usize,
    time: usize,
    vocab: usize,
    hidden: usize,
    teacher_hidden: usize,
    reduction: HeadReduction,
    divergence: HeadDivergence,
    beta: u8,
    smoothing: u8,
    z_loss: u8,
    softcap: u8,
    temperature: u8,
    scale: u8,
    ignored: u8,
    class_weights: bool,
    bias: bool,
    underflow: bool,
    ignore_index: i32,
    cotangent: u8,
    edge: Edge,
    seed: u64,
}

/// The edges a kernel gets wrong, one forced per case: the plan's last rows
/// force each in turn (its other rows pin `Free`); a case no row pins draws
/// one in two cases with an edge. `Free` leaves every choice to its own law.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Edge {
    /// Nothing forced.
    Free,
    /// Classes that both distributions give about e^-200 of (f32 underflows both), no softcap; a JSD between 0 and 1 for distillation.
    Underflow,
    /// Every label ignored, a mean: the loss is 0, never 0/0.
    AllIgnored,
    /// One whole sequence ignored (with B = 1, the whole batch).
    IgnoredSequence,
    /// A softcap on a V that is not a power of two (padded lanes must not count).
    SoftcapOddVocab,
    /// Reduction none: non-uniform upstream weights per token.
    Upstream,
}

impl Edge {
    /// Every edge, in the strategy's order.
    pub const ALL: [Edge; 6] = [Edge::Free, Edge::Underflow, Edge::AllIgnored, Edge::IgnoredSequence, Edge::SoftcapOddVocab, Edge::Upstream];
}

/// One row of a run's plan: what its case is pinned to (None: drawn).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pin {
    /// The reduction.
    pub reduction: Option<HeadReduction>,
    /// The divergence (distillation).
    pub divergence: Option<HeadDivergence>,
    /// Class weights or none (cross-entropy).
    pub class_weights: Option<bool>,
    /// The edge forced.
    pub edge: Option<Edge>,
}

/// The rows a run's cases cycle through: every reduction with every
/// divergence (distillation) or with and without class weights
/// (cross-entropy), then each edge; everything a row does not pin is drawn.
/// A 40-case run meets every pair two or three times, where free draws
/// left a pair like (mean, class weights) to a 1-in-10 chance per case
/// (and the gate's seed 1 missed it).
pub fn plan(objective: HeadObjective) -> Vec<Pin> {
    let mut rows = Vec::new();
    for reduction in HeadReduction::ALL {
        match objective {
            HeadObjective::Distillation => {
                rows.extend(HeadDivergence::ALL.map(|d| Pin { reduction: Some(reduction), divergence: Some(d), edge: Some(Edge::Free), ..Pin::default() }))
            }
            HeadObjective::CrossEntropy => {
                rows.extend([true, false].map(|w| Pin { reduction: Some(reduction), class_weights: Some(w), edge: Some(Edge::Free), ..Pin::default() }))
            }
        }
    }
    rows.extend(Edge::ALL[1..].iter().map(|&e| Pin { edge: Some(e), ..Pin::default() }));
    rows
}

/// The strategy of `bounds`' cases, each pinned to `pin`.
pub fn strategy(bounds: &HeadBounds, pin: Pin) -> BoxedStrategy<HeadCase> {
    let b = bounds.clone();
    let vocab = prop_oneof![
        2 => proptest::sample::select(VOCAB_EDGES.iter().copied().filter(|&v| v <= b.max_vocab.max(2)).collect::<Vec<_>>()),
        1 => 2..=b.max_vocab.max(2),
    ];
    let hidden = prop_oneof![1 => Just(1usize), 3 => 1..=b.max_hidden.max(1)];
    let shape = (proptest::sample::select(b.dtypes.clone()), 1..=b.max_batch.max(1), 1..=b.max_time.max(1), vocab, hidden, 1..=b.max_hidden.clamp(1, 8));
    let switches = (
        proptest::sample::select(HeadReduction::ALL.to_vec()),
        proptest::sample::select(HeadDivergence::ALL.to_vec()),
        0u8..5,
        0u8..4,
        0u8..3,
        0u8..3,
        0u8..3,
        0u8..5,
        // Which rows are ignored: none, some (two ways), one sequence; all of them is an edge.
        0u8..4,
    );
    let flags = (any::<bool>(), any::<bool>(), prop_oneof![3 => Just(false), 1 => Just(true)], prop_oneof![Just(-100), Just(-1)], 0u8..4, any::<u64>());
    let edge = prop_oneof![5 => Just(Edge::Free), 1 => Just(Edge::Underflow), 1 => Just(Edge::AllIgnored), 1 => Just(Edge::IgnoredSequence), 1 => Just(Edge::SoftcapOddVocab), 1 => Just(Edge::Upstream)];
    (shape, switches, flags, edge)
        .prop_map(move |((dtype, batch, time, vocab, hidden, teacher_hidden), sw, fl, edge)| {
            let draw = Draw {
                dtype,
                batch,
                time,
                vocab,
                hidden,
                teacher_hidden,
                reduction: sw.0,
                divergence: sw.1,
                beta: sw.2,
                smoothing: sw.3,
                z_loss: sw.4,
                softcap: sw.5,
                temperature: sw.6,
                scale: sw.7,
                ignored: sw.8,
                class_weights: fl.0,
                bias: fl.1,
                underflow: fl.2,
                ignore_index: fl.3,
                cotangent: fl.4,
                edge,
                seed: fl.5,
            };
            materialise(&b, &draw.pinned(pin).forced().supported(&b.supports, b.kind))
        })
        .boxed()
}

impl Draw {
    /// The draw with a plan row's pins applied.
    fn pinned(&self, pin: Pin) -> Draw {
        Draw {
            reduction: pin.reduction.unwrap_or(self.reduction),
            divergence: pin.divergence.unwrap_or(self.divergence),
            class_weights: pin.class_weights.unwrap_or(self.class_weights),
            edge: pin.edge.unwrap_or(self.edge),
            ..self.clone()
        }
    }

    /// The draw kept to what the implementation supports: a reduction or
    /// divergence it lacks becomes one it has (chosen by the draw), an
    /// ignore_index one it takes, and a softcap, temperature, smoothing,
    /// z-loss, class weights, ignored rows or a bias it lacks their off
    /// values (without a bias, a fused case cannot underflow: its
    /// underflowing classes come through the bias).
    fn supported(&self, supports: &Supports, kind: Kind) -> Draw {
        let mut d = self.clone();
        if let Some(reductions) = supports.reductions.as_ref().filter(|r| !r.is_empty() && !r.contains(&d.reduction)) {
            d.reduction = reductions[d.seed as usize % reductions.len()];
        }
        if let Some(divergences) = supports.divergences.as_ref().filter(|v| !v.is_empty() && !v.contains(&d.divergence)) {
            d.divergence = divergences[d.seed as usize % divergences.len()];
        }
        if supports.ignored_rows == Some(false) {
            d.ignored = 0;
        }
        if supports.bias == Some(false) {
            d.bias = false;
            if kind == Kind::Fused {
                d.underflow = false;
            }
        }
        if supports.softcap == Some(false) {
            d.softcap = 0;
        }
        if let Some(values) = supports.ignore_index.as_ref().filter(|v| !v.is_empty() && !v.contains(&d.ignore_index)) {
            d.ignore_index = values[0];
        }
        if supports.temperature == Some(false) {
            d.temperature = 0;
        }
        if supports.label_smoothing == Some(false) {
            d.smoothing = 0;
        }
        if supports.z_loss == Some(false) {
            d.z_loss = 0;
        }
        if supports.class_weights == Some(false) {
            d.class_weights = false;
        }
        d
    }

    /// The draw with its edge's choices forced.
    fn forced(&self) -> Draw {
        let mut d = self.clone();
        match d.edge {
            Edge::Free => {}
            Edge::Underflow => {
                d.underflow = true;
                d.softcap = 0;
                d.divergence = HeadDivergence::Jsd;
                d.beta = if d.beta < 3 { 3 } else { d.beta };
            }
            Edge::AllIgnored => {
                d.ignored = 4;
                d.reduction = HeadReduction::Mean;
            }
            Edge::IgnoredSequence => {
                d.ignored = 3;
            }
            Edge::SoftcapOddVocab => {
                d.softcap = 1 + d.softcap % 2;
                if d.vocab.is_power_of_two() {
                    d.vocab = (d.vocab + 1).max(3);
                }
            }
            Edge::Upstream => d.reduction = HeadReduction::None,
        }
        d
    }
}

/// splitmix64: the arrays' numbers from the draw's seed.
struct Numbers(u64);

impl Numbers {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    fn uniform(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Standard normal (Box-Muller).
    fn normal(&mut self) -> f64 {
        let u = self.uniform().max(1e-300);
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * self.uniform()).cos()
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn materialise(b: &HeadBounds, d: &Draw) -> HeadCase {
    let mut r = Numbers(d.seed);
    let (n, v) = (d.batch * d.time, d.vocab);
    let distill = b.objective == HeadObjective::Distillation;
    let fused = b.kind == Kind::Fused;
    let round = |x: f64| d.dtype.round(x);
    let f32_of = |x: f64| x as f32 as f64;
    // The logits' spread: from nearly uniform to a peaked, bf16-coarse row.
    let spread = [0.1, 1.0, 4.0, 12.0, 40.0][d.scale as usize];
    let ignore_index = d.ignore_index;
    // Ignored rows: none, some, one whole sequence, or the whole batch.
    let mut labels: Vec<i32> = (0..n)
        .map(|_| match r.below(4) {
            0 => (v - 1) as i32, // the last vocabulary id: the tail tile's
            1 => 0,
            _ => r.below(v) as i32,
        })
        .collect();
    match d.ignored {
        1 | 2 => labels.iter_mut().for_each(|y| {
            if r.uniform() < 0.3 {
                *y = ignore_index
            }
        }),
        3 => {
            let s = r.below(d.batch);
            labels[s * d.time..(s + 1) * d.time].iter_mut().for_each(|y| *y = ignore_index);
        }
        4 => labels.iter_mut().for_each(|y| *y = ignore_index),
        _ => {}
    }
    let hidden_dim = if fused { d.hidden } else { 0 };
    let teacher_hidden_dim = if fused && distill { d.teacher_hidden } else { 0 };
    let gauss = |r: &mut Numbers, count: usize, sd: f64| -> Vec<f32> { (0..count).map(|_| round(r.normal() * sd)).collect() };
    let mut case = HeadCase {
        objective: b.objective,
        kind: b.kind,
        dtype: d.dtype,
        batch: d.batch,
        time: d.time,
        vocab: v,
        hidden_dim,
        teacher_hidden_dim,
        reduction: d.reduction,
        divergence: if distill { d.divergence } else { HeadDivergence::ForwardKl },
        ignore_index,
        label_smoothing: if distill { 0.0 } else { [0.0, 0.0, 0.1, f32_of(0.05 + 0.9 * r.uniform())][d.smoothing as usize] },
        z_loss: if distill { 0.0 } else { [0.0, 1e-4, 1e-2][d.z_loss as usize] },
        softcap: [f64::INFINITY, 30.0, f32_of(2.0 + 20.0 * r.uniform())][d.softcap as usize],
        temperature: [1.0, 0.5, f32_of(0.25 + 3.0 * r.uniform())][d.temperature as usize],
        beta: if distill && d.divergence == HeadDivergence::Jsd { [0.5, 0.0, 1.0, 0.1, f32_of(r.uniform())][d.beta as usize] } else { 0.5 },
        num_items: 1.0,
        labels,
        logits: Vec::new(),
        hidden: Vec::new(),
        lm_head: Vec::new(),
        bias: None,
        teacher_logits: Vec::new(),
        teacher_hidden: Vec::new(),
        teacher_lm_head: Vec::new(),
        class_weights: None,
        cotangent: [1.0, -0.5, 2.5, 0.375][d.cotangent as usize],
        upstream: None,
    };
    if fused {
        let h = d.hidden;
        case.hidden = gauss(&mut r, n * h, 1.0);
        case.lm_head = gauss(&mut r, h * v, spread / (h as f64).sqrt());
        case.bias = (d.bias || d.underflow).then(|| gauss(&mut r, v, spread / 4.0));
        if distill {
            let ht = d.teacher_hidden;
            case.teacher_hidden = gauss(&mut r, n * ht, 1.0);
            case.teacher_lm_head = gauss(&mut r, ht * v, spread / (ht as f64).sqrt());
        }
        if d.underflow {
            // Underflowing classes through the bias, and for the teacher
            // through a feature held at 1 whose head row is very negative there.
            if distill {
                let ht = d.teacher_hidden;
                (0..n).for_each(|i| case.teacher_hidden[i * ht] = 1.0);
            }
            for _ in 0..(v / 2).max(1) {
                let c = r.below(v);
                let low = round(-150.0 - 150.0 * r.uniform());
                if let Some(bias) = case.bias.as_mut() {
                    bias[c] = low;
                }
                if distill {
                    case.teacher_lm_head[c] = round(low as f64 - 20.0 * r.uniform());
                }
            }
        }
    } else {
        case.logits = gauss(&mut r, n * v, spread);
        if distill {
            // A teacher near the student (the on-policy case) or its own.
            let near = r.uniform() < 0.5;
            case.teacher_logits = case.logits.iter().map(|&z| if near { round(z as f64 + 0.5 * r.normal()) } else { round(r.normal() * spread) }).collect();
        }
        if d.underflow {
            // Classes both distributions give e^-200 of: f32 underflows both.
            for i in 0..n {
                for _ in 0..(v / 2).max(1) {
                    let c = r.below(v);
                    let low = round(-150.0 - 150.0 * r.uniform());
                    case.logits[i * v + c] = low;
                    if distill {
                        case.teacher_logits[i * v + c] = round(low as f64 - 20.0 * r.uniform());
                    }
                }
            }
        }
    }
    if !distill && d.class_weights {
        case.class_weights = Some((0..v).map(|_| if r.uniform() < 0.1 { 0.0 } else { f32_of(2.0 * r.uniform()) as f32 }).collect());
    }
    let live = (0..n).filter(|&i| !case.ignored(i)).count();
    case.num_items = (live.max(1) as f64 * (1.0 + r.below(4) as f64)).max(1.0);
    if d.reduction == HeadReduction::None {
        // Non-uniform per-token weights: a backward that reads one scalar is wrong.
        case.upstream = Some((0..n).map(|_| f32_of(4.0 * r.uniform() - 2.0) as f32).collect());
    }
    case
}

/// The runner that draws (and shrinks) case k of a run: seeded with the
/// run's seed, the implementation's kind and k, so a case is the same
/// whatever came before it.
pub fn case_runner(seed: u64, kind: Kind, k: usize, shrink_iters: u32) -> TestRunner {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    bytes[8..16].copy_from_slice(&(kind as u64 + 1).to_le_bytes());
    bytes[16..24].copy_from_slice(&(k as u64).to_le_bytes());
    let config = ProptestConfig { cases: 1, max_shrink_iters: shrink_iters, failure_persistence: None, ..ProptestConfig::default() };
    TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes))
}

/// What a case exercised, as the coverage report counts it: its dtype,
/// reduction, divergence (distillation) or class weights (cross-entropy),
/// and the edges it meets, read from the case itself.
pub fn coverage_keys(case: &HeadCase) -> Vec<String> {
    let n = case.rows();
    let v = case.vocab;
    let mut keys = vec![
        format!("dtype={}", match case.dtype { Dtype::F32 => "f32", Dtype::Bf16 => "bf16" }),
        format!("reduction={}", case.reduction.name()),
    ];
    match case.objective {
        HeadObjective::Distillation => keys.push(format!("divergence={}", case.divergence.name())),
        HeadObjective::CrossEntropy => keys.push(format!("class_weights={}", case.class_weights.is_some())),
    }
    let ignored = (0..n).filter(|&i| case.ignored(i)).count();
    if ignored == n {
        keys.push("edge:all_ignored".into());
    } else if (0..case.batch).any(|b| (0..case.time).all(|t| case.ignored(b * case.time + t))) {
        keys.push("edge:ignored_sequence".into());
    }
    if case.softcap.is_finite() && !v.is_power_of_two() {
        keys.push("edge:softcap_odd_vocab".into());
    }
    if case.upstream.as_ref().is_some_and(|u| u.iter().any(|&g| g != u[0])) {
        keys.push("edge:nonuniform_upstream".into());
    }
    // Both distributions below f32's range at some class of a live row (x <= -104 after tau).
    let low = |z: f32| (z as f64) / case.temperature <= -104.0 && !case.softcap.is_finite();
    let underflow = match case.kind {
        Kind::Logits => (0..n).filter(|&i| !case.ignored(i)).any(|i| {
            (0..v).any(|c| low(case.logits[i * v + c]) && (case.objective == HeadObjective::CrossEntropy || low(case.teacher_logits[i * v + c])))
        }),
        Kind::Fused => case.bias.as_ref().is_some_and(|b| b.iter().any(|&z| low(z))),
    };
    if underflow {
        keys.push("edge:underflow".into());
    }
    if VOCAB_EDGES.contains(&v) {
        keys.push("vocab:tile_edge".into());
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::ValueTree;

    /// The first 40 cases of a run (the gates' budget) meet every pair the
    /// plan pins and every edge, for both objectives and kinds.
    #[test]
    fn forty_cases_cover_the_plan_and_every_edge() {
        for objective in HeadObjective::ALL {
            for kind in [Kind::Logits, Kind::Fused] {
                let bounds = HeadBounds {
                    supports: Supports::default(),
                    objective,
                    kind,
                    dtypes: vec![Dtype::F32, Dtype::Bf16],
                    max_batch: 3,
                    max_time: 6,
                    max_vocab: 1100,
                    max_hidden: 16,
                };
                let plan = plan(objective);
                let mut seen = std::collections::BTreeMap::<String, usize>::new();
                for k in 0..40 {
                    let mut runner = case_runner(1, kind, k, 0);
                    let case = strategy(&bounds, plan[k % plan.len()]).new_tree(&mut runner).unwrap().current();
                    for key in coverage_keys(&case) {
                        *seen.entry(key).or_insert(0) += 1;
                    }
                    let pair = match objective {
                        HeadObjective::Distillation => format!("{}/{}", case.reduction.name(), case.divergence.name()),
                        HeadObjective::CrossEntropy => format!("{}/{}", case.reduction.name(), case.class_weights.is_some()),
                    };
                    *seen.entry(pair).or_insert(0) += 1;
                }
                for reduction in HeadReduction::ALL {
                    let second: Vec<String> = match objective {
                        HeadObjective::Distillation => HeadDivergence::ALL.iter().map(|d| d.name().to_string()).collect(),
                        HeadObjective::CrossEntropy => vec!["true".into(), "false".into()],
                    };
                    for s in second {
                        let pair = format!("{}/{s}", reduction.name());
                        assert!(seen.contains_key(&pair), "{objective:?} {kind:?}: no case of {pair}: {seen:?}");
                    }
                }
                for edge in ["edge:all_ignored", "edge:ignored_sequence", "edge:softcap_odd_vocab", "edge:nonuniform_upstream", "edge:underflow", "vocab:tile_edge"] {
                    assert!(seen.contains_key(edge), "{objective:?} {kind:?}: no case meets {edge}: {seen:?}");
                }
            }
        }
    }

    /// A declaration the draws keep to: one divergence, no ignored rows, no
    /// bias (Liger's KL-div, tokamax), over every plan row and edge; and
    /// the rest still drawn (several reductions, the odd-V softcap edge).
    #[test]
    fn the_draws_keep_to_divergences_ignored_rows_and_bias() {
        let supports = Supports { divergences: Some(vec![HeadDivergence::ForwardKl]), ignored_rows: Some(false), bias: Some(false), ..Supports::default() };
        for kind in [Kind::Logits, Kind::Fused] {
            let bounds = HeadBounds { supports: supports.clone(), objective: HeadObjective::Distillation, kind, dtypes: vec![Dtype::F32], max_batch: 3, max_time: 6, max_vocab: 1100, max_hidden: 16 };
            let plan = plan(HeadObjective::Distillation);
            let mut reductions = std::collections::BTreeSet::new();
            for k in 0..40 {
                let mut runner = case_runner(1, kind, k, 0);
                let case = strategy(&bounds, plan[k % plan.len()]).new_tree(&mut runner).unwrap().current();
                assert_eq!(case.divergence, HeadDivergence::ForwardKl, "{kind:?} case {k}");
                assert!((0..case.rows()).all(|i| !case.ignored(i)), "{kind:?} case {k}: an ignored row");
                assert!(case.bias.is_none(), "{kind:?} case {k}: a bias");
                reductions.insert(case.reduction.name());
            }
            assert_eq!(reductions.len(), HeadReduction::ALL.len(), "{kind:?}: {reductions:?}");
        }
    }
}
