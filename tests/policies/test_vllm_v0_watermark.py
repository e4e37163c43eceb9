"""vllm-v0 keeps vLLM v0's and Vidur's 1% free-block watermark at admission (issue 19)."""

from __future__ import annotations

from paper_host import FakeReq, decoding, make_view

from harness.policies.registry import make_policy


def _view(running: bool):
    run = [decoding("d0", 100, 5, 200)] if running else []
    wait = [FakeReq("w0", 160, 10)]  # 10 blocks of 16
    return make_view(wait, run, total_blocks=1000, used_blocks=985, block_size=16)


def test_watermark_blocks_admission_that_would_eat_the_last_percent():
    # 15 free blocks - 10 reserved (1% of 1000) = 5 < 10 needed: held back
    assert make_policy("vllm-v0").schedule(_view(True)).admit == []
    # without the watermark the same prompt is admitted
    plan = make_policy("vllm-v0", watermark=0.0).schedule(_view(True))
    assert plan.admit == [("w0", 160)]


def test_watermark_waived_when_nothing_runs():
    assert make_policy("vllm-v0").schedule(_view(False)).admit == [("w0", 160)]
