"""Fixtures for the vLLM adapter tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def harness_cli() -> list[str]:
    """The ``harness`` console script of the environment running the tests."""
    exe = Path(sys.executable).parent / "harness"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "harness.cli.main"]
