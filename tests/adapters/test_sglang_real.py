"""The SGLang adapter against sglang 0.5.23's real classes (CPU only, no GPU stack).

Runs ``adapters/sglang/cpu_check.py`` with the interpreter of ``.venv-sglang`` (made by
``adapters/sglang/setup_cpu_venv.sh``: the pinned sglang wheel ``--no-deps`` plus the
packages its scheduler modules import) and checks what it reports. Skipped, with the reason,
when that venv is absent.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PY = Path(os.environ.get("SGLANG_VENV", ROOT / ".venv-sglang")) / "bin" / "python"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not PY.exists(), reason=f"no sglang venv at {PY} (setup_cpu_venv.sh)"),
]


@pytest.fixture(scope="module")
def result() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{ROOT / 'adapters' / 'sglang' / 'plugin_path'}"
    env["HARNESS_POLICY"] = "vllm"
    env.pop("SGLANG_PLUGINS", None)
    p = subprocess.run(
        [str(PY), "-m", "adapters.sglang.cpu_check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    tail = p.stdout.rsplit("@@RESULT@@", 1)
    assert len(tail) == 2, f"no result (rc {p.returncode}): {p.stderr[-2000:]}"
    out = json.loads(tail[1])
    assert "error" not in out, out["error"]
    return out


@pytest.mark.timeout(180)
def test_real_req_views(result: dict) -> None:
    assert result["sglang"] == "0.5.23"
    a, b, c = result["views"]
    assert a == {
        "id": "a",
        "tier": "paid",
        "ttft": 2.0,
        "tbt": 0.1,
        "prio": 0,
        "prompt": 12,
        "out": 0,
        "computed": 0,
        "max": 5,
        "preempt": 0,
    }
    assert (b["tier"], b["tbt"], b["prio"], b["max"]) == ("free", 0.5, 7, 9)
    assert (c["tier"], c["ttft"], c["prio"]) == ("default", None, 0)
    # SGLang's kv_committed_len after a prefill = the prompt: one token left (decoding).
    assert result["after_prefill"] == {"out": 1, "computed": 12, "remaining": 1}


@pytest.mark.timeout(180)
def test_plugin_is_discovered_and_hooks_the_real_scheduler(result: dict) -> None:
    assert result["patched"] == [
        "sglang.srt.managers.scheduler.Scheduler._add_request_to_queue",
        "sglang.srt.managers.scheduler.Scheduler.get_new_batch_prefill",
        "sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run",
    ]
    assert all(result["wrapped"].values())
    h = result["hook"]
    assert h["is_next_batch_plan"] and h["batch_to_run"] is None and h["same_running"]
    assert h["waiting"] == ["b", "c"] and h["running"] == ["a"]
    assert h["kv"] == [16, 64, 6]  # 1024 tokens / 16; free 900 + 36 evictable = 58 pages
    assert h["queue_after"] == ["b", "c"]
    assert result["report"] == {"decode": 1, "prefill": 0, "n_dec": 1, "first_token": 0.5}
