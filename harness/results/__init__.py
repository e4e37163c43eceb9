"""harness.results: the run directory (writer/reader), vLLM-compatible metrics, summaries.

The public names load lazily, so that ``from harness.results import schema`` (the load
generator's hot import) does not pull in pandas and rich.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Run": "rundir",
    "RunWriter": "rundir",
    "read_run": "rundir",
    "read_table": "rundir",
    "write_json": "rundir",
    "parse_goodput": "metrics",
    "request_metrics": "metrics",
    "compute_summary": "summary",
    "write_summary": "summary",
    "print_summary": "console",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'harness.results' has no attribute {name!r}")
    return getattr(importlib.import_module(f"harness.results.{mod}"), name)
