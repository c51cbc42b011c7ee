"""Run `grpo-verify check` from Python and read its report (docs/cli.md, "Files").

The binary is `GRPO_VERIFY_BIN`, else the `grpo-verify` of this
interpreter's environment (what the wheel installs beside `python`), else
one on PATH, else a repository checkout's `target/release/grpo-verify`.
The worker runs on this interpreter (`GRPO_VERIFY_PYTHON = sys.executable`)
with this process's `sys.path` on its PYTHONPATH, so whatever the caller can
import, the implementation can too.
"""

import dataclasses
import inspect
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile


class UsageError(ValueError):
    """`grpo-verify` exited 2: bad input or setup. The message is its stderr."""


class CheckFailed(AssertionError):
    """An implementation failed a check: the message has the minimal case and the replay command."""


@dataclasses.dataclass(frozen=True)
class ImplResult:
    """One implementation's outcome, as report.json's summary gives it."""

    implementation: str
    passed: bool
    cases: int  # cases checked (the draws it supported), real-model ones included
    real_cases: int  # of them, drawn from a real model's rollouts (check --real-cases)
    unsupported: int  # draws it refused (NotImplementedError)
    failure: str | None  # what failed on the minimal case
    minimal_case: str | None  # the shrunk case, in words
    repro: str | None  # the repro file (an absolute path)
    replay: str | None  # the one-line command that replays it
    summary: dict  # everything report.json says of it

    def describe(self):
        lines = [f"{self.implementation}: FAIL after {self.cases} cases"]
        for label, value in (("failure", self.failure), ("minimal case", self.minimal_case),
                             ("repro", self.repro), ("replay", self.replay)):
            if value:
                lines.append(f"  {label}: {value}")
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class CheckResult:
    passed: bool
    exit_code: int
    report_dir: pathlib.Path
    implementations: list  # of ImplResult, in --impl order
    report: dict  # report.json
    stdout: str
    stderr: str

    def failures(self):
        return [i for i in self.implementations if not i.passed]

    def describe(self):
        failed = self.failures()
        head = f"grpo-verify check: {'PASS' if self.passed else 'FAIL'} (report: {self.report_dir / 'report.md'})"
        return "\n".join([head] + [f.describe() for f in failed])


def binary():
    """The grpo-verify executable this API runs."""
    chosen = os.environ.get("GRPO_VERIFY_BIN")
    if chosen:
        if not os.path.isfile(chosen):
            raise UsageError(f"GRPO_VERIFY_BIN = {chosen} is not a file")
        return chosen
    beside = shutil.which("grpo-verify", path=os.path.dirname(sys.executable))
    found = beside or shutil.which("grpo-verify")
    if found:
        return found
    checkout = pathlib.Path(__file__).resolve().parents[2] / "target" / "release" / "grpo-verify"
    if checkout.is_file():
        return str(checkout)
    raise UsageError(
        "no grpo-verify executable: install the wheel into this environment "
        "(pip install grpo-verify-*.whl), or set GRPO_VERIFY_BIN to a built binary"
    )


def implementation_name(impl):
    """The `--impl` name of `impl`: a string as given; a function as
    `module:qualname` when its module is part of a package, else as
    `path/to/file.py:qualname` (a test file, a script)."""
    if isinstance(impl, str):
        return impl
    if not callable(impl):
        raise UsageError(f"impl must be a name (str) or a function, got {type(impl).__name__}")
    module, qualname = getattr(impl, "__module__", None), getattr(impl, "__qualname__", type(impl).__name__)
    if "<locals>" in qualname:
        raise UsageError(f"{qualname} is defined inside a function: the worker imports it by name; define it at module level")
    if module and "." in module and module != "__main__":
        return f"{module}:{qualname}"
    source = inspect.getsourcefile(impl)
    if source is None:
        raise UsageError(f"cannot find the source file of {qualname}; name it as 'module:function'")
    return f"{os.path.abspath(source)}:{qualname}"


def _flag(name, value):
    return [] if value is None else [f"--{name.replace('_', '-')}", str(value)]


def check(*impls, cases=50, seed=0, dtype=None, objective=None, kind=None, conventions=(), keep_going=False,
          jobs=None, report_dir=None, regressions=None, real_cases=None, args=(), cwd=None, timeout=None):
    """Run `grpo-verify check` on `impls` (names or functions) and return a CheckResult.

    Options are `check`'s flags (docs/cli.md); `args` passes any other flag
    as given. `report_dir` defaults to a new temporary directory, and
    `regressions` (where minimal failures are remembered and tried first)
    to none, so a test depends on nothing an earlier run left; `real_cases`
    to check's own default (one case in eight from a real model's rollouts
    where the binary finds real fixtures; 0 for none). Exit 2 (bad input or
    setup) raises UsageError with the binary's message.
    """
    if not impls:
        raise UsageError("check() needs at least one implementation")
    report = pathlib.Path(report_dir) if report_dir else pathlib.Path(tempfile.mkdtemp(prefix="grpo-verify-")) / "report"
    command = [binary(), "check"]
    for impl in impls:
        command += ["--impl", implementation_name(impl)]
    command += ["--cases", str(cases), "--seed", str(seed), "--report", str(report)]
    command += ["--regressions", str(regressions) if regressions else "none"]
    command += _flag("dtype", dtype) + _flag("objective", objective) + _flag("kind", kind) + _flag("jobs", jobs)
    command += _flag("real_cases", real_cases)
    for convention in conventions:
        command += ["--convention", convention]
    if keep_going:
        command.append("--keep-going")
    command += list(args)
    env = dict(os.environ)
    env.setdefault("GRPO_VERIFY_PYTHON", sys.executable)
    importable = [p for p in sys.path if p and os.path.isdir(p)]
    env["PYTHONPATH"] = os.pathsep.join(importable + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    run = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if run.returncode not in (0, 1):
        raise UsageError(f"grpo-verify exited {run.returncode}: {run.stderr.strip() or run.stdout.strip()}")
    parsed = json.loads((report / "report.json").read_text())
    results = []
    for entry in parsed["implementations"]:
        s = entry["summary"]
        repro = s.get("repro")
        results.append(ImplResult(
            implementation=s["implementation"], passed=bool(s["passed"]), cases=int(s["supported"]),
            real_cases=int(s.get("real_cases") or 0),
            unsupported=int(s.get("unsupported") or 0), failure=s.get("failure"),
            minimal_case=s.get("minimal_case"), replay=s.get("replay"), summary=s,
            repro=str((pathlib.Path(cwd or ".") / repro).resolve()) if repro else None,
        ))
    return CheckResult(
        passed=run.returncode == 0, exit_code=run.returncode, report_dir=report,
        implementations=results, report=parsed, stdout=run.stdout, stderr=run.stderr,
    )


def assert_passes(*impls, **options):
    """`check(*impls, **options)`, raising CheckFailed (an AssertionError: a
    failed test) with each failure's minimal case and replay command."""
    result = check(*impls, **options)
    if not result.passed:
        raise CheckFailed(result.describe())
    return result
