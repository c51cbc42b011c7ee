//! Case groups: `draws` cases sharing one signature (what the worker
//! compiles once), a planned group's signature from its covering-array row
//! and its draws' edge foci, and the value tree that shrinks a group: cases
//! dropped first, then the shared signature, then each case's values.

use grpo_oracle::Config;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use std::cell::RefCell;
use std::sync::Arc;

use crate::case::dimension::dimension;
use crate::case::objective::{Objective, Preset};
use crate::case::plan::{Row, Space};
use crate::case::strategy::{case_of, draw, mesh, signature, Bounds, Draw, Signature};
use crate::case::{AdvantagePattern, CaseSpec, IsWeightsPattern, KlPattern, LogitPattern, MaskPattern, RatioPattern};

/// `draws` cases sharing one signature (shape, dtype, switches, mesh): the
/// worker compiles one step for all of them. Shrinking first drops cases
/// (down to one), then shrinks the shared signature, then each case's values,
/// so a failure still shrinks to one case of a minimal shape. A planned
/// group (`plan`) starts from its row's switches and gives its draws their
/// edge foci; shrinking walks its switches back to v1's one at a time. A
/// real group (`real`: the banks of `case::real` are installed) draws its
/// cases from a real model's numbers, and stays real while it shrinks.
pub fn case_group(bounds: &Bounds, draws: usize, planned: Option<Planned>, real: bool) -> CaseGroup {
    let draws = draws.max(1);
    let focused = |j: usize| -> BoxedStrategy<Draw> {
        match &planned {
            Some(p) => {
                let (focus, v2) = (Focus::of(p.group + j), bounds.objective.is_v2());
                draw(&bounds.objective).prop_map(move |d| focus.apply(d, v2)).boxed()
            }
            None => draw(&bounds.objective),
        }
    };
    let signature = if real { signature(bounds).prop_map(Signature::into_real).boxed() } else { signature(bounds) };
    CaseGroup {
        signature,
        draws: (0..draws).map(focused).collect(),
        objective: bounds.objective.clone(),
        bounds: bounds.clone(),
        planned: planned.map(|p| RefCell::new((p, 0, 0))),
        refusals: RefCell::new(Vec::new()),
    }
}

/// A planned group: the row its signature starts from, its index in the
/// run, and the run's factor space (to relax a refused row).
#[derive(Clone, Debug)]
pub struct Planned {
    /// The covering array's row its signature starts from.
    pub row: Row,
    /// Its group's number in the run.
    pub group: usize,
    /// The run's factors (to relax the row when a draw of it is refused).
    pub space: Arc<Space>,
}

/// Draws of a planned group's signature before it falls back to a random
/// one (each after a refusal relaxes the row further).
const PLANNED_ATTEMPTS: usize = 8;

/// One signature group's strategy for proptest: a signature (shape, dtype, switches, mesh), then its draws.
#[derive(Debug)]
pub struct CaseGroup {
    signature: BoxedStrategy<Signature>,
    draws: Vec<BoxedStrategy<Draw>>,
    objective: Objective,
    bounds: Bounds,
    /// The planned row as relaxed so far, the draws of it made, and the refusals applied.
    planned: Option<RefCell<(Planned, usize, usize)>>,
    refusals: RefCell<Vec<(Option<String>, String)>>,
}

impl CaseGroup {
    /// The implementation refused the signature last drawn (the switch it
    /// named as data, if any, and its message): a planned row is relaxed by
    /// it before the next draw.
    pub fn refused(&self, switch: Option<&str>, reason: &str) {
        self.refusals.borrow_mut().push((switch.map(String::from), reason.to_string()));
    }
}

impl Strategy for CaseGroup {
    type Tree = CaseGroupTree;
    type Value = Vec<CaseSpec>;

    fn new_tree(&self, runner: &mut proptest::test_runner::TestRunner) -> proptest::strategy::NewTree<Self> {
        let planned_signature = self.planned.as_ref().and_then(|cell| {
            let (planned, attempts, applied) = &mut *cell.borrow_mut();
            let refusals = self.refusals.borrow();
            for (switch, reason) in &refusals[*applied..] {
                let rng = &mut *runner.rng();
                planned.row = planned.space.relax(&planned.row, switch.as_deref(), reason, &mut || rng.next_u32() % 2 == 0);
            }
            *applied = refusals.len();
            *attempts += 1;
            (*attempts <= PLANNED_ATTEMPTS).then(|| planned_signature(&self.bounds, &planned.row))
        });
        let signature = match planned_signature {
            Some(s) => s.new_tree(runner)?,
            None => self.signature.new_tree(runner)?,
        };
        let draws = self.draws.iter().map(|d| d.new_tree(runner)).collect::<Result<Vec<_>, _>>()?;
        let included = vec![true; draws.len()];
        Ok(CaseGroupTree { signature, draws, included, next: Step::Drop(0), last: None, objective: self.objective.clone() })
    }
}

/// The signature of a planned row: its switches (shrinking towards v1's),
/// dtype and weights' shape; shape and mesh drawn as any signature's.
fn planned_signature(bounds: &Bounds, row: &Row) -> BoxedStrategy<Signature> {
    let preset = bounds.objective.preset();
    let dtype = if bounds.dtypes.contains(&row.dtype) { row.dtype } else { bounds.dtypes[0] };
    let config = PlannedConfig { config: row.config, objective: bounds.objective.clone(), preset };
    let is_weights_per_row = row.is_weights_per_row;
    (
        dimension(bounds.max_batch),
        dimension(bounds.max_time),
        dimension(bounds.max_vocab),
        dimension(bounds.max_hidden),
        config,
        mesh(bounds.devices),
    )
        .prop_map(move |(batch, time, vocab, hidden, config, mesh)| Signature {
            batch,
            time,
            vocab,
            hidden,
            dtype,
            config,
            mesh,
            preset,
            is_weights_per_row: is_weights_per_row && config.rollout_correction,
            real: false,
        })
        .boxed()
}

/// A planned configuration that shrinks by putting its switches back at
/// v1's values, one at a time.
#[derive(Clone, Debug)]
struct PlannedConfig {
    config: Config,
    objective: Objective,
    preset: Option<&'static Preset>,
}

impl Strategy for PlannedConfig {
    type Tree = PlannedConfigTree;
    type Value = Config;

    fn new_tree(&self, _: &mut proptest::test_runner::TestRunner) -> proptest::strategy::NewTree<Self> {
        let planned = serde_json::to_value(self.config).expect("a config serialises");
        let defaults = serde_json::to_value(Config::default()).expect("a config serialises");
        let keys: Vec<String> = planned
            .as_object()
            .expect("a config is an object")
            .iter()
            .filter(|(k, v)| defaults[k.as_str()] != **v)
            .map(|(k, _)| k.clone())
            .collect();
        let reset = vec![false; keys.len()];
        Ok(PlannedConfigTree { planned, defaults, keys, reset, next: 0, last: None, objective: self.objective.clone(), preset: self.preset })
    }
}

#[derive(Clone, Debug)]
struct PlannedConfigTree {
    planned: serde_json::Value,
    defaults: serde_json::Value,
    /// The switches off v1's value, and which of them are back at it.
    keys: Vec<String>,
    reset: Vec<bool>,
    next: usize,
    last: Option<usize>,
    objective: Objective,
    preset: Option<&'static Preset>,
}

impl ValueTree for PlannedConfigTree {
    type Value = Config;

    fn current(&self) -> Config {
        let mut v = self.planned.clone();
        for (key, _) in self.keys.iter().zip(&self.reset).filter(|(_, &r)| r) {
            v[key.as_str()] = self.defaults[key.as_str()].clone();
        }
        let config = serde_json::from_value(v).expect("switch values");
        self.objective.constrain_with(config, self.preset)
    }

    fn simplify(&mut self) -> bool {
        while self.next < self.keys.len() {
            let i = self.next;
            self.next += 1;
            if !self.reset[i] {
                self.reset[i] = true;
                self.last = Some(i);
                return true;
            }
        }
        false
    }

    fn complicate(&mut self) -> bool {
        match self.last.take() {
            Some(i) => {
                self.reset[i] = false;
                true
            }
            None => false,
        }
    }
}

/// What a draw of a planned group is steered to (edges reached on purpose,
/// not by chance): draw j of planned group g gets focus g + j.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Focus {
    /// Ratios on the clip band's edges and delta, both advantage signs.
    Clip,
    /// Finite log-ratio and k3 clamps, with ratios and KL log-ratios on
    /// them, past them and past f32 exp's overflow.
    Clamps,
    /// Logits far below or above zero, an empty row or batch, weights of
    /// 0 and large.
    Extremes,
    /// Logits of scale 0.02 with a live gradient (ratios inside the band,
    /// advantages not all 0): a near-uniform softmax, where the declared
    /// bf16 conventions' allowances are tightest and an undeclared rounding
    /// (d hidden carried in bf16 across vocabulary tiles) stands out; the
    /// 0.1 of random draws (1 in 9) left it to survive seed 3 of the gate.
    Small,
}

impl Focus {
    fn of(k: usize) -> Focus {
        [Focus::Clip, Focus::Clamps, Focus::Extremes, Focus::Small][k % 4]
    }

    /// The draw steered (its seed picks among the edge values).
    fn apply(self, mut d: Draw, v2: bool) -> Draw {
        let seed = d.seed;
        let pick = |k: u64, n: usize| ((seed >> (8 * k)) % n as u64) as usize;
        match self {
            Focus::Clip => {
                d.ratios = RatioPattern::OnEdges;
                d.advantages = AdvantagePattern::Mixed;
            }
            Focus::Clamps if v2 => {
                let r = |x: f64| x as f32 as f64;
                d.hparams.log_ratio_min = r([-20.0, -1.0, -0.3][pick(1, 3)]);
                d.hparams.log_ratio_max = r([20.0, 10.0, 1.0, 0.3][pick(2, 4)]);
                // Half the time an infinite clamp: then the finite kl_max after
                // k3's exp is the only guard of d past f32 exp's overflow (1 in
                // 4 left an exp of the uncapped d surviving 60 cases at seeds
                // 2, 3 and 4 of the gate).
                d.hparams.kl_log_ratio_clamp = if pick(6, 2) == 0 { f64::INFINITY } else { r([20.0, 1.0, 0.5][pick(3, 3)]) };
                d.hparams.kl_max = r([10.0, 1.0][pick(4, 2)]);
                d.ratios = RatioPattern::PastClamps;
                d.kl_pattern = KlPattern::Overflow;
                // Tokens to reach them with.
                if d.mask == MaskPattern::FullyMaskedBatch {
                    d.mask = MaskPattern::Full;
                }
            }
            // v1 has no clamps: its ratios over every region instead.
            Focus::Clamps => d.ratios = RatioPattern::Mixed,
            Focus::Extremes => {
                let (scale, offset) = ([1.0, 3.0][pick(1, 2)], [1000.0, 30000.0][pick(2, 2)]);
                d.logits = if pick(3, 2) == 0 { LogitPattern::AllNegative { scale, offset } } else { LogitPattern::Shifted { scale, offset } };
                d.mask = if pick(4, 4) == 0 { MaskPattern::FullyMaskedBatch } else { MaskPattern::FullyMaskedRow };
                d.is_weights = [IsWeightsPattern::Masked, IsWeightsPattern::Large][pick(5, 2)];
                if v2 {
                    // d past f32 exp's overflow with only a finite kl_max to
                    // guard k3's exp: the Clamps draw alone left an exp of the
                    // uncapped d surviving 60 cases at half the gate's seeds.
                    d.hparams.kl_log_ratio_clamp = f64::INFINITY;
                    d.hparams.kl_max = [10.0, 1.0][pick(6, 2)];
                    d.kl_pattern = KlPattern::Overflow;
                }
            }
            Focus::Small => {
                d.logits = match d.logits {
                    LogitPattern::Zipf { .. } => LogitPattern::Zipf { scale: 0.02 },
                    LogitPattern::TailMax { .. } => LogitPattern::TailMax { scale: 0.02 },
                    _ => LogitPattern::Normal { scale: 0.02 },
                };
                // With a live gradient: ratios inside the band, advantages not all 0.
                d.ratios = RatioPattern::NearOne;
                if d.advantages == AdvantagePattern::Zero {
                    d.advantages = AdvantagePattern::Mixed;
                }
            }
        }
        d
    }
}

/// Where shrinking is: dropping case i, the signature, or case i's values.
#[derive(Clone, Copy, Debug)]
enum Step {
    Drop(usize),
    Signature,
    Values(usize),
}

/// The value tree of a `CaseGroup`: shrinks by dropping draws, then the signature, then each draw's values.
pub struct CaseGroupTree {
    signature: Box<dyn ValueTree<Value = Signature>>,
    draws: Vec<Box<dyn ValueTree<Value = Draw>>>,
    included: Vec<bool>,
    /// The next kind of simplification to try.
    next: Step,
    /// The last simplification made (what `complicate` undoes).
    last: Option<Step>,
    objective: Objective,
}

impl std::fmt::Debug for CaseGroupTree {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaseGroupTree").field("current", &self.current()).finish()
    }
}

impl ValueTree for CaseGroupTree {
    type Value = Vec<CaseSpec>;

    fn current(&self) -> Vec<CaseSpec> {
        let sig = self.signature.current();
        self.draws.iter().zip(&self.included).filter(|(_, &keep)| keep).map(|(d, _)| case_of(&sig, &d.current(), &self.objective)).collect()
    }

    fn simplify(&mut self) -> bool {
        loop {
            match self.next {
                Step::Drop(i) => {
                    let kept = self.included.iter().filter(|&&k| k).count();
                    match (i..self.draws.len()).find(|&j| self.included[j]) {
                        Some(j) if kept > 1 => {
                            self.included[j] = false;
                            self.next = Step::Drop(j + 1);
                            self.last = Some(Step::Drop(j));
                            return true;
                        }
                        _ => self.next = Step::Signature,
                    }
                }
                Step::Signature => {
                    if self.signature.simplify() {
                        self.last = Some(Step::Signature);
                        return true;
                    }
                    self.next = Step::Values(0);
                }
                Step::Values(i) if i >= self.draws.len() => return false,
                Step::Values(i) => {
                    if self.included[i] && self.draws[i].simplify() {
                        self.last = Some(Step::Values(i));
                        return true;
                    }
                    self.next = Step::Values(i + 1);
                }
            }
        }
    }

    fn complicate(&mut self) -> bool {
        match self.last {
            None => false,
            Some(Step::Drop(j)) => {
                // The case was needed: keep it (the next drop tries the one after).
                self.included[j] = true;
                self.last = None;
                true
            }
            Some(Step::Signature) => {
                let more = self.signature.complicate();
                if !more {
                    self.last = None;
                }
                more
            }
            Some(Step::Values(i)) => {
                let more = self.draws[i].complicate();
                if !more {
                    self.last = None;
                }
                more
            }
        }
    }
}
