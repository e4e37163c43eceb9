"""The built-in server embedded in another program: in this event loop (tests) or in a
spawned child process (``harness replay`` without ``--target``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

from harness.engine.costmodel import DEFAULT_COST_MODEL
from harness.server.app import start_server
from harness.server.cluster_host import make_config
from harness.server.config import ServerConfig


def embedded(
    policy: str = "vllm",
    cost_model: str = DEFAULT_COST_MODEL,
    kv_tokens: int | None = None,
    speed: float = 1.0,
    faults: str | None = None,
    *,
    process: bool = False,
    **kw: Any,
) -> contextlib.AbstractAsyncContextManager[str]:
    """Run the built-in server on a free 127.0.0.1 port; yield its base URL.

    ``process=False`` serves from this event loop (tests reach into the app). ``process=True``
    serves from a spawned child process, so that a load generator in this process and the
    engine loop never delay each other: measured with `harness replay --trace lmsys --rate 50`
    on 2 cores, the in-loop server pushed the client's send lag p99 to 256 ms, which marks the
    run invalid. Only built-in (importable) policies work in a child process.

    Extra keywords are :class:`ServerConfig` fields (``model``, ``api_key``, ``fault_log``,
    ``tiers``, ``engine``, ``policy_params``...). The server stops when the block exits.
    Bad settings raise :class:`ValueError` (one line) here, before the block is entered.
    """
    cfg = make_config(
        policy=policy, cost_model=cost_model, kv_tokens=kv_tokens, speed=speed, faults=faults, **kw
    )
    return _embedded_process(cfg) if process else _embedded(cfg)


def _die_with_parent(parent_pid: int) -> None:
    """Make this child process end when its parent does, however the parent ends (SIGKILL,
    OOM kill, crash), so no engine is left orphaned and listening (issue 14, point 3).

    Linux: ``prctl(PR_SET_PDEATHSIG, SIGTERM)``, then a re-check of the parent (it may have
    died before the call). Everywhere: a daemon thread that polls ``os.getppid()`` once a
    second and ends the process when the parent changed (reparented to init/a subreaper).
    """
    import os
    import signal
    import sys
    import threading
    import time

    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            import ctypes

            pr_set_pdeathsig = 1
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(0)

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent_pid:
                os._exit(0)

    threading.Thread(target=watch, name="harness-parent-watchdog", daemon=True).start()


def _child_main(cfg_json: str, conn: Any, parent_pid: int | None = None) -> None:
    """Entry point of the server child process: start, report the URL, serve until SIGTERM
    (or until the parent is gone: :func:`_die_with_parent`)."""
    import signal
    import sys

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # likewise (a closed terminal)
    if parent_pid is not None:
        _die_with_parent(parent_pid)
    cfg = ServerConfig.model_validate_json(cfg_json)

    async def main() -> None:
        runner, url = await start_server(cfg, "127.0.0.1", 0)
        conn.send(url)
        conn.close()
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    with contextlib.suppress(SystemExit):
        asyncio.run(main())


class EngineURL(str):
    """The child server's base URL, plus :meth:`exit_code` so that the run can tell whether
    its engine died while it was measuring (a run whose engine died is marked and warned
    about, not reported ``complete``)."""

    proc: Any

    def __new__(cls, url: str, proc: Any) -> EngineURL:
        obj = super().__new__(cls, url)
        obj.proc = proc
        return obj

    def exit_code(self) -> int | None:
        """None while the child runs, else its exit code (negative: killed by that signal)."""
        return None if self.proc.is_alive() else self.proc.exitcode


@contextlib.asynccontextmanager
async def _embedded_process(cfg: ServerConfig) -> AsyncIterator[str]:
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(
        target=_child_main,
        args=(cfg.model_dump_json(), child, os.getpid()),
        name="harness-serve",
        daemon=True,
    )
    proc.start()
    child.close()
    loop = asyncio.get_running_loop()
    try:
        if not await loop.run_in_executor(None, parent.poll, 120):
            raise RuntimeError("the built-in server did not start within 120 s")
        try:
            url = parent.recv()
        except EOFError:
            raise RuntimeError(
                f"the built-in server exited during start-up (exit code {proc.exitcode})"
            ) from None
        yield EngineURL(url, proc)
    finally:
        parent.close()
        proc.terminate()
        await loop.run_in_executor(None, proc.join, 10)
        if proc.is_alive():
            proc.kill()
            await loop.run_in_executor(None, proc.join, 5)


@contextlib.asynccontextmanager
async def _embedded(cfg: ServerConfig) -> AsyncIterator[str]:
    runner, url = await start_server(cfg, "127.0.0.1", 0)
    try:
        yield url
    finally:
        await runner.cleanup()
