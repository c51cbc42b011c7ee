"""schema.py: the switches and hyperparameters of docs/spec.md, read from schema.json."""

import math
import pathlib
import re

from grpo_kernels import schema


def test_v1_is_a_subset_of_v2():
    for name, values in schema.CONFIG_CHOICES[1].items():
        assert set(values) <= set(schema.CONFIG_CHOICES[2][name]), name
    assert set(schema.HPARAM_NAMES[1]) <= set(schema.HPARAM_NAMES[2])
    assert set(schema.CONFIG_CHOICES[2]) - set(schema.CONFIG_CHOICES[1]) == set(schema.V2_CONFIG_DEFAULTS)


def test_a_switch_lists_its_default_first_and_only_its_versions_values():
    for name, switch in schema.SWITCHES.items():
        first = switch["values"][0]["name"]
        assert schema.switch_values(name)[0] == first, name
        for entry in switch["values"]:
            since = entry.get("since", switch["since"])
            assert (entry["name"] in schema.switch_values(name, 1)) == (since <= 1 and switch["since"] <= 1), (name, entry)


def test_a_v1_config_means_the_v2_switches_at_their_first_values():
    for name, value in schema.V2_CONFIG_DEFAULTS.items():
        assert value == schema.SWITCHES[name]["values"][0]["name"]

SPEC = (pathlib.Path(__file__).resolve().parents[3] / "docs" / "spec.md").read_text()


def default(name):
    """A hyperparameter's default as a float (schema.json writes infinities as strings)."""
    value = schema.HPARAMS[name]["default"]
    return schema.INFINITIES.get(value, value) if isinstance(value, str) else float(value)


def test_the_key_sets_are_docs_spec_md_s():
    assert list(schema.CONFIG_CHOICES[1]) == ["temperature_mode", "aggregation", "on_policy", "kl", "entropy_bonus", "two_sided"]
    assert schema.HPARAM_NAMES[1] == ("eps_low", "eps_high", "temperature", "beta", "entropy_coef", "delta", "normalizer")
    for name in [*schema.SWITCHES, *schema.HPARAMS]:
        assert f"`{name}`" in SPEC, f"{name} is in schema.json but docs/spec.md never names it"


def test_v1_s_switches_off_pass_their_neutral_hyperparameters_as_defaults():
    # docs/spec.md, "Hyperparameters": "at its neutral value (beta = 0, entropy_coef = 0, delta = +inf)".
    assert (default("beta"), default("entropy_coef"), default("delta")) == (0.0, 0.0, math.inf)
    assert (default("temperature"), default("normalizer")) == (1.0, 1.0)


def spec_v2_defaults():
    """{name: default} of docs/spec.md's table "Defaults and ranges (v2)"."""
    table = SPEC.split("### Defaults and ranges (v2)")[1].split("###")[0]
    word = {"+inf": math.inf, "-inf": -math.inf}
    found = {}
    for names, defaults in re.findall(r"^\| (`[^|]+`) \| ([^|]+) \|", table, re.M):
        names = re.findall(r"`(\w+)`", names)
        values = re.sub(r"\(.*?\)", "", defaults).split(",")
        if len(values) == len(names) and not defaults.startswith("as in"):
            values = [v.strip() for v in values]
            found.update({n: word[v] if v in word else float(v) for n, v in zip(names, values)})
    return found


def test_v2_s_defaults_are_the_table_of_docs_spec_md():
    documented = spec_v2_defaults()
    assert set(documented) == {name for name in schema.HPARAM_NAMES[2] if schema.HPARAMS[name]["since"] == 2}
    for name, value in documented.items():
        assert default(name) == value, f"{name}: schema.json's default {default(name)}, docs/spec.md's {value}"


def test_an_infinite_hyperparameter_says_which_infinity_and_draws_its_default_first():
    for name, hparam in schema.HPARAMS.items():
        if math.isinf(default(name)):
            assert schema.INFINITIES[hparam["infinite"]] == default(name), name
        if "draw" in hparam:  # shrinking walks back to the default (schema.json's "about")
            first = hparam["draw"][0]
            assert schema.INFINITIES.get(first, first) == default(name), name


def test_a_bool_switch_is_false_then_true_and_values_are_unique():
    for name, switch in schema.SWITCHES.items():
        values = schema.switch_values(name)
        assert len(set(values)) == len(values), name
        if any(isinstance(v, bool) for v in values):
            assert values == (False, True), name
    assert schema.switch_values("aggregation", 1) == ("token_mean", "seq_mean_token_mean", "sum_over_constant")
