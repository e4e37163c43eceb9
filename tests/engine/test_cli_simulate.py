"""`harness simulate` end to end: run dirs + table on good input, one line + exit 2 on bad."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli.main import app
from harness.results.rundir import read_run


@pytest.fixture
def csv_trace(tmp_path: Path) -> Path:
    p = tmp_path / "lengths.csv"
    rows = ["num_prefill_tokens,num_decode_tokens"]
    rows += [f"{5 + (i * 7) % 60},{3 + (i * 11) % 40}" for i in range(60)]
    p.write_text("\n".join(rows) + "\n")
    return p


def test_simulate_two_policies(csv_trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "runs"
    res = CliRunner().invoke(
        app,
        [
            "simulate",
            "--trace",
            str(csv_trace),
            "--rate",
            "20",
            "--policy",
            "vllm,orca",
            "--cost-model",
            "h100-llama2-7b",
            "--kv-tokens",
            "4096",
            "--num-requests",
            "60",
            "--seed",
            "3",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    dirs = sorted(p for p in out.iterdir() if p.is_dir())
    assert len(dirs) == 2
    assert all((d / "report.html").is_file() for d in dirs)
    assert len(list(out.glob("*comparison.html"))) == 1
    for d in dirs:
        assert str(d) in res.output
        run = read_run(d)
        assert run.meta["kind"] == "simulate" and run.summary is not None
        assert len(run.requests) == 60 and run.requests["success"].all()
        assert run.meta["engine"]["capacity_tokens"] == 4096
    assert {read_run(d).meta["policy"] for d in dirs} == {"vllm", "orca"}


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--rate", "-3"], "rate"),
        (["--policy", "vllm,nope"], "unknown policy"),
        (["--cost-model", "nope"], "unknown cost model"),
        (["--kv-tokens", "0"], "kv"),
        (["--tiers", "paid:0.5"], "tier"),
        (["--param", "sarathi.bogus=1", "--policy", "sarathi"], "bogus"),
    ],
)
def test_bad_input_is_one_line_exit_2(csv_trace: Path, tmp_path: Path, args, needle) -> None:
    res = CliRunner().invoke(
        app,
        ["simulate", "--trace", str(csv_trace), "--num-requests", "5", "--rate", "1"]
        + args
        + ["--out", str(tmp_path / "o")],
    )
    assert res.exit_code == 2, res.output
    assert needle in res.output.lower()
    assert "Traceback" not in res.output
    assert len([ln for ln in res.output.splitlines() if ln.startswith("error:")]) == 1


def test_plain_trace_imports_no_cluster_or_http_client(csv_trace: Path, tmp_path: Path) -> None:
    """A plain trace on one engine runs the single-engine kernel: the cluster modules and the
    load generator's HTTP client (aiohttp, a fixed cost of every run) are never imported."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from harness.cli.main import app\n"
        f"r = CliRunner().invoke(app, ['simulate', '--trace', {str(csv_trace)!r}, '--rate', '20',"
        f" '--num-requests', '20', '--no-report', '--out', {str(tmp_path / 'o')!r}])\n"
        "assert r.exit_code == 0, r.output\n"
        "bad = sorted(m for m in sys.modules if m == 'aiohttp' or m.startswith("
        "('harness.engine.cluster', 'harness.loadgen', 'harness.routers')))\n"
        "print(bad)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
