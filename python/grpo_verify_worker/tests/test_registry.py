"""registry.py's declared refusals hold: each built-in that runs on one device is traced
(jax.eval_shape: nothing is computed) with every value of every v2 switch of schema.json,
the others at their defaults, and it refuses exactly the values its entry declares, with a
Refusal naming the switch and the value. The sharded built-ins need the harness's device mesh:
they declare no refusal, and `check` holds them to that on every case it draws."""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_kernels import objective, registry, schema

B, T, V, H = 1, 3, 8, 4


def defaults():
    """Every v2 switch at its default, off-policy (old_logp given)."""
    return {name: values[0] for name, values in schema.CONFIG_CHOICES[2].items()}


def hparams():
    out = {}
    for name, entry in schema.HPARAMS.items():
        value = entry["default"]
        out[name] = schema.INFINITIES.get(value, value)
    out["temperature"] = 0.7
    out["normalizer"] = float(B * T)
    return out


def trace(builtin, config):
    """jax.eval_shape of the built-in's value and gradient on a small case under `config`."""
    module, function = builtin.target.split(":")
    grpo_loss = getattr(importlib.import_module(module), function)
    rng = np.random.default_rng(0)
    side = dict(
        tokens=jnp.asarray(rng.integers(0, V, (B, T)), jnp.int32),
        mask=jnp.ones((B, T), jnp.float32),
        advantages=jnp.ones((B,), jnp.float32),
        old_logp=None if config["on_policy"] else jnp.full((B, T), -2.0, jnp.float32),
        ref_logp=jnp.full((B, T), -2.0, jnp.float32) if config["kl"] else None,
        hparams=hparams(),
        config=config,
        is_weights=jnp.ones((B, T), jnp.float32) if config["rollout_correction"] else None,
    )
    if builtin.kind == "logits":
        def loss(logits):
            return grpo_loss(logits=logits, **side)[0]
        args = (jax.ShapeDtypeStruct((B, T, V), jnp.float32),)
    else:
        def loss(hidden, lm_head):
            return grpo_loss(hidden=hidden, lm_head=lm_head, **side)[0]
        args = (jax.ShapeDtypeStruct((B, T, H), jnp.float32), jax.ShapeDtypeStruct((H, V), jnp.float32))
    jax.eval_shape(jax.value_and_grad(loss, argnums=tuple(range(len(args)))), *args)


def one_device_builtins():
    return [b for b in registry.BUILTINS.values() if not b.sharded]


def test_declarations_name_schema_switches_and_values():
    for builtin in registry.BUILTINS.values():
        for switch, values in builtin.refuses:
            assert switch in schema.SWITCHES, f"{builtin.name}: {switch!r} is not a switch of schema.json"
            for value in values:
                assert value in schema.switch_values(switch), f"{builtin.name}: {switch}={value!r} is not a value of it"


@pytest.mark.parametrize("builtin", one_device_builtins(), ids=lambda b: b.name)
def test_a_builtin_refuses_exactly_what_it_declares(builtin):
    disagreements = []
    for switch, values in schema.CONFIG_CHOICES[2].items():
        for value in values:
            config = {**defaults(), switch: value}
            declared = builtin.refused(config)
            try:
                trace(builtin, config)
                refused = None
            except objective.Refusal as refusal:
                refused = (refusal.switch, refusal.value)
            if refused != declared:
                disagreements.append(f"{switch}={value!r}: declared {declared}, refused {refused}")
    assert not disagreements, f"{builtin.name} (python/grpo_kernels/registry.py):\n" + "\n".join(disagreements)
