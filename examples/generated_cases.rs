//! Generated fused cases, dumped for `python -m grpo_fixtures statistics
//! --generated FILE` (the table of real, synthetic and generated
//! numbers: fixtures/README.md, "How the real numbers differ"):
//!
//!     cargo run --release --example generated_cases -- OUT.safetensors [CASES] [SEED]
//!
//! CASES (default 200) fused cases drawn by `check`'s generators at its
//! default bounds (B <= 4, T <= 48, V <= 4100, H <= 256, f32 and bf16, v1),
//! materialised as `check` gives them to an implementation. Per case i:
//! `case{i}.hidden` [B*T, H], `case{i}.lm_head` [H, V] (f32), `case{i}.tokens`,
//! `case{i}.mask` [B*T], `case{i}.advantages` [B], `case{i}.time` [1].

use std::collections::HashMap;

use grpo_verify::case::strategy::{case_spec, Bounds};
use grpo_verify::case::{Dtype, Inputs, Kind};
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use safetensors::tensor::TensorView;
use safetensors::Dtype as StDtype;

fn bytes_f32(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn bytes_i32(values: &[i32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let out = args.first().expect("usage: generated_cases OUT.safetensors [CASES] [SEED]");
    let cases: usize = args.get(1).map_or(200, |c| c.parse().expect("CASES is a count"));
    let seed: u64 = args.get(2).map_or(0, |s| s.parse().expect("SEED is an integer"));
    // check's defaults (src/cli.rs).
    let bounds = Bounds::new(4, 48, 4100, 256, vec![Dtype::F32, Dtype::Bf16]);
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let mut runner = TestRunner::new_with_rng(Config::default(), TestRng::from_seed(RngAlgorithm::ChaCha, &bytes));
    let strategy = case_spec(&bounds);
    let mut arrays: Vec<(String, StDtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for i in 0..cases {
        let case = strategy.new_tree(&mut runner).expect("a case").current().materialize(Kind::Fused);
        let Inputs::Fused { hidden_dim, hidden, lm_head } = &case.inputs else { unreachable!("a fused case") };
        let (n, v) = (case.shape.batch * case.shape.time, case.shape.vocab);
        arrays.push((format!("case{i:04}.hidden"), StDtype::F32, vec![n, *hidden_dim], bytes_f32(hidden)));
        arrays.push((format!("case{i:04}.lm_head"), StDtype::F32, vec![*hidden_dim, v], bytes_f32(lm_head)));
        arrays.push((format!("case{i:04}.tokens"), StDtype::I32, vec![n], bytes_i32(&case.tokens)));
        arrays.push((format!("case{i:04}.mask"), StDtype::F32, vec![n], bytes_f32(&case.mask)));
        arrays.push((format!("case{i:04}.advantages"), StDtype::F32, vec![case.shape.batch], bytes_f32(&case.advantages)));
        arrays.push((format!("case{i:04}.time"), StDtype::I32, vec![1], bytes_i32(&[case.shape.time as i32])));
    }
    let views: Vec<(String, TensorView<'_>)> =
        arrays.iter().map(|(name, dtype, shape, data)| (name.clone(), TensorView::new(*dtype, shape.clone(), data).expect("a tensor"))).collect();
    let metadata = HashMap::from([("about".to_string(), format!("{cases} generated fused cases, seed {seed}, check's default bounds"))]);
    safetensors::tensor::serialize_to_file(views, Some(metadata), std::path::Path::new(out)).expect("writing the dump");
    println!("{out}: {cases} fused cases");
}
