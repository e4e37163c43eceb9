"""What a trace source hands to :func:`harness.workload.build_trace`.

A source yields *rows* (lengths, optional prompt text, optional timestamps); build_trace
then samples rows, draws arrivals and tags tiers. Column contract of ``SourceData.df``:

- ``prompt_len``, ``output_len``: int >= 1 (required);
- ``prompt``: str (optional; None = synthesise from the length);
- ``timestamp_s``: float seconds, the source's own arrival times (optional);
- ``request_id``, ``tier``, ``arrival_s``: only the project format carries these (a frozen
  replay); ``hash_ids``: Mooncake prefix-block ids (optional).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from harness.workload.tiers import Tier
from harness.workload.trace import TraceError


@dataclass
class SourceData:
    df: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)
    tiers: list[Tier] | None = None
    notes: list[str] = field(default_factory=list)
    # A generative source (synthetic, length profiles) draws ``n`` rows on demand instead
    # of holding a finite table; ``df`` is then empty.
    sampler: Callable[[int, np.random.Generator], pd.DataFrame] | None = None
    # True when ``sampler`` also yields ``timestamp_s`` (a profile with inter-arrival gaps).
    timed: bool = False

    @property
    def has_timestamps(self) -> bool:
        return self.timed or "timestamp_s" in self.df.columns


def announce(message: str) -> None:
    """One yellow ``warning:`` line on stderr: fallbacks and oversampling are never silent."""
    from rich.console import Console

    Console(stderr=True, highlight=False).print(
        f"[bold yellow]warning:[/] {message}", markup=True, soft_wrap=True
    )
    sys.stderr.flush()


def take_options(options: dict[str, Any], allowed: dict[str, Any], source: str) -> dict[str, Any]:
    """Split ``options`` into the ``allowed`` keys (with defaults); unknown keys are an error."""
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise TraceError(
            f"source {source!r}: unknown option(s) {', '.join(unknown)} "
            f"(known: {', '.join(sorted(allowed)) or 'none'})"
        )
    out = dict(allowed)
    out.update(options)
    return out
