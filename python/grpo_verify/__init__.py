"""Check a GRPO loss kernel from Python or pytest, with the grpo-verify binary.

    import grpo_verify

    def test_my_kernel():
        grpo_verify.assert_passes("my_kernels/grpo.py:grpo_loss", cases=50)

`assert_passes` fails the test with the minimal case, the failure and the
one-line replay command; `check` returns a `CheckResult` with the numbers
(report.json, parsed). Both take the options of `grpo-verify check`
(docs/cli.md) and run the worker on this interpreter, so the kernel is
checked in the environment the test runs in.
"""

from grpo_verify.api import CheckFailed, CheckResult, ImplResult, UsageError, assert_passes, binary, check

__all__ = ["CheckFailed", "CheckResult", "ImplResult", "UsageError", "assert_passes", "binary", "check"]
