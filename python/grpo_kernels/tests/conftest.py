"""Puts python/ on sys.path, as the worker's process has it (src/worker/pyenv.rs)."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
