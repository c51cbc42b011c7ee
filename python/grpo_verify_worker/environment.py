"""What the worker's environment must have, checked before anything is imported.

The worker runs on whatever interpreter the user gives it (a TPU VM's
`jax[tpu]`, a GPU box's torch, the repository's `.venv`, the environment a
wheel is installed in). This module reads the installed versions from the
package metadata (nothing is imported, so a broken or missing package is
named, not crashed on) and says what is missing or too old:

    Python >= 3.11, jax and jaxlib >= 0.9 (docs/environments.md: the versions
    the matrix tests), numpy and ml_dtypes (JAX's own dependencies);
    torch >= 2.11 only for a PyTorch implementation (`framework = "torch"`).

`python -m grpo_verify_worker.environment [--torch] [--json]` prints the
versions and exits 2 naming the first missing or too-old package
(`grpo-verify setup` runs it); the worker's entry point refuses to serve on
such an environment with the same message.
"""

import importlib.metadata
import json
import platform
import re
import sys

# The oldest version of each package the worker serves on: the oldest the
# environment matrix (ci/matrix) tests. A package absent here is not checked.
MINIMUM = {"python": (3, 11), "jax": (0, 9), "jaxlib": (0, 9), "numpy": (1, 26), "ml_dtypes": (0, 4)}
TORCH_MINIMUM = (2, 11)
REPORTED = ("python", "jax", "jaxlib", "numpy", "ml_dtypes", "torch", "triton")


def installed(package):
    """The installed version of `package` ("python": the interpreter's), or None."""
    if package == "python":
        return platform.python_version()
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def release(version):
    """The leading numeric release of a version string: "2.11.0+cu130" -> (2, 11, 0)."""
    match = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()


def _dotted(numbers):
    return ".".join(str(n) for n in numbers)


def problem(package, minimum):
    """Why `package` cannot serve (None when it can): absent, or older than `minimum`."""
    found = installed(package)
    if found is None:
        return (
            f"{package} is not installed in {sys.executable} (grpo-verify needs "
            f"{package} >= {_dotted(minimum)}: pip install '{package}>={_dotted(minimum)}')"
        )
    if release(found) < minimum:
        return (
            f"{package} {found} in {sys.executable} is too old: grpo-verify needs "
            f"{package} >= {_dotted(minimum)} (docs/environments.md lists the versions tested)"
        )
    return None


def undeclared_problem():
    """A dependency a tested JAX imports without declaring it (None: none missing).

    JAX 0.9's Pallas TPU interpreter (jax/_src/pallas/mosaic/interpret/
    shared_memory.py) imports absl; its package does not require absl-py, so
    `pip install jax==0.9.2` leaves the Pallas built-ins unloadable (ci/matrix
    found it). JAX 0.10 no longer imports it there.
    """
    jax = installed("jax")
    if jax is not None and release(jax)[:2] == (0, 9) and installed("absl-py") is None:
        return (
            f"jax {jax} in {sys.executable} imports absl (its Pallas TPU module) without requiring it, "
            "and absl-py is not installed: pip install absl-py"
        )
    return None


def problems(torch=False):
    """Every reason this environment cannot serve, in the order of MINIMUM."""
    found = [problem(package, minimum) for package, minimum in MINIMUM.items()] + [undeclared_problem()]
    if torch:
        found.append(torch_problem())
    return [p for p in found if p]


def torch_problem():
    """Why a PyTorch implementation cannot run here (None when it can)."""
    return problem("torch", TORCH_MINIMUM)


def versions():
    """{package: installed version or None} for the packages the report names."""
    return {package: installed(package) for package in REPORTED}


def main(argv):
    want_torch = "--torch" in argv
    found = problems(torch=want_torch)
    if "--json" in argv:
        print(json.dumps({"python_executable": sys.executable, "versions": versions(), "problems": found}))
    else:
        print(f"interpreter: {sys.executable}")
        for package, version in versions().items():
            print(f"  {package:10} {version or 'not installed'}")
        for message in found:
            print(f"error: {message}", file=sys.stderr)
    return 2 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
