"""The scripts of benchmarks/ as modules, for the tests of their pure parts (the scripts are
run by hand; they are not a package)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py``, imported afresh."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
