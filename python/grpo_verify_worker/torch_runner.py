"""Run a PyTorch implementation (SPEC.md, "Implementations in PyTorch").

The same request as a JAX run, the same outputs: the float inputs become
leaf tensors that require gradients (bf16 as torch.bfloat16, bit for bit),
the implementation runs eagerly on CPU, and

    grads = torch.autograd.grad(loss, floats, grad_outputs=cotangent)

is the VJP, so a custom backward receives the case's cotangent as its
grad_output. An input the loss does not depend on gets a zero gradient, and
so does every input of a loss that does not require grad.

Inputs as SPEC says a torch implementation takes them: tokens int64 (torch
indexes with int64), mask and the other per-token arrays float32,
hyperparameters 0-d float32 tensors (Python floats with `static_hparams`).
Nothing is compiled or cached, so `compiled` is always false.

Determinism: `torch.use_deterministic_algorithms(True)` and a fixed thread
count (GRPO_VERIFY_TORCH_THREADS, default 1: with one thread a CPU reduction
has one order; the harness runs one case at a time anyway).
"""

import os

import numpy as np
import torch

from grpo_verify_worker.protocol import AUX_KEYS, WorkerError, implementation_failure, split_result

torch.use_deterministic_algorithms(True)
torch.set_num_threads(int(os.environ.get("GRPO_VERIFY_TORCH_THREADS", "1")))


def version():
    return torch.__version__


def _to_torch(array):
    """A CPU tensor holding exactly `array`'s values: bf16 by its bits, int32 ids as int64."""
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(array).view(np.int16).copy()).view(torch.bfloat16)
    if array.dtype.name == "int32":
        return torch.from_numpy(array.astype(np.int64))
    return torch.from_numpy(np.array(array, copy=True))


def _to_host(tensor, what):
    """A wire array from an output tensor: f32 and bf16 kept (bf16 by its bits), other floats -> f32."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what} is a {type(tensor).__name__}, not a torch.Tensor")
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        import ml_dtypes

        return tensor.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    if tensor.dtype == torch.float32:
        return tensor.numpy()
    if not (tensor.is_floating_point() or tensor.dtype in (torch.int32, torch.int64, torch.bool)):
        raise TypeError(f"{what} has dtype {tensor.dtype}; expected a float tensor")
    return tensor.to(torch.float64).numpy().astype(np.float32)


def _scalar_loss(name, result):
    """(loss as a 0-d tensor, aux dict) from what a torch implementation returned, or a clear TypeError."""
    loss, aux = split_result(name, result)
    if not isinstance(loss, torch.Tensor):
        raise TypeError(f"{name} returned a loss of type {type(loss).__name__}; expected a torch.Tensor")
    if loss.numel() != 1:
        raise TypeError(f"{name} returned a loss of shape {list(loss.shape)}; expected a scalar")
    return loss.reshape(()), aux


def _gradients(loss, floats, cotangent):
    """torch.autograd.grad of the loss with the cotangent; zeros for unused inputs.

    A loss that does not require grad (a constant, say for a fully masked
    batch, or one computed under no_grad or detached) depends on no input as
    far as autograd knows: every gradient is zero, as jax.vjp gives for a
    constant. Where that is wrong the comparison with the oracle says so.
    """
    if not loss.requires_grad:
        return [torch.zeros_like(x) for x in floats]
    grad_output = torch.full((), cotangent, dtype=loss.dtype)
    grads = torch.autograd.grad(loss, floats, grad_outputs=grad_output, allow_unused=True)
    return [torch.zeros_like(x) if g is None else g for x, g in zip(floats, grads)]


def run(implementation, request, outputs_type):
    """`outputs_type` (runner.Outputs) of one run of a torch implementation."""
    if request.mesh is not None:
        raise WorkerError(
            "unsupported",
            f"{implementation.name} is a torch implementation: it runs on one CPU device, "
            "not under a mesh (sharded runs are for JAX implementations)",
        )
    floats = [_to_torch(request.arrays[n]).requires_grad_(True) for n in implementation.float_params]
    others = {n: _to_torch(a) for n, a in request.arrays.items() if n not in implementation.float_params}
    if implementation.static_hparams:
        hparams = dict(request.hparams)
    else:
        hparams = {n: torch.tensor(v, dtype=torch.float32) for n, v in request.hparams.items()}
    extra = {"is_weights": others.get("is_weights")} if implementation.spec_version >= 2 else {}
    try:
        with torch.enable_grad():
            result = implementation.function(
                **extra,
                **dict(zip(implementation.float_params, floats)),
                tokens=others["tokens"],
                mask=others["mask"],
                advantages=others["advantages"],
                old_logp=others.get("old_logp"),
                ref_logp=others.get("ref_logp"),
                hparams=hparams,
                config=dict(request.config),
            )
            loss, aux = _scalar_loss(implementation.name, result)
            grads = _gradients(loss, floats, request.cotangent)
        arrays = [("loss", _to_host(loss, "the loss"))]
        arrays += [
            (f"grad.{n}", _to_host(g, f"the gradient of {n}"))
            for n, g in zip(implementation.float_params, grads)
        ]
        arrays += [(f"aux.{key}", _to_host(aux[key], f"aux[{key!r}]")) for key in AUX_KEYS if key in aux]
    except WorkerError:
        raise
    except Exception as error:
        raise implementation_failure(error) from error
    aux_ignored = sorted(str(key) for key in aux if key not in AUX_KEYS)
    return outputs_type(False, arrays, aux_ignored)
