"""Triton kernels on a machine without a GPU: Triton's interpreter, made to round as compiled Triton does.

An adapter whose library runs Triton kernels sets `TRITON_INTERPRET=1` before the library defines
them (`@triton.jit` reads it at decoration), then calls `require(kernel, what)` and the fixes it
needs. The adapters in examples/trl, examples/liger (triton_adapter.py, head_ce_adapter.py),
examples/verl (triton_adapter.py), examples/unsloth (head_adapter.py) and examples/cut_cross_entropy
(head_adapter.py) do; their FINDINGS.md say
what each fix changed.

The fixes, each for Triton 3.8.0's `triton.runtime.interpreter.InterpreterBuilder` and each applied
once per process (a marker on the replacement), so adapters sharing a worker cooperate:

- `round_bf16_casts_to_nearest`: the interpreter's f32 -> bf16 cast (`cast_impl`) drops the low 16
  bits (toward zero); compiled Triton lowers `.to(tl.bfloat16)` to LLVM fptrunc, nearest even.
- `multiply_bf16_dots_as_floats`: the interpreter stores bf16 as uint16 and its `create_dot`
  multiplies those integers; compiled Triton multiplies the bf16 values (f32 accumulation).
- `pass_float_args_as_f32`: the interpreter hands a Python float argument on as a float; compiled
  Triton passes an fp32 scalar (a kernel's `.to(tl.float32)` on it fails in the interpreter).
- `libdevice_tanh_for(module, name)`: libdevice's functions are stubs in the interpreter (`tanh`
  returns None); a kernel module's global bound to it is computed by NumPy instead (f32 only).
- `bf16_arithmetic_as_floats`: the interpreter stores bf16 as uint16 and its `binary_op` applies
  the NumPy ufunc to that storage, so bf16 `*` multiplies bit patterns as integers (and `+` adds
  them); compiled Triton computes on the values and rounds to bf16, nearest even. Here + - * / of
  two bf16 tensors widen them to f32 (exact), operate, and round once to bf16: the single rounding
  of the exact value for + - * (a product of two 8-bit significands is exact in f32; a sum is exact
  in f32 or its smaller term is below half a bf16 ulp), f32-then-bf16 for /.
- `libdevice_module_for(module, global_name, names)`: as `libdevice_tanh_for`, for a kernel module
  that holds the libdevice module itself (cut-cross-entropy's `tl_libdevice`): that global becomes
  a proxy whose `names` (tanh, log1p) are NumPy's in f32 and whose other attributes are libdevice's.
- `builtin_aliases_for(module, *names)`: the interpreter patches `triton.language`'s builtins
  where they live; a module global aliasing one (`triton_cast = tl.cast`) keeps the unpatched
  builtin, and is rebound to look the builtin up when called.
"""


def interpreted(kernel):
    """Whether a `@triton.jit` kernel (or the autotuner wrapping one, as `.fn`) runs in the interpreter."""
    return any(type(k).__name__ == "InterpretedFunction" for k in (kernel, getattr(kernel, "fn", None)))


def require(kernel, what):
    """ImportError when there is no GPU and `kernel` was defined before TRITON_INTERPRET=1 was set."""
    import torch

    if not torch.cuda.is_available() and not interpreted(kernel):
        raise ImportError(
            f"{what} is a Triton kernel and there is no GPU: it needs Triton's interpreter, but its kernels "
            "were defined before the adapter set TRITON_INTERPRET=1. Start the worker with TRITON_INTERPRET=1 "
            "in its environment."
        )


def round_bf16_casts_to_nearest():
    """f32 -> bf16 in the interpreter rounded to nearest even (bf16 stays stored as uint16)."""
    import ml_dtypes
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    truncating = builder.cast_impl
    if getattr(truncating, "rounds_bf16_to_nearest", False):
        return

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            data = np.asarray(src.data, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)
            return interpreter.TensorHandle(data, dst_type.scalar)
        return truncating(self, src, dst_type)

    cast_impl.rounds_bf16_to_nearest = True
    builder.cast_impl = cast_impl


def multiply_bf16_dots_as_floats():
    """`tl.dot` of bf16 operands in the interpreter multiplies their values, not their uint16 storage."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    integer_dot = builder.create_dot
    if getattr(integer_dot, "multiplies_bf16_as_floats", False):
        return

    def as_f32(handle):
        if handle.dtype.scalar == tl.bfloat16:  # stored as uint16: the high half of an f32
            data = (np.asarray(handle.data, np.uint16).astype(np.uint32) << 16).view(np.float32)
            return interpreter.TensorHandle(data, tl.float32)
        return handle

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return integer_dot(self, as_f32(a), as_f32(b), d, input_precision, max_num_imprecise_acc)

    create_dot.multiplies_bf16_as_floats = True
    builder.create_dot = create_dot


def pass_float_args_as_f32():
    """A Python float argument reaches the kernel as an fp32 scalar, as compiled Triton passes it.

    Triton 3.8.0's interpreter (`interpreter._implicit_cvt`) wraps ints, bools and pointers but hands a
    float on as a Python float, so a kernel's `x.to(tl.float32)` on a float argument raises
    AttributeError there (Liger's cross-entropy does it to `softcap` and its weight sums,
    ops/cross_entropy.py:126-130), where compiled Triton has an fp32 scalar.
    """
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    convert = interpreter._implicit_cvt
    if getattr(convert, "passes_floats_as_f32", False):
        return

    def _implicit_cvt(arg):
        if isinstance(arg, float):
            return tl.tensor(interpreter.TensorHandle(np.array([arg], dtype=np.float32), tl.float32), tl.float32)
        return convert(arg)

    _implicit_cvt.passes_floats_as_f32 = True
    interpreter._implicit_cvt = _implicit_cvt


def libdevice_tanh_for(module, name="tanh"):
    """`module.<name>` (a kernel's global bound to `triton.language.extra.libdevice.tanh`: `tanh` in
    Liger, `triton_tanh` in Unsloth) computed by NumPy in the interpreter: Triton 3.8.0's interpreter
    patches `tl.math` but not libdevice, whose functions are stubs there (`tanh` returns None).
    CUDA's libdevice tanhf is within 2 ulp; NumPy's float32 tanh is correctly rounded to within 1.
    """
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    if getattr(getattr(module, name, None), "numpy_tanh", False):
        return

    def tanh(x):
        data = np.tanh(np.asarray(x.handle.data, np.float32)).astype(np.float32)
        return tl.tensor(interpreter.TensorHandle(data, tl.float32), x.type)

    tanh.numpy_tanh = True
    setattr(module, name, tanh)


def builtin_aliases_for(module, *names):
    """Each `module.<name>` that is a `triton.language` builtin under another name (Unsloth's
    `triton_cast = tl.cast`) looked up on `triton.language` when the kernel calls it: the interpreter
    patches the builtins on `triton.language` itself, so an alias bound at import keeps the
    unpatched builtin, which raises "Did you forget to add @triton.jit ?" in the interpreter.
    """
    import triton.language as tl

    for name in names:
        builtin = getattr(module, name)
        if getattr(builtin, "interpreter_alias", False):
            continue
        if not tl.core.is_builtin(builtin):
            raise TypeError(f"{module.__name__}.{name} is not a triton.language builtin")
        target = builtin.__name__

        def alias(*args, _target=target, **kwargs):
            return getattr(tl, _target)(*args, **kwargs)

        alias.interpreter_alias = True
        setattr(module, name, alias)


def bf16_arithmetic_as_floats():
    """bf16 +, -, *, / in the interpreter on the values, rounded to nearest bf16 (bf16 stays stored as uint16)."""
    import ml_dtypes
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_fmul, "bf16_arithmetic_as_floats", False):
        return

    def values(handle):  # bf16 is stored as uint16: the high half of an f32
        return (np.asarray(handle.data, np.uint16).astype(np.uint32) << 16).view(np.float32)

    def on_values(name, op):
        on_storage = getattr(builder, name)

        def create(self, lhs, rhs):
            if lhs.dtype.scalar == tl.bfloat16 and rhs.dtype.scalar == tl.bfloat16:
                wide = op(values(lhs), values(rhs)).astype(np.float32)
                return interpreter.TensorHandle(wide.astype(ml_dtypes.bfloat16).view(np.uint16), tl.bfloat16)
            return on_storage(self, lhs, rhs)

        create.bf16_arithmetic_as_floats = True
        setattr(builder, name, create)

    for name, op in (("create_fadd", np.add), ("create_fsub", np.subtract), ("create_fmul", np.multiply),
                     ("create_fdiv", np.divide)):
        on_values(name, op)


def libdevice_module_for(module, global_name="tl_libdevice", names=("tanh", "log1p")):
    """`module.<global_name>` (the libdevice module a kernel module imported whole) made a proxy whose
    `names` are NumPy's, in f32, in the interpreter (f32 arguments only, as `libdevice_tanh_for`)."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    libdevice = getattr(module, global_name)
    if getattr(libdevice, "numpy_functions", None) is not None:
        return

    def numpy_f32(ufunc):
        def function(x):
            data = ufunc(np.asarray(x.handle.data, np.float32)).astype(np.float32)
            return tl.tensor(interpreter.TensorHandle(data, tl.float32), x.type)

        return function

    class Libdevice:
        numpy_functions = tuple(names)

        def __getattr__(self, name):
            return getattr(libdevice, name)

    proxy = Libdevice()
    for name in names:
        setattr(proxy, name, numpy_f32(getattr(np, name)))
    setattr(module, global_name, proxy)
