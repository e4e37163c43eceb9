"""The ``harness`` command turns numpy's huge-page advice off unless the user chose (each case
in a fresh interpreter: the setting is process-wide)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# main() with a command that does nothing much, then what numpy and the environment say
_PROBE = """
import os, sys
import numpy as np
from harness.cli import main as m
sys.argv = ["harness", "policies"]
try:
    m.main()
except SystemExit:
    pass
core = getattr(np, "_core", None) or np.core
now = core.multiarray._set_madvise_hugepage(True)  # returns the setting it replaces
print("RESULT", now, os.environ.get("NUMPY_MADVISE_HUGEPAGE"), file=sys.stderr)
"""


def _probe(env_value: str | None) -> tuple[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "NUMPY_MADVISE_HUGEPAGE"}
    if env_value is not None:
        env["NUMPY_MADVISE_HUGEPAGE"] = env_value
    p = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr[-2000:]
    line = next(ln for ln in p.stderr.splitlines() if ln.startswith("RESULT "))
    _, setting, value = line.split()
    return setting, value


def test_main_turns_numpy_huge_pages_off_for_itself_and_its_children() -> None:
    assert _probe(None) == ("False", "0")


@pytest.mark.parametrize("user", ["0", "1"])
def test_main_keeps_the_users_choice(user: str) -> None:
    setting, value = _probe(user)
    assert value == user
    assert setting == str(user == "1")  # numpy read it at import; main() left it alone
