//! Self-verification of the f64 oracle (no JAX involved), SPEC v1 and v2:
//! its gradients against central finite differences away from kinks, and
//! the metamorphic identities docs/spec.md implies, on generated cases.
//! Trials are named `oracle::` (v1) and `oracle_v2::` (v2).

mod helpers;
mod v1;
mod v1_fused;
mod v2;
mod v2_identities;

use libtest_mimic::Trial;

use v1::*;
use v1_fused::*;
use v2_identities as v2i;

/// The one comparison every self-check uses fails on a NaN scale (a NaN
/// coefficient) saying so, fails on a real difference, and holds within its
/// tolerance.
fn close_fails_on_nan_and_holds_within_rel() -> Trial {
    crate::common::trial("oracle::close_fails_on_nan_and_holds_within_rel", || {
        use helpers::close;
        let checks = [
            (close(1.0, 1.0, 1e-9, f64::NAN, "nan scale").is_err_and(|e| e.to_string().contains("NaN scale")), "a NaN scale was not named"),
            (close(1.0, 1.0 + 1e-6, 1e-9, 1.0, "apart").is_err(), "1e-6 apart passed at 1e-9"),
            (close(1.0, 1.0 + 1e-10, 1e-9, 1.0, "within").is_ok(), "1e-10 apart failed at 1e-9"),
        ];
        match checks.iter().find(|(ok, _)| !ok) {
            Some((_, what)) => Err((*what).into()),
            None => Ok(()),
        }
    })
}

/// This suite's trials (suites/main.rs runs them with the others).
pub fn trials() -> Vec<Trial> {
    let v1 = vec![
        counted_property("oracle::gradient_matches_finite_differences", 48, FINITE_DIFFERENCES_MIN, finite_differences),
        counted_property("oracle::on_policy_is_off_policy_at_old_equal_logp", 48, ON_POLICY_MIN, on_policy_is_off_policy_at_logp),
        counted_property("oracle::row_shift_changes_nothing", 48, ROW_SHIFT_MIN, row_shift_changes_nothing),
        counted_property("oracle::temperature_is_a_scaling_of_the_logits", 48, TEMPERATURE_MIN, temperature_is_scaling_of_logits),
        counted_property("oracle::masked_inputs_do_not_matter", 48, MASKED_INPUTS_MIN, masked_inputs_do_not_matter),
        property("oracle::seq_mean_equals_token_mean_at_equal_counts", 48, seq_mean_equals_token_mean_at_equal_counts),
        property("oracle::sum_over_constant_is_linear_in_1_over_n", 48, sum_over_constant_is_linear_in_inverse_normalizer),
        counted_property("oracle::batch_permutation_permutes_outputs", 48, BATCH_PERMUTATION_MIN, batch_permutation_permutes_outputs),
        property("oracle::fully_masked_batch_is_exactly_zero", 24, fully_masked_batch_is_zero),
        property("oracle::aggregations_decompose_over_rows", 48, aggregations_decompose_over_rows),
        crate::common::trial("oracle::kink_intervals", kink_intervals),
        counted_property("oracle::fused_gradients_match_finite_differences", 24, FUSED_FINITE_DIFFERENCES_MIN, fused_finite_differences),
        property("oracle::fused_is_the_logits_oracle_on_the_product", 24, fused_is_logits_of_the_product),
        crate::common::trial("oracle::fused_blocks_are_the_rows", fused_blocks_are_the_rows),
    ];
    let v2 = vec![
        v2::property("oracle_v2::gradient_matches_finite_differences", 256, v2::finite_differences),
        v2::property("oracle_v2::sequence_is_token_with_one_token_per_row", 128, v2i::sequence_is_token_with_one_token_per_row),
        v2::property("oracle_v2::sequence_token_has_the_value_of_sequence", 128, v2i::sequence_token_has_the_value_of_sequence),
        v2::property("oracle_v2::straight_through_is_k2_gradient", 128, v2i::straight_through_is_k2_gradient),
        v2::property("oracle_v2::two_sided_is_verl_dual_clip", 128, v2i::two_sided_is_verl_dual_clip),
        v2::property("oracle_v2::unit_is_weights_are_no_weights", 128, v2i::unit_weights_are_no_weights),
        v2::property("oracle_v2::logit_scale_is_a_temperature", 128, v2i::logit_scale_is_a_temperature),
        v2::property("oracle_v2::far_softcap_changes_nothing", 128, v2i::far_softcap_changes_nothing),
        v2::property("oracle_v2::log_ratio_clamps", 128, v2i::log_ratio_clamps),
        v2::property("oracle_v2::over_constant_b_is_seq_mean_token_mean", 128, v2i::over_constant_b_is_seq_mean),
        v2::property("oracle_v2::entropy_token_mean_is_same_under_token_mean", 128, v2i::entropy_token_mean_is_same_under_token_mean),
        v2::property("oracle_v2::cispo_coefficient_is_minus_clip_r_a", 128, v2i::cispo_coefficient),
        v2::property("oracle_v2::sapo_is_odd_in_a_through_k", 128, v2i::sapo_is_odd_in_a_through_k),
        v2::property("oracle_v2::fully_masked_batch_is_exactly_zero", 64, v2i::fully_masked_batch_is_zero),
        v2::property("oracle_v2::kl_times_ratio_excess_only_on_policy", 128, v2i::kl_times_ratio_excess_only_on_policy),
        v2i::clamp_window_admits_every_unclamped_slope(),
        v2i::a_pinned_switch_is_exercised(),
    ];
    v1.into_iter().chain(v2).chain([close_fails_on_nan_and_holds_within_rel()]).collect()
}
