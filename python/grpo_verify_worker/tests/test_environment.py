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


def pretend(monkeypatch, **versions):
    """environment.installed as if these packages (None: absent) were installed, the rest as they are."""
    real = environment.installed
    monkeypatch.setattr(environment, "installed", lambda package: versions.get(package.replace("-", "_"), real(package)))


def test_jax_0_9_needs_absl_which_it_does_not_declare(monkeypatch):
    pretend(monkeypatch, jax="0.9.2", absl_py=None)
    assert "pip install absl-py" in environment.undeclared_problem()
    assert any("absl" in problem for problem in environment.problems())
    pretend(monkeypatch, jax="0.10.2", absl_py=None)
    assert environment.undeclared_problem() is None


def test_torch_is_checked_only_when_asked(monkeypatch):
    pretend(monkeypatch, torch="2.10.0+cpu")
    assert "torch 2.10.0+cpu" in environment.torch_problem() and "torch >= 2.11" in environment.torch_problem()
    assert environment.problems() == [] and len(environment.problems(torch=True)) == 1


def test_the_command_exits_2_naming_the_problem(monkeypatch, capsys):
    assert environment.main(["--json"]) == 0
    assert '"problems": []' in capsys.readouterr().out
    pretend(monkeypatch, jax="0.8.0")
    assert environment.main([]) == 2
    assert "error: jax 0.8.0" in capsys.readouterr().err
