"""`harness report RUN [RUN ...] [-o FILE]`: one self-contained HTML report.

One run dir: its report (default ``RUN/report.html``). Several: a comparison with verdicts
at 95% confidence, per-tier overlays, a side-by-side table and paired per-request differences
when they share a frozen trace (default ``<parent of the first>/compare-report.html``). A
simulate/replay folder (``runs.json``, e.g. ``--repeats``): the comparison of its runs,
grouped by seed (default ``FOLDER/report.html``). A sweep folder (``sweep.json``): latency,
throughput and per-tier attainment vs rate with each policy's capacity.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from harness.cli.errors import fail


def report(
    runs: Annotated[
        list[Path],
        typer.Argument(
            help="Run directories, or one folder written by simulate/replay (runs.json) or "
            "sweep (sweep.json).",
            show_default=False,
        ),
    ],
    out: Annotated[
        Path | None, typer.Option("-o", "--out", help="Output HTML file.", show_default=False)
    ] = None,
) -> None:
    """Render one self-contained HTML report (opens offline) for runs, a comparison or a sweep."""
    from harness.report import RUNS_JSON, SWEEP_JSON, write_report

    for d in runs:
        if not d.is_dir():
            fail(f"{d}: no such directory")
        if not any((d / f).is_file() for f in ("run.json", SWEEP_JSON, RUNS_JSON)):
            fail(
                f"{d}: not a run directory (no run.json), a simulate/replay folder (no "
                f"{RUNS_JSON}) nor a sweep folder (no {SWEEP_JSON})"
            )
    folders = [d for d in runs if (d / SWEEP_JSON).is_file() or (d / RUNS_JSON).is_file()]
    if len(runs) > 1 and folders:
        fail(f"give one sweep or simulate folder on its own ({folders[0]}), or run directories")
    if out is not None and out.exists() and out.is_dir():
        fail(f"-o {out}: is a directory; give a file name such as {out / 'report.html'}")
    try:
        path = write_report(list(runs), out)
    except (FileNotFoundError, ValueError, KeyError, OSError) as e:
        fail(f"{type(e).__name__}: {e}".splitlines()[0])
    typer.echo(str(path))


def register(app: typer.Typer) -> None:
    app.command("report")(report)
