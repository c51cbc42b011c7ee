//! `grpo-verify necessity`: is every declared convention needed? For each
//! declaration of an implementation (and each stage of a multi-stage one),
//! the same implementation is checked declaring everything but that
//! (`python/grpo_verify_worker/perturb.py`). A declaration
//! whose removal no case fails is broader than the code, or than what the
//! draws reach: either way a verdict under it is weaker than it reads.
//!
//! A `bf16_accumulation` declaration matters where a sum spans many chunks,
//! which the generated shapes rarely reach: its removal is also tried on one
//! directed case ([`aligned_case`]) that spans 32 of its chunks with every
//! term of the accumulated gradient of one sign.

use std::path::PathBuf;

use anyhow::{bail, Result};
use grpo_oracle::{AccumulatedGradient, Config, Convention, Declared};
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config as ProptestConfig, RngAlgorithm, TestRng, TestRunner};
use serde::Serialize;

use crate::case::materialise::{Case, Inputs};
use crate::case::prng::Prng;
use crate::case::strategy::{case_spec, Bounds};
use crate::case::vocabulary::{AdvantagePattern, Dtype, Kind, LogitPattern, MaskPattern, TokenPattern};
use crate::evaluate::Outcome;
use crate::check::{run_check, CheckOptions};
use crate::evaluate::Evaluator;

/// What one `necessity` run checks (docs/conventions.md, "Every declaration needed").
pub struct NecessityOptions {
    /// The implementation whose declared conventions are each removed in turn.
    pub implementation: String,
    /// Generated cases per removal.
    pub cases: u32,
    /// The run's seed (the same cases for every removal).
    pub seed: u64,
    /// Shapes, dtypes and objective drawn.
    pub bounds: Bounds,
    /// Where report.json and report.md go.
    pub report_dir: PathBuf,
}

/// One declaration removed: whether some case then fails.
#[derive(Serialize)]
pub struct Removal {
    /// What was taken away: a whole declaration, or one stage of it.
    pub removed: String,
    /// The declaration checked instead.
    pub declared: Vec<String>,
    /// Some case failed without the declaration: it is needed (otherwise BROADER).
    pub needed: bool,
    /// Cases checked without it.
    pub cases: usize,
    /// The first failure without it, and its minimal case.
    pub failure: Option<String>,
    /// The first case that failed without it, shrunk (None when none failed).
    pub minimal_case: Option<String>,
    /// For a `bf16_accumulation` removal no generated case needed: the
    /// directed case it was tried on ([`aligned_case`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub directed_case: Option<String>,
}

/// How many of a declaration's chunks the directed case spans. Measured on
/// verl's fused path (`bf16_accumulation:d_lm_head:tokens=512`, a 64 x 16
/// gradient, `necessity --objective verl:vanilla --switch
/// entropy_bonus=false --seed S`): with 32 chunks the case fails without
/// the declaration at seeds 0 to 5, with 16 at 4 of the 6 (the other
/// stages' allowances held the bf16 running sum at the other two). Two rows
/// of a production T = 8192 span 32 of its 512-token chunks.
const DIRECTED_CHUNKS: usize = 32;

/// A case that spans [`DIRECTED_CHUNKS`] chunks of `chunk` along what
/// `gradient` is summed over, every term of that sum of one sign: one target
/// id everywhere, on policy (ratio 1, off the clip edges) with positive
/// advantages, no KL or entropy term, no padding, tau = 1, and the factor
/// the sum runs over positive: hidden entries in [0.5, 1.5) for d lm_head
/// (whose d logits keep one sign per column), LM head entries |N(0, 0.05^2)|
/// for d hidden (whose non-target d logits share one sign). The other
/// factor keeps mixed signs, N(0, 0.05^2) (the LM head) or N(0, 1)
/// (hidden): with both positive, every token's softmax is nearly the same
/// and on verl's fused path the case stayed within the other stages'
/// allowances. Each bf16 partial sum then only grows, the worst order for a
/// running bf16 sum. The other switches and the aggregation are `base`'s (a
/// draw of the run's objective), so the case is one the implementation was
/// checked on, save the shape. None for a chunk so large the case would not
/// fit (over 2^24 LM head entries).
pub fn aligned_case(gradient: AccumulatedGradient, chunk: usize, base: &crate::case::spec::CaseSpec) -> Option<Case> {
    let many = DIRECTED_CHUNKS.checked_mul(chunk)?;
    let (batch, time, vocab, hidden_dim) = match gradient {
        AccumulatedGradient::LmHeadOverTokens => (2, many.div_ceil(2), 16, 64),
        AccumulatedGradient::LmHeadOverSequences => (many, 16, 16, 64),
        AccumulatedGradient::HiddenOverColumns => (1, 2, many, 16),
    };
    if vocab * hidden_dim > 1 << 24 {
        return None;
    }
    let config = Config {
        on_policy: true,
        kl: false,
        entropy_bonus: false,
        rollout_correction: false,
        logit_transform: false,
        ..base.config
    };
    let spec = crate::case::spec::CaseSpec {
        batch,
        time,
        vocab,
        hidden: hidden_dim,
        dtype: Dtype::Bf16,
        config,
        // A clip edge at 0 puts ratio 1 on its kink, where the oracle
        // admits either side's gradient and so the sum's rounding too.
        hparams: grpo_oracle::Hparams {
            temperature: 1.0,
            eps_low: if base.hparams.eps_low > 0.0 { base.hparams.eps_low } else { 0.2 },
            eps_high: if base.hparams.eps_high > 0.0 { base.hparams.eps_high } else { 0.28 },
            ..base.hparams
        },
        cotangent: 1.0,
        logits: LogitPattern::Normal { scale: 0.05 },
        tokens: TokenPattern::Zero,
        mask: MaskPattern::Full,
        advantages: AdvantagePattern::Positive,
        masked_garbage: false,
        is_weights: None,
        is_weights_per_row: false,
        mesh: None,
        real: false,
        ..base.clone()
    };
    let case = spec.materialize(Kind::Fused);
    let columns = gradient == AccumulatedGradient::HiddenOverColumns;
    let mut rng = Prng::keyed(spec.seed, u64::from(columns), batch * time, vocab);
    let hidden = (0..batch * time * hidden_dim)
        .map(|_| Dtype::Bf16.round(if columns { rng.normal() } else { rng.range(0.5, 1.5) }))
        .collect();
    let lm_head = (0..hidden_dim * vocab)
        .map(|_| {
            let w = 0.05 * rng.normal();
            Dtype::Bf16.round(if columns { w.abs() } else { w })
        })
        .collect();
    Some(case.with_inputs(Inputs::Fused { hidden_dim, hidden, lm_head }))
}

/// One draw of the run's objective in bf16 (seed `seed`): the switches a
/// directed case keeps.
pub fn base_spec(bounds: &Bounds, seed: u64) -> Result<crate::case::spec::CaseSpec> {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    let config = ProptestConfig { failure_persistence: None, ..ProptestConfig::default() };
    let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &key));
    let bounds = Bounds { dtypes: vec![Dtype::Bf16], devices: 1, ..bounds.clone() };
    let tree = case_spec(&bounds).new_tree(&mut runner).map_err(|e| anyhow::anyhow!("drawing a case: {e}"))?;
    Ok(tree.current())
}

/// The accumulation `removed` took away (its gradient and chunk), if any.
fn accumulation(removed: &Declared) -> Option<(AccumulatedGradient, usize)> {
    match removed.convention {
        Convention::Bf16Accumulation { gradient, chunk } => Some((gradient, chunk)),
        _ => None,
    }
}

/// The loader name of `implementation` declaring `declared` instead of its own.
fn redeclared(implementation: &str, declared: &[String]) -> String {
    crate::sensitivity::perturb_name(&serde_json::json!({"conventions": declared, "impl": implementation}))
}

/// The stage counts a declaration can lose one of.
fn fewer_stages(c: Convention) -> Option<Convention> {
    match c {
        Convention::Bf16Logits { stages } if stages > 1 => Some(Convention::Bf16Logits { stages: stages - 1 }),
        Convention::Bf16GradLogits { stages } if stages > 1 => Some(Convention::Bf16GradLogits { stages: stages - 1 }),
        _ => None,
    }
}

/// Every declaration with one thing taken away: (what, the declaration it
/// was taken from, the rest).
fn removals(declared: &[Declared]) -> Vec<(String, Declared, Vec<Declared>)> {
    let mut out = Vec::new();
    for (i, d) in declared.iter().enumerate() {
        if let Some(fewer) = fewer_stages(d.convention) {
            let mut rest = declared.to_vec();
            rest[i] = Declared { convention: fewer, ..*d };
            out.push((format!("one stage of `{d}`"), *d, rest));
        }
        let rest = declared.iter().enumerate().filter(|&(j, _)| j != i).map(|(_, d)| *d).collect();
        out.push((format!("`{d}`"), *d, rest));
    }
    out
}

/// The directed case of a `bf16_accumulation` removal, run declaring
/// `declared`: Ok(None) when it passes, Ok(Some(failure)) when it fails.
fn directed(eval: &mut Evaluator, opts: &NecessityOptions, declared: &[String], case: &Case) -> Result<Option<String>> {
    let name = redeclared(&opts.implementation, declared);
    eval.worker.load(&name)?;
    let result = eval.evaluate(&name, case).map_err(|e| anyhow::anyhow!("{}: the directed case {}: {e}", opts.implementation, case.summary()))?;
    match result.outcome {
        Outcome::Pass => Ok(None),
        Outcome::Fail => Ok(Some(result.reason.lines().next().unwrap_or("").to_string())),
        Outcome::Unsupported => bail!("{}: the directed case {} is unsupported: {}", opts.implementation, case.summary(), result.reason),
    }
}

fn check(eval: &mut Evaluator, opts: &NecessityOptions, declared: &[String], k: usize) -> Result<crate::report::ImplSummary> {
    let name = redeclared(&opts.implementation, declared);
    let kind = eval.worker.load(&name)?;
    let check = CheckOptions {
        seed: opts.seed,
        shrink_time: std::time::Duration::from_secs(60),
        ..CheckOptions::new(vec![name], opts.cases, opts.bounds.clone(), opts.report_dir.join(format!("removal-{k:02}")))
    };
    let summary = run_check(&check, std::slice::from_mut(eval), &[kind])?.summaries.remove(0);
    if summary.supported == 0 {
        bail!("{}: every one of {} cases was unsupported: nothing was checked", opts.implementation, summary.cases);
    }
    Ok(summary)
}

/// `Ok(true)`: every declaration and stage was needed by some case.
pub fn command(opts: NecessityOptions, timeout: std::time::Duration) -> Result<bool> {
    let mut eval = Evaluator::start(timeout, opts.bounds.devices.max(1))?;
    eval.worker.load(&opts.implementation)?;
    let declared = eval.worker.conventions(&opts.implementation)?;
    if declared.is_empty() {
        bail!("{} declares no precision conventions: nothing to take away", opts.implementation);
    }
    let names = |d: &[Declared]| d.iter().map(ToString::to_string).collect::<Vec<_>>();
    println!("{} declares {}; {} cases a check (seed {})", opts.implementation, names(&declared).join(", "), opts.cases, opts.seed);
    let whole = check(&mut eval, &opts, &names(&declared), 0)?;
    if !whole.passed {
        bail!(
            "{} fails under its own declarations: {}; necessity is asked of an implementation that passes",
            opts.implementation,
            whole.failure.unwrap_or_default().lines().next().unwrap_or("")
        );
    }
    let base = base_spec(&opts.bounds, opts.seed)?;
    let mut results = Vec::new();
    for (k, (removed, from, rest)) in removals(&declared).into_iter().enumerate() {
        let s = check(&mut eval, &opts, &names(&rest), k + 1)?;
        let mut removal = Removal {
            removed,
            declared: names(&rest),
            needed: !s.passed,
            cases: s.supported,
            failure: s.failure.map(|f| f.lines().next().unwrap_or("").to_string()),
            minimal_case: s.minimal_case,
            directed_case: None,
        };
        if let Some(case) = accumulation(&from).filter(|_| !removal.needed).and_then(|(g, chunk)| aligned_case(g, chunk, &base)) {
            // Under the whole declaration first: a directed case the
            // implementation fails anyway says nothing of the removal.
            if let Some(failure) = directed(&mut eval, &opts, &names(&declared), &case)? {
                bail!("{} fails the directed case {} under its own declarations: {failure}", opts.implementation, case.summary());
            }
            removal.failure = directed(&mut eval, &opts, &removal.declared, &case)?;
            removal.needed = removal.failure.is_some();
            removal.minimal_case = removal.failure.is_some().then(|| case.summary());
            removal.directed_case = Some(case.summary());
        }
        let Removal { removed, needed, .. } = &removal;
        println!(
            "{} {removed}{}",
            if *needed { "needed " } else { "BROADER" },
            match (&removal.directed_case, *needed) {
                (Some(case), true) => format!(": no generated case fails without it; the directed case {case} does: {}", removal.failure.as_deref().unwrap_or("")),
                (Some(case), false) => format!(": no case of {} fails without it, nor the directed case {case}", removal.cases),
                (None, true) => format!(": without it {} (minimal: {})", removal.failure.as_deref().unwrap_or(""), removal.minimal_case.as_deref().unwrap_or("?")),
                (None, false) => format!(": no case of {} fails without it", removal.cases),
            }
        );
        results.push(removal);
    }
    std::fs::create_dir_all(&opts.report_dir)?;
    let path = opts.report_dir.join("report.json");
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&serde_json::json!({
            "implementation": opts.implementation, "declared": names(&declared), "cases": opts.cases, "seed": opts.seed,
            "removals": results, "worker": eval.worker.hello,
        }))?,
    )?;
    let broader = results.iter().filter(|r| !r.needed).count();
    println!("{} of {} removals needed; report: {}", results.len() - broader, results.len(), path.display());
    Ok(broader == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The directed case spans its 32 chunks along the summed axis and every
    /// term of the sum has one sign. Red when a chunk count, a sign or the
    /// on-policy ratio is lost.
    #[test]
    fn the_directed_case_spans_its_chunks_with_aligned_terms() {
        let bounds = Bounds { objective: crate::case::objective::Objective::parse(Some("all"), &[], &[]).unwrap(), ..Bounds::new(4, 48, 4100, 256, vec![Dtype::Bf16]) };
        let base = base_spec(&bounds, 3).unwrap();
        for (gradient, chunk) in [(AccumulatedGradient::LmHeadOverTokens, 512), (AccumulatedGradient::LmHeadOverSequences, 1), (AccumulatedGradient::HiddenOverColumns, 32)] {
            let case = aligned_case(gradient, chunk, &base).unwrap();
            let spanned = match gradient {
                AccumulatedGradient::LmHeadOverTokens => case.shape.batch * case.shape.time,
                AccumulatedGradient::LmHeadOverSequences => case.shape.batch,
                AccumulatedGradient::HiddenOverColumns => case.shape.vocab,
            };
            assert!(spanned >= DIRECTED_CHUNKS * chunk, "{gradient:?}: {spanned} < {DIRECTED_CHUNKS} x {chunk}");
            let Inputs::Fused { hidden, lm_head, .. } = &case.inputs else { panic!("{gradient:?}: not fused") };
            let summed_over = if gradient == AccumulatedGradient::HiddenOverColumns { lm_head } else { hidden };
            assert!(summed_over.iter().all(|&x| x >= 0.0), "{gradient:?}: a negative entry in the factor summed over");
            assert!(case.tokens.iter().all(|&y| y == 0) && case.mask.iter().all(|&m| m == 1.0), "{gradient:?}: tokens or mask");
            assert!(case.advantages.iter().all(|&a| a > 0.0), "{gradient:?}: advantages {:?}", case.advantages);
            assert!(case.old_logp.is_none() && case.ref_logp.is_none() && case.config.on_policy && !case.config.entropy_bonus);
            assert_eq!(case.hparams.temperature, 1.0);
        }
        assert!(aligned_case(AccumulatedGradient::HiddenOverColumns, 1 << 20, &base).is_none(), "a case past 2^24 LM head entries");
    }
}
