//! proptest strategies for [`CaseSpec`]. They draw counts (blocks and a
//! remainder) rather than raw sizes, put the simplest alternative first so
//! shrinking walks towards it, and cover tile edges, every clip region for
//! both advantage signs, edges hit exactly, masked rows and batches, garbage
//! at masked positions, logit scales 0.1 to 1000, all switches and
//! aggregations, non-unit cotangents.

use grpo_oracle::{Aggregation, Config, Hparams, PolicyLoss, TemperatureMode, HPARAMS, SWITCHES};
use proptest::prelude::*;
use proptest::sample::select;
use proptest::strategy::Union;

use crate::case::dimension::dimension;
use crate::case::objective::{Objective, Preset, Scope, PRESET_TABLE};
use crate::case::{
    AdvantagePattern, CaseSpec, Dtype, IsWeightsPattern, KlPattern, LogitPattern, Mesh, MaskPattern, NormalizerChoice, RatioPattern,
    TokenPattern,
};

/// The largest shapes a run may generate (`--max-*` flags).
#[derive(Clone, Debug)]
pub struct Bounds {
    /// B at most.
    pub max_batch: usize,
    /// T at most.
    pub max_time: usize,
    /// V at most.
    pub max_vocab: usize,
    /// H of the fused kind.
    pub max_hidden: usize,
    /// The dtypes drawn (f32, bf16 or both).
    pub dtypes: Vec<Dtype>,
    /// Devices to run on (`--devices`); above 1 every case carries a mesh.
    pub devices: usize,
    /// The objectives drawn (`--objective`, `--switch`): v1 by default.
    pub objective: Objective,
}

impl Bounds {
    /// Bounds on one device drawing v1's objective.
    pub fn new(max_batch: usize, max_time: usize, max_vocab: usize, max_hidden: usize, dtypes: Vec<Dtype>) -> Self {
        Bounds { max_batch, max_time, max_vocab, max_hidden, dtypes, devices: 1, objective: Objective::default() }
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
pub(super) fn mesh(devices: usize) -> BoxedStrategy<Option<Mesh>> {
    if devices <= 1 {
        return Just(None).boxed();
    }
    let (full, all) = meshes(devices);
    prop_oneof![1 => select(all).prop_map(Some), 3 => select(full).prop_map(Some)].boxed()
}

fn f32_value(choices: Vec<f32>, lo: f32, hi: f32) -> BoxedStrategy<f64> {
    prop_oneof![3 => select(choices), 1 => lo..hi].prop_map(|v| v as f64).boxed()
}

/// SPEC v2's switches (the schema's `since` 2), each drawn freely by its
/// values' weights (v1's value first, so shrinking walks back to v1).
fn v2_switches() -> impl Strategy<Value = Vec<(&'static str, &'static str)>> {
    // Each rarely drawn switch at least 2 in 5 (the weights in schema.json):
    // a bug behind one switch must show within the gate's ~15 signatures
    // (measured over seeds 1-8).
    SWITCHES
        .iter()
        .filter(|switch| switch.since >= 2)
        .map(|switch| {
            let name = switch.name;
            let values = switch.values.iter().map(|v| (v.weight, Just((name, v.name)).boxed())).collect();
            Union::new_weighted(values).boxed()
        })
        .collect::<Vec<_>>()
}

/// The switches of one signature, fitted to the run's objective; with
/// `all`, a preset (or none: free) is drawn first.
fn config(objective: &Objective) -> BoxedStrategy<(Config, Option<&'static Preset>)> {
    let objective = objective.clone();
    let preset: BoxedStrategy<Option<&'static Preset>> = match objective.scope {
        Scope::V1 => Just(None).boxed(),
        Scope::Preset(preset) => Just(Some(preset)).boxed(),
        Scope::All => prop_oneof![
            // Free draws twice as often as presets: they reach every switch.
            2 => Just(None),
            1 => select(PRESET_TABLE.iter().collect::<Vec<_>>()).prop_map(Some),
        ]
        .boxed(),
    };
    // The KL term and the entropy bonus on in 2 of 3 v2 signatures: four
    // estimators, two gradients, two clamps and the ratio factor hang on
    // the one, TRL's separate entropy mean on the other.
    // verl's seq-mean over a count (its default; v2's value of a v1 switch) in about 1 of 3.
    let over_constant = prop::bool::weighted(0.35);
    (v1_config(), v2_switches(), over_constant, preset, prop::bool::weighted(0.67), prop::bool::weighted(0.67))
        .prop_map(move |(v1, v2, over_constant, preset, kl, entropy_bonus)| {
            let mut drawn = Config { kl, entropy_bonus, ..v1 };
            if over_constant {
                drawn.aggregation = Aggregation::SeqMeanTokenMeanOverConstant;
            }
            for (name, value) in v2 {
                let known = drawn.set_switch(name, value);
                debug_assert!(known);
            }
            (objective.constrain_with(drawn, preset), preset)
        })
        .boxed()
}

fn v1_config() -> impl Strategy<Value = Config> {
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
            ..Config::default()
        })
}

/// The hyperparameters with a `draw` list in the schema (SPEC v2's): the
/// neutral value first, then values that put the new kinks where the
/// generated log-ratios and logits fall.
fn drawn_hparams() -> impl Strategy<Value = Vec<(&'static str, f64)>> {
    HPARAMS
        .iter()
        .filter(|info| !info.draw.is_empty())
        .map(|info| {
            let name = info.name;
            select(info.draw.to_vec()).prop_map(move |x| (name, x as f32 as f64)).boxed()
        })
        .collect::<Vec<_>>()
}

fn hparams() -> impl Strategy<Value = Hparams> {
    (v1_hparams(), drawn_hparams()).prop_map(|(mut h, drawn)| {
        for (name, x) in drawn {
            *h.field_mut(name).expect("a schema name") = x;
        }
        h
    })
}

fn v1_hparams() -> impl Strategy<Value = Hparams> {
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
            ..Hparams::default()
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

/// What a compiled step depends on: shape, dtype, switches and mesh. Cases
/// that share it share one compiled value-and-VJP step in the worker.
#[derive(Clone, Debug)]
pub(super) struct Signature {
    pub(super) batch: usize,
    pub(super) time: usize,
    pub(super) vocab: usize,
    pub(super) hidden: usize,
    pub(super) dtype: Dtype,
    pub(super) config: Config,
    pub(super) mesh: Option<Mesh>,
    pub(super) preset: Option<&'static Preset>,
    /// is_weights of shape [B, 1] rather than [B, T].
    pub(super) is_weights_per_row: bool,
    /// Drawn from the real banks (`case::real`): H is the model's, V holds
    /// the positions' tokens and largest logits.
    pub(super) real: bool,
}

impl Signature {
    /// This signature as a real-model one: H the model's, V at least what
    /// B*T positions need and at most what every bank holds.
    pub(super) fn into_real(mut self) -> Signature {
        let banks = crate::case::real::installed().expect("real-model groups are drawn only where the real banks are loaded");
        self.real = true;
        self.hidden = banks.hidden_dim();
        self.vocab = self.vocab.max(crate::case::real::needed_vocab(self.batch, self.time)).min(banks.max_vocab());
        self
    }
}

/// Everything else of a case: values, hyperparameters (traced, so they never
/// recompile), patterns, cotangent and the seed of the inputs.
#[derive(Clone, Debug)]
pub(super) struct Draw {
    pub(super) hparams: Hparams,
    pub(super) normalizer: NormalizerChoice,
    pub(super) logits: LogitPattern,
    pub(super) tokens: TokenPattern,
    pub(super) mask: MaskPattern,
    pub(super) ratios: RatioPattern,
    pub(super) advantages: AdvantagePattern,
    pub(super) masked_garbage: bool,
    pub(super) cotangent: f64,
    pub(super) seed: u64,
    pub(super) is_weights: IsWeightsPattern,
    pub(super) kl_pattern: KlPattern,
}

/// The case of a signature and a draw: a v1 case keeps v1's neutral v2
/// hyperparameters and patterns; a preset's fixed values override the draw.
pub(super) fn case_of(sig: &Signature, draw: &Draw, objective: &Objective) -> CaseSpec {
    let v2 = sig.config.v2_switch().is_some() || sig.preset.is_some();
    let (hparams, normalizer) = match sig.preset {
        Some(p) => (objective.constrain_hparams(draw.hparams, Some(p)), p.normalizer.unwrap_or(draw.normalizer)),
        None if v2 => (draw.hparams, draw.normalizer),
        None => {
            let mut h = draw.hparams;
            for info in HPARAMS.iter().filter(|info| info.since >= 2) {
                *h.field_mut(info.name).expect("a schema name") = info.default;
            }
            // v1 never divides by the count of non-empty rows.
            (h, if draw.normalizer == NormalizerChoice::NonEmptyRows { NormalizerChoice::ValidCount } else { draw.normalizer })
        }
    };
    let mut hparams = if sig.preset.is_some() { hparams } else { objective.constrain_hparams(hparams, None) };
    if sig.config.policy_loss != PolicyLoss::Cispo && hparams.eps_low.is_infinite() {
        hparams.eps_low = draw.hparams.eps_low;
    }
    CaseSpec {
        batch: sig.batch,
        time: sig.time,
        vocab: sig.vocab,
        hidden: sig.hidden,
        dtype: sig.dtype,
        config: sig.config,
        hparams,
        normalizer,
        logits: draw.logits,
        tokens: draw.tokens,
        mask: draw.mask,
        ratios: draw.ratios,
        advantages: draw.advantages,
        masked_garbage: draw.masked_garbage,
        cotangent: draw.cotangent,
        seed: draw.seed,
        mesh: sig.mesh,
        preset: sig.preset.map(|p| p.name.to_string()),
        is_weights: sig.config.rollout_correction.then_some(draw.is_weights),
        is_weights_per_row: sig.config.rollout_correction && sig.is_weights_per_row,
        kl_pattern: if v2 && sig.config.kl { draw.kl_pattern } else { KlPattern::Near },
        real: sig.real,
    }
}

pub(super) fn signature(bounds: &Bounds) -> BoxedStrategy<Signature> {
    let shape = (
        dimension(bounds.max_batch),
        dimension(bounds.max_time),
        dimension(bounds.max_vocab),
        dimension(bounds.max_hidden),
        select(bounds.dtypes.clone()),
    );
    if !bounds.objective.is_v2() {
        // v1 runs' random groups draw what they drew before v2 existed
        // (the planned ones come first: `case_group`); only the pins can
        // change a switch.
        let objective = bounds.objective.clone();
        return (shape, v1_config(), mesh(bounds.devices))
            .prop_map(move |((batch, time, vocab, hidden, dtype), config, mesh)| Signature {
                batch,
                time,
                vocab,
                hidden,
                dtype,
                config: objective.constrain(config),
                mesh,
                preset: None,
                is_weights_per_row: false,
                real: false,
            })
            .boxed();
    }
    (shape, config(&bounds.objective), mesh(bounds.devices), any::<bool>())
        .prop_map(|((batch, time, vocab, hidden, dtype), (config, preset), mesh, is_weights_per_row)| Signature {
            batch,
            time,
            vocab,
            hidden,
            dtype,
            config,
            mesh,
            preset,
            is_weights_per_row,
            real: false,
        })
        .boxed()
}

pub(super) fn draw(objective: &Objective) -> BoxedStrategy<Draw> {
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
    if !objective.is_v2() {
        // As before v2 (see `signature`).
        return (v1_hparams(), patterns, prop::bool::weighted(0.6), cotangent, any::<u64>().no_shrink())
            .prop_map(|(hparams, patterns, masked_garbage, cotangent, seed)| {
                let (logits, tokens, mask, ratios, advantages, normalizer) = patterns;
                let (is_weights, kl_pattern) = (IsWeightsPattern::Ones, KlPattern::Near);
                Draw { hparams, normalizer, logits, tokens, mask, ratios, advantages, masked_garbage, cotangent, seed, is_weights, kl_pattern }
            })
            .boxed();
    }
    let normalizer = prop_oneof![
        Just(NormalizerChoice::BatchTimesTime),
        Just(NormalizerChoice::ValidCount),
        Just(NormalizerChoice::GlobalCount),
        Just(NormalizerChoice::Constant),
        Just(NormalizerChoice::NonEmptyRows)
    ];
    let patterns = (patterns, normalizer).prop_map(|((l, t, m, r, a, _), n)| (l, t, m, r, a, n));
    // The seed does not shrink: no seed is simpler than another, and
    // bisecting a u64 would spend 64 shrink steps on nothing.
    let v2_patterns = (
        prop_oneof![
            Just(IsWeightsPattern::Ones),
            Just(IsWeightsPattern::Truncated),
            Just(IsWeightsPattern::Masked),
            Just(IsWeightsPattern::Large)
        ],
        prop_oneof![1 => Just(KlPattern::Near), 3 => Just(KlPattern::Mixed)],
    );
    (hparams(), patterns, prop::bool::weighted(0.6), cotangent, any::<u64>().no_shrink(), v2_patterns)
        .prop_map(|(hparams, patterns, masked_garbage, cotangent, seed, (is_weights, kl_pattern))| {
            let (logits, tokens, mask, ratios, advantages, normalizer) = patterns;
            Draw { hparams, normalizer, logits, tokens, mask, ratios, advantages, masked_garbage, cotangent, seed, is_weights, kl_pattern }
        })
        .boxed()
}

/// All the strategies together: one generated case.
pub fn case_spec(bounds: &Bounds) -> impl Strategy<Value = CaseSpec> {
    let objective = bounds.objective.clone();
    (signature(bounds), draw(&bounds.objective)).prop_map(move |(sig, draw)| case_of(&sig, &draw, &objective))
}

pub use crate::case::group::{case_group, CaseGroup, CaseGroupTree, Planned};
