"""`harness trace build|show`: the frozen file, the summary, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli.main import app
from harness.workload import load_trace

runner = CliRunner()


def run(*args: str):  # noqa: ANN202
    return runner.invoke(app, list(args))


def test_build_then_show(tmp_path: Path) -> None:
    out = tmp_path / "traces" / "t.parquet"
    r = run(
        "trace",
        "build",
        "synthetic",
        "-n",
        "200",
        "--rate",
        "20",
        "--seed",
        "5",
        "--opt",
        "input_len=64",
        "--opt",
        "output_len=16",
        "-o",
        str(out),
    )
    assert r.exit_code == 0, r.output
    assert "wrote" in r.output and "200 requests" in r.output
    t = load_trace(out)
    assert len(t) == 200 and t.df["prompt"].map(lambda p: len(p.split())).eq(64).all()
    assert t.meta["seed"] == 5
    r = run("trace", "show", str(out), "--json")
    assert r.exit_code == 0, r.output
    info = json.loads(r.output)
    assert info["requests"] == 200 and info["content_hash"] == t.content_hash()
    assert info["prompt_len"]["p50"] == 64
    assert info["offered_prompt_tokens_per_s"] == pytest.approx(64 * 200 / info["span_s"])
    assert {x["name"] for x in info["tiers"]} == {"paid", "free"}
    r = run("trace", "show", str(out))
    assert r.exit_code == 0 and "lengths (tokens)" in r.output and "tiers" in r.output


def test_show_with_fluid_verdict(tmp_path: Path) -> None:
    pytest.importorskip("harness.policies.fluid")
    from harness.engine.costmodel import presets

    out = tmp_path / "t.parquet"
    assert (
        run("trace", "build", "synthetic", "-n", "100", "--rate", "5", "-o", str(out)).exit_code
        == 0
    )
    r = run("trace", "show", str(out), "--cost-model", presets()[0], "--json")
    assert r.exit_code == 0, r.output
    fl = json.loads(r.output)["fluid"]
    assert (
        fl["available"]
        and "message" in fl
        and fl["rate"] == pytest.approx(json.loads(r.output)["offered_rate_rps"])
    )


@pytest.mark.parametrize(
    "args, msg",
    [
        (["trace", "show", "/nonexistent.parquet"], "no such trace file"),
        (["trace", "build", "nosuch", "--rate", "1", "-o", "x.parquet"], "unknown trace"),
        (
            [
                "trace",
                "build",
                "synthetic",
                "-n",
                "5",
                "--rate",
                "1",
                "--tiers",
                "a:0.3",
                "-o",
                "x.parquet",
            ],
            "sum to 0.3",
        ),
        (
            [
                "trace",
                "build",
                "synthetic",
                "-n",
                "5",
                "--rate",
                "1",
                "--opt",
                "bogus",
                "-o",
                "x.parquet",
            ],
            "KEY=VALUE",
        ),
        (
            [
                "trace",
                "build",
                "synthetic",
                "-n",
                "5",
                "--rate-schedule",
                "sine:1:5:10",
                "-o",
                "x.parquet",
            ],
            "AMP <= MEAN",
        ),
    ],
)
def test_errors_are_one_line_exit_2(
    args: list[str], msg: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    r = run(*args)
    assert r.exit_code == 2
    assert msg in r.output
    assert "Traceback" not in r.output
    assert len([ln for ln in r.output.splitlines() if ln.startswith("error:")]) == 1


def test_malformed_csv_via_cli(tmp_path: Path) -> None:
    f = tmp_path / "bad.csv"
    f.write_text("num_prefill_tokens,num_decode_tokens\n1,2\n3,-4\n")
    r = run("trace", "build", str(f), "--rate", "1", "-o", str(tmp_path / "o.parquet"))
    assert r.exit_code == 2
    assert "line 3" in r.output and "num_decode_tokens" in r.output
