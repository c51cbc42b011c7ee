"""Lower tokamax 0.0.12's Mosaic TPU linear softmax cross-entropy for a TPU from a host without one.

    .venv/bin/python examples/tokamax/lower_tpu.py [--batch 1024 --hidden 1536 --vocab 151936 --dtype bf16]
                                                    [--device-kind "TPU v6 lite"] [--reduction mean]

Every export is `jax.export.export(jax.jit(f), platforms=["tpu"])` on jax.ShapeDtypeStructs (nothing
is allocated, nothing runs), of four functions:

  api forward    tokamax.linear_softmax_cross_entropy_loss(..., implementation="mosaic_tpu")
  api gradient   jax.grad of the same, in x and w
  kernel forward / kernel gradient
                 the op's two Pallas entry points (pallas_mosaic_tpu_kernel.py:238, :569) called
                 directly, with the library's own block configuration for that TPU
                 (pallas_mosaic_tpu.get_tpu_specific_default_config, pallas_mosaic_tpu.py:47-61):
                 what the api runs on a TPU, without the op wrapper

each twice: as the issue asks (plain, on the CPU host), and under a JAX abstract mesh whose abstract
device is a TPU of --device-kind (jax.sharding.AbstractDevice / use_abstract_mesh, JAX's way to trace
and lower for a TPU from another host; Pallas's TPU lowering reads the TPU's info from it,
jax/_src/pallas/mosaic/tpu_info.py:633-636).

It prints one line per export: OK with the count of Mosaic custom calls (tpu_custom_call) in the
StableHLO and the outputs' types, or FAIL with the exception's type, message and the file:line that
raised it. Exit 0 when every export lowered, 1 otherwise (FINDINGS.md, TK5: in 0.0.12 the api's
exports fail in both settings, the kernels' lower under the abstract TPU device).
"""

import argparse
import importlib.metadata
import contextlib
import sys
import traceback

import jax
import jax.numpy as jnp
import tokamax
from jax.sharding import AbstractDevice, AbstractMesh, AxisType
from tokamax._src.ops.linear_softmax_cross_entropy_loss import pallas_mosaic_tpu
from tokamax._src.ops.linear_softmax_cross_entropy_loss import pallas_mosaic_tpu_kernel as kernel


def export(name, f, specs, scope):
    try:
        with scope():
            exported = jax.export.export(jax.jit(f), platforms=["tpu"])(*specs)
    except Exception as error:  # noqa: BLE001 - the report is the exception
        last = traceback.extract_tb(error.__traceback__)[-1]
        print(f"FAIL {name}: {type(error).__name__}: {error}\n       raised at {last.filename}:{last.lineno}")
        return False
    text = exported.mlir_module()
    outs = ", ".join(f"{a.dtype}{list(a.shape)}" for a in exported.out_avals)
    print(f"OK   {name}: platforms {exported.platforms}, {text.count('tpu_custom_call')} tpu_custom_call, "
          f"{len(text)} chars of StableHLO, out {outs}")
    return True


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=1536)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--dtype", choices=("bf16", "f32"), default="bf16")
    parser.add_argument("--reduction", choices=("sum", "mean"), default="mean")
    parser.add_argument("--device-kind", default="TPU v6 lite", help="a device_kind jax's tpu_info knows")
    args = parser.parse_args()
    dtype = {"bf16": jnp.bfloat16, "f32": jnp.float32}[args.dtype]
    specs = (jax.ShapeDtypeStruct((args.batch, args.hidden), dtype),
             jax.ShapeDtypeStruct((args.batch,), jnp.int32),
             jax.ShapeDtypeStruct((args.hidden, args.vocab), dtype))
    print(f"jax {jax.__version__}, tokamax {importlib.metadata.version('tokamax')}, "
          f"host {jax.devices()}; B={args.batch} H={args.hidden} V={args.vocab} {args.dtype} "
          f"reduction={args.reduction}")

    device = AbstractDevice(device_kind=args.device_kind, num_cores=1, platform="tpu")
    mesh = AbstractMesh((1,), ("x",), (AxisType.Explicit,), abstract_device=device)
    with jax.sharding.use_abstract_mesh(mesh):
        c = pallas_mosaic_tpu.get_tpu_specific_default_config(args.batch, args.hidden, args.vocab)
    blocks = dict(b_block_size=c.b_block_size, h_block_size=c.h_block_size, v_block_size=c.v_block_size,
                  reduction=args.reduction)
    print(f"blocks for {args.device_kind}: B {c.b_block_size}, H {c.h_block_size}, V {c.v_block_size}")

    def api_loss(x, labels, w):
        return tokamax.linear_softmax_cross_entropy_loss(x, labels, w, reduction=args.reduction,
                                                         implementation="mosaic_tpu")

    def kernel_loss(x, labels, w):
        return kernel.linear_softmax_cross_entropy_loss_fwd_pallas_mosaic_tpu(x, labels, w, **blocks)[0]

    def kernel_grad(x, labels, w):  # the op's VJP: the forward's LSE, then the backward kernel
        _, lse = kernel.linear_softmax_cross_entropy_loss_fwd_pallas_mosaic_tpu(x, labels, w, **blocks)
        return kernel.linear_softmax_cross_entropy_loss_bwd_pallas_mosaic_tpu(
            jnp.float32(1), lse, x, labels, w, **blocks)

    functions = [("api forward", api_loss), ("api gradient", jax.grad(api_loss, argnums=(0, 2))),
                 ("kernel forward", kernel_loss), ("kernel gradient", kernel_grad)]
    scopes = [("CPU host", contextlib.nullcontext),
              (f"abstract {args.device_kind}", lambda: jax.sharding.use_abstract_mesh(mesh))]
    ok = [export(f"{name} [{where}]", f, specs, scope) for where, scope in scopes for name, f in functions]
    print(f"{sum(ok)} of {len(ok)} lowered")
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
