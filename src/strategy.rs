//! proptest strategies for [`CaseSpec`]. They draw counts (blocks and a
//! remainder) rather than raw sizes, put the simplest alternative first so
//! shrinking walks towards it, and cover what LESSONS.md lists: tile edges,
//! every clip region for both advantage signs, edges hit exactly, masked rows
//! and batches, garbage at masked positions, logit scales 0.1 to 1000, all
//! switches and aggregations, non-unit cotangents.

use grpo_oracle::{Aggregation, Config, Hparams, TemperatureMode};
use proptest::prelude::*;
use proptest::sample::select;

use crate::case::{
    AdvantagePattern, CaseSpec, Dtype, LogitPattern, Mesh, MaskPattern, NormalizerChoice, RatioPattern, TokenPattern,
};

/// The largest shapes a run may generate (`--max-*` flags).
#[derive(Clone, Debug)]
pub struct Bounds {
    pub max_batch: usize,
    pub max_time: usize,
    pub max_vocab: usize,
    /// H of the fused kind.
    pub max_hidden: usize,
    pub dtypes: Vec<Dtype>,
    /// Devices to run on (`--devices`); above 1 every case carries a mesh.
    pub devices: usize,
}

impl Bounds {
    pub fn new(max_batch: usize, max_time: usize, max_vocab: usize, max_hidden: usize, dtypes: Vec<Dtype>) -> Self {
        Bounds { max_batch, max_time, max_vocab, max_hidden, dtypes, devices: 1 }
    }
}

/// The meshes of `devices` devices, (data, model) with data * model =
/// devices (1x8, 2x4, 4x2, 8x1 for 8), and the smaller meshes a failure can
/// shrink to (data * model dividing `devices`), simplest first.
pub fn meshes(devices: usize) -> (Vec<Mesh>, Vec<Mesh>) {
    let divisors: Vec<usize> = (1..=devices).filter(|d| devices % d == 0).collect();
    let mut all: Vec<Mesh> = divisors
        .iter()
        .flat_map(|&data| divisors.iter().map(move |&model| Mesh { data, model }))
        .filter(|m| devices % m.devices() == 0)
        .collect();
    all.sort_by_key(|m| (m.devices(), m.model));
    let full = all.iter().copied().filter(|m| m.devices() == devices).collect();
    (full, all)
}

/// On one device no mesh; otherwise mostly a mesh of all the devices (3 in
/// 4), else any smaller one. Shrinking walks to the smaller meshes first
/// (the lower-index alternative), then towards 1x1.
fn mesh(devices: usize) -> BoxedStrategy<Option<Mesh>> {
    if devices <= 1 {
        return Just(None).boxed();
    }
    let (full, all) = meshes(devices);
    prop_oneof![1 => select(all).prop_map(Some), 3 => select(full).prop_map(Some)].boxed()
}

const PRIMES: [usize; 16] = [2, 3, 5, 7, 11, 13, 17, 31, 61, 127, 131, 257, 509, 1021, 2039, 4093];
/// Block sizes kernels use along the vocabulary or time axis.
const BLOCKS: [usize; 6] = [8, 128, 256, 512, 1024, 2048];

/// A dimension in 1..=max, biased to 1, small primes, powers of two and
/// multiples of common block sizes, each +-1.
pub fn dimension(max: usize) -> BoxedStrategy<usize> {
    let max = max.max(1);
    let clamp = move |v: usize| v.clamp(1, max);
    let primes: Vec<usize> = PRIMES.iter().copied().filter(|&p| p <= max).collect();
    let blocks: Vec<usize> = BLOCKS.iter().copied().filter(|&b| b <= max).collect();
    let max_log2 = usize::BITS - 1 - max.leading_zeros();
    let mut options: Vec<(u32, BoxedStrategy<usize>)> = vec![
        (3, (1..=max.min(4)).boxed()),
        (2, (0..=max_log2, -1i64..=1).prop_map(move |(k, d)| clamp(((1i64 << k) + d).max(1) as usize)).boxed()),
        (2, (1..=max).boxed()),
    ];
    if !primes.is_empty() {
        options.push((2, select(primes).boxed()));
    }
    if !blocks.is_empty() {
        let tile = select(blocks)
            .prop_flat_map(move |block| (Just(block), 1..=max / block, -1i64..=1))
            .prop_map(move |(block, n, d)| clamp((n as i64 * block as i64 + d).max(1) as usize));
        options.push((3, tile.boxed()));
    }
    proptest::strategy::Union::new_weighted(options).boxed()
}

fn f32_value(choices: Vec<f32>, lo: f32, hi: f32) -> BoxedStrategy<f64> {
    prop_oneof![3 => select(choices), 1 => lo..hi].prop_map(|v| v as f64).boxed()
}

fn config() -> impl Strategy<Value = Config> {
    (
        prop_oneof![Just(TemperatureMode::Logits), Just(TemperatureMode::Logp)],
        prop_oneof![
            Just(Aggregation::TokenMean),
            Just(Aggregation::SeqMeanTokenMean),
            Just(Aggregation::SumOverConstant)
        ],
        prop::bool::weighted(0.25),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(temperature_mode, aggregation, on_policy, kl, entropy_bonus, two_sided)| Config {
            temperature_mode,
            aggregation,
            on_policy,
            kl,
            entropy_bonus,
            two_sided,
        })
}

fn hparams() -> impl Strategy<Value = Hparams> {
    (
        f32_value(vec![0.2, 0.0, 0.1, 0.28], 0.0, 0.5),
        f32_value(vec![0.2, 0.28, 0.0, 0.3], 0.0, 0.5),
        f32_value(vec![1.0, 0.7, 0.1, 2.0], 0.1, 2.0),
        f32_value(vec![0.04, 0.1, 1.0], 0.001, 2.0),
        f32_value(vec![0.01, 0.1, 1.0], 0.001, 2.0),
        f32_value(vec![1.5, 2.0, 3.0, 10.0], 1.05, 10.0),
    )
        .prop_map(|(eps_low, eps_high, temperature, beta, entropy_coef, delta_factor)| Hparams {
            eps_low,
            eps_high,
            temperature,
            beta,
            entropy_coef,
            // delta > 1 + eps_high, also after rounding to f32.
            delta: ((1.0 + eps_high) * delta_factor) as f32 as f64,
            normalizer: 1.0,
        })
}

fn logit_pattern() -> impl Strategy<Value = LogitPattern> {
    // Moderate scales most often: at 100 and above the softmax is nearly
    // one-hot, where logp, the entropy and its gradient, and the two
    // temperature modes hardly differ, so many bugs cannot show there.
    let scale = prop_oneof![
        3 => Just(1.0),
        2 => Just(3.0),
        1 => Just(0.1),
        1 => Just(10.0),
        1 => Just(100.0),
        1 => Just(1000.0)
    ];
    prop_oneof![
        scale.clone().prop_map(|scale| LogitPattern::Normal { scale }),
        scale.clone().prop_map(|scale| LogitPattern::Zipf { scale }),
        scale.clone().prop_map(|scale| LogitPattern::NearOneHot { scale }),
        select(vec![0.0, 3.0, -50.0]).prop_map(|value| LogitPattern::Flat { value }),
        (scale.clone(), select(vec![1000.0, 30000.0]))
            .prop_map(|(scale, offset)| LogitPattern::AllNegative { scale, offset }),
        scale.prop_map(|scale| LogitPattern::TailMax { scale }),
    ]
}

fn token_pattern() -> impl Strategy<Value = TokenPattern> {
    prop_oneof![
        3 => Just(TokenPattern::Mixed),
        1 => Just(TokenPattern::Random),
        1 => Just(TokenPattern::Argmax),
        1 => Just(TokenPattern::Argmin),
        1 => Just(TokenPattern::Zero),
        1 => Just(TokenPattern::Last),
        1 => Just(TokenPattern::TileEdge),
    ]
}

fn mask_pattern() -> impl Strategy<Value = MaskPattern> {
    prop_oneof![
        2 => Just(MaskPattern::Full),
        3 => Just(MaskPattern::RightPadded),
        2 => Just(MaskPattern::PromptAndPadding),
        2 => Just(MaskPattern::FullyMaskedRow),
        1 => Just(MaskPattern::FullyMaskedBatch),
        2 => Just(MaskPattern::Random),
    ]
}

/// All the strategies together: one generated case.
pub fn case_spec(bounds: &Bounds) -> impl Strategy<Value = CaseSpec> {
    let shape = (
        dimension(bounds.max_batch),
        dimension(bounds.max_time),
        dimension(bounds.max_vocab),
        dimension(bounds.max_hidden),
        select(bounds.dtypes.clone()),
    );
    let patterns = (
        logit_pattern(),
        token_pattern(),
        mask_pattern(),
        prop_oneof![3 => Just(RatioPattern::Mixed), 1 => Just(RatioPattern::OnEdges), 1 => Just(RatioPattern::Wide), 1 => Just(RatioPattern::NearOne)],
        prop_oneof![3 => Just(AdvantagePattern::Mixed), 1 => Just(AdvantagePattern::Positive), 1 => Just(AdvantagePattern::Negative), 1 => Just(AdvantagePattern::Zero)],
        prop_oneof![
            Just(NormalizerChoice::BatchTimesTime),
            Just(NormalizerChoice::ValidCount),
            Just(NormalizerChoice::GlobalCount),
            Just(NormalizerChoice::Constant)
        ],
    );
    let cotangent = prop_oneof![3 => Just(1.0), 1 => select(vec![-1.0, 2.5, 0.375, -0.125, 1e-3])];
    (shape, config(), hparams(), patterns, prop::bool::weighted(0.6), cotangent, any::<u64>(), mesh(bounds.devices)).prop_map(
        |((batch, time, vocab, hidden, dtype), config, hparams, patterns, masked_garbage, cotangent, seed, mesh)| {
            let (logits, tokens, mask, ratios, advantages, normalizer) = patterns;
            CaseSpec {
                batch,
                time,
                vocab,
                hidden,
                dtype,
                config,
                hparams,
                normalizer,
                logits,
                tokens,
                mask,
                ratios,
                advantages,
                masked_garbage,
                cotangent,
                seed,
                mesh,
            }
        },
    )
}
