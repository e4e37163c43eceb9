"""Repeated runs (``--repeats K``): one run per seed, grouped, and the folder index that lets
``harness report FOLDER`` compare the groups with confidence intervals.

Why seeds: one run's P99 depends on which requests happened to arrive together; only runs
with other draws of the same workload (seed, seed+1, ...) show how much of a gap between two
policies is theirs (issue 20). Each run's run.json gets ``repeat = {group, seed, index, of}``
(``group``: what the runs repeat, e.g. the policy); the folder gets ``runs.json`` listing
them in order. Every policy sees the same trace for a given seed, so comparisons stay
paired by request within each seed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.results import schema
from harness.results.rundir import write_json

RUNS_JSON = "runs.json"


def seeds_for(seed: int, repeats: int) -> list[int]:
    """The seeds of ``repeats`` runs starting at ``seed``."""
    if repeats < 1:
        raise ValueError(f"--repeats {repeats}: must be >= 1")
    return [seed + i for i in range(repeats)]


def mark_run(
    run_dir: Path, *, group: str, seed: int, index: int, of: int, label: str | None = None
) -> None:
    """Record the run's place in its repeat group in run.json (and a readable label). A
    summary.json already written echoes run.json's label (``summary._ECHO``): it gets the new
    one too, so the two files agree."""
    path = Path(run_dir) / schema.RUN_JSON
    meta = json.loads(path.read_text(encoding="utf-8"))
    meta["repeat"] = {"group": group, "seed": seed, "index": index, "of": of}
    meta["label"] = label or (group if of == 1 else f"{group} (seed {seed})")
    write_json(path, meta)
    sp = Path(run_dir) / schema.SUMMARY_JSON
    if sp.is_file():
        summary = json.loads(sp.read_text(encoding="utf-8"))
        if summary.get("label") != meta["label"]:
            summary["label"] = meta["label"]
            write_json(sp, summary)


def write_index(folder: Path, command: str, runs: Sequence[tuple[Path, str, int]]) -> Path:
    """``runs.json`` in ``folder``: (run dir, group, seed) in the order they ran."""
    folder = Path(folder)
    rows: list[dict[str, Any]] = []
    for d, group, seed in runs:
        d = Path(d)
        try:
            rel = str(d.resolve().relative_to(folder.resolve()))
        except ValueError:
            rel = str(d.resolve())
        rows.append({"dir": rel, "group": group, "seed": seed})
    groups = list(dict.fromkeys(r["group"] for r in rows))
    path = folder / RUNS_JSON
    write_json(path, {"kind": "runs", "command": command, "groups": groups, "runs": rows})
    return path


def read_index(folder: Path) -> list[Path]:
    """The run directories a ``runs.json`` lists, in order."""
    folder = Path(folder)
    data = json.loads((folder / RUNS_JSON).read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
        raise ValueError(f"{folder / RUNS_JSON} is not a run index (no 'runs')")
    out = []
    for r in data["runs"]:
        p = Path(r["dir"])
        out.append(p if p.is_absolute() else folder / p)
    return out


def group_key(meta: dict[str, Any]) -> tuple[str | None, int | None]:
    """(group, seed) of a run from run.json, (None, None) when it is not part of a group."""
    rep = meta.get("repeat")
    if isinstance(rep, dict) and rep.get("group") is not None:
        seed = rep.get("seed")
        return str(rep["group"]), int(seed) if isinstance(seed, int) else None
    return None, None
