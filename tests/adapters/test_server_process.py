"""The engine-server child process: own process group (stops as one), the caller's session
(one scheduling autogroup with the load generator; see adapters/server_process.py)."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from adapters.server_process import EngineServer, LaunchError, running

# A stand-in engine: a stdlib HTTP server answering /health, with a child process of its own
# (as vLLM's engine core and SGLang's scheduler are children of their API servers).
SERVER = """
import http.server, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(sys.argv[2], "w").write(str(child.pid))
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


@dataclass
class FakeConfig:
    tmp: Path
    script: str = SERVER
    port: int | None = None
    log_path: Path | None = None
    ready_timeout_s: float = 30.0
    own_session: bool = False

    def command(self, port: int) -> list[str]:
        return [sys.executable, "-c", self.script, str(port), str(self.tmp / "child.pid")]

    def environment(self) -> dict[str, str]:
        return dict(os.environ)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); it has exited
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_server_has_its_own_group_in_the_callers_session(tmp_path: Path) -> None:
    server = EngineServer(FakeConfig(tmp_path, log_path=tmp_path / "log"))
    with running(server):
        pid = server.proc.pid
        assert os.getpgid(pid) == pid  # its own group: stop() kills the whole tree
        assert os.getpgid(pid) != os.getpgid(0)
        assert os.getsid(pid) == os.getsid(0)  # not setsid: same autogroup as the caller
        child = int((tmp_path / "child.pid").read_text())
        assert os.getpgid(child) == pid
    assert server.proc.poll() is not None
    # the group went with the leader: poll (bounded) until SIGKILL has taken the child
    deadline = time.monotonic() + 10
    while _alive(child):
        if time.monotonic() > deadline:
            pytest.fail("the server's child outlived stop()")
        time.sleep(0.01)


def test_own_session_puts_the_server_in_a_session_of_its_own(tmp_path: Path) -> None:
    server = EngineServer(FakeConfig(tmp_path, log_path=tmp_path / "log", own_session=True))
    with running(server):
        pid = server.proc.pid
        assert os.getsid(pid) == pid != os.getsid(0)
        assert os.getpgid(pid) == pid
    assert server.proc.poll() is not None


def test_a_server_that_exits_early_is_one_error_with_its_log(tmp_path: Path) -> None:
    cfg = FakeConfig(tmp_path, script="import sys; print('boom'); sys.exit(3)")
    server = EngineServer(cfg)
    with pytest.raises(LaunchError, match="exited with code 3"), running(server):
        pass
