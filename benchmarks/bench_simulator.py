"""Simulator speed and memory: a table for every registered policy, two workloads, and overload.

Usage (any part alone, so the table can be re-measured piece by piece on a quiet machine)::

    python benchmarks/bench_simulator.py [--requests 100000] [--policies all|vllm,rad]
        [--workloads lmsys,azure,overload] [--repeat 3] [--no-kernel] [--timeout 600]
        [--json OUT.json]
    python benchmarks/bench_simulator.py --readme-table LMSYS_AZURE.json OVERLOAD.json

Workloads (issue 13):

- ``lmsys``: the LMSYS-Chat lengths sample (lmsys_sample_lengths.csv), Poisson at 0.9 x
  capacity, where capacity C is ``vllm``'s saturated throughput on this engine configuration:
  finished requests / makespan with 5,000 requests offered at t = 0 (the definition of
  harness/experiments/capacity.py ``saturated_capacity``, on ``harness simulate``'s engine
  defaults rather than Vidur's).
- ``azure``: Azure LLM-inference 2023 conversation lengths, Poisson at 4 req/s.
- ``overload``: the lmsys lengths at 1.5 x the policy's *own* capacity; the run must finish
  within 60 s (``--overload-limit``) and its stability verdict (summary.json) must say
  ``unstable``: the ``check`` column says ``ok`` or what failed.

Per row: *whole process* = ``harness simulate --no-report`` in a child process (import, trace
build, simulate, run-directory and summary.json writing), its wall time and peak RSS (from
``wait4``); *kernel* = :func:`~harness.engine.simulate.simulate` alone in this process on the
same trace (token times kept in memory). Requests/s = requests / seconds. The header line gives
the load average and an interpreter probe (the seconds 10M additions take in a CPython loop,
before the table and after it): figures from a busy or slower machine are not comparable, and
the probe tells a slower sitting apart where the load average does not (a shared host's
neighbours are not in it). It reads only the interpreter's own loop, though: a sitting with
the fastest probe seen (0.29 s, 2026-12-02) ran one and the same commit of the simulator 1.4x
slower than the sitting of an earlier table; only the same code timed in both sittings
compares them. The header also says how many of the modules the install compiles
(harness/compiled.py) run compiled; ``HARNESS_INTERPRETED=1`` runs them all from source.

``--repeat N``: each workload's whole-process runs go round the policies N times (policy A, B,
..., then A, B, ... again) and each row gives the median wall time (its largest peak RSS), so
a drift of the machine's speed during the table reaches every row alike instead of the few
that ran while it lasted. The column ``x vllm`` divides a row's whole-process time by
``vllm``'s on the same workload in the same sitting (when ``vllm`` is in the table): the
figure that carries from one sitting to another on a machine whose speed drifts.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from harness import compiled
from harness.engine.costmodel import get_cost_model
from harness.engine.simulate import SimulateConfig, SimulationStalled, simulate
from harness.policies import make_policy
from harness.policies.registry import available
from harness.shared_data import shared_data_dir
from harness.workload import build_trace

LMSYS = str(shared_data_dir() / "lmsys_sample_lengths.csv")
AZURE = str(shared_data_dir() / "azure_conv_2023.csv")
HARNESS = str(Path(sys.executable).parent / "harness")


def capacity(trace: str, policy: str, cost_model: str, n: int = 5000, seed: int = 0) -> float:
    """Saturated throughput (req/s): finished requests / makespan, ``n`` requests at t = 0
    (harness/experiments/capacity.py's definition) on ``harness simulate``'s engine defaults."""
    econf = SimulateConfig(trace=trace, cost_model=cost_model).engine_config()
    probe = build_trace(trace, num_requests=n, rate=float("inf"), seed=seed, quiet=True)
    res = simulate(probe, make_policy(policy), get_cost_model(cost_model), econf)
    done = res.status == 1
    if not done.any():
        raise RuntimeError(f"{policy}: the capacity run finished nothing")
    return float(done.sum() / np.nanmax(res.last_s[done]))


# Runs the command from a small fresh process and prints its wall time and peak RSS: Linux
# keeps ru_maxrss across exec, so a child forked straight from this process (hundreds of MB
# after the kernel-only runs) would report at least this process's size as its own peak.
_LAUNCHER = """
import json, os, subprocess, sys, time
t0 = time.perf_counter()
p = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
_, st, ru = os.wait4(p.pid, 0)
wall = time.perf_counter() - t0
code = os.waitstatus_to_exitcode(st)
print(json.dumps({"wall_s": wall, "rss_mib": ru.ru_maxrss / 1024, "exit": code}))
"""


def whole_process(
    trace: str, rate: float, n: int, policy: str, cost_model: str, timeout: float, seed: int
) -> dict[str, Any]:
    """``harness simulate`` in a child: wall seconds, peak RSS (MiB), stability verdict."""
    with tempfile.TemporaryDirectory(prefix="bench-sim-") as out:
        cmd = [HARNESS, "simulate", "--trace", trace, "--rate", f"{rate}"]
        cmd += ["--num-requests", str(n), "--policy", policy, "--cost-model", cost_model]
        cmd += ["--seed", str(seed), "--no-report", "--out", out]
        p = subprocess.Popen(
            [sys.executable, "-c", _LAUNCHER, *cmd],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # a timeout kills the launcher and the run together
        )
        try:
            out_b, err_b = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
            return {"wall_s": None, "rss_mib": None, "verdict": None, "error": "timeout"}
        err = err_b.decode(errors="replace").strip().splitlines()
        if p.returncode != 0 or not out_b.strip():  # the launcher itself failed
            return {
                "wall_s": None,
                "rss_mib": None,
                "verdict": None,
                "error": err[-1] if err else "?",
            }
        got = json.loads(out_b)
        row: dict[str, Any] = {"wall_s": got["wall_s"], "rss_mib": got["rss_mib"], "verdict": None}
        if got["exit"] != 0:
            row["error"] = err[-1] if err else f"exit {got['exit']}"
            return row
        summaries = list(Path(out).glob("*/summary.json"))
        if summaries:
            stab = json.loads(summaries[0].read_text()).get("stability") or {}
            row["verdict"] = stab.get("verdict")
        return row


def kernel_only(trace: Any, src: str, policy: str, cost_model: str) -> dict[str, Any]:
    """The simulation loop alone (this process), wall and CPU seconds."""
    econf = SimulateConfig(trace=src, cost_model=cost_model).engine_config()
    w0, c0 = time.perf_counter(), time.process_time()
    try:
        r = simulate(trace, make_policy(policy), get_cost_model(cost_model), econf)
    except SimulationStalled as e:
        return {"kernel_s": None, "error": str(e)}
    return {
        "kernel_s": time.perf_counter() - w0,
        "kernel_cpu_s": time.process_time() - c0,
        "steps": r.num_steps,
        "policy_calls": r.num_calls,
        # which step ran it: the vectorised budget-rule kernel or the engine core
        "kernel": {"fast": "vectorised", "core": "engine core"}.get(r.counters["kernel"], "?"),
    }


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from repeated whole-process runs: the median wall time of those that finished
    (``runs``: the count of them), the largest peak RSS, the verdict of the median run; the
    first failure's row when any run failed (a failure is not averaged away)."""
    bad = [r for r in runs if r.get("error") is not None or r.get("wall_s") is None]
    if bad:
        return bad[0]
    ordered = sorted(runs, key=lambda r: r["wall_s"])
    mid = ordered[(len(ordered) - 1) // 2]
    walls = [r["wall_s"] for r in ordered]
    return {
        **mid,
        "wall_s": float(np.median(walls)),
        "rss_mib": max(r["rss_mib"] for r in runs),
        "runs": len(runs),
    }


def interpreter_probe(n: int = 10_000_000) -> float:
    """Seconds a CPython loop of ``n`` additions takes here (the module docstring: how fast
    the machine runs the interpreter in this sitting)."""
    t0 = time.perf_counter()
    s = 0
    for i in range(n):
        s += i
    return time.perf_counter() - t0


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


# issue 13's bars: whole-process requests/s on each workload, peak RSS (1 GB, read as 10**9
# bytes: the stricter reading), the overload run's wall time
TARGETS = {"lmsys": 20_000.0, "azure": 10_000.0}
RSS_LIMIT_MIB = 1e9 / 2**20
OVERLOAD_LIMIT_S = 60.0


def readme_table(rows: list[dict[str, Any]], n: int) -> list[str]:
    """The README's table (one line a policy: both workloads, their ``x vllm``, kernels, peak
    RSS and the overload run), from the rows of one or more ``--json`` files of ``n``
    requests, fastest on LMSYS first; then a line per bar a policy misses (``TARGETS``,
    ``RSS_LIMIT_MIB``, the overload check), or one saying none does. A row's ``requests``
    (written since) overrides ``n``."""
    by: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        wl = "overload" if r["workload"].startswith("lmsys ") else r["workload"]
        by.setdefault(r["policy"], {})[wl] = r

    def rate(r: dict[str, Any] | None, key: str) -> float | None:
        s = None if r is None else r.get(key)
        return r.get("requests", n) / s if s else None  # type: ignore[union-attr]

    def whole(r: dict[str, Any] | None) -> str:
        q = rate(r, "wall_s")
        return "-" if q is None else f"{r['wall_s']:.1f} s ({q / 1000:.1f}k)"  # type: ignore[index]

    def kernel(r: dict[str, Any] | None) -> str:
        q = rate(r, "kernel_s")
        return "-" if q is None else f"{q / 1000:.1f}k"

    out = [
        "| policy | step | LMSYS whole (req/s) | x `vllm` | LMSYS kernel | Azure whole | x `vllm` "
        "| Azure kernel | peak RSS MiB (LMSYS / Azure) | 1.5 x own capacity |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    misses: list[str] = []
    order = sorted(by, key=lambda p: by[p].get("lmsys", {}).get("wall_s") or math.inf)
    for pol in order:
        wl = by[pol]
        lm, az, ov = wl.get("lmsys"), wl.get("azure"), wl.get("overload")
        step = next((w["kernel"] for w in (lm, az) if w and w.get("kernel")), "-")
        rss = " / ".join(_fmt(w and w.get("rss_mib"), ".0f") for w in (lm, az))
        over = "-" if ov is None else f"{_fmt(ov.get('wall_s'), '.1f')} s, {ov.get('verdict')}"
        out.append(
            f"| `{pol}` | {step} | {whole(lm)} | {_fmt(lm and lm.get('x_vllm'), '.2f')} | "
            f"{kernel(lm)} | {whole(az)} | {_fmt(az and az.get('x_vllm'), '.2f')} | "
            f"{kernel(az)} | {rss} | {over} |"
        )
        for name, w in (("lmsys", lm), ("azure", az)):
            q = rate(w, "wall_s")
            if w is not None and (q is None or q < TARGETS[name]):
                misses.append(f"{pol} {name}: {_fmt(q, ',.0f')} req/s < {TARGETS[name]:,.0f}")
            if w is not None and (w.get("rss_mib") or math.inf) >= RSS_LIMIT_MIB:
                misses.append(f"{pol} {name}: peak RSS {_fmt(w.get('rss_mib'), '.0f')} MiB")
        if ov is not None and ov.get("check", "ok") != "ok":
            misses.append(f"{pol} overload: {ov.get('check')}")
    out += [f"# misses: {m}" for m in misses] or ["# every row meets issue 13's bars"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", "--num-requests", dest="requests", type=int, default=100_000)
    ap.add_argument("--policies", default="all", help="comma-separated, or 'all' registered")
    ap.add_argument("--workloads", default="lmsys,azure,overload", help="any of these three")
    ap.add_argument("--load", type=float, default=0.9, help="lmsys rate / capacity")
    ap.add_argument("--azure-rate", type=float, default=4.0)
    ap.add_argument("--overload", type=float, default=1.5, help="overload rate / own capacity")
    ap.add_argument("--overload-limit", type=float, default=60.0, help="s, whole process")
    ap.add_argument("--cost-model", default="a100-llama2-7b")
    ap.add_argument("--timeout", type=float, default=600.0, help="per whole-process run, s")
    ap.add_argument("--repeat", type=int, default=1, help="whole-process runs per row (median)")
    ap.add_argument("--no-kernel", action="store_true", help="skip the kernel-only timing")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    ap.add_argument(
        "--readme-table",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="run nothing: print the README's table from these --json files (and the bars missed)",
    )
    args = ap.parse_args()
    if args.readme_table:
        rows = [r for f in args.readme_table for r in json.loads(f.read_text())]
        print("\n".join(readme_table(rows, args.requests)))
        return

    known = available()
    policies = known if args.policies == "all" else args.policies.split(",")
    workloads = [w for w in args.workloads.split(",") if w]
    bad = [p for p in policies if p not in known] + [
        w for w in workloads if w not in ("lmsys", "azure", "overload")
    ]
    if bad:
        print(f"error: unknown policy or workload {bad[0]!r}", file=sys.stderr)
        sys.exit(2)
    if args.repeat < 1:
        print("error: --repeat must be >= 1", file=sys.stderr)
        sys.exit(2)
    n, cm = args.requests, args.cost_model
    cap_lmsys = capacity(LMSYS, "vllm", cm, seed=args.seed)
    rates = {"lmsys": (LMSYS, args.load * cap_lmsys), "azure": (AZURE, args.azure_rate)}
    print(
        f"# {n:,} requests, cost model {cm}; lmsys capacity (vllm) {cap_lmsys:.1f} req/s -> "
        f"{args.load} x = {rates['lmsys'][1]:.1f} req/s; azure {args.azure_rate} req/s; "
        f"overload {args.overload} x own capacity; whole process: median of {args.repeat}; "
        "load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
        f"interpreter probe {interpreter_probe():.2f} s; "
        f"compiled modules {len(compiled.runs_compiled())} of {len(compiled.MODULES)}",
        flush=True,
    )
    head = (
        "| policy | workload | rate req/s | whole s | whole req/s | x vllm | peak RSS MiB "
        "| kernel s | kernel req/s | steps | policy calls | kernel | verdict | check |"
    )
    print(head + "\n|" + "---|" * 14, flush=True)
    rows: list[dict[str, Any]] = []

    def emit(row: dict[str, Any]) -> None:
        rows.append(row)
        ws, ks = row.get("wall_s"), row.get("kernel_s")
        print(
            f"| {row['policy']} | {row['workload']} | {row['rate']:.1f} | {_fmt(ws, '.1f')} | "
            f"{_fmt(n / ws if ws else None, ',.0f')} | {_fmt(row.get('x_vllm'), '.2f')} | "
            f"{_fmt(row.get('rss_mib'), ',.0f')} | "
            f"{_fmt(ks, '.1f')} | {_fmt(n / ks if ks else None, ',.0f')} | "
            f"{row.get('steps', '-')} | {row.get('policy_calls', '-')} | "
            f"{row.get('kernel', '-')} | {row.get('verdict') or row.get('error', '-')} | "
            f"{row.get('check', '-')} |",
            flush=True,
        )
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))

    for wl in workloads:
        traces: dict[float, Any] = {}
        setups: dict[str, tuple[str, float, str]] = {}
        for pol in policies:
            if wl == "overload":
                src, rate = LMSYS, args.overload * capacity(LMSYS, pol, cm, seed=args.seed)
                label = f"lmsys {args.overload:g}x own capacity"
            else:
                (src, rate), label = rates[wl], wl
            setups[pol] = (src, rate, label)
        # the whole-process runs, round the policies --repeat times (module docstring)
        runs: dict[str, list[dict[str, Any]]] = {pol: [] for pol in policies}
        for _ in range(args.repeat):
            for pol in policies:
                src, rate, _label = setups[pol]
                runs[pol].append(whole_process(src, rate, n, pol, cm, args.timeout, args.seed))
        medians = {pol: median_run(runs[pol]) for pol in policies}
        base = medians.get("vllm", {}).get("wall_s")
        for pol in policies:
            src, rate, label = setups[pol]
            row: dict[str, Any] = {"policy": pol, "workload": label, "rate": rate, "requests": n}
            row.update(medians[pol])
            if base and row.get("wall_s"):
                row["x_vllm"] = row["wall_s"] / base
            if wl == "overload":
                fails = []
                if row.get("wall_s") is None or row["wall_s"] >= args.overload_limit:
                    fails.append(f">= {args.overload_limit:g} s")
                if row.get("verdict") != "unstable":
                    fails.append(f"verdict {row.get('verdict')}")
                row["check"] = "; ".join(fails) or "ok"
            if not args.no_kernel and row.get("error") is None:
                if rate not in traces:
                    traces = {
                        rate: build_trace(
                            src, num_requests=n, rate=rate, seed=args.seed, quiet=True
                        )
                    }
                row.update(kernel_only(traces[rate], src, pol, cm))
            emit(row)
    print(f"# interpreter probe after the table {interpreter_probe():.2f} s", flush=True)


if __name__ == "__main__":
    main()
