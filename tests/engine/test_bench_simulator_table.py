"""benchmarks/bench_simulator.py --readme-table: the README's table of issue 13 from the
benchmark's --json rows (the runs themselves are by hand, on a quiet machine), and the bars a
row misses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmark_modules import ROOT, load_benchmark


def _bench():  # type: ignore[no-untyped-def]
    return load_benchmark("bench_simulator")


def _row(policy: str, workload: str, wall: float, rss: float, **more: object) -> dict:
    return {
        "policy": policy,
        "workload": workload,
        "rate": 45.3,
        "wall_s": wall,
        "rss_mib": rss,
        "verdict": "stable",
        "kernel_s": wall / 2,
        "kernel": "vectorised",
        **more,
    }


ROWS = [
    _row("vllm", "lmsys", 3.4, 545.0, x_vllm=1.0),
    _row("rad", "lmsys", 5.5, 572.0, x_vllm=1.62),  # 18.2k req/s: under 20k
    _row("vllm", "azure", 4.7, 691.0, x_vllm=1.0),
    _row("rad", "azure", 9.6, 980.0, x_vllm=2.04),  # 10.4k, but 980 MiB > 10**9 bytes
    _row("vllm", "lmsys 1.5x own capacity", 3.2, 500.0, verdict="unstable", check="ok"),
    _row("rad", "lmsys 1.5x own capacity", 61.0, 500.0, verdict="unstable", check=">= 60 s"),
]


def test_the_readme_table_has_a_line_a_policy_and_names_the_bars_missed() -> None:
    lines = _bench().readme_table(ROWS, 100_000)
    assert lines[0].startswith("| policy | step | LMSYS whole (req/s) | x `vllm` |")
    vllm, rad = lines[2], lines[3]  # fastest on LMSYS first
    assert vllm == (
        "| `vllm` | vectorised | 3.4 s (29.4k) | 1.00 | 58.8k | 4.7 s (21.3k) | 1.00 | 42.6k "
        "| 545 / 691 | 3.2 s, unstable |"
    )
    assert rad.startswith("| `rad` | vectorised | 5.5 s (18.2k) | 1.62 |")
    assert rad.endswith("| 572 / 980 | 61.0 s, unstable |")
    assert lines[4:] == [
        "# misses: rad lmsys: 18,182 req/s < 20,000",
        "# misses: rad azure: peak RSS 980 MiB",
        "# misses: rad overload: >= 60 s",
    ]


def test_a_row_that_meets_every_bar_says_so_and_its_own_request_count_counts() -> None:
    rows = [dict(r, requests=200_000) for r in ROWS if r["policy"] == "vllm"]
    lines = _bench().readme_table(rows, 100_000)
    assert "3.4 s (58.8k)" in lines[2]
    assert lines[-1] == "# every row meets issue 13's bars"


def test_the_flag_prints_the_table_from_json_files_and_runs_nothing(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(ROWS[:4]))
    b.write_text(json.dumps(ROWS[4:]))
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_simulator.py"), "--readme-table"]
        + [str(a), str(b)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.splitlines()
    assert out == _bench().readme_table(ROWS, 100_000)
