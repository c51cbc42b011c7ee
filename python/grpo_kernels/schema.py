"""docs/spec.md's switches and hyperparameters, read from schema.json.

schema.json is the one place that names them: the oracle (oracles/build.rs),
the case generators, the wire protocol and this package all take their
names, values, defaults and off values from it. A switch's first value is
its default (v1's behaviour); `since` is the SPEC version that added a
switch, a value or a hyperparameter. Infinities are the strings "inf" and
"-inf" in every JSON the suite reads or writes.
"""

import json
import math
import pathlib

_SCHEMA = json.loads((pathlib.Path(__file__).parent / "schema.json").read_text())

# How JSON writes an infinity (JSON has none).
INFINITIES = {"inf": math.inf, "-inf": -math.inf}


def _value(entry):
    return entry["name"]


def switch_values(name, spec_version=2):
    """The values of switch `name` an implementation of `spec_version` may be given, the default first."""
    switch = SWITCHES[name]
    return tuple(
        _value(entry) for entry in switch["values"] if entry.get("since", switch["since"]) <= spec_version
    )


SWITCHES = {switch["name"]: switch for switch in _SCHEMA["switches"]}
HPARAMS = {hparam["name"]: hparam for hparam in _SCHEMA["hparams"]}

# {version: {switch: its values}}: what a config of that SPEC version holds.
CONFIG_CHOICES = {
    version: {name: switch_values(name, version) for name, switch in SWITCHES.items() if switch["since"] <= version}
    for version in (1, 2)
}
# {version: hyperparameter names}, in the schema's order.
HPARAM_NAMES = {
    version: tuple(name for name, hparam in HPARAMS.items() if hparam["since"] <= version) for version in (1, 2)
}
# The switches SPEC v2 added, with their v1 values: what a v1 config (which lacks them) means.
V2_CONFIG_DEFAULTS = {name: switch_values(name)[0] for name, switch in SWITCHES.items() if switch["since"] >= 2}

# The other losses on the head (docs/spec.md, "The head-loss adapter"): schema.json's "head_losses".
_HEAD = _SCHEMA["head_losses"]
HEAD_OBJECTIVES = tuple(objective["name"] for objective in _HEAD["objectives"])
HEAD_SWITCHES = {switch["name"]: tuple(value["name"] for value in switch["values"]) for switch in _HEAD["switches"]}
HEAD_HPARAMS = {hparam["name"]: hparam["default"] for hparam in _HEAD["hparams"]}
