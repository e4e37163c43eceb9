"""Fixtures for the built-in server tests: a tiny FCFS policy (so these tests do not depend on
the baseline policies' details) and a client session."""

from __future__ import annotations

import aiohttp
import pytest

from harness.policies.base import BasePolicy, Plan, View, remaining_tokens
from harness.policies.registry import _REGISTRY, register

TEST_POLICY = "server-test-fcfs"

if TEST_POLICY not in _REGISTRY:

    @register(TEST_POLICY)
    class _Fcfs(BasePolicy):
        """Run every running request (whole remaining prefill, else one decode), then admit
        waiting requests in arrival order; the host clips to budget and KV."""

        def schedule(self, view: View) -> Plan:
            run = [(r.request_id, remaining_tokens(r)) for r in view.running]
            admit = [(r.request_id, remaining_tokens(r)) for r in view.waiting]
            return Plan(run=run, admit=admit)


@pytest.fixture
async def session():
    async with aiohttp.ClientSession() as s:
        yield s
