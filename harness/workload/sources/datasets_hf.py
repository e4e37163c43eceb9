"""Named datasets: ``lmsys``, ``sharegpt``, ``azure-conv`` (real data, else a bundled profile).

Placeholder until the full loader lands: always the bundled profile fallback.
"""

from __future__ import annotations

from typing import Any

from harness.workload.sources.base import SourceData


def fallback(name: str, reason: str) -> SourceData:
    from harness.workload.profile import load_profile

    prof = load_profile(name)
    return SourceData(
        df=__import__("pandas").DataFrame(columns=["prompt_len", "output_len"]),
        meta={
            "source": name,
            "fallback": True,
            "profile": prof.name,
            "profile_origin": prof.origin,
            "reason": reason,
        },
        notes=[
            f"{name}: real dataset not available ({reason}); using the bundled length "
            f"profile {prof.name!r} ({prof.origin})"
        ],
        sampler=prof.sample_frame,
    )


def load_named(name: str, options: dict[str, Any], seed: int | None) -> SourceData:
    return fallback(name, "loader not implemented yet")
