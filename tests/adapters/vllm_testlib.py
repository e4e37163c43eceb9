"""Helpers for the vLLM adapter tests: where the vLLM venv lives, and a clean skip without it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
VLLM_VENV = Path(os.environ.get("VLLM_VENV") or ROOT / ".venv-vllm")
VLLM_PY = VLLM_VENV / "bin" / "python"
TINY_MODEL = Path(os.environ.get("TINY_MODEL_DIR") or ROOT / ".cache" / "tiny-llama")
SETUP_CMD = "scripts/vllm-cpu/setup.sh"


def vllm_missing_reason() -> str | None:
    """Why the real-vLLM tests cannot run here, or None when they can."""
    if not (VLLM_PY.exists() and (VLLM_VENV / ".harness-ok").exists()):
        return f"vLLM-CPU venv missing ({VLLM_VENV}); run {SETUP_CMD}"
    if not (TINY_MODEL / "config.json").exists():
        return f"tiny model missing ({TINY_MODEL}); run {SETUP_CMD}"
    return None


requires_vllm = pytest.mark.skipif(
    vllm_missing_reason() is not None, reason=vllm_missing_reason() or ""
)


# The settings documented in scripts/vllm-cpu/setup.sh (and the ones the process needs to
# find its tools and temp space): passed through so a model or venv elsewhere is still found.
PASSED_ENV = ("TINY_MODEL_DIR", "VLLM_VENV", "VLLM_CPU_KVCACHE_SPACE", "HOME", "TMPDIR", "LANG")


def vllm_venv_env() -> dict[str, str]:
    """The environment of a vLLM-venv subprocess: a clean one plus :data:`PASSED_ENV`."""
    env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
    env.update({"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    env.setdefault("TINY_MODEL_DIR", str(TINY_MODEL))
    env.setdefault("VLLM_VENV", str(VLLM_VENV))
    return env


def run_in_vllm_venv(code: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run a Python snippet with the vLLM venv's interpreter (repo root on the path)."""
    return subprocess.run(
        [str(VLLM_PY), "-c", code],
        cwd=str(ROOT),
        env=vllm_venv_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


SNIPPETS_MARKER = "SNIPPETS-JSON "

_SNIPPETS_RUNNER = """
import contextlib, io, json, traceback
out = {}
for name, code in json.loads(SNIPPETS).items():
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            exec(compile(code, name, "exec"), {"__name__": "__snippet__"})
        out[name] = {"stdout": buf.getvalue(), "error": None}
    except BaseException:
        out[name] = {"stdout": buf.getvalue(), "error": traceback.format_exc()}
print(MARKER + json.dumps(out))
"""


def marked_json(text: str, marker: str, context: str | None = None) -> Any:
    """The JSON after the last line of ``text`` that starts with ``marker`` (the snippets'
    way of reporting); asserts there is one, showing ``context`` (default: ``text``)."""
    lines = [ln for ln in text.splitlines() if ln.startswith(marker)]
    assert lines, text if context is None else context
    return json.loads(lines[-1].removeprefix(marker))


def run_snippets_in_vllm_venv(snippets: dict[str, str], timeout: float = 600) -> dict[str, str]:
    """Run several independent snippets in one vLLM-venv interpreter, each in a namespace of
    its own, and return each one's stdout. One process, because importing vLLM costs 7-15 s
    on 2 cores; a snippet that raises fails with its own traceback and the others still run."""
    code = f"SNIPPETS = {json.dumps(json.dumps(snippets))}\nMARKER = {SNIPPETS_MARKER!r}\n"
    proc = run_in_vllm_venv(code + _SNIPPETS_RUNNER, timeout=timeout)
    got = marked_json(proc.stdout, SNIPPETS_MARKER, proc.stdout[-2000:] + proc.stderr[-3000:])
    out: dict[str, str] = {}
    for name in snippets:
        res = got[name]
        out[name] = res["stdout"] if res["error"] is None else "SNIPPET-ERROR " + res["error"]
    return out
