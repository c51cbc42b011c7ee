"""request.py: a run request's config, hyperparameters, mesh and arrays are checked, and every
refusal is a protocol error naming the input (docs/worker-protocol.md, "run")."""

import math
import types

import numpy as np
import pytest

from grpo_kernels import schema
from grpo_verify_worker import request
from grpo_verify_worker.protocol import WorkerError

V2_CONFIG = {name: values[0] for name, values in schema.CONFIG_CHOICES[2].items()}
V2_HPARAMS = {name: 0.5 for name in schema.HPARAM_NAMES[2]}
LOGITS_IMPL = types.SimpleNamespace(spec_version=2, float_params=("logits",), kind="logits")


def refused(call, *needles):
    with pytest.raises(WorkerError) as caught:
        call()
    assert caught.value.kind == "protocol"
    for needle in needles:
        assert needle in caught.value.message, caught.value.message
    return caught.value.message


def test_a_config_with_every_key_of_its_version_is_accepted():
    assert request.parse_config(V2_CONFIG, 2) == V2_CONFIG
    v1 = {name: values[0] for name, values in schema.CONFIG_CHOICES[1].items()}
    assert request.parse_config(v1, 1) == v1


def test_a_config_names_its_missing_and_extra_keys():
    config = dict(V2_CONFIG)
    del config["kl"]
    config["kl_weight"] = 0.1
    refused(lambda: request.parse_config(config, 2), "missing ['kl']", "extra ['kl_weight']")


def test_a_config_value_must_be_a_choice_of_the_right_type():
    refused(lambda: request.parse_config({**V2_CONFIG, "kl": 1}, 2), "config['kl'] = 1")
    refused(lambda: request.parse_config({**V2_CONFIG, "aggregation": "mean"}, 2), "config['aggregation'] = 'mean'")


def test_hparams_are_f32_values_with_written_infinities():
    parsed = request.parse_hparams({**V2_HPARAMS, "eps_low": 0.1, "kl_max": "inf", "log_ratio_min": "-inf"}, True, 2)
    assert parsed["eps_low"] == float(np.float32(0.1)) != 0.1
    assert parsed["kl_max"] == math.inf and parsed["log_ratio_min"] == -math.inf
    assert parsed["delta"] == 0.5


def test_delta_is_infinite_unless_two_sided():
    assert request.parse_hparams(V2_HPARAMS, False, 2)["delta"] == math.inf


def test_a_hparam_that_is_not_a_number_is_named():
    refused(lambda: request.parse_hparams({**V2_HPARAMS, "beta": "0.1"}, True, 2), "hparams['beta'] = '0.1'")
    refused(lambda: request.parse_hparams({**V2_HPARAMS, "beta": True}, True, 2), "hparams['beta'] = True")


def test_a_mesh_is_checked_against_its_axes_and_the_devices():
    assert request.parse_mesh(None) is None
    assert request.parse_mesh({"data": 1, "model": 1}) == (1, 1)
    refused(lambda: request.parse_mesh({"data": 1}), '"mesh" must be an object')
    refused(lambda: request.parse_mesh({"data": 0, "model": 1}), "mesh['data'] = 0")
    refused(lambda: request.parse_mesh({"data": 4096, "model": 2}), "needs 8192 devices")


def run_arrays(batch=2, time=3, vocab=5):
    return {
        "logits": np.zeros((batch, time, vocab), np.float32),
        "tokens": np.zeros((batch, time), np.int32),
        "mask": np.ones((batch, time), np.float32),
        "advantages": np.ones((batch,), np.float32),
    }


def run_header(**config):
    """On policy, no KL, no weights: the arrays of run_arrays and nothing else."""
    config = {**V2_CONFIG, "on_policy": True, **config}
    return {"impl": "x", "config": config, "hparams": V2_HPARAMS, "cotangent": 1.0}


def test_a_run_takes_the_arrays_its_config_needs_in_order():
    parsed = request.parse_run(run_header(), run_arrays(), LOGITS_IMPL)
    assert list(parsed.arrays) == ["logits", "tokens", "mask", "advantages"]
    refused(lambda: request.parse_run(run_header(kl=True), run_arrays(), LOGITS_IMPL), "takes the arrays", "ref_logp")
    refused(lambda: request.parse_run(run_header(on_policy=False), run_arrays(), LOGITS_IMPL), "old_logp")


def test_a_token_outside_the_vocabulary_is_named_where_unmasked_only():
    arrays = run_arrays()
    arrays["tokens"][1, 2] = 5
    refused(lambda: request.parse_run(run_header(), arrays, LOGITS_IMPL), "tokens[1, 2] = 5 is outside the vocabulary [0, 5)")
    arrays["mask"][1, 2] = 0
    request.parse_run(run_header(), arrays, LOGITS_IMPL)


def test_shapes_dtypes_and_mask_values_are_named():
    arrays = run_arrays()
    arrays["advantages"] = np.ones((3,), np.float32)
    refused(lambda: request.parse_run(run_header(), arrays, LOGITS_IMPL), "advantages has shape [3]; expected [2]")
    arrays = run_arrays()
    arrays["tokens"] = arrays["tokens"].astype(np.int64)
    refused(lambda: request.parse_run(run_header(), arrays, LOGITS_IMPL), "tokens has dtype int64")
    arrays = run_arrays()
    arrays["mask"][0, 1] = 0.5
    refused(lambda: request.parse_run(run_header(), arrays, LOGITS_IMPL), "mask[0, 1] = 0.5 is not 0 or 1")


def test_stand_ins_have_the_shape_without_the_memory():
    arrays = request.stand_ins([{"name": "logits", "dtype": "f32", "shape": [4, 8192, 151936]}])
    assert arrays["logits"].shape == (4, 8192, 151936) and arrays["logits"].strides == (0, 0, 0)
    refused(lambda: request.stand_ins([{"name": "a", "dtype": "f32", "shape": [1]}] * 2), "'a' is listed twice")
