"""Fixtures shared by every test folder.

Child processes started by tests inherit ``PYTHONFAULTHANDLER=1``: a harness process that
hangs can then be made to print every thread's stack (SIGABRT), so a test that times out
says where the child was stuck, not only that it was.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable

import pytest

os.environ.setdefault("PYTHONFAULTHANDLER", "1")


def _stop(proc: subprocess.Popen[str], sig: int, timeout_s: float) -> tuple[str, str]:
    proc.send_signal(sig)
    try:
        return proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)  # faulthandler dumps every thread, then it dies
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        pytest.fail(
            f"still running {timeout_s:.0f} s after {signal.Signals(sig).name}; its threads:\n"
            + (err or "")[-8000:]
        )


@pytest.fixture
def signal_and_wait() -> Callable[[subprocess.Popen[str], int, float], tuple[str, str]]:
    """``signal_and_wait(proc, sig, timeout_s)``: send ``sig``, return (stdout, stderr); a
    child still alive after ``timeout_s`` fails the test with its threads' stacks."""
    return _stop


def _fresh_python(code: str, *, stale: tuple[str, str] | None = None, **env: str) -> list[str]:
    """Run ``code`` in a new interpreter (import-time choices: built extensions, environment
    switches) with ``env`` added to this one's; its stdout's words. ``stale``: ``(module,
    name)``, an extension module that holds only ``name`` stands in for ``module`` (an
    install built before its other passes were added)."""
    if stale is not None:
        module, name = stale
        code = (
            f"import sys, types; m = types.ModuleType({module!r}); m.{name} = len;"
            f"sys.modules[{module!r}] = m;" + code
        )
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()


@pytest.fixture
def fresh_python() -> Callable[..., list[str]]:
    """``fresh_python(code, *, stale=None, **env)``: ``code``'s stdout words from a new
    interpreter (:func:`_fresh_python`)."""
    return _fresh_python
