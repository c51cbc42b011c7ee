"""The built-ins' refusals name real switches: every `objective.refuse_unless(...)` in
python/grpo_kernels passes a switch of schema.json, so the plan and the coverage report can read
it as data (docs/spec.md, "Refusing a configuration")."""

import ast
import pathlib

import pytest

from grpo_kernels import objective, schema

KERNELS = pathlib.Path(objective.__file__).parent


def refusal_switches():
    """(file:line, switch) of every refuse_unless call with a literal switch in the kernels."""
    found = []
    for path in sorted(KERNELS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "refuse_unless":
                key = node.args[2] if len(node.args) > 2 else None
                where = f"{path.relative_to(KERNELS)}:{node.lineno}"
                assert isinstance(key, ast.Constant), f"{where}: the switch is not a literal"
                found.append((where, key.value))
    return found


def test_the_kernels_refuse_by_switch():
    assert len(refusal_switches()) >= 2, "the fused paths refuse logit_transform, fused_onepass the sequence ratio levels"


@pytest.mark.parametrize("where,switch", refusal_switches())
def test_each_refusal_names_a_schema_switch(where, switch):
    assert switch in schema.SWITCHES, f"{where}: {switch!r} is not a switch of schema.json"


def test_refuse_unless_raises_a_refusal_with_its_switch_and_value():
    config = {name: values[0] for name, values in schema.CONFIG_CHOICES[2].items()}
    config["ratio_level"] = "sequence"
    with pytest.raises(objective.Refusal) as caught:
        objective.refuse_unless("k", config, "ratio_level", ("token",), "couples the tokens of a row")
    assert (caught.value.switch, caught.value.value) == ("ratio_level", "sequence")
    assert isinstance(caught.value, NotImplementedError)
    objective.refuse_unless("k", config, "kl", (False,), "never")
