"""The host conformance suite (harness.engine.conformance) against the vLLM adapter.

Runs in the vLLM venv (vLLM is not installed in the harness's own environment): one
subprocess (every snippet of this module: vllm_testlib.run_snippets_in_vllm_venv) drives a
real ``HarnessScheduler`` built from vLLM 0.32's own config, KV-cache manager and request
classes, with a fake model runner (``adapters.vllm.inproc``), through every scenario, and
reports each one.
"""

from __future__ import annotations

import pytest
from vllm_testlib import marked_json, requires_vllm, run_snippets_in_vllm_venv

from harness.engine.conformance import SCENARIOS

pytestmark = [pytest.mark.slow, pytest.mark.vllm, requires_vllm, pytest.mark.timeout(600)]


XARGS = """
import json, time
from vllm.sampling_params import SamplingParams
from vllm.v1.request import Request
from adapters.vllm.inproc import make_scheduler
from harness.policies.base import Plan
seen = {}
class Spy:
    name = "spy"
    def on_arrival(self, r, now): seen["arrival_now"] = now
    def schedule(self, v):
        for r in v.waiting:
            seen[r.request_id] = [r.tier, r.priority, r.ttft_slo_s, r.tbt_slo_s,
                                  r.num_prompt_tokens, r.max_tokens, r.predicted_output_len]
        return Plan()
    def on_step(self, rep): pass
s = make_scheduler(Spy(), block_size=16, num_blocks=32, token_budget=64, max_num_seqs=4)
xa = {"tier": "paid", "ttft_slo_ms": 1500, "tbt_slo_ms": 80}
s.add_request(Request("p", [1] * 9, SamplingParams(max_tokens=5, extra_args=xa), None,
                      arrival_time=time.time(), priority=0))
s.add_request(Request("f", [1] * 3, SamplingParams(max_tokens=2, extra_args={"tier": "free"}),
                      None, arrival_time=time.time(), priority=1))
s.add_request(Request("n", [1] * 4, SamplingParams(max_tokens=2), None, arrival_time=time.time()))
s.schedule()
print("VIEW-JSON " + json.dumps(seen))
"""

IDLE = """
import json
from adapters.vllm.inproc import VllmDriver, make_scheduler
from harness.policies.base import Plan
class Hold:
    name = "hold"
    release = False
    def on_arrival(self, r, now): pass
    def schedule(self, v):
        if not self.release:
            return Plan()
        return Plan(run=[(r.request_id, 1) for r in v.running],
                    admit=[(r.request_id, r.num_prompt_tokens) for r in v.waiting])
    def on_step(self, rep): pass
pol = Hold()
s = make_scheduler(pol, block_size=16, num_blocks=32, token_budget=64, max_num_seqs=4)
waits = []
s._idle_sleep = waits.append
d = VllmDriver(s)
d.step()                       # no requests: vLLM would block on its input queue, no wait
d.add_request("a", 8, 3)
for _ in range(3):
    d.step()                   # held back three times
held = list(waits)
pol.release = True
steps = 0
while s.requests and steps < 10:
    d.step(); steps += 1
print("IDLE-JSON " + json.dumps({"held": held, "after": waits[len(held):], "steps": steps,
                                 "left": len(s.requests), "idle_waits": s.idle_waits,
                                 "last_step_s": s._last_step_s}))
"""

PREFIX_HIT = """
import json
from adapters.vllm.inproc import make_request, make_scheduler
from harness.policies.base import Plan
from vllm.v1.outputs import ModelRunnerOutput
seen = {}
class Exact:
    name = "exact"
    def on_arrival(self, r, now): pass
    def schedule(self, v):
        for r in v.waiting:
            seen.setdefault(r.request_id, r.num_computed_tokens)
        return Plan(run=[(r.request_id, r.num_tokens - r.num_computed_tokens) for r in v.running],
                    admit=[(r.request_id, r.num_tokens - r.num_computed_tokens) for r in v.waiting])
    def on_step(self, rep): pass
s = make_scheduler(Exact(), block_size=16, num_blocks=32, token_budget=256, max_num_seqs=4,
                   prefix_caching=True)
def run(req):
    s.add_request(req)
    sched, cached = [], None
    while req.request_id in s.requests:
        so = s.schedule()
        ids = list(so.num_scheduled_tokens)
        sched.append(so.num_scheduled_tokens.get(req.request_id, 0))
        if cached is None:  # vLLM's computed count right after admission, minus what ran
            cached = req.num_computed_tokens - sched[0]
        smp = [[7] if s.requests[i].num_computed_tokens >= s.requests[i].num_tokens else []
               for i in ids]
        s.update_from_output(so, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={i: k for k, i in enumerate(ids)},
            sampled_token_ids=smp))
    return sched, cached
shared = list(range(100, 164))                   # 64 tokens = 4 full blocks
a = run(make_request(s, "a", shared + [1, 2, 3, 4, 5], 2))
b = run(make_request(s, "b", shared + [9] * 20, 2))   # same 4 blocks, another tail
print("PFX-JSON " + json.dumps({"seen": seen, "a": a, "b": b}))
"""

CONFORMANCE = """
import json, adapters.vllm.inproc as m
print("CONFORMANCE-JSON " + json.dumps(m.run_conformance()))
"""


@pytest.fixture(scope="module")
def outputs() -> dict[str, str]:
    """Every snippet of this module, run in one vLLM-venv process (one vLLM import)."""
    return run_snippets_in_vllm_venv(
        {"CONFORMANCE": CONFORMANCE, "XARGS": XARGS, "IDLE": IDLE, "PREFIX_HIT": PREFIX_HIT}
    )


@pytest.fixture(scope="module")
def results(outputs: dict[str, str]) -> dict[str, str]:
    out = outputs["CONFORMANCE"]
    return marked_json(out, "CONFORMANCE-JSON ")


@pytest.mark.parametrize("scenario", [s.__name__ for s in SCENARIOS])
def test_vllm_adapter_conforms(results: dict[str, str], scenario: str) -> None:
    assert scenario in results, f"scenario {scenario} did not run"
    assert results[scenario] == "ok", results[scenario]


def test_adapter_view_reads_vllm_xargs(outputs: dict[str, str]) -> None:
    """Tier, SLOs and priority reach the policy from the request's vllm_xargs / priority."""
    out = outputs["XARGS"]
    seen = marked_json(out, "VIEW-JSON ")
    assert seen["p"] == ["paid", 0, 1.5, 0.08, 9, 5, None]
    # no SLOs in the request: the project's default tier table (tiers.py) fills them in
    assert seen["f"] == ["free", 1, 10.0, 0.5, 3, 2, None]
    assert seen["n"] == ["default", 0, None, None, 4, 2, None]


def test_a_policy_holding_every_request_waits_instead_of_spinning(outputs: dict[str, str]) -> None:
    """vLLM's engine loop never blocks while it has requests, so an empty plan (a WAIT-style
    hold) must cost a bounded wait, one step's worth of time, not a spinning core; a step
    that runs something never waits."""
    out = outputs["IDLE"]
    got = marked_json(out, "IDLE-JSON ")
    assert got["held"] == [0.001, 0.001, 0.001]  # no step measured yet: the 1 ms floor
    assert got["after"] == [] and got["left"] == 0 and got["idle_waits"] == 3
    assert 1 <= got["steps"] <= 4


def test_prefix_cache_hit_counts_as_computed_in_the_view(outputs: dict[str, str]) -> None:
    """With prefix caching on, a waiting request whose prompt starts with a cached prefix shows
    that prefix as computed (vLLM's own count once it schedules it), so a policy plans only
    the tokens vLLM will compute: the plan asks for exactly the uncached rest, and vLLM
    schedules exactly that."""
    out = outputs["PREFIX_HIT"]
    got = marked_json(out, "PFX-JSON ")
    assert got["seen"] == {"a": 0, "b": 64}
    assert got["a"] == [[69, 1], 0]  # whole prompt, then one decode
    assert got["b"] == [[20, 1], 64]  # only the uncached tail; vLLM counted 64 as computed
