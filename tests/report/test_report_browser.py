"""The report opened in headless Chromium: every figure rendered, no console error, no
network, and hostile text from traces/servers shown as text (issue 7 "Must show")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.report import write_report
from harness.results.sweep import capacities, sweep_point

XSS = "<script>alert(1)</script>"  # same text as conftest.XSS

pytestmark = pytest.mark.browser


def _check_rendered(o, expected_figs: int) -> None:
    counts = o.figure_svg_counts()
    assert len(counts) == expected_figs
    assert all(c > 0 for c in counts), counts  # every plotly div drew its svg
    assert o.errors == []
    assert o.requests == []  # opens offline: not one request beyond the file itself
    assert o.dialogs == []


def _trace_names(o, title_part: str) -> list[str]:
    """Legend names of the drawn figure whose title contains ``title_part``."""
    return o.page.evaluate(
        """t => { for (const d of document.querySelectorAll('div[data-fig]')) {
             const tt = (d.layout && d.layout.title && d.layout.title.text) || '';
             if (tt.includes(t)) return d.data.map(x => x.name || ''); }
           return null; }""",
        title_part,
    )


def test_single_run_report_renders(runs_dir: Path, open_report, tmp_path: Path) -> None:
    path = write_report([runs_dir / "slots8"], tmp_path / "one.html")
    o = open_report(path)
    # TTFT CDF, TBT tail per tier, ITL, throughput, backlog, KV/GPU, send lag, timeline
    _check_rendered(o, 8)
    assert _trace_names(o, "TBT per tier") == ["paid", "free"]  # per-tier TBT drawn
    assert o.page.inner_text("#confidence").count("[") >= 8  # headline intervals
    text = o.page.inner_text("body")
    for needle in ("Per-tier SLOs", "p99_ttft_ms", "stable", "paid", "free", "Backlog and queue"):
        assert needle in text
    shot = tmp_path / "one.png"
    o.page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 50_000


def test_hostile_text_renders_as_text(runs_dir: Path, open_report, tmp_path: Path) -> None:
    path = write_report([runs_dir / "hostile"], tmp_path / "hostile.html")
    raw = path.read_text(encoding="utf-8")
    assert "<script>alert(1)" not in raw  # escaped in tables and inside the figure JSON
    o = open_report(path)
    _check_rendered(o, 8)
    assert o.dialogs == []  # no alert() ran
    o.page.click("text=run.json")  # open the metadata table
    visible = o.page.get_by_text(XSS, exact=True)
    assert visible.count() >= 1 and visible.first.is_visible()  # the error example cell
    body = o.page.inner_text("body")
    assert f"prompt[0] = {XSS}" in body  # a prompt quoted in a trace note
    assert body.count(XSS) >= 4  # title, label, model, fallback reason, error...
    assert o.page.eval_on_selector_all("script", "s => s.length") == 3  # only ours


def test_comparison_with_paired_differences(runs_dir: Path, open_report, tmp_path: Path) -> None:
    path = write_report([runs_dir / "slots8", runs_dir / "slots12"], tmp_path / "cmp.html")
    o = open_report(path)
    # tier bars, TBT and TTFT per tier, 4 all-tier overlays, paired CDF, 8 per run
    _check_rendered(o, 3 + 4 + 1 + 2 * 8)
    text = o.page.inner_text("#compare")
    assert "Paired per-request differences" in text
    assert "fcfs12" in text and "fcfs8" in text
    names = _trace_names(o, "TBT per tier: share of gaps")
    a, b = "fcfs8 @ 3 req/s", "fcfs12 @ 3 req/s"
    assert names.count(a) == 2 and names.count(b) == 2  # one panel per tier
    verdicts = o.page.inner_text("#confidence")
    assert f"Verdicts at 95% confidence ({a} is the base)" in verdicts
    assert "paid tier" in verdicts and "paired by request" in verdicts


def test_sweep_report_renders(runs_dir: Path, open_report, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    points = []
    for name, rate in (("slots8", 3.0), ("slots12", 3.0), ("hostile", 2.0)):
        p = sweep_point(runs_dir / name, "fcfs", rate, 0.5)
        p["policy"] = name
        points.append(p)
    data = {
        "kind": "sweep",
        "policies": ["slots8", "slots12", "hostile"],
        "min_attainment": 0.5,
        "runs": points,
        "capacity": capacities(points),
    }
    (sweep / "sweep.json").write_text(json.dumps(data))
    path = write_report([sweep])
    assert path == sweep / "report.html"
    o = open_report(path)
    # latency, throughput, then attainment / goodput / P99 TBT per tier vs rate
    _check_rendered(o, 2 + 3)
    assert "capacity per policy" in o.page.inner_text("#sweep")
    assert "paid capacity" in o.page.inner_text("#sweep")
    assert _trace_names(o, "SLO attainment per tier vs rate").count("slots8") == 2
