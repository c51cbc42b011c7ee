//! Shared by the `cargo test` suites: case budgets, the test runner config,
//! and paths to the suite's own fixtures.
#![allow(dead_code)]

use std::path::PathBuf;

use grpo_verify::case::Dtype;
use grpo_verify::strategy::Bounds;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

/// Cases per property: `GRPO_VERIFY_TEST_CASES` (the nightly raises it),
/// else `default` (sized for CI).
pub fn cases(default: u32) -> u32 {
    std::env::var("GRPO_VERIFY_TEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A deterministic runner: the same cases on every run unless
/// `GRPO_VERIFY_TEST_SEED` says otherwise.
pub fn runner(cases: u32) -> TestRunner {
    let seed: u64 = std::env::var("GRPO_VERIFY_TEST_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let config = Config { cases, failure_persistence: None, max_shrink_iters: 256, ..Config::default() };
    TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes))
}

pub fn small_bounds() -> Bounds {
    Bounds { max_batch: 4, max_time: 12, max_vocab: 300, dtypes: vec![Dtype::F32, Dtype::Bf16] }
}

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `suites/fixtures/impls/<rel>:grpo_loss`.
pub fn fixture_impl(rel: &str) -> String {
    format!("{}:grpo_loss", repo().join("suites/fixtures/impls").join(rel).display())
}
