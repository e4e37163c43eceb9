"""`harness replay`: build a trace, check the target, dispatch it open-loop, write the run.

Flow (design.md "One flow"): ``build_trace`` (engineer W) → readiness check (httpx, bounded
by ``ready_timeout_s``) → :class:`~harness.results.rundir.RunWriter` → optional
:class:`~harness.loadgen.sampler.Sampler` → :class:`~harness.loadgen.dispatcher.Dispatcher`
→ ``write_summary`` (engineer R). With no ``target`` the built-in engine server is started
in-process (``harness.server.embedded``, engineer S).

User errors raise :class:`~harness.cli.errors.HarnessError` with one line; the CLI prints it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import platform
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import aiohttp
import httpx
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from harness import clock
from harness.cli.errors import HarnessError
from harness.loadgen.client import make_session
from harness.loadgen.dialects import Endpoint, get_dialect
from harness.loadgen.dispatcher import (
    Dispatcher,
    DispatchStats,
    Job,
    jobs_from_frame,
    synthetic_prompt,
)
from harness.loadgen.fdlimit import FdBudget, fd_budget
from harness.loadgen.sessions import session_factory
from harness.results.schema import ERROR_CLIENT_LIMIT, FAULTS_FILE, STATUS_PARTIAL
from harness.workload.session_options import SessionOptions, session_run_meta, session_trace
from harness.workload.tiers import Tier, TierSpecError, parse_tiers
from harness.workload.trace import Trace, TraceError

GOODPUT_KEYS = ("ttft", "tpot", "e2el")
BUILTIN_ONLY = ("policy", "cost_model", "kv_tokens", "speed", "faults")


class ReplayConfig(BaseModel):
    """Everything one replay needs. Immutable; validated on construction."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    trace: str = Field(description="trace name (lmsys, sharegpt, synthetic, ...) or file path")
    rate: float | None = Field(
        None, gt=0, description="offered request rate, req/s; None = the trace's own timestamps"
    )
    target: str | None = Field(
        None, description="base URL of an OpenAI-compatible server; None = built-in engine"
    )
    model: str | None = Field(None, description="model name; None = first of /v1/models")
    engine: Literal["openai", "vllm", "sglang", "builtin"] | None = Field(
        None, description="request dialect; None = builtin without a target, else vllm"
    )
    endpoint: Endpoint = Field(
        Endpoint.COMPLETIONS, description="completions, chat, or generate (SGLang's native API)"
    )
    arrival: Literal["poisson", "gamma", "constant", "trace"] = Field(
        "poisson", description="arrival process; 'trace' = the trace's timestamps"
    )
    burstiness: float = Field(1.0, gt=0, description="gamma shape (vLLM --burstiness); 1=Poisson")
    time_scale: float = Field(1.0, gt=0, description="multiplies trace timestamps")
    num_requests: int | None = Field(None, ge=1, description="send at most this many requests")
    duration_s: float | None = Field(None, gt=0, description="send no request after this, s")
    max_concurrency: int | None = Field(None, ge=1, description="cap on requests in flight")
    workers: int | None = Field(
        None, ge=1, description="load-generator processes; None = automatic from rate and cores"
    )
    ray: str | None = Field(
        None, description="Ray cluster address: load-generator shards as actors on its hosts"
    )
    tiers: str | None = Field(None, description="tier spec; None = the SLAI paper's defaults")
    goodput: dict[str, float] | None = Field(
        None, description="goodput SLOs in ms, keys ttft/tpot/e2el (vLLM --goodput)"
    )
    seed: int = Field(
        0, ge=0, description="seed for arrivals, sampling and tiers (separate streams)"
    )
    out: Path | None = Field(None, description="run directory; None = reports/<run-id>")
    timeout_s: float = Field(600.0, gt=0, description="longest silence within one response, s")
    drain_timeout_s: float = Field(
        30.0, ge=0, description="with duration_s: time in-flight requests get to finish, s"
    )
    ready_timeout_s: float = Field(5.0, gt=0, description="how long the target may take to answer")
    send_priority: bool = Field(True, description="send the tier as the body 'priority' field")
    extra_body: dict[str, Any] | None = Field(None, description="merged into every request body")
    api_key: str | None = Field(None, description="sent as 'Authorization: Bearer <key>'")
    sample_interval_s: float | None = Field(
        0.25, description="engine /metrics + GPU sampling period, s; None = no sampling"
    )
    gpu: bool = Field(True, description="sample GPU memory through NVML when available")
    progress: bool = Field(True, description="show the live progress bar")
    trace_options: dict[str, Any] = Field(
        default_factory=dict, description="source options passed through to build_trace"
    )
    # Built-in engine only (no target).
    policy: str | None = Field(None, description="built-in: scheduling policy (default vllm)")
    cost_model: str | None = Field(None, description="built-in: cost model preset or file")
    kv_tokens: int | None = Field(None, ge=1, description="built-in: KV-cache capacity, tokens")
    speed: float | None = Field(None, gt=0, description="built-in: wall-clock speed-up factor")
    faults: str | None = Field(None, description="built-in: fault-injection spec")
    sessions: SessionOptions | None = Field(
        None, description="session replay (multi-turn / agent graphs); harness.loadgen.sessions"
    )

    @field_validator("tiers")
    @classmethod
    def _tiers_parse(cls, v: str | None) -> str | None:
        if v is not None:
            parse_tiers(v)  # TierSpecError (a ValueError) names the bad part
        return v

    @field_validator("goodput")
    @classmethod
    def _goodput_keys(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v:
            bad = set(v) - set(GOODPUT_KEYS)
            if bad:
                raise ValueError(f"goodput keys must be ttft, tpot, e2el; got {sorted(bad)}")
            if any(x <= 0 for x in v.values()):
                raise ValueError("goodput SLOs must be > 0 ms")
        return v or None

    @field_validator("target")
    @classmethod
    def _target_url(cls, v: str | None) -> str | None:
        if v is not None:
            if not v.startswith(("http://", "https://")):
                raise ValueError(f"target {v!r} must start with http:// or https://")
            v = v.rstrip("/")
            if v.endswith("/v1"):
                v = v[:-3]
        return v

    @model_validator(mode="after")
    def _cross(self) -> ReplayConfig:
        if self.target is not None:
            given = [k for k in BUILTIN_ONLY if getattr(self, k) is not None]
            if given:
                flags = ", ".join("--" + k.replace("_", "-") for k in given)
                raise ValueError(f"{flags} only apply to the built-in engine (drop --target)")
        if self.endpoint is Endpoint.GENERATE and self.dialect_name != "sglang":
            raise ValueError("--endpoint generate is SGLang's native API: use --engine sglang")
        if self.arrival == "trace" and self.rate is not None:
            raise ValueError("--arrival trace replays the trace's timestamps; drop --rate")
        if self.arrival != "trace" and self.rate is None and not self._session_rate:
            raise ValueError(f"--arrival {self.arrival} needs --rate")
        if self.sample_interval_s is not None and self.sample_interval_s <= 0:
            raise ValueError("sample_interval_s must be > 0")
        if self.sessions is not None and self.sessions.call_overhead_s:
            # a live replay has the real overhead; the option models it in virtual time only
            raise ValueError("sessions.call_overhead_s is for harness simulate only")
        return self

    @property
    def _session_rate(self) -> bool:
        return self.sessions is not None and self.sessions.session_rate is not None

    @property
    def dialect_name(self) -> str:
        return self.engine or ("builtin" if self.target is None else "vllm")


# -- trace ------------------------------------------------------------------------------------
def load_trace(cfg: ReplayConfig) -> Trace:
    """Build the trace through engineer W's ``build_trace``; errors become HarnessError."""
    try:
        from harness.workload import build_trace  # type: ignore[attr-defined]
    except ImportError:
        try:
            from harness.workload.build import build_trace  # type: ignore[no-redef]
        except ImportError:
            raise HarnessError(
                "trace sources are not available yet (harness.workload.build_trace)"
            ) from None
    tiers: list[Tier] | None = parse_tiers(cfg.tiers) if cfg.tiers else None
    try:
        sessions = session_trace(cfg, tiers)  # multi-turn / agent sessions (issue 15)
        if sessions is not None:
            return sessions
        return build_trace(
            cfg.trace,
            num_requests=cfg.num_requests,
            rate=cfg.rate,
            arrival="trace" if cfg.arrival == "trace" else cfg.arrival,
            burstiness=cfg.burstiness,
            time_scale=cfg.time_scale,
            duration_s=cfg.duration_s,
            tiers=tiers,
            seed=cfg.seed,
            **cfg.trace_options,
        )
    except (TraceError, TierSpecError, FileNotFoundError, KeyError, ValueError) as exc:
        msg = str(exc.args[0] if isinstance(exc, KeyError) and exc.args else exc)
        raise HarnessError(msg if cfg.trace in msg else f"trace {cfg.trace!r}: {msg}") from None


# -- target -----------------------------------------------------------------------------------
async def check_ready(
    base_url: str,
    model: str | None,
    timeout_s: float,
    api_key: str | None = None,
    info: dict[str, Any] | None = None,
) -> str:
    """Wait (up to ``timeout_s``) until the target answers ``/health`` or ``/v1/models``;
    return the model to use (``model``, else the first id ``/v1/models`` lists). ``info``,
    when given, receives ``max_model_len`` if ``/v1/models`` states it (vLLM does)."""
    deadline = clock.now() + timeout_s
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    last = "no answer"
    async with httpx.AsyncClient(headers=headers) as client:
        while True:
            left = deadline - clock.now()
            if left <= 0:
                raise HarnessError(
                    f"target {base_url} is not reachable ({last}) after {timeout_s:g} s"
                )
            per = httpx.Timeout(max(0.05, min(left, 2.0)))
            try:
                r = await client.get(base_url + "/v1/models", timeout=per)
                if r.status_code in (401, 403):
                    refused = " (the key given was refused)" if api_key else ""
                    raise HarnessError(
                        f"unauthorized: pass --api-key or HARNESS_API_KEY{refused} "
                        f"(HTTP {r.status_code} from {base_url}/v1/models)"
                    )
                if r.status_code == 200:
                    if info is not None:
                        info.update(_model_info(r, model))
                    if model is not None:
                        return model
                    try:
                        data = r.json().get("data") or []
                        if data and data[0].get("id"):
                            return str(data[0]["id"])
                    except (ValueError, AttributeError):
                        pass
                    raise HarnessError(f"target {base_url} lists no model; pass --model")
                r2 = await client.get(base_url + "/health", timeout=per)
                if r2.status_code == 200:
                    if model is None:
                        raise HarnessError(f"target {base_url} has no /v1/models; pass --model")
                    return model
                last = f"HTTP {r.status_code} on /v1/models, {r2.status_code} on /health"
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            await asyncio.sleep(min(0.2, max(0.0, deadline - clock.now())))


def _model_info(resp: httpx.Response, model: str | None) -> dict[str, Any]:
    """``max_model_len`` of ``model`` (else the first listed) from a /v1/models answer."""
    try:
        data = resp.json().get("data") or []
        pick = next((d for d in data if d.get("id") == model), data[0] if data else {})
        n = pick.get("max_model_len")
    except (ValueError, AttributeError, TypeError):
        return {}
    return {"max_model_len": int(n)} if isinstance(n, int) and n > 0 else {}


def context_warning(jobs: list[Job], max_model_len: int | None) -> str | None:
    """A warning when rows ask for more than the model's context (prompt + output): the
    server will reject them (``rejected``); named by the first trace row."""
    if not max_model_len:
        return None
    over = [j.req for j in jobs if j.prompt_len + j.output_len > max_model_len]
    if not over:
        return None
    return (
        f"{len(over)} requests need more than the model's context ({max_model_len} tokens, "
        f"from /v1/models; first: trace row {over[0]}): the server will reject them"
    )


@contextlib.asynccontextmanager
async def _target(cfg: ReplayConfig, run_dir: Path) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """Yield (base URL, engine info): the given target, or the in-process built-in server."""
    if cfg.target is not None:
        yield cfg.target, {"kind": "external"}
        return
    try:
        from harness.server import embedded  # type: ignore[attr-defined]
    except ImportError:
        raise HarnessError("the built-in engine is not available yet; pass --target URL") from None
    kw: dict[str, Any] = {"policy": cfg.policy or "vllm"}
    for k in ("cost_model", "kv_tokens", "speed", "faults"):
        if getattr(cfg, k) is not None:
            kw[k] = getattr(cfg, k)
    try:
        from harness.server import make_config

        info = make_config(**kw).model_dump(
            mode="json", include={"policy", "policy_params", "cost_model", "kv_tokens", "speed"}
        )
        info["faults"] = kw.get("faults")
        if cfg.faults:
            # The server's own record of every injected fault lands beside the requests, so a
            # reader can match failed requests to faults one by one.
            run_dir.mkdir(parents=True, exist_ok=True)
            kw["fault_log"] = info["fault_log"] = str(run_dir / FAULTS_FILE)
        # A child process keeps the engine loop and the load generator from delaying each
        # other (see harness.server.embedded).
        cm = embedded(**kw, process=True)
    except (ValueError, KeyError) as exc:
        raise HarnessError(f"built-in engine: {exc}") from None
    try:
        async with cm as url:
            # The URL object keeps exit_code() (harness.server.embed.EngineURL): the run
            # checks at its end whether the engine died under it.
            yield url, {"kind": "builtin", **info}
    except RuntimeError as exc:
        raise HarnessError(f"built-in engine: {exc}") from None


# -- run --------------------------------------------------------------------------------------
def default_run_dir(cfg: ReplayConfig, trace_hash: str) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    rate = "trace" if cfg.rate is None else f"{cfg.rate:g}"
    digest = hashlib.sha1(f"{time.time_ns()}{trace_hash}".encode()).hexdigest()[:6]
    return Path("reports") / f"replay-{stamp}-{cfg.dialect_name}-r{rate}-{digest}"


def _versions() -> dict[str, str]:
    from harness import __version__

    return {
        "harness": __version__,
        "python": platform.python_version(),
        "aiohttp": aiohttp.__version__,
    }


def _meta(
    cfg: ReplayConfig, trace: Trace, base_url: str, model: str, n_jobs: int
) -> dict[str, Any]:
    """run.json content. ``duration_s`` (top level) is written at the end as the measured
    dispatch-start → last-request-done time (vLLM's ``duration``, what the summary divides by);
    the configured bound is ``duration_limit_s``, kept out of ``config`` so the summary cannot
    mistake it for the measured one."""
    conf = cfg.model_dump(mode="json")
    conf["duration_limit_s"] = conf.pop("duration_s")
    if conf.get("api_key"):
        conf["api_key"] = "***"  # never write a credential into the run directory
    return {
        "kind": "replay",
        "config": conf,
        "target": base_url,
        "engine": cfg.dialect_name,
        "endpoint": cfg.endpoint.value,
        "model": model,
        "trace": {
            "source": cfg.trace,
            "num_requests": len(trace),
            "content_hash": trace.content_hash(),
            "meta": json.loads(json.dumps(trace.meta, default=str)),
        },
        "tiers": [t.to_dict() for t in trace.tiers],
        "seed": cfg.seed,
        "rate": cfg.rate,
        "arrival": cfg.arrival,
        "burstiness": cfg.burstiness,
        "time_scale": cfg.time_scale,
        "max_concurrency": cfg.max_concurrency,
        "num_requests": n_jobs,
        "duration_limit_s": cfg.duration_s,
        "goodput": cfg.goodput,
        "versions": _versions(),
        "host": platform.node(),
    }


def _stats_meta(stats: DispatchStats, budget: FdBudget | None = None) -> dict[str, Any]:
    out = {
        "planned": stats.planned,
        "sent": stats.sent,
        "completed": stats.done,
        "failed": stats.failed,
        "cancelled": stats.cancelled,
        "not_sent": stats.not_sent,
        "max_release_lag_ms": round(stats.max_lag_s * 1000.0, 3),
        "error_kinds": dict(stats.error_kinds),
        "end_s": None if math.isnan(stats.end_s) else stats.end_s,
    }
    if budget is not None:
        out["fd_limit"] = {
            "soft": budget.soft,
            "hard": budget.hard,
            "max_in_flight": budget.max_in_flight,
        }
        if stats.error_kinds.get(ERROR_CLIENT_LIMIT):
            out["client_limit_advice"] = budget.advice()
    return out


async def run_replay_async(
    cfg: ReplayConfig,
    *,
    trace: Trace | None = None,
    on_progress: Callable[[DispatchStats], None] | None = None,
) -> Path:
    """Run one replay and return its run directory. ``trace`` overrides ``cfg.trace``
    (tests, sweeps that build the trace once)."""
    from harness.loadgen.workers import make_dispatcher, session_keys
    from harness.results.rundir import RunWriter

    if trace is None:
        trace = load_trace(cfg)
    jobs = jobs_from_frame(trace.df)
    if cfg.num_requests is not None:
        jobs = jobs[: cfg.num_requests]
    dialect = get_dialect(cfg.dialect_name, send_priority=cfg.send_priority)
    tiers = {t.name: t for t in trace.tiers}

    run_dir = cfg.out or default_run_dir(cfg, trace.content_hash())
    # Before the engine child and the writer open theirs: soft limit up to the hard one,
    # then what is left after the writer's reserve caps the requests in flight.
    budget = fd_budget()
    async with _target(cfg, run_dir) as (base_url, engine_info):
        model_info: dict[str, Any] = {}
        model = await check_ready(
            base_url, cfg.model, cfg.ready_timeout_s, cfg.api_key, info=model_info
        )
        ctx_warning = context_warning(jobs, model_info.get("max_model_len"))
        meta = _meta(cfg, trace, base_url, model, len(jobs))
        meta.update(model_info)
        meta["engine_info"] = engine_info
        meta.update(session_run_meta(cfg, trace))
        try:
            writer = RunWriter(run_dir, meta)
        except (FileExistsError, OSError) as exc:
            raise HarnessError(f"cannot write run directory {run_dir}: {exc}") from None
        with writer:
            session = make_session(limit=cfg.max_concurrency or 0, timeout_s=cfg.timeout_s)
            headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else None
            progress_cb = on_progress
            async with session:
                ctx = model_info.get("max_model_len")
                disp = (session_factory(cfg, trace, run_dir, ctx) or make_dispatcher)(
                    cfg.workers,
                    jobs,
                    shard_keys=session_keys(trace.df, len(jobs)),
                    ray_address=cfg.ray,
                    session=session,
                    base_url=base_url,
                    model=model,
                    dialect=dialect,
                    endpoint=cfg.endpoint,
                    tiers=tiers,
                    writer=writer,
                    max_concurrency=cfg.max_concurrency,
                    duration_s=cfg.duration_s,
                    drain_timeout_s=cfg.drain_timeout_s,
                    headers=headers,
                    extra_body=cfg.extra_body,
                    prompt_fn=prompt_synthesiser(cfg.seed),
                    on_progress=progress_cb,
                    in_flight_limit=budget.max_in_flight,
                )
                sampler = _make_sampler(cfg, base_url, disp)
                try:
                    async with sampler if sampler is not None else contextlib.nullcontext():
                        disp.prepare()
                        t0 = clock.now() + 0.01
                        if sampler is not None:
                            sampler.t0 = t0
                        writer.update_meta(t0_unix=time.time() + (t0 - clock.now()))
                        await disp.run(t0)
                finally:
                    extra: dict[str, Any] = {"dispatch": _stats_meta(disp.stats, budget)}
                    if sampler is not None:
                        extra["sampler"] = sampler.meta()
                    if not math.isnan(disp.stats.end_s):
                        extra["duration_s"] = disp.stats.end_s
                    warnings = run_warnings(disp.stats, budget)
                    if ctx_warning:
                        warnings.insert(0, ctx_warning)
                    died = _engine_exit(base_url)
                    if died is not None:
                        extra["engine_died"] = {"exit_code": died}
                        warnings.append(
                            f"the built-in engine process died during the run (exit code "
                            f"{died}): requests after that failed; the run is marked partial"
                        )
                    if warnings:
                        extra["warnings"] = warnings
                    await disp.flush(in_thread=False)
                    writer.update_meta(**extra)
                    if died is not None:
                        writer.close(STATUS_PARTIAL)
    _summarise(run_dir, cfg.goodput)
    from harness.results.sessions import add_session_summary

    add_session_summary(run_dir)  # summary.json["sessions"] for session runs
    return Path(run_dir)


def _engine_exit(base_url: str) -> int | None:
    """Exit code of the built-in engine child if it is gone (None: alive, or external)."""
    check = getattr(base_url, "exit_code", None)
    return check() if callable(check) else None


def run_warnings(stats: DispatchStats, budget: FdBudget | None) -> list[str]:
    """Lines the CLI prints as ``warning:`` and run.json keeps: each names a cause and a fix."""
    out = []
    if stats.done == 0 and stats.failed > stats.cancelled:
        kinds = ", ".join(f"{k}={v}" for k, v in sorted(stats.error_kinds.items()))
        out.append(f"no request succeeded ({kinds}); see error in requests.parquet")
    n = stats.error_kinds.get(ERROR_CLIENT_LIMIT, 0)
    if n:
        fix = budget.advice() if budget is not None else "raise `ulimit -n` or lower --rate"
        out.append(f"{n} requests were not sent (error kind {ERROR_CLIENT_LIMIT}): {fix}")
    return out


def prompt_synthesiser(seed: int) -> Callable[[int, int], str]:
    """Prompt text for rows without one: engineer W's ``synthesize_prompt`` (n words, one
    token each for the built-in engine; deterministic per seed and row), else " hi" * n."""
    try:
        from harness.workload.prompts import synthesize_prompt
    except ImportError:
        return _HiPrompt()
    synthesize_prompt(1, seed, 0)  # warm-up before t0: the first call builds its word tape
    return _SynthPrompt(seed)


class _HiPrompt:
    """ " hi" * n; a class, not a lambda, so worker processes can be sent it (pickle)."""

    def __call__(self, n: int, req: int) -> str:
        return synthetic_prompt(n)


class _SynthPrompt:
    """``synthesize_prompt(n, seed, req)``; picklable for worker processes."""

    def __init__(self, seed: int) -> None:
        from harness.workload.prompts import synthesize_prompt

        self.seed = seed
        self.fn = synthesize_prompt  # pickled by reference

    def __call__(self, n: int, req: int) -> str:
        return self.fn(n, self.seed, req)


def _make_sampler(cfg: ReplayConfig, base_url: str, disp: Dispatcher) -> Any:
    if cfg.sample_interval_s is None:
        return None
    try:
        from harness.loadgen.sampler import Sampler
    except ImportError:
        return None
    url = None if cfg.dialect_name == "openai" else base_url
    return Sampler(
        url,
        cfg.dialect_name,
        disp.sample_sink,
        t0=clock.now(),
        interval_s=cfg.sample_interval_s,
        gpu=cfg.gpu,
    )


def _summarise(run_dir: Path, goodput: dict[str, float] | None) -> dict[str, Any] | None:
    try:
        from harness.results.summary import write_summary
    except ImportError:
        return None
    return write_summary(run_dir, goodput=goodput)


def run_replay(
    cfg: ReplayConfig, *, trace: Trace | None = None, progress: bool | None = None
) -> Path:
    """Synchronous entry point: runs the replay with a live progress bar (when ``cfg.progress``
    and a terminal is attached) and returns the run directory."""
    from harness.loadgen.workers import new_event_loop  # uvloop when installed: less CPU/request

    show = cfg.progress if progress is None else progress
    if not show:
        with asyncio.Runner(loop_factory=new_event_loop) as runner:
            return runner.run(run_replay_async(cfg, trace=trace))
    from harness.loadgen.progress import LiveProgress

    with (
        LiveProgress(total=cfg.num_requests) as live,
        asyncio.Runner(loop_factory=new_event_loop) as runner,
    ):
        return runner.run(run_replay_async(cfg, trace=trace, on_progress=live.update))
