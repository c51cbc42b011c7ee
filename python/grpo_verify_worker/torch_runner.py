"""Run a PyTorch implementation (docs/spec.md, "Implementations in PyTorch").

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

Device: CUDA where torch sees one, else CPU; `GRPO_VERIFY_TORCH_DEVICE`
(`cpu`, `cuda`, `cuda:1`) chooses. The inputs are put on it and it is torch's
default device for the call and its backward, so an adapter that creates
tensors gets them there too (what ci/accelerator's shim did, run on an H100:
the torch port, Liger and TRL passed). On CUDA, cuBLAS needs
`CUBLAS_WORKSPACE_CONFIG` for deterministic matmuls (set here unless the
user set it), and an op with no deterministic CUDA kernel warns instead of
raising, so it still gives numbers.
"""

import os

# Before anything initialises CUDA (importing torch does not).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from grpo_verify_worker import adapter_call  # noqa: E402
from grpo_verify_worker.protocol import WorkerError, implementation_failure  # noqa: E402

def _device():
    chosen = os.environ.get("GRPO_VERIFY_TORCH_DEVICE")
    if not chosen:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(chosen)
    except RuntimeError as error:
        raise WorkerError("load", f"GRPO_VERIFY_TORCH_DEVICE = {chosen!r} is not a torch device ({error})") from error


DEVICE = _device()
torch.use_deterministic_algorithms(True, warn_only=DEVICE.type == "cuda")
torch.set_num_threads(int(os.environ.get("GRPO_VERIFY_TORCH_THREADS", "1")))


def version():
    """torch's version, and the device when it is not the CPU: "2.11.0+cu130 on cuda"."""
    return torch.__version__ if DEVICE.type == "cpu" else f"{torch.__version__} on {DEVICE}"


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


def _scalar_loss(name, loss):
    """The loss a torch implementation returned, as a 0-d tensor, or a clear TypeError."""
    if not isinstance(loss, torch.Tensor):
        raise TypeError(f"{name} returned a loss of type {type(loss).__name__}; expected a torch.Tensor")
    if loss.numel() != 1:
        raise TypeError(f"{name} returned a loss of shape {list(loss.shape)}; expected a scalar")
    return loss.reshape(())


def _gradients(loss, floats, cotangent):
    """torch.autograd.grad of the loss with the cotangent; zeros for unused inputs.

    A loss that does not require grad (a constant, say for a fully masked
    batch, or one computed under no_grad or detached) depends on no input as
    far as autograd knows: every gradient is zero, as jax.vjp gives for a
    constant. Where that is wrong the comparison with the oracle says so.
    """
    if not loss.requires_grad:
        return [torch.zeros_like(x) for x in floats]
    grad_output = torch.full((), cotangent, dtype=loss.dtype, device=loss.device)
    grads = torch.autograd.grad(loss, floats, grad_outputs=grad_output, allow_unused=True)
    return [torch.zeros_like(x) if g is None else g for x, g in zip(floats, grads)]


def run(implementation, request):
    """The adapter_call.Outputs of one run of a torch implementation."""
    if request.mesh is not None:
        raise WorkerError(
            "unsupported",
            f"{implementation.name} is a torch implementation: it runs on one device, "
            "not under a mesh (sharded runs are for JAX implementations)",
        )
    floats = [_to_torch(request.arrays[n]).to(DEVICE).requires_grad_(True) for n in implementation.float_params]
    others = {n: _to_torch(a).to(DEVICE) for n, a in request.arrays.items() if n not in implementation.float_params}
    if implementation.static_hparams:
        hparams = dict(request.hparams)
    else:
        hparams = {n: torch.tensor(v, dtype=torch.float32, device=DEVICE) for n, v in request.hparams.items()}
    try:
        with torch.enable_grad(), DEVICE:
            loss, aux = adapter_call.call(implementation, floats, others, hparams, request.config)
            loss = _scalar_loss(implementation.name, loss)
            grads = _gradients(loss, floats, request.cotangent)
        arrays = adapter_call.outputs(implementation, loss, grads, aux, _to_host)
    except WorkerError:
        raise
    except Exception as error:
        raise implementation_failure(error) from error
    return adapter_call.Outputs(False, arrays, adapter_call.ignored_aux(aux))
