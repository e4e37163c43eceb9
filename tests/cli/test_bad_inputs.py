"""A battery of bad inputs (issue 14, "Must show"): each ends with exactly one ``error:`` line,
the documented exit code and no traceback; where a run directory was there before, every one
of its rows survives."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from harness.cli.main import app
from harness.results import schema
from harness.results.rundir import RunWriter, read_run

runner = CliRunner()
SYN = ["replay", "--trace", "synthetic", "--rate", "5", "--no-progress"]


def _one_error(args: list[str], needle: str, code: int = 2) -> str:
    res = runner.invoke(app, args)
    text = res.output  # stdout and stderr, mixed
    assert res.exit_code == code, text
    assert "Traceback" not in text and not isinstance(res.exception, AssertionError)
    errors = [ln for ln in text.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, text
    assert needle in errors[0], errors[0]
    return errors[0]


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--rate", "0"], "--rate"),
        (["--seed", "-1"], "--seed"),
        (["--num-requests", "0"], "--num-requests"),
        (["--duration", "-1"], "--duration:"),
        (["--timeout", "0"], "--timeout:"),
        (["--drain-timeout", "-1"], "--drain-timeout:"),
        (["--goodput", "bogus:5"], "--goodput"),
        (["--extra-body", "[1]"], "--extra-body"),
        (["--endpoint", "generate"], "--engine sglang"),
        (["--endpoint", "nope"], "--endpoint"),
        (["--arrival", "trace"], "drop --rate"),
        (["--source-option", "noeq"], "key=value"),
        (["--source-option", "bogus=1"], "unknown option"),
        (["--source-option", "input_len=1000000000000"], "maximum of 1048576"),
        (["--burstiness", "0"], "--burstiness"),
        (["--tiers", "paid:2"], "--tiers"),
    ],
)
def test_replay_flag_errors(extra: list[str], needle: str) -> None:
    _one_error([*SYN, *extra], needle)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    f: dict[str, Path] = {}
    f["big"] = tmp_path / "big.csv"
    f["big"].write_text("num_prefill_tokens,num_decode_tokens\n10,5\n1000000000000,5\n")
    f["latin1"] = tmp_path / "latin1.csv"
    f["latin1"].write_bytes(b"num_prefill_tokens,num_decode_tokens\n10,5\n12,5\n1\xe90,5\n")
    f["badjson"] = tmp_path / "bad.jsonl"
    f["badjson"].write_text('{"prompt_len": 10, "output_len": 5}\n{"prompt_len": 10\n')
    f["neg"] = tmp_path / "neg.csv"
    f["neg"].write_text("num_prefill_tokens,num_decode_tokens\n10,-5\n")
    f["bigjsonl"] = tmp_path / "big.jsonl"
    f["bigjsonl"].write_text('{"prompt_len": 10, "output_len": 5000000}\n')
    f["file"] = tmp_path / "a-file"
    f["file"].write_text("x")
    return f


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("big", "line 3: field 'num_prefill_tokens'=1000000000000 is above the maximum"),
        ("latin1", "line 4: not UTF-8"),
        ("badjson", "line 2"),
        ("neg", "line 2"),
        ("bigjsonl", "line 1: field 'output_len'=5000000 is above the maximum"),
    ],
)
def test_bad_trace_files_name_the_line(files: dict[str, Path], name: str, needle: str) -> None:
    _one_error(["replay", "--trace", str(files[name]), "--rate", "5"], needle)
    # `trace build` reads the same rows through the same checks
    out = files["file"].parent / f"{name}.parquet"
    _one_error(["trace", "build", str(files[name]), "--rate", "5", "--out", str(out)], needle)
    assert not out.exists()


def test_missing_and_directory_traces(tmp_path: Path) -> None:
    _one_error([*SYN[:1], "--trace", str(tmp_path / "nope.csv"), "--rate", "5"], "no such")
    _one_error([*SYN[:1], "--trace", str(tmp_path), "--rate", "5"], "is a directory")


def test_edited_frozen_trace_is_refused(tmp_path: Path) -> None:
    frozen = tmp_path / "t.parquet"
    res = runner.invoke(
        app,
        ["trace", "build", "synthetic", "--rate", "5", "--num-requests", "20",
         "--out", str(frozen)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    t = pq.read_table(frozen)
    i = t.schema.get_field_index("output_len")
    col = t.column(i).to_pylist()
    col[3] += 1  # one edited value; the file's stored content hash no longer matches
    t2 = t.set_column(i, t.schema.field(i), pa.array(col, t.schema.field(i).type))
    pq.write_table(t2.replace_schema_metadata(t.schema.metadata), frozen)
    _one_error(["replay", "--trace", str(frozen), "--no-progress"], "content hash mismatch")


def _old_run(path: Path) -> int:
    with RunWriter(path, {"kind": "replay"}) as w:
        for i in range(7):
            w.add_request({"req": i, "request_id": f"r{i}", "success": True})
    return 7


def test_existing_run_dir_is_refused_and_kept(tmp_path: Path, files: dict[str, Path]) -> None:
    old = tmp_path / "old"
    n = _old_run(old)
    _one_error([*SYN, "--out", str(old)], "--force")
    assert len(read_run(old).requests) == n  # every row of the old run survives
    notrun = tmp_path / "notrun"
    notrun.mkdir()
    (notrun / "keep.txt").write_text("mine")
    _one_error([*SYN, "--out", str(notrun), "--force"], "holds no run")
    assert (notrun / "keep.txt").read_text() == "mine"
    _one_error([*SYN, "--out", str(files["file"])], "is a file")


def test_corrupt_run_json_names_the_file(tmp_path: Path) -> None:
    d = tmp_path / "run"
    _old_run(d)
    (d / schema.RUN_JSON).write_text('{"status": "compl')
    _one_error(["report", str(d)], str(d / schema.RUN_JSON))


def test_simulate_errors(tmp_path: Path, files: dict[str, Path]) -> None:
    sim = ["simulate", "--trace", "synthetic", "--rate", "5", "--num-requests", "5"]
    _one_error([*sim, "--out", str(files["file"])], "is a file")
    out = str(tmp_path / "s")
    _one_error([*sim, "--policy", "sarathi", "--param", "sarthi.order=spf", "--out", out],
               "unknown policy 'sarthi'; choose from:")  # fmt: skip
    _one_error([*sim, "--policy", "sarathi", "--param", "sarathi.bogus=1", "--out", out],
               "valid: order, chunk_size")  # fmt: skip
    _one_error([*sim, "--policy", "sarathi", "--param", "vllm.order=1", "--out", out],
               "not in this run")  # fmt: skip
    _one_error([*sim, "--policy", "sarathi", "--param", "sarathi", "--out", out],
               "POLICY.NAME=VALUE")  # fmt: skip
    # values parse as JSON: a word where a number goes fails here, not inside the policy
    _one_error([*sim, "--policy", "wait", "--param", "wait.flush_after_s=none", "--out", out],
               "wait.flush_after_s='none': expected a number or null")  # fmt: skip
    _one_error([*sim, "--policy", "sarathi", "--param", "sarathi.chunk_size=big", "--out", out],
               "expected a number")  # fmt: skip
    _one_error([*sim, "--policy", "slai", "--param", "slai.dynamic_offset=1", "--out", out],
               "expected true or false")  # fmt: skip


@pytest.fixture
def locked_server() -> Iterator[str]:
    """A real local HTTP server that answers every request 401 (a target behind a key)."""

    class H(http.server.BaseHTTPRequestHandler):
        def _deny(self) -> None:
            body = json.dumps({"error": "unauthorized"}).encode()
            self.send_response(401)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _deny

        def log_message(self, *a: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize("with_model", [False, True])
def test_unauthorized_target(locked_server: str, tmp_path: Path, with_model: bool) -> None:
    out = tmp_path / "run"
    extra = ["--model", "m"] if with_model else []
    _one_error(
        [*SYN, "--num-requests", "3", "--target", locked_server, "--out", str(out), *extra],
        "unauthorized: pass --api-key or HARNESS_API_KEY",
    )
    assert not (out / schema.RUN_JSON).exists()


def test_bracketed_run_dir_and_warning_print_as_typed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A path or warning holding ``[...]`` is text, not rich markup: ``[/x]`` used to raise
    MarkupError (a traceback after the run) and ``[exp]`` vanished from the printed path."""
    import subprocess
    import sys

    from harness.cli.errors import warn

    warn("trace /tmp/[/odd]/t.csv [exp]")
    assert "warning: trace /tmp/[/odd]/t.csv [exp]" in capsys.readouterr().err
    out = tmp_path / "[exp] [/odd]"
    args = [*SYN, "--rate", "50", "--num-requests", "3", "--no-gpu", "--out", str(out)]
    harness = [sys.executable, "-m", "harness.cli.main"]
    proc = subprocess.run([*harness, *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert f"run directory: {out}" in proc.stdout
    assert len(read_run(out).requests) == 3
