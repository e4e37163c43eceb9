"""Drive the adapter against SGLang's real classes on a CPU-only machine; print JSON results.

Run with the interpreter of a venv that has the pinned sglang installed without its GPU
stack (``adapters/sglang/setup_cpu_venv.sh``), with the plugin folder on ``PYTHONPATH``::

    PYTHONPATH=.:adapters/sglang/plugin_path .venv-sglang/bin/python -m adapters.sglang.cpu_check

What runs for real: sglang's ``Req``, ``SamplingParams``, ``ReqKvInfo``, ``ScheduleBatch``,
``ForwardMode``, ``NextBatchPlan``; its plugin discovery (``load_plugins`` → our entry point
from ``plugin_path``) and ``HookRegistry`` patching the real ``Scheduler`` class. What does not:
a real ``Scheduler`` instance (it needs a model runner and GPU memory pools), so the
scheduler object below is a stand-in holding real ``Req``s; the original
``get_new_batch_prefill`` is never reached in the hook path exercised here (the policy holds
admission, so the host answers "decode" itself). ``tests/adapters/test_sglang_real.py``
asserts on the output.
"""

from __future__ import annotations

import json
import os
import sys
from array import array
from types import SimpleNamespace
from typing import Any


def _req(rid: str, prompt: int, max_new: int, cp: dict[str, Any] | None, prio: int | None) -> Any:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    sp = SamplingParams(max_new_tokens=max_new, ignore_eos=True, custom_params=cp)
    return Req(rid, "x " * prompt, array("q", range(prompt)), sp, priority=prio)


def main() -> dict[str, Any]:
    import sglang
    from adapters.sglang.host import SGLangHost
    from adapters.sglang.plugin import HOOKED
    from adapters.sglang.view import SglRequestView
    from harness.policies.base import Plan
    from sglang.srt.managers.schedule_batch import NextBatchPlan, ScheduleBatch
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.plugins import load_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry

    out: dict[str, Any] = {"sglang": sglang.__version__}

    # 1. Views over real Reqs.
    paid = _req("a", 12, 5, {"tier": "paid", "ttft_slo_ms": 2000.0, "tbt_slo_ms": 100.0}, 0)
    free = _req("b", 7, 9, {"tier": "free", "tbt_slo_ms": 500.0}, 7)
    plain = _req("c", 3, 4, None, None)
    va, vb, vc = (SglRequestView(r, 1.0) for r in (paid, free, plain))
    out["views"] = [
        {
            "id": v.request_id,
            "tier": v.tier,
            "ttft": v.ttft_slo_s,
            "tbt": v.tbt_slo_s,
            "prio": v.priority,
            "prompt": v.num_prompt_tokens,
            "out": v.num_output_tokens,
            "computed": v.num_computed_tokens,
            "max": v.max_tokens,
            "preempt": v.num_preemptions,
        }
        for v in (va, vb, vc)
    ]
    # Simulate SGLang's own accounting after a prefill and one sampled token.
    paid.kv.kv_committed_len = 12
    paid.output_ids.append(42)
    out["after_prefill"] = {
        "out": va.num_output_tokens,
        "computed": va.num_computed_tokens,
        "remaining": va.num_tokens - va.num_computed_tokens,
    }

    # 2. Plugin discovery through the dist-info on PYTHONPATH, and the real HookRegistry.
    load_plugins()
    out["patched"] = sorted(t for t in HookRegistry._patched if t.endswith(HOOKED))
    out["wrapped"] = {n: hasattr(getattr(Scheduler, n), "__wrapped__") for n in HOOKED}

    # 3. The patched real Scheduler.get_new_batch_prefill on a stand-in scheduler whose
    #    policy holds admission: the host answers with a real NextBatchPlan (decode step).
    class Hold:
        name = "hold"

        def __init__(self) -> None:
            self.views: list[Any] = []
            self.arrivals: list[str] = []

        def on_arrival(self, r: Any, now: float) -> None:
            self.arrivals.append(r.request_id)

        def schedule(self, view: Any) -> Plan:
            self.views.append(view)
            return Plan()

        def on_step(self, report: Any) -> None:
            pass

    hold = Hold()
    alloc = SimpleNamespace(available_size=lambda: 900)
    tree = SimpleNamespace(evictable_size=lambda: 36)
    running = ScheduleBatch(reqs=[paid], forward_mode=ForwardMode.DECODE)
    sched = SimpleNamespace(
        waiting_queue=[free, plain],
        chunked_req=None,
        max_total_num_tokens=1024,
        page_size=16,
        token_to_kv_pool_allocator=alloc,
        tree_cache=tree,
        max_prefill_tokens=4096,
        max_running_requests=32,
        enable_overlap=False,
        _harness_host=SGLangHost(hold),
    )
    res = Scheduler.get_new_batch_prefill(sched, running)
    v = hold.views[-1]
    out["hook"] = {
        "plan_type": type(res).__name__,
        "is_next_batch_plan": isinstance(res, NextBatchPlan),
        "batch_to_run": res.batch_to_run,
        "same_running": res.running_batch is running,
        "waiting": [w.request_id for w in v.waiting],
        "running": [w.request_id for w in v.running],
        "kv": [v.kv.block_size, v.kv.total_blocks, v.kv.used_blocks],
        "queue_after": [r.rid for r in sched.waiting_queue],
    }
    # 4. The step report path with a real ScheduleBatch / ForwardMode: a decode step that
    #    produced one token for "a".
    host = sched._harness_host
    pend = host._record(running, [paid], 0.0, ())
    paid.output_ids.append(43)
    seen: list[Any] = []
    hold.on_step = seen.append  # type: ignore[method-assign]
    host._report(sched, pend, 0.5)
    rep = seen[-1]
    out["report"] = {
        "decode": rep.decode_tokens,
        "prefill": rep.prefill_tokens,
        "n_dec": rep.num_decode_seqs,
        "first_token": host.views["a"].first_token_s if "a" in host.views else None,
    }
    return out


if __name__ == "__main__":
    os.environ.setdefault("HARNESS_POLICY", "vllm")
    try:
        result = main()
    except Exception as exc:  # report the exact failure for the test to show
        result = {"error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write("\n@@RESULT@@" + json.dumps(result, default=str) + "\n")
