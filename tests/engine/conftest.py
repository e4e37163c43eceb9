"""Fixtures for the engine tests."""

from __future__ import annotations

import pytest
from engine_traces import poisson_trace

from harness.workload.trace import Trace


@pytest.fixture
def small_trace() -> Trace:
    return poisson_trace(300, 30.0, seed=1)
