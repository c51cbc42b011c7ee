"""Checking your own kernel from pytest (docs/cli.md: the options are check's).

    pip install grpo-verify-*.whl pytest   # into the environment with your JAX
    pytest examples/pytest -q

`assert_passes` runs `grpo-verify check` on this interpreter; a failure
fails the test with the minimal case, what failed on it and the one-line
replay command. GRPO_VERIFY_EXAMPLE_CASES sets the budget (CI: 20).
"""

import os

import pytest

import grpo_verify
import my_kernel

CASES = int(os.environ.get("GRPO_VERIFY_EXAMPLE_CASES", "50"))


def test_my_kernel_matches_the_oracle():
    result = grpo_verify.assert_passes(my_kernel.grpo_loss, cases=CASES)
    (mine,) = result.implementations
    # Every drawn case was checked (and, in a checkout, real-model ones after them)...
    assert mine.cases == CASES + mine.real_cases
    assert mine.unsupported > 0  # ...and the logp temperature mode was refused, not failed


def test_a_broken_clip_fails_with_a_minimal_case_and_a_replay_command():
    with pytest.raises(grpo_verify.CheckFailed) as failed:
        grpo_verify.assert_passes(my_kernel.grpo_loss_clip_inverted, cases=CASES, dtype="f32")
    message = str(failed.value)
    assert "minimal case: B=" in message and " replay /" in message, message


def test_the_numbers_are_there_for_those_who_want_them():
    result = grpo_verify.check(my_kernel.grpo_loss, cases=4, dtype="f32", objective="grpo")
    assert result.passed and result.report["cases"] == 4
    assert (result.report_dir / "report.md").is_file()


def test_bad_input_is_a_usage_error():
    with pytest.raises(grpo_verify.UsageError, match="no/such/kernel.py"):
        grpo_verify.check("no/such/kernel.py:grpo_loss", cases=1)
