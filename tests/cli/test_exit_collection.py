"""``harness`` freezes the process's objects on its way out, so the interpreter's last full
collection skips them (each case in a fresh interpreter: freezing is process-wide)."""

from __future__ import annotations

import subprocess
import sys

import pytest

_PROBE = """
import gc, sys
from harness.cli import main as m
sys.argv = ["harness", *sys.argv[1:]]
before = gc.get_freeze_count()
code = 0
try:
    m.main()
except SystemExit as e:
    code = e.code
print("RESULT", before, gc.get_freeze_count() > 0, code, file=sys.stderr)
"""


@pytest.mark.parametrize(
    ("args", "code"),
    [(["policies"], 0), (["simulate", "--trace", "no-such-trace.csv", "--no-report"], 2)],
)
def test_main_freezes_on_the_way_out_and_keeps_the_exit_code(
    args: list[str], code: int, tmp_path
) -> None:
    p = subprocess.run(
        [sys.executable, "-c", _PROBE, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    line = next(ln for ln in p.stderr.splitlines() if ln.startswith("RESULT "))
    _, before, frozen, got = line.split()
    assert before == "0" and frozen == "True"
    assert int(got) == code, p.stderr[-2000:]
