"""loader.py: how a name becomes an implementation (docs/spec.md, "Implementation adapter"), and
every load error naming the implementation and what is wrong with it."""

import itertools
import sys
import textwrap

import pytest

from grpo_kernels import registry
from grpo_verify_worker import loader
from grpo_verify_worker.protocol import WorkerError

LOGITS_PARAMS = "logits, tokens, mask, advantages, old_logp, ref_logp, hparams, config"
FUSED_PARAMS = "hidden, lm_head, tokens, mask, advantages, old_logp, ref_logp, hparams, config"


FRESH = itertools.count()


def write(tmp_path, source, name=None):
    """A new file each call: import_file keeps a module per path, so a rewritten file would not reload."""
    path = tmp_path / (name or f"impl_{next(FRESH)}.py")
    path.write_text(textwrap.dedent(source))
    return path


def load(tmp_path, source, function="f"):
    return loader.Loader().load(f"{write(tmp_path, source)}:{function}")


def refused(tmp_path, source, *needles, function="f"):
    with pytest.raises(WorkerError) as caught:
        load(tmp_path, source, function)
    assert caught.value.kind == "load"
    for needle in needles:
        assert needle in caught.value.message, caught.value.message
    return caught.value.message


def test_import_file_gives_one_module_per_path(tmp_path):
    (tmp_path / "other").mkdir()
    first = write(tmp_path, "X = []\n", "same.py")
    second = write(tmp_path / "other", "X = []\n", "same.py")  # the same file name elsewhere
    module = loader.import_file(first)
    assert loader.import_file(str(first)) is module
    assert loader.import_file(second) is not module and loader.import_file(second).X is not module.X


def test_import_file_names_a_missing_file_and_forgets_a_failed_import(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.py"):
        loader.import_file(tmp_path / "nowhere.py")
    broken = write(tmp_path, "raise RuntimeError('at import')\n", "broken.py")
    before = set(sys.modules)
    for _ in range(2):  # raised again: no half-initialised module was left behind
        with pytest.raises(RuntimeError, match="at import"):
            loader.import_file(broken)
    assert set(sys.modules) == before


def test_the_kind_is_read_from_the_signature(tmp_path):
    logits = load(tmp_path, f"def f(*, {LOGITS_PARAMS}): pass\n")
    assert (logits.kind, logits.float_params, logits.spec_version, logits.framework) == ("logits", ("logits",), 1, "jax")
    fused = load(tmp_path, f"def g(*, {FUSED_PARAMS}): pass\n", "g")
    assert (fused.kind, fused.float_params) == ("fused", ("hidden", "lm_head"))
    assert not fused.static_hparams and fused.precision_conventions == () and fused.matmul_precision is None


def test_a_wrapper_declares_its_kind_and_a_declaration_must_agree(tmp_path):
    wrapper = load(tmp_path, "def f(**kwargs): pass\nf.kind = 'fused'\n")
    assert wrapper.float_params == ("hidden", "lm_head")
    refused(tmp_path, "def f(**kwargs): pass\n", "cannot tell the kind", 'f.kind = "logits" or "fused"')
    refused(tmp_path, f"def f(*, {LOGITS_PARAMS}): pass\nf.kind = 'fused'\n",
            "declares kind = 'fused'", "of the 'logits' kind")
    refused(tmp_path, "def f(**kwargs): pass\nf.kind = 'tokens'\n", "kind must be one of ('logits', 'fused')")


def test_a_signature_both_kinds_or_lacking_parameters_is_refused(tmp_path):
    refused(tmp_path, f"def f(*, hidden, lm_head, {LOGITS_PARAMS}): pass\n", "cannot tell the kind")
    refused(tmp_path, "def f(*, logits, tokens, advantages, old_logp, ref_logp, hparams, config): pass\n",
            "the signature lacks the parameters ['mask']")
    v2 = f"def f(*, {LOGITS_PARAMS}): pass\nf.spec_version = 2\n"
    refused(tmp_path, v2, "the signature lacks the parameters ['is_weights']")


def test_parameters_the_adapter_cannot_fill_are_refused(tmp_path):
    refused(tmp_path, f"def f(logits, /, *, {LOGITS_PARAMS[8:]}): pass\n", "parameters ['logits'] cannot be passed by keyword")
    refused(tmp_path, f"def f(*, {LOGITS_PARAMS}, chunk): pass\n", "parameters ['chunk'] cannot be passed")
    assert load(tmp_path, f"def f(*, {LOGITS_PARAMS}, chunk=128): pass\n").kind == "logits"


@pytest.mark.parametrize(
    "attribute,needle",
    [
        ("spec_version = 3", "spec_version must be one of (1, 2), got 3"),
        ("spec_version = True", "spec_version must be one of (1, 2), got True"),
        ("framework = 'tensorflow'", "framework must be one of ('jax', 'torch')"),
        ("precision_conventions = 'bf16_logits'", "precision_conventions must be a tuple of strings"),
        ("static_hparams = 1", "static_hparams must be True or False, got 1"),
    ],
)
def test_a_malformed_attribute_is_named(tmp_path, attribute, needle):
    refused(tmp_path, f"def f(*, {LOGITS_PARAMS}): pass\nf.{attribute}\n", needle)


def test_the_attributes_are_read(tmp_path):
    impl = load(tmp_path, f"""
        def f(*, {LOGITS_PARAMS}, is_weights=None): pass
        f.spec_version, f.static_hparams, f.precision_conventions = 2, True, ["bf16_logits"]
        """)
    assert (impl.spec_version, impl.static_hparams, impl.precision_conventions) == (2, True, ("bf16_logits",))


def test_a_nested_attribute_and_a_module_name_resolve(tmp_path):
    source = f"class Kernels:\n    @staticmethod\n    def grpo_loss(*, {LOGITS_PARAMS}): pass\n"
    assert load(tmp_path, source, "Kernels.grpo_loss").kind == "logits"
    impl = loader.Loader().load("grpo_kernels.logits.reference:grpo_loss")
    assert impl.kind == "logits" and impl.matmul_precision is None  # only a built-in's name gets "highest"


def test_a_name_that_is_neither_a_builtin_nor_module_function_lists_the_builtins():
    with pytest.raises(WorkerError) as caught:
        loader.Loader().load("refrence")
    assert caught.value.kind == "load" and "'refrence' is not a built-in (fused_chunked" in caught.value.message
    assert "module:function or path/to/file.py:function" in caught.value.message


def test_an_import_error_is_a_load_error_with_what_to_install(tmp_path):
    message = refused(tmp_path, "import no_such_package_grpo\n", "ModuleNotFoundError", "no_such_package_grpo")
    assert sys.executable in message and "install the package there" in message
    refused(tmp_path, "X = 1\n", "AttributeError", function="f")
    refused(tmp_path, "f = 3\n", "TypeError", "is a int, not a function")


def test_a_torch_implementation_needs_torch(tmp_path, monkeypatch):
    monkeypatch.setattr(loader.environment, "torch_problem", lambda: "torch is not installed in X")
    refused(tmp_path, f"def f(*, {LOGITS_PARAMS}): pass\nf.framework = 'torch'\n",
            'is a PyTorch implementation (framework = "torch"): torch is not installed in X', "grpo-verify setup --torch")


def test_an_implementation_is_loaded_once(tmp_path):
    path = write(tmp_path, f"CALLS = []\ndef f(*, {LOGITS_PARAMS}): pass\nCALLS.append(1)\n")
    loaded = loader.Loader()
    assert loaded.load(f"{path}:f") is loaded.load(f"{path}:f")
    assert loader.import_file(path).CALLS == [1]


@pytest.mark.parametrize("name", sorted(registry.BUILTINS))
def test_every_builtin_loads_as_the_registry_says(name):
    impl = loader.Loader().load(name)
    builtin = registry.BUILTINS[name]
    assert (impl.kind, impl.spec_version, impl.matmul_precision) == (builtin.kind, builtin.spec_version, "highest")
