"""Helpers shared by the server tests (a module with a unique name, not conftest, so that it
is importable without colliding with other folders' conftest modules)."""

from __future__ import annotations

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
