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


V1_CONFIG = {name: values[0] for name, values in schema.CONFIG_CHOICES[1].items()}
V1_HPARAMS = {name: 0.5 for name in schema.HPARAM_NAMES[1]}


def test_a_config_or_hparams_that_is_not_an_object_is_named():
    refused(lambda: request.parse_config(None, 2), "config must be an object, got None")
    refused(lambda: request.parse_hparams([0.5], True, 2), "hparams must be an object, got [0.5]")


def test_each_version_gets_exactly_its_own_keys():
    v2_only = sorted(set(schema.CONFIG_CHOICES[2]) - set(schema.CONFIG_CHOICES[1]))
    refused(lambda: request.parse_config(V2_CONFIG, 1), "SPEC v1 implementation", f"extra {v2_only}")
    refused(lambda: request.parse_config(V1_CONFIG, 2), "SPEC v2 implementation", "missing ['logit_transform'")
    refused(lambda: request.parse_hparams(V2_HPARAMS, True, 1), "extra ['kl_log_ratio_clamp'")
    assert list(request.parse_hparams(V1_HPARAMS, True, 1)) == list(schema.HPARAM_NAMES[1])


def test_a_value_added_by_v2_is_refused_in_a_v1_config():
    config = {**V1_CONFIG, "aggregation": "seq_mean_token_mean_over_constant"}
    refused(lambda: request.parse_config(config, 1), "config['aggregation'] = 'seq_mean_token_mean_over_constant'")
    assert request.parse_config({**V2_CONFIG, "aggregation": "seq_mean_token_mean_over_constant"}, 2)


def test_the_cotangent_must_be_a_number():
    refused(lambda: request.parse_run({**run_header(), "cotangent": "1"}, run_arrays(), LOGITS_IMPL), "cotangent = '1' is not a number")
    parsed = request.parse_run({**run_header(), "cotangent": 0.1}, run_arrays(), LOGITS_IMPL)
    assert parsed.cotangent == float(np.float32(0.1)) and parsed.mesh is None


def test_rollout_weights_come_iff_rollout_correction_per_token_or_per_row():
    header = run_header(rollout_correction=True)
    refused(lambda: request.parse_run(header, run_arrays(), LOGITS_IMPL), "rollout_correction = True", "is_weights")
    for shape in [(2, 3), (2, 1)]:
        arrays = {**run_arrays(), "is_weights": np.ones(shape, np.float32)}
        assert list(request.parse_run(header, arrays, LOGITS_IMPL).arrays)[-1] == "is_weights"
    arrays = {**run_arrays(), "is_weights": np.ones((1, 3), np.float32)}
    refused(lambda: request.parse_run(header, arrays, LOGITS_IMPL), "is_weights has shape [1, 3]; expected [2, 3] or [2, 1]")


def test_float_inputs_may_be_bf16_and_nothing_else_is():
    arrays = run_arrays()
    arrays["logits"] = arrays["logits"].astype(request.DTYPES["bf16"])
    assert request.parse_run(run_header(), arrays, LOGITS_IMPL).arrays["logits"].dtype.name == "bfloat16"
    arrays["logits"] = arrays["logits"].astype(np.float16)
    refused(lambda: request.parse_run(run_header(), arrays, LOGITS_IMPL), "logits has dtype float16; expected one of ('float32', 'bfloat16')")
    arrays = run_arrays()
    arrays["mask"] = arrays["mask"].astype(request.DTYPES["bf16"])
    refused(lambda: request.parse_run(run_header(), arrays, LOGITS_IMPL), "mask has dtype bfloat16; expected one of ('float32',)")


FUSED_IMPL = types.SimpleNamespace(spec_version=2, float_params=("hidden", "lm_head"), kind="fused")


def fused_arrays(batch=2, time=3, hidden=4, vocab=5):
    arrays = run_arrays(batch, time, vocab)
    del arrays["logits"]
    return {"hidden": np.zeros((batch, time, hidden), np.float32), "lm_head": np.zeros((hidden, vocab), np.float32), **arrays}


def test_a_fused_run_takes_the_vocabulary_from_the_lm_head():
    parsed = request.parse_run(run_header(), fused_arrays(), FUSED_IMPL)
    assert list(parsed.arrays)[:2] == ["hidden", "lm_head"]
    arrays = fused_arrays()
    arrays["tokens"][0, 0] = 5
    refused(lambda: request.parse_run(run_header(), arrays, FUSED_IMPL), "tokens[0, 0] = 5 is outside the vocabulary [0, 5)")
    arrays = fused_arrays()
    arrays["lm_head"] = np.zeros((3, 5), np.float32)
    refused(lambda: request.parse_run(run_header(), arrays, FUSED_IMPL), "lm_head has shape [3, 5]; expected [4, 5]")
    arrays["lm_head"] = np.zeros((4,), np.float32)
    refused(lambda: request.parse_run(run_header(), arrays, FUSED_IMPL), "expected [B, T, H] and [H, V]")


def test_an_empty_dimension_is_refused():
    refused(lambda: request.parse_run(run_header(), run_arrays(time=0), LOGITS_IMPL), "B = 2, T = 0, V = 5: all must be at least 1")
    arrays = run_arrays()
    arrays["logits"] = np.zeros((2, 3), np.float32)
    refused(lambda: request.parse_run(run_header(), arrays, LOGITS_IMPL), "expected [B, T, V]")


def test_lower_and_bench_specs_are_checked_as_a_run():
    specs = [{"name": name, "dtype": "f32" if name != "tokens" else "i32", "shape": list(array.shape)}
             for name, array in run_arrays().items()]
    parsed = request.parse_specs({**run_header(), "specs": specs}, LOGITS_IMPL)
    assert [array.shape for array in parsed.arrays.values()] == [(2, 3, 5), (2, 3), (2, 3), (2,)]
    refused(lambda: request.parse_specs({**run_header(), "specs": specs[:-1]}, LOGITS_IMPL), "takes the arrays", "advantages")
    refused(lambda: request.stand_ins({"logits": [1]}), '"specs" must be a list')
    refused(lambda: request.stand_ins([{"name": "logits", "shape": [1]}]), "bad spec {'name': 'logits', 'shape': [1]}")


def test_a_mesh_names_its_axes_and_wants_integers():
    refused(lambda: request.parse_mesh({"data": 1, "model": 1, "pipe": 1}), "exactly the keys ['data', 'model']")
    refused(lambda: request.parse_mesh({"data": 1.0, "model": 1}), "mesh['data'] = 1.0; expected an integer >= 1")
    refused(lambda: request.parse_mesh({"data": True, "model": 1}), "mesh['data'] = True")
    assert request.parse_run({**run_header(), "mesh": {"data": 1, "model": 1}}, run_arrays(), LOGITS_IMPL).mesh == (1, 1)
