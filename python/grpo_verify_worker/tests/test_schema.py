"""schema.py: the switches and hyperparameters of docs/spec.md, read from schema.json."""

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
