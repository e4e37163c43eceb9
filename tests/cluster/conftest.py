"""Small engines and traces for the cluster simulator tests (no files, no network)."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from harness.engine.cluster import EngineSpec
from harness.engine.config import EngineConfig
from harness.engine.costmodel import get_cost_model
from harness.policies import make_policy
from harness.workload.tiers import parse_tiers
from harness.workload.trace import Trace

TIERS = parse_tiers("default:1")


def engines(n: int, policy: str = "vllm", kv_tokens: int = 1 << 16, **kw: Any) -> list[EngineSpec]:
    cm = get_cost_model("a100-llama2-7b")
    return [
        EngineSpec(f"r{i}", make_policy(policy), cm, EngineConfig(kv_tokens=kv_tokens, **kw))
        for i in range(n)
    ]


def session_trace(rows: list[dict[str, Any]]) -> Trace:
    """A session trace from rows with session_id, call_index, parents, think_s, prompt_len,
    output_len, arrival_s (optional: agent, context, system)."""
    df = pd.DataFrame(rows)
    df["request_id"] = df["session_id"].astype(str) + "/" + df["call_index"].astype(str)
    df["tier"] = "default"
    for col, default in (("context", "history"), ("think_s", 0.0), ("parents", "")):
        if col not in df.columns:
            df[col] = default
    df = df.sort_values("arrival_s", kind="stable").reset_index(drop=True)
    return Trace.from_frame(df, TIERS, {"source": "test", "sessions": True})


@pytest.fixture
def chain_trace() -> Trace:
    """Two 3-turn conversations (think 1 s), arriving at 0 and 0.5 s."""
    rows = []
    for s, arr in (("a", 0.0), ("b", 0.5)):
        for k in range(3):
            rows.append(
                {
                    "session_id": s,
                    "call_index": k,
                    "parents": "" if k == 0 else str(k - 1),
                    "think_s": 0.0 if k == 0 else 1.0,
                    "prompt_len": 50 + 10 * k,
                    "output_len": 20,
                    "arrival_s": arr,
                }
            )
    return session_trace(rows)
