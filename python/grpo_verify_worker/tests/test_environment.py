"""environment.py: which packages the worker needs, and the messages naming what is missing."""

from grpo_verify_worker import environment


def test_a_release_is_the_leading_numbers():
    assert environment.release("2.11.0+cu130") == (2, 11, 0)
    assert environment.release("0.10.2rc1") == (0, 10, 2)
    assert environment.release("dev") == ()


def test_a_missing_package_is_named_with_the_install_command():
    message = environment.problem("no-such-package-grpo", (1, 2))
    assert "no-such-package-grpo is not installed" in message and "pip install 'no-such-package-grpo>=1.2'" in message


def test_a_package_too_old_is_named_and_a_new_enough_one_passes():
    assert "is too old" in environment.problem("numpy", (99, 0))
    assert environment.problem("numpy", (1, 0)) is None


def test_this_environment_serves():
    assert environment.problems() == []
