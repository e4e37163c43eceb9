"""`harness sweep --rates 10,20,40|START:STOP:STEP [--policy a,b] [--target URL | simulate flags]`.

One run per (policy, rate): simulated by default (every policy replays the same trace at
each rate), or live with ``--live`` (the built-in engine running each policy) or
``--target URL`` (an external server; ``--policy`` then only labels the runs). Writes
``<out>/sweep.json`` with each policy's capacity and ``<out>/report.html``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from harness.cli.errors import HarnessError, fail, one_line

_FLAGS = {"policies": "policy", "arrival_window_s": "duration", "duration_s": "duration"}


def sweep(
    rates: Annotated[
        str,
        typer.Option(
            help="Rates in req/s (sessions/s for a session trace): 10,20,40 or START:STOP:STEP."
        ),
    ],
    trace: Annotated[
        str, typer.Option(help="Trace name (lmsys, sharegpt, synthetic, ...) or file.")
    ] = "synthetic",
    policy: Annotated[str, typer.Option(help="Comma-separated policies.")] = "vllm",
    target: Annotated[
        str | None, typer.Option(help="Live: base URL of an OpenAI-compatible server.")
    ] = None,
    live: Annotated[
        bool,
        typer.Option(
            help="Live against the built-in engine (wall clock) instead of the simulator."
        ),
    ] = False,
    num_requests: Annotated[
        int | None, typer.Option(help="Requests per run (sessions for a session trace).")
    ] = 1000,
    duration: Annotated[
        float | None, typer.Option(help="Keep arrivals within this many seconds per run.")
    ] = None,
    tiers: Annotated[str | None, typer.Option(help="Tier spec (default: SLAI paper's).")] = None,
    cost_model: Annotated[
        str | None, typer.Option(help="Cost model preset or file (simulator / built-in).")
    ] = None,
    kv_tokens: Annotated[int | None, typer.Option(help="KV capacity, tokens.")] = None,
    speed: Annotated[
        float | None, typer.Option(help="Live built-in engine: wall-clock speed-up factor.")
    ] = None,
    arrival: Annotated[str, typer.Option(help="poisson, gamma or constant.")] = "poisson",
    burstiness: Annotated[float, typer.Option(help="Gamma shape; 1 = Poisson.")] = 1.0,
    seed: Annotated[int, typer.Option(help="Seed of every random stream.")] = 0,
    min_attainment: Annotated[
        float, typer.Option(help="Per-tier SLO attainment a rate needs to pass (0..1).")
    ] = 0.9,
    out: Annotated[
        Path,
        typer.Option("-o", "--out", help="Folder this sweep writes (sweep.json, runs, report)."),
    ] = Path("reports/sweep"),
    repeats: Annotated[
        int,
        typer.Option(
            help="Runs per (policy, rate) with seeds SEED, SEED+1, ...: capacity gets the "
            "range of the per-seed capacities."
        ),
    ] = 1,
    warmup: Annotated[
        str | None,
        typer.Option(
            help="Exclude the first N requests or DURATION (30s) of every run from metrics.",
            show_default=False,
        ),
    ] = None,
    report: Annotated[bool, typer.Option(help="Write <out>/report.html.")] = True,
    ray: Annotated[
        str | None,
        typer.Option(
            "--ray",
            help="Simulated sweeps: run the rates as Ray tasks on 'auto' (a running "
            "cluster, else a local one) or a cluster ADDRESS (needs the [ray] extra).",
        ),
    ] = None,
) -> None:
    """Sweep request rates per policy; report each policy's capacity (largest stable rate
    meeting every tier's SLOs)."""
    from pydantic import ValidationError

    from harness.results.sweep import SweepConfig, parse_rates, run_sweep

    try:
        rate_list = parse_rates(rates)
    except ValueError as e:
        fail(str(e))
    policies = [p.strip() for p in policy.split(",") if p.strip()]
    if not policies:
        fail("--policy: give at least one name")
    if not 0 <= min_attainment <= 1:
        fail(f"--min-attainment {min_attainment}: must be within 0..1")
    if repeats < 1:
        fail(f"--repeats {repeats}: must be >= 1")
    warmup_spec = None
    if warmup is not None:
        from harness.results.warmup import parse_warmup

        try:
            warmup_spec = parse_warmup(warmup)
        except ValueError as e:
            fail(str(e))
    mode = "live" if (live or target) else "simulate"
    from harness.workload.sources.conversations import is_session_source

    if mode == "simulate" and is_session_source(trace):
        fail(f"{trace}: a session trace sweeps live (--live or --target URL), in sessions/s")
    if is_session_source(trace):
        from harness.workload.session_freeze import fixed_arrivals

        if fixed_arrivals(trace):
            fail(
                f"{trace}: a frozen session trace keeps its own arrivals at every rate; "
                "sweep its source or a JSONL session file (trace build -o FILE.jsonl)"
            )
    if ray is not None:
        if mode == "live":
            fail("--ray fans out simulated sweeps; a live sweep runs one rate at a time")
        from harness.distributed import require_ray

        try:
            require_ray()
        except HarnessError as e:
            fail(str(e))
    base: dict[str, Any] = {
        "trace": trace,
        "num_requests": num_requests,
        "tiers": tiers,
        "seed": seed,
        "arrival": arrival,
        "burstiness": burstiness,
    }
    if mode == "simulate":
        base["arrival_window_s"] = duration
        if cost_model is not None:
            base["cost_model"] = cost_model
        if kv_tokens is not None:
            base["kv_tokens"] = kv_tokens
        try:  # validate the policies and options once, before the first run
            from harness.engine.simulate import SimulateConfig

            SimulateConfig(**base, rate=rate_list[0], policies=policies, out_dir=out)
        except (ValidationError, ValueError) as e:
            fail(one_line(e, _FLAGS))
    else:
        base["duration_s"] = duration
        if target is not None:
            if cost_model is not None or kv_tokens is not None or speed is not None:
                fail("--cost-model/--kv-tokens/--speed only apply to the built-in engine")
            base["target"] = target
        else:
            base["cost_model"] = cost_model
            base["kv_tokens"] = kv_tokens
            base["speed"] = speed
        try:
            from harness.loadgen.replay import ReplayConfig

            probe = {**base, "rate": rate_list[0], "out": out / "probe", "progress": False}
            if target is None:
                probe["policy"] = policies[0]
            ReplayConfig(**probe)
        except (ValidationError, ValueError) as e:
            fail(one_line(e, _FLAGS))
    try:
        cfg = SweepConfig(
            rates=rate_list,
            policies=policies,
            mode=mode,
            base=base,
            out_dir=out,
            min_attainment=min_attainment,
            report=report,
            repeats=repeats,
            warmup=warmup_spec,
        )
    except (ValidationError, ValueError) as e:
        fail(one_line(e, _FLAGS))

    def show(p: dict[str, Any]) -> None:
        mark = "PASS" if p["passes"] else ("FAIL" if p.get("fails", True) else "PASS?")
        seed = f" seed {p['seed']}" if p.get("seed") is not None else ""
        typer.echo(
            f"{p['policy']:>12} @ {p['rate']:g} {p.get('unit', 'req/s')}{seed}: "
            f"{p['verdict']:<12} "
            f"SLOs {'met' if p['meets_slos'] else 'missed'}  [{mark}]"
        )

    try:
        from harness.distributed.pool import mapper

        out_dir = run_sweep(cfg, on_point=show, map_fn=mapper(ray))
    except (HarnessError, FileNotFoundError, ValueError, OSError) as e:
        fail(one_line(e, _FLAGS))
    import json

    data = json.loads((out_dir / "sweep.json").read_text(encoding="utf-8"))
    for pol, c in data["capacity"].items():
        typer.echo(capacity_line(pol, c))
        if c.get("hint"):
            typer.echo(f"  hint: {c['hint']}")
    typer.echo(str(out_dir / "sweep.json"))
    if report:
        typer.echo(str(out_dir / "report.html"))


def capacity_line(policy: str, c: dict[str, Any]) -> str:
    """``capacity vllm: 8 req/s (paid 8, free 10)``, saying when stability was unconfirmed
    and which rate failed first when no swept rate passed."""
    cap = c.get("capacity_rps")
    unit = c.get("unit", "req/s")  # sessions/s when the trace carries sessions
    if cap is None:
        ff = c.get("first_failure") or {}
        why = ""
        if ff:
            why = f" (first failure at {ff['rate']:g} {unit}: " + (
                "unstable)" if ff.get("verdict") == "unstable" else "SLO attainment missed)"
            )
        text = f"capacity {policy}: below the lowest swept rate{why}"
    else:
        text = f"capacity {policy}: {cap:g} {unit}"
        if c.get("capacity_hi") is not None and c.get("capacity_lo") is not None:
            cov = c.get("interval_coverage")
            how = f", {cov:.0%} interval for the median seed" if cov else ""
            text += f" [{c['capacity_lo']:g}, {c['capacity_hi']:g}] over seeds{how}"
        if c.get("confirmed") is False:
            text += " (unconfirmed: stability inconclusive)"
    tiers = {t: v for t, v in (c.get("by_tier") or {}).items()}
    if tiers:
        text += " · per tier: " + ", ".join(
            f"{t} {'<' + format(c['rates'][0], 'g') if v is None else format(v, 'g')}"
            for t, v in tiers.items()
        )
    return text


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep)
