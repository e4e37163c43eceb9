"""Trace sources: named datasets and local files, all returning :class:`SourceData`.

Names: ``synthetic``, ``lmsys``, ``sharegpt``, ``azure-conv``. Anything else is a file path
(format from the suffix/header, or ``format=``: project, csv, burstgpt, mooncake, azure).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.workload.sources.base import SourceData
from harness.workload.trace import TraceError

NAMED = ("synthetic", "lmsys", "sharegpt", "azure-conv")


def load_source(source: str, options: dict[str, Any], seed: int | None = 0) -> SourceData:
    """Load rows for ``source`` (a name from :data:`NAMED` or a file path)."""
    if source == "synthetic":
        from harness.workload.sources.synthetic import load_synthetic

        return load_synthetic(options)
    if source in ("lmsys", "sharegpt", "azure-conv"):
        from harness.workload.sources.datasets_hf import load_named

        return load_named(source, options, seed)
    path = Path(source).expanduser()
    if not path.exists():
        if "/" not in source and "." not in source:
            raise TraceError(
                f"unknown trace {source!r}: use one of {', '.join(NAMED)} or a file path"
            )
        raise TraceError(f"{source}: no such trace file")
    from harness.workload.sources.files import load_file

    return load_file(path, options)


__all__ = ["NAMED", "SourceData", "load_source"]
