"""Must-show (a): one trace through ``harness simulate`` (virtual time) and through a replay
against the built-in server (wall clock, real HTTP) gives matching TTFT and TBT
distributions, same policy, same cost model, same KV (harness.server.fidelity)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

# Above this server step lateness (p99, ms) the host was starved of CPU (2 shared cores) and
# the comparison measures the machine, not the server: the run is repeated, then skipped.
MAX_STEP_LATENESS_P99_MS = 10.0


async def test_simulate_and_replay_agree(tmp_path: Path):
    from harness.server.fidelity import compare
    from harness.workload import build_trace

    trace = build_trace(
        "synthetic",
        num_requests=200,
        rate=40.0,
        seed=11,
        input_len=200,
        output_len=40,
        range_ratio=0.5,
    )
    res = {}
    for attempt in range(3):
        # KV of 8192 tokens: admission is memory-bound and a few preemptions happen.
        res = await compare(
            trace,
            tmp_path / str(attempt),
            policy="vllm",
            kv_tokens=8192,
            speed=1.0,
            separate_process=True,
        )
        # The engine host alone is exact whatever the machine does (short of a resync): the
        # requests simulated at the server's own arrival stamps get identical token times.
        if res["server"]["resyncs"] == 0:
            assert res["engine_match"]["identical_share"] == 1.0, res["engine_match"]
        late = res["server"]["step_lateness"]["p99_ms"]
        if late <= MAX_STEP_LATENESS_P99_MS:
            break
    else:
        pytest.skip(f"machine too contended: server step lateness p99 {late:.1f} ms")
    sim, rep = res["sim_server_arrivals"], res["replay"]
    assert sim["completed"] == rep["completed"] == 200
    assert res["server"]["resyncs"] == 0
    # Against the simulation at the server's arrival stamps (same engine decisions), what a
    # client measures adds each request's delivery (send stamp -> server receipt: median
    # ~1 ms, p95 ~9 ms on this loaded 2-core machine) and emission/receipt lateness.
    # TPOT (a per-request mean) within 3%; TTFT and ITL quantiles within 10% of the simulated
    # value plus 8 ms (TTFT: delivery + first-token lateness) / 3 ms (ITL: jitter smearing the
    # simulator's point masses at exact step times), plus the server's own measured
    # step-lateness p99: on a contended machine a late wake-up shifts every quantile, the
    # median included, one for one (seen: TTFT median +7 to +10 ms at lateness p99 7-9 ms).
    assert rep["tpot_median_ms"] == pytest.approx(sim["tpot_median_ms"], rel=0.03)
    for m, slack in (("ttft", 8.0), ("itl", 3.0)):
        for q in ("median", "p90", "p99"):
            k = f"{m}_{q}_ms"
            allowed = 0.10 * sim[k] + slack + late
            assert abs(rep[k] - sim[k]) <= allowed, (k, rep[k], sim[k], allowed, res)
