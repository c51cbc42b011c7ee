"""head_losses.py against torch's own cross_entropy and kl_div, where docs/spec.md says the
contract is torch's semantics (label smoothing with class weights, ignore_index, the weighted
mean), values and gradients; and the contract's own cases torch does not share (every row
ignored is 0, not NaN; ignored rows may hold NaN)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from grpo_kernels import head_losses  # noqa: E402

N, V = 6, 11


def draw(seed=0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0.0, 3.0, (N, V)).astype(np.float32)
    teacher = rng.normal(0.0, 3.0, (N, V)).astype(np.float32)
    labels = rng.integers(0, V, N).astype(np.int64)
    labels[2] = -100
    weights = (0.25 + rng.random(V)).astype(np.float32)
    return logits, teacher, labels, weights


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.15])
@pytest.mark.parametrize("weighted", [False, True])
def test_cross_entropy_is_torchs(reduction, smoothing, weighted):
    logits, _, labels, weights = draw()
    w = weights if weighted else None
    upstream = np.linspace(0.5, 3.0, N).astype(np.float32)  # non-uniform, as a caller's weights

    def ours(z):
        loss, _ = head_losses.cross_entropy(z, jnp.asarray(labels), label_smoothing=smoothing, class_weights=w,
                                            reduction=reduction, upstream=jnp.asarray(upstream) if reduction == "none" else None)
        return loss

    loss, grad = jax.value_and_grad(ours)(jnp.asarray(logits))
    z = torch.tensor(logits, dtype=torch.float64, requires_grad=True)
    theirs = torch.nn.functional.cross_entropy(z, torch.tensor(labels), weight=None if w is None else torch.tensor(w, dtype=torch.float64),
                                               label_smoothing=smoothing, reduction=reduction)
    if reduction == "none":
        theirs = (theirs * torch.tensor(upstream, dtype=torch.float64)).sum()
    theirs.backward()
    np.testing.assert_allclose(float(loss), theirs.item(), rtol=2e-6)
    np.testing.assert_allclose(np.asarray(grad), z.grad.numpy(), rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("divergence", ["forward_kl", "reverse_kl"])
def test_kl_is_torchs_kl_div(divergence):
    logits, teacher, labels, _ = draw(1)
    live = labels != -100
    loss, _ = head_losses.distillation(jnp.asarray(logits), jnp.asarray(teacher), jnp.asarray(labels),
                                       divergence=divergence, temperature=0.7, reduction="batchmean", batch=N)
    log_q = torch.log_softmax(torch.tensor(logits[live], dtype=torch.float64) / 0.7, -1)
    log_p = torch.log_softmax(torch.tensor(teacher[live], dtype=torch.float64) / 0.7, -1)
    # kl_div(input, target) is KL(target || input).
    args = (log_q, log_p) if divergence == "forward_kl" else (log_p, log_q)
    want = torch.nn.functional.kl_div(*args, log_target=True, reduction="sum").item() / N
    np.testing.assert_allclose(float(loss), want, rtol=2e-6)


def test_jsd_is_symmetric_under_swapped_roles_and_finite_on_underflows():
    logits, teacher, labels, _ = draw(2)

    def jsd(beta, student, teacher_):
        return float(head_losses.distillation(jnp.asarray(student), jnp.asarray(teacher_), jnp.asarray(labels),
                                              divergence="jsd", beta=beta, reduction="sum")[0])

    for beta in (0.2, 0.5):
        np.testing.assert_allclose(jsd(beta, logits, teacher), jsd(1.0 - beta, teacher, logits), rtol=1e-5)
    # Both distributions below f32's range on the last class.
    student = np.zeros((1, 2), np.float32)
    student[0, 1] = -200.0
    loss, grad = jax.value_and_grad(lambda z: head_losses.distillation(z, jnp.asarray(student), jnp.zeros(1, jnp.int32),
                                                                       divergence="jsd", beta=0.5, reduction="sum")[0])(jnp.asarray(student))
    assert np.isfinite(float(loss)) and np.all(np.isfinite(np.asarray(grad)))


def test_every_row_ignored_is_zero_and_nan_rows_do_not_leak():
    logits, teacher, labels, _ = draw(3)
    logits[2] = np.nan  # row 2 is ignored
    for reduction in ("mean", "sum", "batchmean", "over_count"):
        kw = dict(reduction=reduction, batch=2, num_items=7.0)
        loss, grad = jax.value_and_grad(lambda z: head_losses.cross_entropy(z, jnp.asarray(labels), z_loss=1e-3, **kw)[0])(jnp.asarray(logits))
        assert np.isfinite(float(loss)) and np.all(np.asarray(grad)[2] == 0.0) and np.all(np.isfinite(np.asarray(grad)))
        none = jnp.full((N,), -100, jnp.int32)
        loss, grad = jax.value_and_grad(lambda z: head_losses.distillation(z, jnp.asarray(teacher), none, **kw)[0])(jnp.asarray(logits))
        assert float(loss) == 0.0 and np.all(np.asarray(grad) == 0.0)
