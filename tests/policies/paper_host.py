"""Test helpers for the paper policies: hand-built Views and a tiny event loop over EngineCore.

``FakeReq`` satisfies RequestView for unit tests of single ``schedule`` calls; ``drive`` runs a
policy on the real engine core (virtual time, next-arrival jumps when idle) and calls a
checker after every step, so invariants are asserted on the real host semantics.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from harness.engine.config import EngineConfig
from harness.engine.core import EngineCore, StepOutcome
from harness.engine.costmodel import AffineCostModel
from harness.policies.base import KVView, Policy, View


@dataclass
class FakeReq:
    request_id: str
    num_prompt_tokens: int
    max_tokens: int
    arrival_s: float = 0.0
    num_output_tokens: int = 0
    num_computed_tokens: int = 0
    predicted_output_len: int | None = None
    tier: str = "free"
    priority: int = 1
    ttft_slo_s: float | None = None
    tbt_slo_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    num_preemptions: int = 0

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens


def decoding(rid: str, prompt: int, out: int, max_tokens: int, **kw: Any) -> FakeReq:
    """A request that has generated ``out`` tokens and holds KV for all but the last."""
    kw.setdefault("last_token_s", 0.0)
    return FakeReq(
        rid, prompt, max_tokens, num_output_tokens=out, num_computed_tokens=prompt + out - 1, **kw
    )


def make_view(
    waiting: Sequence[FakeReq] = (),
    running: Sequence[FakeReq] = (),
    *,
    now: float = 0.0,
    total_blocks: int = 10_000,
    used_blocks: int | None = None,
    block_size: int = 1,
    token_budget: int = 4096,
    max_num_seqs: int = 256,
) -> View:
    if used_blocks is None:
        used_blocks = sum(-(-r.num_computed_tokens // block_size) for r in running)
    return View(
        now=now,
        waiting=list(waiting),
        running=list(running),
        kv=KVView(block_size, total_blocks, used_blocks),
        token_budget=token_budget,
        max_num_seqs=max_num_seqs,
    )


LINEAR = AffineCostModel(name="test-linear", base_s=0.01, per_kv_s=1e-5)


def drive(
    policy: Policy,
    requests: Sequence[dict[str, Any]],
    *,
    kv_tokens: int = 100_000,
    block_size: int = 1,
    token_budget: int = 8192,
    max_num_seqs: int = 1024,
    cost_model: Any = LINEAR,
    check: Callable[[EngineCore, StepOutcome], None] | None = None,
    max_steps: int = 200_000,
    idle_tick_s: float = 0.05,
    known_output_lengths: bool = True,
) -> tuple[EngineCore, dict[str, dict[str, float]]]:
    """Run ``requests`` (dicts of add_request kwargs plus ``arrival_s``) to completion.

    Returns the core and per-request ``{"arrival", "first", "finish"}`` times. When the policy
    idles with nothing left to arrive, time advances by ``idle_tick_s`` (so flush timers fire).
    """
    cfg = EngineConfig(
        kv_tokens=kv_tokens,
        block_size=block_size,
        token_budget=token_budget,
        max_num_seqs=max_num_seqs,
        known_output_lengths=known_output_lengths,
    )
    core = EngineCore(policy, cost_model, cfg)
    pending = sorted(requests, key=lambda r: r["arrival_s"])
    times: dict[str, dict[str, float]] = {}
    i = 0
    now = 0.0
    for _ in range(max_steps):
        while i < len(pending) and pending[i]["arrival_s"] <= now:
            spec = dict(pending[i])
            rid = spec.pop("request_id")
            arrival = spec.pop("arrival_s")
            assert core.add_request(rid, arrival_s=arrival, **spec), core.rejections.get(rid)
            times[rid] = {"arrival": arrival}
            i += 1
        if not core.has_work():
            if i >= len(pending):
                return core, times
            now = pending[i]["arrival_s"]
            continue
        nxt = pending[i]["arrival_s"] if i < len(pending) else None
        out = core.step(now, fast_forward_until=nxt)
        assert not out.plan_bugs, out.plan_bugs
        if check is not None:
            check(core, out)
        for r in out.sampled:
            times[r.request_id].setdefault("first", float(out.step_ends[0]))
        for r in out.finished:
            times[r.request_id]["finish"] = out.end_s
        if out.idle and not out.preempted:
            now = nxt if nxt is not None and nxt > now else now + idle_tick_s
        elif not out.idle:
            now = out.end_s
    raise AssertionError("drive: max_steps reached")
