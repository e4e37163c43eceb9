"""The prefix-caching conformance scenarios (harness.engine.conformance.PREFIX_SCENARIOS) against
real vLLM 0.32's scheduler and KV-cache manager, prefix caching on: the engine core's prefix
cache must behave as vLLM's does (admission hits, all-hit cap, LRU eviction, held blocks).

Runs in the vLLM venv: ``adapters.vllm.inproc`` builds a real ``HarnessScheduler`` with a fake
model runner; prompts are given as token ids, hashed by vLLM's own block hasher.
"""

from __future__ import annotations

import pytest
from vllm_testlib import marked_json, requires_vllm, run_in_vllm_venv

from harness.engine.conformance import PREFIX_SCENARIOS

pytestmark = [pytest.mark.slow, pytest.mark.vllm, requires_vllm, pytest.mark.timeout(600)]

CODE = """
import json, traceback
from adapters.vllm.inproc import VllmDriver, make_request, make_scheduler
from harness.engine.conformance import PREFIX_SCENARIOS

class PrefixDriver(VllmDriver):
    def add_prompt(self, request_id, token_ids, max_tokens):
        self.sched.add_request(make_request(self.sched, request_id, list(token_ids), max_tokens))
        return True

def factory(policy, spec):
    return PrefixDriver(make_scheduler(policy, block_size=spec.block_size,
        num_blocks=spec.num_blocks, token_budget=spec.token_budget,
        max_num_seqs=spec.max_num_seqs, prefix_caching=True))

res = {}
for s in PREFIX_SCENARIOS:
    try:
        s(factory)
        res[s.__name__] = "ok"
    except Exception:
        res[s.__name__] = traceback.format_exc()
print("PREFIX-JSON " + json.dumps(res))
"""


@pytest.fixture(scope="module")
def results() -> dict[str, str]:
    proc = run_in_vllm_venv(CODE)
    return marked_json(proc.stdout, "PREFIX-JSON ", proc.stdout[-2000:] + proc.stderr[-3000:])


@pytest.mark.parametrize("scenario", [s.__name__ for s in PREFIX_SCENARIOS])
def test_vllm_prefix_cache_conforms(results: dict[str, str], scenario: str) -> None:
    assert scenario in results, f"scenario {scenario} did not run"
    assert results[scenario] == "ok", results[scenario]
