"""The head_run op: every built-in head-loss implementation, and the chunked path in small chunks,
agree with the plain reference on values and gradients (the Rust suite holds them to the f64
oracle; this pins the worker's plumbing: vjp, cotangents, arrays back)."""

import itertools

import ml_dtypes
import numpy as np
import pytest

from grpo_kernels.fused import head_chunked
from grpo_verify_worker import head
from grpo_verify_worker.protocol import WorkerError

N, H, HT, V = 7, 5, 3, 13


def _arrays(rng, objective, kind, reduction, dtype=np.float32, bias=True):
    labels = rng.integers(0, V, N).astype(np.int32)
    labels[[1, 4]] = -100
    arrays = {"labels": labels}
    if kind == "logits":
        arrays["logits"] = (rng.standard_normal((N, V)) * 3).astype(dtype)
    else:
        arrays["hidden"] = rng.standard_normal((N, H)).astype(dtype)
        arrays["lm_head"] = rng.standard_normal((H, V)).astype(dtype)
        if bias:
            arrays["bias"] = rng.standard_normal(V).astype(dtype)
    if objective == "distillation":
        if kind == "logits":
            arrays["teacher_logits"] = (rng.standard_normal((N, V)) * 3).astype(dtype)
        else:
            arrays["teacher_hidden"] = rng.standard_normal((N, HT)).astype(dtype)
            arrays["teacher_lm_head"] = rng.standard_normal((HT, V)).astype(dtype)
    if objective == "cross_entropy":
        arrays["class_weights"] = rng.uniform(0.5, 2.0, V).astype(np.float32)
    if reduction == "none":
        arrays["cotangent"] = rng.uniform(-2, 2, N).astype(np.float32)
    return arrays


def _header(impl, objective, reduction, divergence="jsd"):
    return {
        "op": "head_run", "impl": impl, "objective": objective, "cotangent": 0.75,
        "config": {"reduction": reduction, "divergence": divergence},
        "hparams": {"ignore_index": -100, "label_smoothing": 0.1, "z_loss": 1e-3, "softcap": 30.0,
                    "temperature": 0.7, "beta": 0.3, "num_items": 11.0, "batch": 2},
    }


def _run(impl, header, arrays):
    implementation = impl if isinstance(impl, head.HeadImplementation) else head.load(impl)
    reply, out = head.HeadRunner().run(implementation, header, dict(arrays))
    assert reply["ok"]
    return dict(out)


@pytest.mark.parametrize("objective,reduction", list(itertools.product(head.OBJECTIVES, head.REDUCTIONS)))
def test_fused_paths_agree_with_the_plain_reference(objective, reduction):
    rng = np.random.default_rng(7)
    arrays = _arrays(rng, objective, "fused", reduction)
    header = _header("head_fused_reference", objective, reduction)
    want = _run("head_fused_reference", header, arrays)
    small = head.HeadImplementation("small", head_chunked.small_chunks(3), "fused")
    for impl in ("head_fused_chunked", small):
        got = _run(impl, header, arrays)
        assert set(got) == set(want)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=2e-5, atol=2e-6, err_msg=f"{impl} {name}")
    # ignored rows get exactly zero gradient rows
    assert not want["d_hidden"][[1, 4]].any()


def test_logits_reference_returns_its_gradient_and_z_loss():
    rng = np.random.default_rng(3)
    arrays = _arrays(rng, "cross_entropy", "logits", "mean")
    out = _run("head_reference", _header("head_reference", "cross_entropy", "mean"), arrays)
    assert set(out) == {"loss", "z_loss", "d_logits"}
    assert out["d_logits"].shape == (N, V) and not out["d_logits"][[1, 4]].any()


def test_bf16_gradients_come_back_in_bf16():
    rng = np.random.default_rng(5)
    arrays = _arrays(rng, "distillation", "fused", "sum", dtype=ml_dtypes.bfloat16, bias=False)
    out = _run("head_fused_chunked", _header("head_fused_chunked", "distillation", "sum"), arrays)
    assert out["d_hidden"].dtype == ml_dtypes.bfloat16 and "d_bias" not in out


def test_bad_requests_name_what_is_wrong():
    rng = np.random.default_rng(1)
    arrays = _arrays(rng, "cross_entropy", "logits", "none")
    header = _header("head_reference", "cross_entropy", "none")
    with pytest.raises(WorkerError, match="cotangent array"):
        _run("head_reference", header, {k: v for k, v in arrays.items() if k != "cotangent"})
    with pytest.raises(WorkerError, match="objective"):
        _run("head_reference", dict(header, objective="sft"), arrays)
    with pytest.raises(WorkerError, match="not a built-in"):
        head.load("head_nonexistent")


@pytest.mark.parametrize("objective", head.OBJECTIVES)
def test_the_fused_paths_lower_for_tpu(objective):
    """The value-and-grad step of each fused built-in exports for TPU from CPU (jax.export), the
    chunked path with several chunks and a ragged tail."""
    import jax

    config = {"reduction": "mean", "divergence": "jsd"}
    hparams = _header("x", objective, "mean")["hparams"]
    n, h, v = 600, 64, 1000
    specs = {"labels": jax.ShapeDtypeStruct((n,), np.int32),
             "hidden": jax.ShapeDtypeStruct((n, h), ml_dtypes.bfloat16),
             "lm_head": jax.ShapeDtypeStruct((h, v), ml_dtypes.bfloat16)}
    if objective == "distillation":
        specs.update(teacher_hidden=jax.ShapeDtypeStruct((n, h), ml_dtypes.bfloat16),
                     teacher_lm_head=jax.ShapeDtypeStruct((h, v), ml_dtypes.bfloat16))
    for name in ("head_fused_reference", "head_fused_chunked"):
        step = head.HeadRunner._step(head.load(name), objective, config, hparams, ["hidden", "lm_head"])
        exported = jax.export.export(step, platforms=["tpu"])(specs, jax.ShapeDtypeStruct((), np.float32))
        assert exported.platforms == ("tpu",)
