"""spec_mapping.py: the library adapters' refusal and SPEC's aggregation as TRL's loss_type.

    .venv/bin/python -m pytest -q examples/test_spec_mapping.py

(.ci/run runs it with the worker's tests.) The masks are NumPy arrays: the mapping reads only
their shape and sum, as it does of the adapters' torch tensors.
"""

import pathlib
import sys

import numpy as np
import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))  # grpo_kernels and grpo_verify_worker, as the worker has them
from grpo_kernels import schema  # noqa: E402
from grpo_verify_worker import protocol  # noqa: E402
from grpo_verify_worker.loader import import_file  # noqa: E402

# Imported as the adapters import it: one module per path.
spec_mapping = import_file(HERE / "spec_mapping.py")
LossType = spec_mapping.LossType

LIBRARY = "Lib 1.0"
MASK = np.array([[1, 1, 0], [1, 1, 0]], np.float32)  # B = 2, T = 3, 4 valid tokens


def test_refuse_raises_a_not_implemented_error_naming_the_library():
    with pytest.raises(NotImplementedError, match="^Lib 1.0: no logp mode$") as caught:
        spec_mapping.refuse(LIBRARY, "no logp mode")
    assert (caught.value.switch, caught.value.value) == (None, None)
    # A refusal that says no switch relaxes it (a hyperparameter or a shape) reaches the suite as "".
    assert protocol.implementation_failure(caught.value).switch == ""
    # A bare NotImplementedError says nothing: the suite reads the words.
    assert protocol.implementation_failure(NotImplementedError("no logp mode")).switch is None


def test_a_refusal_carries_its_switch_and_value_to_the_worker_s_reply():
    with pytest.raises(spec_mapping.Refusal) as caught:
        spec_mapping.refuse(LIBRARY, "no sequence ratio", switch="ratio_level", value="sequence")
    reply = protocol.error_reply(protocol.implementation_failure(caught.value))
    assert (reply["error"], reply["switch"], reply["value"]) == ("unsupported", "ratio_level", "sequence")


def test_a_switch_that_is_not_the_schema_s_is_a_value_error():
    with pytest.raises(ValueError, match="switch 'ratio' is not a switch of schema.json"):
        spec_mapping.refuse(LIBRARY, "no", switch="ratio")


def loss_type(policy, aggregation, normalizer, own_count=False, mask=MASK):
    config = {name: values[0] for name, values in schema.CONFIG_CHOICES[2].items()}
    config.update(policy_loss=policy, aggregation=aggregation)
    return spec_mapping.trl_loss_type(LIBRARY, config, {"normalizer": normalizer}, mask, own_count)


@pytest.mark.parametrize(
    "policy,aggregation,normalizer,own_count,expected",
    [
        ("ppo", "seq_mean_token_mean", 1.0, False, LossType("grpo")),
        ("sapo", "seq_mean_token_mean", 1.0, False, LossType("sapo")),
        ("ppo", "seq_mean_token_mean_over_constant", 2.0, False, LossType("grpo")),
        ("sapo", "seq_mean_token_mean_over_constant", 2.0, True, LossType("sapo")),
        ("ppo", "token_mean", 1.0, False, LossType("bnpo")),
        ("cispo", "token_mean", 1.0, False, LossType("cispo", num_items_in_batch=4.0)),
        ("cispo", "token_mean", 1.0, True, LossType("cispo")),
        ("ppo", "sum_over_constant", 6.0, False, LossType("dr_grpo", max_completion_length=3)),
        ("ppo", "sum_over_constant", 0.5, False, LossType("dr_grpo", max_completion_length=0.25)),
        ("ppo", "sum_over_constant", 4.0, False, LossType("dapo", num_items_in_batch=4.0)),
        ("ppo", "sum_over_constant", 4.0, True, LossType("dapo")),
        ("ppo", "sum_over_constant", 7.0, True, LossType("dapo", num_items_in_batch=7.0)),
        ("cispo", "sum_over_constant", 6.0, False, LossType("cispo", num_items_in_batch=6.0)),
        ("cispo", "sum_over_constant", 4.0, True, LossType("cispo")),
    ],
)
def test_each_aggregation_has_its_loss_type(policy, aggregation, normalizer, own_count, expected):
    assert loss_type(policy, aggregation, normalizer, own_count) == expected


def test_own_count_comes_before_dr_grpo_where_every_token_is_valid():
    full = np.ones((2, 3), np.float32)  # N = B * T = the valid count
    assert loss_type("ppo", "sum_over_constant", 6.0, True, full) == LossType("dapo")
    assert loss_type("ppo", "sum_over_constant", 6.0, False, full) == LossType("dr_grpo", max_completion_length=3)


@pytest.mark.parametrize(
    "policy,aggregation,normalizer,words",
    [
        ("sapo", "token_mean", 1.0, ["policy_loss='sapo'", "aggregation='token_mean'"]),
        ("cispo", "seq_mean_token_mean", 1.0, ["policy_loss='cispo'"]),
        ("ppo", "seq_mean_token_mean_over_constant", 3.0, ["aggregation=", "normalizer 3.0 != B = 2"]),
        ("cispo", "sum_over_constant", 0.5, ["cispo with normalizer 0.5 < 1"]),
    ],
)
def test_what_no_loss_type_gives_is_refused_naming_it(policy, aggregation, normalizer, words):
    with pytest.raises(spec_mapping.Refusal) as caught:
        loss_type(policy, aggregation, normalizer)
    assert str(caught.value).startswith(f"{LIBRARY}: ")
    for word in words:
        assert word in str(caught.value)


def refusal_calls():
    """(file:line, keyword names) of every refuse(...) / _refuse(...) call in the adapters of examples/."""
    import ast
    import pathlib

    root = pathlib.Path(__file__).parent
    calls = []
    for path in sorted(root.rglob("*.py")):
        if path.name.startswith("test_"):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in ("refuse", "_refuse"):
                calls.append((f"{path.relative_to(root)}:{node.lineno}", [k.arg for k in node.keywords]))
    return calls


def test_every_adapter_refusal_says_its_switch():
    """Each refusal in the adapters passes `switch=` (a schema switch, or None for a hyperparameter or a
    shape): the plan and the coverage report read it as data, never the message's words."""
    calls = refusal_calls()
    assert len(calls) >= 40, f"the adapters refuse in more places than {len(calls)}: is the scan blind?"
    missing = [where for where, keywords in calls if "switch" not in keywords]
    assert not missing, f"refusals without switch=: {missing}"
