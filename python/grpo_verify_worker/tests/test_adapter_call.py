"""adapter_call.py: docs/spec.md's call of an implementation, and the outputs it sends back."""

import types

import numpy as np
import pytest

from grpo_verify_worker import adapter_call
from grpo_verify_worker.protocol import AUX_KEYS


def implementation(version, returns=None):
    seen = {}

    def function(**kwargs):
        seen.update(kwargs)
        return returns if returns is not None else (1.0, {"logp": 2.0, "extra": 3.0})

    impl = types.SimpleNamespace(name="f", spec_version=version, float_params=("logits",), function=function)
    return impl, seen


OTHERS = {"tokens": "T", "mask": "M", "advantages": "A"}


def test_a_v2_implementation_gets_is_weights_and_a_v1_one_never():
    impl, seen = implementation(2)
    adapter_call.call(impl, ["Z"], OTHERS, {"beta": 0.1}, {"kl": False})
    assert seen["is_weights"] is None and seen["logits"] == "Z" and seen["old_logp"] is None and seen["ref_logp"] is None
    impl, seen = implementation(1)
    adapter_call.call(impl, ["Z"], OTHERS, {}, {})
    assert "is_weights" not in seen


def test_the_config_passed_is_a_copy():
    impl, seen = implementation(2)
    config = {"kl": False}
    adapter_call.call(impl, ["Z"], OTHERS, {}, config)
    seen["config"]["kl"] = True
    assert config == {"kl": False}


def test_a_malformed_return_is_a_type_error_naming_the_implementation():
    impl, _ = implementation(2, returns=(1.0, [2.0]))
    with pytest.raises(TypeError, match="f returned aux of type list"):
        adapter_call.call(impl, ["Z"], OTHERS, {}, {})
    impl, _ = implementation(2, returns=1.0)
    with pytest.raises(TypeError, match="f returned a float"):
        adapter_call.call(impl, ["Z"], OTHERS, {}, {})


def test_outputs_are_named_on_the_wire_and_unknown_aux_is_reported():
    impl, _ = implementation(2)
    aux = {"extra": 3.0, AUX_KEYS[0]: 2.0}
    wire = adapter_call.outputs(impl, 1.0, [np.zeros(2)], aux, lambda value, what: np.asarray(value))
    assert [name for name, _ in wire] == ["loss", "grad.logits", f"aux.{AUX_KEYS[0]}"]
    assert adapter_call.ignored_aux(aux) == ["extra"]


def test_a_fused_implementation_gets_hidden_and_lm_head_in_order_and_the_inputs_by_name():
    impl, seen = implementation(2)
    impl.float_params = ("hidden", "lm_head")
    hparams = {"beta": 0.1}
    others = {**OTHERS, "old_logp": "O", "ref_logp": "R", "is_weights": "W"}
    adapter_call.call(impl, ["H", "L"], others, hparams, {"kl": True})
    assert (seen["hidden"], seen["lm_head"]) == ("H", "L") and "logits" not in seen
    assert {k: seen[k] for k in ("tokens", "mask", "advantages", "old_logp", "ref_logp", "is_weights")} == {
        "tokens": "T", "mask": "M", "advantages": "A", "old_logp": "O", "ref_logp": "R", "is_weights": "W"}
    assert seen["hparams"] is hparams and seen["config"] == {"kl": True}


def test_each_output_is_named_for_the_host_and_compared_aux_follows_aux_keys():
    impl, _ = implementation(2)
    impl.float_params = ("hidden", "lm_head")
    asked = []
    aux = {key: float(i) for i, key in reversed(list(enumerate(AUX_KEYS)))}
    wire = adapter_call.outputs(impl, 1.0, ["dH", "dL"], aux, lambda value, what: asked.append(what) or value)
    assert [name for name, _ in wire] == ["loss", "grad.hidden", "grad.lm_head"] + [f"aux.{key}" for key in AUX_KEYS]
    assert asked == ["the loss", "the gradient of hidden", "the gradient of lm_head"] + [f"aux[{key!r}]" for key in AUX_KEYS]
    assert list(adapter_call.compared_aux(aux)) == list(AUX_KEYS) and adapter_call.ignored_aux(aux) == []
