"""Find an implementation by name and classify it (docs/spec.md, "Implementation adapter").

A name is a built-in ("reference"), "module:function" or
"path/to/file.py:function" (relative to the worker's current directory).
The kind is the `kind` attribute ("logits" or "fused") where the function
has one (a wrapper `def f(**kwargs)` must), else it is read from the
signature: a `logits` parameter means the logits kind, `hidden` and
`lm_head` the fused kind. Wrappers made with `functools.wraps` show the
wrapped function's signature and carry its attributes. A `static_hparams = True`
attribute asks for the hyperparameters as Python floats; `spec_version = 2`
(absent: 1) says which version of docs/spec.md's contract it implements;
`framework = "torch"` (absent: "jax") that it takes and returns torch tensors
(docs/spec.md, "Implementations in PyTorch"; torch_runner.py runs it).
"""

import dataclasses
import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
import traceback

from grpo_kernels import registry
from grpo_verify_worker import environment
from grpo_verify_worker.protocol import WorkerError

COMMON_PARAMS = ("tokens", "mask", "advantages", "old_logp", "ref_logp", "hparams", "config")
FLOAT_PARAMS = {"logits": ("logits",), "fused": ("hidden", "lm_head")}
SPEC_VERSIONS = (1, 2)
FRAMEWORKS = ("jax", "torch")
V2_PARAMS = ("is_weights",)  # what a spec_version 2 implementation also takes


@dataclasses.dataclass(frozen=True)
class Implementation:
    name: str
    function: object
    kind: str  # "logits" | "fused"
    static_hparams: bool
    spec_version: int = 1  # 2: v2 config / hparams keys and the is_weights keyword
    framework: str = "jax"  # "torch": run by torch_runner with torch.autograd
    precision_conventions: tuple = ()  # declared roundings (docs/conventions.md), checked by the harness
    # The precision the step's matmuls are traced under (`jax.default_matmul_precision`): "highest"
    # for the built-ins and baselines, so their f32 error stays f32's where the backend's default is
    # not (TF32 on NVIDIA GPUs, one bf16 pass on TPU); None for an implementation under test, which
    # runs as its author wrote it.
    matmul_precision: str | None = None

    @property
    def float_params(self):
        """The differentiated inputs, in the order their gradients are sent."""
        return FLOAT_PARAMS[self.kind]


def import_file(path):
    """Import a .py file under a module name unique to its absolute path.

    Public for adapters that share a file (a sibling, or examples/spec_mapping.py one folder up):
    importing it through here gives the module the worker loads for `that.py:function`, not a
    second copy.
    """
    absolute = os.path.abspath(path)
    if not os.path.isfile(absolute):
        raise FileNotFoundError(f"{path} (resolved to {absolute}) is not a file")
    stem = os.path.splitext(os.path.basename(absolute))[0]
    digest = hashlib.sha1(absolute.encode()).hexdigest()[:10]
    module_name = f"grpo_verify_impl_{stem}_{digest}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, absolute)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


def _resolve(name):
    builtin = registry.BUILTINS.get(name)
    target = builtin.target if builtin else name
    if ":" not in target:
        raise WorkerError(
            "load",
            f"{name!r} is not a built-in ({', '.join(sorted(registry.BUILTINS))}); "
            "name an implementation as module:function or path/to/file.py:function",
        )
    return resolve_target(target)


def resolve_target(target):
    """The callable `module:function` or `path/to/file.py:function` names (attributes may be dotted)."""
    module_part, _, attribute = target.rpartition(":")
    if module_part.endswith(".py"):
        module = import_file(module_part)
    else:
        module = importlib.import_module(module_part)
    function = module
    for part in attribute.split("."):
        function = getattr(function, part)
    if not callable(function):
        raise TypeError(f"{target} is a {type(function).__name__}, not a function")
    return function


def _spec_version(name, function):
    """The function's `spec_version` attribute (absent: 1), checked."""
    version = getattr(function, "spec_version", 1)
    if type(version) is not int or version not in SPEC_VERSIONS:
        raise WorkerError(
            "load", f"{name}: spec_version must be one of {SPEC_VERSIONS}, got {version!r}"
        )
    return version


def _framework(name, function):
    """The function's `framework` attribute (absent: "jax"), checked."""
    framework = getattr(function, "framework", "jax")
    if framework not in FRAMEWORKS:
        raise WorkerError("load", f"{name}: framework must be one of {FRAMEWORKS}, got {framework!r}")
    return framework


def _precision_conventions(name, function):
    """The function's `precision_conventions` attribute (absent: none) as a
    tuple of strings; the harness checks the names against its closed list."""
    declared = getattr(function, "precision_conventions", ())
    if isinstance(declared, str) or not isinstance(declared, (list, tuple)) or not all(
        isinstance(c, str) for c in declared
    ):
        raise WorkerError(
            "load",
            f"{name}: precision_conventions must be a tuple of strings "
            f'(e.g. ("bf16_logits", "bf16_grad_logits")), got {declared!r}',
        )
    return tuple(declared)


def _declared_kind(name, function):
    """The function's `kind` attribute (absent: None, the signature says), checked."""
    declared = getattr(function, "kind", None)
    if declared is not None and declared not in FLOAT_PARAMS:
        raise WorkerError("load", f"{name}: kind must be one of {tuple(FLOAT_PARAMS)}, got {declared!r}")
    return declared


def _classify(name, function, spec_version):
    """The kind of `function`, from its parameter names (v2: is_weights among them)."""
    parameters = inspect.signature(function).parameters
    names = set(parameters)
    has_var_keyword = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    kinds = [kind for kind, floats in FLOAT_PARAMS.items() if names.issuperset(floats)]
    declared = _declared_kind(name, function)
    if declared and kinds and kinds != [declared]:
        raise WorkerError(
            "load",
            f"{name}: declares kind = {declared!r} but its signature {inspect.signature(function)} "
            f"takes the {' and '.join(FLOAT_PARAMS[kinds[0]])} of the {kinds[0]!r} kind",
        )
    if declared is None and len(kinds) != 1:
        raise WorkerError(
            "load",
            f"{name}: cannot tell the kind from the signature {inspect.signature(function)}: "
            "expected a `logits` parameter (logits kind) or `hidden` and `lm_head` "
            "(fused kind), not both; a wrapper such as `def f(**kwargs)` declares it "
            'with the attribute f.kind = "logits" or "fused"',
        )
    kind = declared or kinds[0]
    if declared and not names.issuperset(FLOAT_PARAMS[kind]) and not has_var_keyword:
        raise WorkerError(
            "load", f"{name}: declares kind = {kind!r} but its signature lacks {list(FLOAT_PARAMS[kind])}"
        )
    expected = COMMON_PARAMS + (V2_PARAMS if spec_version >= 2 else ())
    accepted = set(FLOAT_PARAMS[kind]) | set(expected)
    missing = [p for p in expected if p not in names]
    if missing and not has_var_keyword:
        raise WorkerError("load", f"{name}: the signature lacks the parameters {missing}")
    unfillable = [
        p.name
        for p in parameters.values()
        if p.kind is p.POSITIONAL_ONLY
        or (
            p.name not in accepted
            and p.default is p.empty
            and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
        )
    ]
    if unfillable:
        raise WorkerError(
            "load",
            f"{name}: parameters {unfillable} cannot be passed by keyword from the adapter inputs",
        )
    return kind


REPOSITORY_TORCH = "in the repository's own environment: grpo-verify setup --torch"


def _install_hint(error):
    """What to install when an implementation's import misses a package."""
    if not isinstance(error, ModuleNotFoundError):
        return ""
    if error.name and error.name.split(".")[0] == "torch":
        return f" ({environment.torch_problem() or 'torch fails to import'}; {REPOSITORY_TORCH})"
    return (
        f" (this worker's Python is {sys.executable}; install the package there; the libraries "
        f"examples/ checks are in python/requirements-torch.txt, {REPOSITORY_TORCH})"
    )


def _check_torch(name):
    """Refuse a PyTorch implementation on an environment without a recent enough torch."""
    problem = environment.torch_problem()
    if problem:
        raise WorkerError("load", f"{name} is a PyTorch implementation (framework = \"torch\"): {problem}; {REPOSITORY_TORCH}")


class Loader:
    """Loads each implementation once and remembers it by the name it was asked by."""

    def __init__(self):
        self._loaded = {}

    def load(self, name):
        if name in self._loaded:
            return self._loaded[name]
        try:
            function = _resolve(name)
            version = _spec_version(name, function)
            framework = _framework(name, function)
            if framework == "torch":
                _check_torch(name)
            kind = _classify(name, function, version)
            builtin = registry.BUILTINS.get(name)
            if builtin and builtin.kind != kind:
                raise WorkerError(
                    "load",
                    f"{name}: the registry says kind {builtin.kind!r} but the signature of "
                    f"{builtin.target} is the {kind!r} kind; correct grpo_kernels/registry.py",
                )
            if builtin and builtin.spec_version != version:
                raise WorkerError(
                    "load",
                    f"{name}: the registry says spec_version {builtin.spec_version} but "
                    f"{builtin.target} has spec_version {version}; correct grpo_kernels/registry.py",
                )
        except WorkerError:
            raise
        except Exception as error:  # anything the import or inspect raises
            raise WorkerError(
                "load", f"{name}: {type(error).__name__}: {error}{_install_hint(error)}",
                traceback.format_exc(),
            ) from error
        static = getattr(function, "static_hparams", False)
        if not isinstance(static, bool):
            raise WorkerError(
                "load", f"{name}: static_hparams must be True or False, got {static!r}"
            )
        conventions = _precision_conventions(name, function)
        implementation = Implementation(
            name, function, kind, static, version, framework, conventions,
            matmul_precision="highest" if name in registry.BUILTINS else None,
        )
        self._loaded[name] = implementation
        return implementation
