"""How a session trace is run: the knobs shared by the live session dispatcher
(:mod:`harness.loadgen.sessions`) and sessions in virtual time (:mod:`harness.engine.vsessions`).

Why here: both hosts read the same options with the same meaning (issue 16: ``simulate`` and
``replay`` of one session trace give comparable run directories), and the simulator must not
import the live load generator (its HTTP clients) to read them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class SessionOptions(BaseModel):
    """Session replay knobs (``harness replay --session-rate ...``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    session_rate: float | None = Field(
        None, gt=0, description="sessions/s (open loop); None = the trace's own arrivals"
    )
    num_sessions: int | None = Field(None, ge=1, description="replay at most this many sessions")
    max_active_sessions: int | None = Field(None, ge=1, description="cap on sessions in progress")
    history: Literal["trace", "reply"] = Field(
        "trace", description="history text: the trace's replies, or the server's real ones"
    )
    think_time: str | None = Field(
        None, description="think time between calls: S, exp:MEAN, lognormal:MED:SIGMA, ..."
    )
    patience_s: float | None = Field(None, gt=0, description="abandon when TTFT exceeds this, s")
    max_retries: int = Field(0, ge=0, description="re-sends of a failed call")
    retry_backoff_s: float = Field(1.0, ge=0, description="first retry delay, doubled per retry")
    max_context: int | None = Field(
        None, ge=1, description="model context, tokens (None: from /v1/models max_model_len)"
    )
    call_overhead_s: float = Field(
        0.0,
        ge=0,
        allow_inf_nan=False,
        description="simulation only: s from a call's release to its arrival at the engine "
        "(the client and API server's share of a call's path, which a simulated engine "
        "otherwise gets at once; a replay measures it)",
    )


# -- hooks for replay and simulate (one meaning of "a session run" for both) -----------------
def is_session_run(cfg: Any, trace: Any = None) -> bool:
    """A session run: session options given, a session source named, or session columns."""
    from harness.workload.sources.conversations import is_session_source

    if getattr(cfg, "sessions", None) is not None or is_session_source(cfg.trace):
        return True
    return trace is not None and "session_id" in trace.df.columns


def session_trace(cfg: Any, tiers: list[Any] | None) -> Any:
    """The session Trace for ``cfg`` (None when ``cfg`` is not a session run)."""
    if not is_session_run(cfg):
        return None
    from harness.workload.session_build import build_session_trace

    opts = cfg.sessions or SessionOptions()
    arrival = "poisson" if cfg.arrival == "trace" else cfg.arrival
    return build_session_trace(
        cfg.trace,
        num_sessions=opts.num_sessions or cfg.num_requests,
        session_rate=opts.session_rate if opts.session_rate is not None else cfg.rate,
        arrival=arrival,
        burstiness=cfg.burstiness,
        tiers=tiers,
        seed=cfg.seed,
        think_time=opts.think_time,
        **cfg.trace_options,
    )


def session_run_meta(cfg: Any, trace: Any) -> dict[str, Any]:
    """run.json keys of a session run (``sessions``: options, counts, source notes); {} else."""
    if not is_session_run(cfg, trace):
        return {}
    from harness.workload.sessions import sessions_from_frame

    opts = cfg.sessions or SessionOptions()
    n = len(sessions_from_frame(trace.df))
    info: dict[str, Any] = {
        "options": opts.model_dump(mode="json"),
        "num_sessions": n,
        "num_calls": len(trace),
    }
    for key in ("sharegpt", "lmsys", "fallback", "agent_graph", "profile"):
        if key in trace.meta:
            info[key] = trace.meta[key]
    return {"sessions": info}


def session_options(trace: str, **given: Any) -> SessionOptions | None:
    """CLI flags -> :class:`SessionOptions`; None when none is set and ``trace`` is not a
    session source (a plain replay stays exactly as before). Raises pydantic's
    ``ValidationError`` for bad values (the CLI prints one line)."""
    from harness.workload.sources.conversations import is_session_source

    set_ = {k: v for k, v in given.items() if v is not None}
    if not set_ and not is_session_source(trace):
        return None
    return SessionOptions(**set_)


__all__ = [
    "SessionOptions",
    "is_session_run",
    "session_options",
    "session_run_meta",
    "session_trace",
]
