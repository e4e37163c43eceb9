"""A real engine server as a child process: start, wait for ``/health``, stop its group.

Shared by the vLLM and SGLang launchers (``adapters.vllm.launch``, ``adapters.sglang.launch``):
each supplies a config with ``command(port)``, ``environment()``, ``port``, ``log_path`` and
``ready_timeout_s``; the process handling (its own process group so the whole tree stops
together, fail-fast health polling with the log tail) is the same for both. Imports no engine.

The server stays in the caller's session on purpose. Linux groups CFS scheduling by session
("autogroup", on by default): a server in a session of its own (``setsid``) is scheduled as one
entity against the load generator's. On a small CPU box (2 cores, kernel 6.18) an engine's busy
processes in their own autogroup kept the client, the API server's readers and a plain sleeper
off the CPU for up to 2.5 s at a time (measured: run-queue waits in ``/proc/self/schedstat``),
so streamed chunks arrived in bursts and the next turns of a session trace went out late and
together. In the caller's session those waits vanished (no gap over 0.3 s in the same replay).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol


class LaunchError(RuntimeError):
    """The engine is not installed, or it died / never became healthy (message says which)."""


def free_port() -> int:
    """An ephemeral loopback port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerConfig(Protocol):
    port: int | None
    log_path: Path | None
    ready_timeout_s: float
    own_session: bool  # a session (CFS autogroup) of its own; see the module docstring

    def command(self, port: int) -> list[str]: ...

    def environment(self) -> dict[str, str]: ...


class EngineServer:
    """A running engine server process (its own process group, the caller's session)."""

    engine = "engine"  # for messages and the default log name
    health_path = "/health"

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg
        self.port = cfg.port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = cfg.command(self.port)
        self.log_path = cfg.log_path or Path(f"/tmp/{self.engine.lower()}-{self.port}.log")
        self._log = self.log_path.open("wb")
        # own_session: the engine in a scheduling group of its own, shielded from the client
        # and everything else on the box: steadier engine steps for engine-side measurements
        # (scripts/vllm-cpu/fidelity.py), at the cost of the starved client described above
        own_session = cfg.own_session
        self.proc = subprocess.Popen(
            self.command,
            cwd=str(Path(__file__).resolve().parents[1]),
            env=cfg.environment(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=own_session,
            process_group=None if own_session else 0,
        )

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, n: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    def wait_healthy(self, timeout_s: float | None = None) -> None:
        """Poll the health path until 200; fail fast (with the log tail) if the process exits."""
        import urllib.error
        import urllib.request

        limit = timeout_s or self.cfg.ready_timeout_s
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise LaunchError(
                    f"{self.engine} exited with code {self.proc.returncode} before becoming "
                    f"healthy; log {self.log_path}:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(self.url + self.health_path, timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.5)  # polling interval of a readiness probe, not synchronisation
        self.stop()
        raise LaunchError(f"{self.engine} not healthy after {limit:.0f}s; log {self.log_path}")

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM the server's process group, SIGKILL it after ``grace_s``."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        # Children that outlived the leader (SGLang's scheduler/detokenizer) go with the group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self._log.close()


@contextlib.contextmanager
def running(server: EngineServer) -> Iterator[EngineServer]:
    """Wait for health, yield the server, always stop it."""
    try:
        server.wait_healthy()
        yield server
    finally:
        server.stop()


def add_process_args(ap: argparse.ArgumentParser) -> None:
    """The launcher flags every engine shares: where it listens and logs, and how it runs."""
    ap.add_argument("--port", type=int, default=None, help="default: a free port")
    ap.add_argument("--log", type=Path, default=None, help="server log file")
    ap.add_argument("--detach", action="store_true", help="leave it running; print URL and exit")
    ap.add_argument("--pidfile", type=Path, default=None, help="with --detach: write the pid")
    ap.add_argument("--ready-timeout", type=float, default=300.0)


def parse_policy_params(text: str) -> dict[str, Any]:
    """``--policy-params`` as a JSON object; :class:`LaunchError` (one line) otherwise."""
    try:
        params = json.loads(text)
        if not isinstance(params, dict):
            raise ValueError("not an object")
    except ValueError as e:
        raise LaunchError(f"--policy-params: {e}") from None
    return params


def serve(make_server: Callable[[], EngineServer], args: argparse.Namespace) -> int:
    """Start the server, print its URL; with ``--detach`` leave it running, else serve until
    it exits or Ctrl-C. Start-up problems are one ``error:`` line and exit code 2."""
    try:
        server = make_server()
        server.wait_healthy()
    except LaunchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(server.url, flush=True)
    if args.detach:
        if args.pidfile:
            args.pidfile.write_text(f"{server.proc.pid}\n")
        return 0
    try:
        server.proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0
