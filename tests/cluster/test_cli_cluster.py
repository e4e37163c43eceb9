"""`harness simulate` on the cluster: run directories that `harness report` renders, agent
engines from the graph file, bad cluster flags as one error line."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from harness.cli.main import app
from harness.results import schema

runner = CliRunner()


def _run_dir(out: Path) -> Path:
    (d,) = [p for p in out.iterdir() if (p / schema.RUN_JSON).is_file()]
    return d


def test_replicas_and_router_write_a_session_run(tmp_path: Path) -> None:
    out = tmp_path / "o"
    args = [
        "simulate",
        "--trace",
        "synthetic-conv",
        "--num-sessions",
        "30",
        "--session-rate",
        "3",
        "--replicas",
        "2",
        "--router",
        "session-affinity",
        "--out",
        str(out),
    ]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    d = _run_dir(out)
    assert (d / "report.html").is_file()  # harness report rendered it
    req = pq.read_table(d / schema.REQUESTS_FILE)
    assert {"session_id", "call_index", "parents", "attempt"} <= set(req.column_names)
    samples = pq.read_table(d / schema.SAMPLES_FILE).to_pydict()
    assert set(samples["engine"]) == {"r0", "r1"}
    assert (d / schema.SESSIONS_FILE).is_file()
    meta = json.loads((d / schema.RUN_JSON).read_text())
    assert meta["cluster"]["router"] == "session-affinity"
    assert [e["name"] for e in meta["cluster"]["engines"]] == ["r0", "r1"]
    summary = json.loads((d / schema.SUMMARY_JSON).read_text())
    assert summary["sessions"]["sessions"] == 30


def test_agent_graph_engines_from_the_file(tmp_path: Path) -> None:
    graph = tmp_path / "tandem.yaml"
    graph.write_text(
        "name: tandem\n"
        "agents:\n"
        "  a1: {prompt_len: 'exp:64', output_len: 'exp:32',"
        " engine: {policy: sarathi, token_budget: 256, kv_tokens: 8192}}\n"
        "  a2: {prompt_len: 'exp:16', output_len: 'exp:64', engine: {replicas: 2}}\n"
        "calls:\n  - {agent: a1}\n  - {agent: a2, parents: [0]}\n",
        encoding="utf-8",
    )
    out = tmp_path / "o"
    args = [
        "simulate",
        "--trace",
        str(graph),
        "--num-sessions",
        "40",
        "--session-rate",
        "4",
        "--router",
        "least-outstanding-tokens",
        "--no-report",
        "--out",
        str(out),
    ]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    d = _run_dir(out)
    engines = json.loads((d / schema.RUN_JSON).read_text())["cluster"]["engines"]
    assert [(e["name"], e["agent"], e["policy"]) for e in engines] == [
        ("a1", "a1", "sarathi"),
        ("a2-0", "a2", "vllm"),
        ("a2-1", "a2", "vllm"),
    ]
    assert engines[0]["engine"]["token_budget"] == 256
    assert engines[0]["engine"]["capacity_tokens"] == 8192
    samples = pq.read_table(d / schema.SAMPLES_FILE).to_pydict()
    assert set(samples["engine"]) == {"a1", "a2-0", "a2-1"}


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--replicas", "0"], "--replicas"),
        (["--replicas", "2", "--router", "bogus"], "bogus"),
        (["--router-param", "seed=1"], "--router"),
        (["--replicas", "2", "--router", "random", "--router-param", "nope=1"], "nope"),
        (["--patience", "-1"], "--patience"),
        (["--agents", "/no/such.yaml"], "--agents"),
        (["--replicas", "2", "--processes", "0"], "--processes"),
    ],
)
def test_bad_cluster_flags(tmp_path: Path, extra: list[str], needle: str) -> None:
    args = [
        "simulate",
        "--trace",
        "synthetic-conv",
        "--num-sessions",
        "3",
        "--no-report",
        "--out",
        str(tmp_path / "o"),
        *extra,
    ]
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    errors = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and needle in errors[0], res.output


def _plain_cluster_run(tmp_path: Path, replicas: int, router: str) -> dict:
    """`harness simulate` of 200 synthetic requests over ``replicas`` engines: every request
    served, samples from every engine; returns run.json's ``cluster`` block."""
    out = tmp_path / "o"
    args = [
        "simulate", "--trace", "synthetic", "--num-requests", "200", "--rate", "20",
        "--replicas", str(replicas), "--router", router, "--no-report", "--out", str(out),
    ]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    d = _run_dir(out)
    req = pq.read_table(d / schema.REQUESTS_FILE).to_pydict()
    assert len(req["req"]) == 200 and all(req["success"])
    samples = pq.read_table(d / schema.SAMPLES_FILE).to_pydict()
    assert set(samples["engine"]) == {f"r{k}" for k in range(replicas)}
    return json.loads((d / schema.RUN_JSON).read_text())["cluster"]


def test_plain_trace_round_robin_splits(tmp_path: Path) -> None:
    assert _plain_cluster_run(tmp_path, 4, "round-robin")["split"] is True


def test_plain_trace_load_aware_router_runs_on_array_engines(tmp_path: Path) -> None:
    cluster = _plain_cluster_run(tmp_path, 3, "least-outstanding-tokens")
    assert cluster["array_engines"] is True and "split" not in cluster


def test_processes_flag_gives_the_same_run(tmp_path: Path) -> None:
    """--processes 1 (in this process) and --processes 2 (forked workers) write the same
    tables for a split cluster."""
    tables = {}
    for n in (1, 2):
        out = tmp_path / f"p{n}"
        args = [
            "simulate", "--trace", "synthetic", "--num-requests", "300", "--rate", "30",
            "--replicas", "3", "--router", "round-robin", "--processes", str(n),
            "--no-report", "--out", str(out),
        ]  # fmt: skip
        res = runner.invoke(app, args)
        assert res.exit_code == 0, res.output
        d = _run_dir(out)
        assert json.loads((d / schema.RUN_JSON).read_text())["cluster"]["split"] is True
        tables[n] = [pq.read_table(d / f) for f in (schema.REQUESTS_FILE, schema.CHUNKS_FILE)]
    assert all(a.equals(b) for a, b in zip(tables[1], tables[2], strict=True))
    assert tables[1][1].num_rows > 300
