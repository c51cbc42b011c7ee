"""Rewards of a real rollout: each completion judged by the task's verifier, as a GRPO trainer would.

Two verifiers, named by a task's "verifier":

    boxed-number   the last \\boxed{...} of the completion, read as a number
                   (commas, spaces, $ and \\text{} dropped; a fraction a/b or
                   \\frac{a}{b} allowed), equal to the task's "answer":
                   reward 1, else 0 (no \\boxed{} at all is 0: the format is
                   part of the task, as in the usual math-RL rewards).
    python-tests   the last ```python block of the completion run with the
                   task's "tests" appended, in a fresh interpreter (-I) in
                   an empty temporary directory, 20 s at most: reward 1 if it
                   exits 0, else 0 (no block, an error, a failed assert, a
                   timeout).

A completion cut off by the length limit is judged like any other (it
usually has no answer yet: reward 0, as verl and TRL give a truncated
response without an overlong penalty).
"""

import fractions
import os
import re
import subprocess
import sys
import tempfile

VERIFIERS = ("boxed-number", "python-tests")
TEST_TIMEOUT_S = 20


def last_boxed(text):
    """The contents of the last \\boxed{...} (braces balanced), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


def as_number(text):
    """A Fraction of a boxed answer such as '1,998', '$745$', '\\frac{3}{4}', '12 \\text{ cm}'; None if not a number."""
    if text is None:
        return None
    cleaned = re.sub(r"\\text\{[^}]*\}", "", text)
    cleaned = re.sub(r"\\(?:,|!|;|quad|qquad|\s)", "", cleaned)
    cleaned = cleaned.replace("$", "").replace(",", "").replace(" ", "").replace("\\%", "").replace("%", "")
    frac = re.fullmatch(r"-?\\[dt]?frac\{(-?\d+)\}\{(-?\d+)\}", cleaned)
    if frac:
        sign = -1 if cleaned.startswith("-") else 1
        return sign * fractions.Fraction(int(frac.group(1)), int(frac.group(2)))
    try:
        return fractions.Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def last_python_block(text):
    """The last ```python ... ``` block's code, or None."""
    blocks = re.findall(r"```(?:python|py)\s*\n(.*?)```", text, flags=re.DOTALL)
    return blocks[-1] if blocks else None


def judge(task, completion):
    """(reward, detail) of one completion's text for one task."""
    kind = task.get("verifier", "boxed-number")
    if kind == "boxed-number":
        boxed = last_boxed(completion)
        got, want = as_number(boxed), as_number(str(task["answer"]))
        if want is None:
            raise ValueError(f"task {task.get('id')!r}: answer {task['answer']!r} is not a number")
        if boxed is None:
            return 0.0, "no \\boxed{} answer"
        return (1.0 if got == want else 0.0), f"boxed {boxed!r}, expected {task['answer']}"
    if kind == "python-tests":
        code = last_python_block(completion)
        if code is None:
            return 0.0, "no ```python block"
        with tempfile.TemporaryDirectory(prefix="grpo-verifier-") as scratch:
            path = os.path.join(scratch, "solution.py")
            with open(path, "w") as stream:
                stream.write(code + "\n\n# the task's tests\n" + task["tests"] + "\n")
            try:
                run = subprocess.run(
                    [sys.executable, "-I", path], cwd=scratch, capture_output=True, text=True,
                    timeout=TEST_TIMEOUT_S, stdin=subprocess.DEVNULL,
                )
            except subprocess.TimeoutExpired:
                return 0.0, f"tests timed out after {TEST_TIMEOUT_S} s"
        if run.returncode == 0:
            return 1.0, "tests passed"
        last = (run.stderr.strip().splitlines() or ["exit status %d" % run.returncode])[-1]
        return 0.0, f"tests failed: {last[:200]}"
    raise ValueError(f"task {task.get('id')!r}: verifier {kind!r}; expected one of {VERIFIERS}")
