"""The host conformance suite run against the engine core (other hosts reuse SCENARIOS)."""

from __future__ import annotations

import pytest

from harness.engine.conformance import SCENARIOS, core_factory, reference_core_factory


@pytest.mark.parametrize("factory", [core_factory, reference_core_factory], ids=["core", "ref"])
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
def test_engine_core_conforms(scenario, factory) -> None:
    scenario(factory)
