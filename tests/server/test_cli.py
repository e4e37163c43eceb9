"""``harness serve``: one-line errors for bad input, and a real process on an ephemeral port."""

from __future__ import annotations

import re
import socket
import subprocess
import sys

import httpx
import pytest
from typer.testing import CliRunner

from harness.cli.main import app

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--policy", "nope"], "unknown policy 'nope'"),
        (["--speed", "0"], "speed"),
        (["--faults", "drop=2"], "outside [0, 1]"),
        (["--cost-model", "nope"], "unknown cost model"),
        (["--kv-tokens", "3"], "less than one block"),
        (["--port", "70000"], "outside 0..65535"),
        (["--tiers", "paid:0.5"], "sum to"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, needle):
    res = CliRunner().invoke(app, ["serve", *args])
    assert res.exit_code == 2
    out = res.output.strip()
    assert needle in out and "Traceback" not in out
    assert len(out.splitlines()) <= 2  # one logical line (rich may wrap long ones)


def test_port_in_use_is_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = CliRunner().invoke(app, ["serve", "--port", str(port)])
    assert res.exit_code == 2 and "cannot listen" in res.output


def test_serve_process_answers_on_an_ephemeral_port():
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.cli.main", "serve", "--port", "0", "--api-key", "k"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed once the socket listens
        url = re.search(r"(http://127\.0\.0\.1:\d+)", line).group(1)
        assert httpx.get(url + "/health", timeout=10).status_code == 200
        assert httpx.get(url + "/v1/models", timeout=10).status_code == 401
        r = httpx.post(
            url + "/v1/completions",
            json={"prompt": "hello", "max_tokens": 3},
            headers={"Authorization": "Bearer k"},
            timeout=10,
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    finally:
        proc.terminate()
        proc.wait(timeout=20)
