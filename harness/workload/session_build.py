"""Build a session Trace: source rows -> whole sessions -> session arrivals, tiers, think times.

The sessions counterpart of :func:`harness.workload.build.build_trace` (same seed streams:
arrivals ``[seed, 1]``, sampling ``[seed, 2]``, tiers ``[seed, 3]``; think times ``[seed, 5]``).
Sampling and arrivals act on sessions, never on single calls, so a conversation is never cut
apart; the result is an ordinary :class:`~harness.workload.trace.Trace` with the session
columns of :data:`harness.workload.sessions.SESSION_COLUMNS`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from harness.workload.sessions import finish_frame, sessions_from_frame, think_times
from harness.workload.sources import conversations as conv
from harness.workload.sources.base import announce, take_options
from harness.workload.tiers import Tier, default_tiers, parse_tiers
from harness.workload.trace import Trace, TraceError

DEFAULT_NUM_SESSIONS = 100


def build_session_trace(
    source: str,
    *,
    num_sessions: int | None = None,
    session_rate: float | None = None,
    arrival: str = "poisson",
    burstiness: float = 1.0,
    tiers: list[Tier] | str | None = None,
    seed: int = 0,
    think_time: str | float | None = None,
    quiet: bool = False,
    **options: Any,
) -> Trace:
    """Sessions from ``source`` (sharegpt-conv, lmsys-conv, synthetic-conv, an agent-graph
    YAML/JSON, or a file with a ``session_id`` column). ``session_rate``: sessions/s;
    None = the file's own timestamps (all at 0 when it has none). ``think_time`` fills the
    think time of non-root calls that the source leaves unset."""
    tier_list = parse_tiers(tiers) if isinstance(tiers, str) else (tiers or default_tiers())
    meta: dict[str, Any] = {"source": source, "sessions": True, "seed": seed}
    n = num_sessions
    if source == "sharegpt-conv":
        opts = take_options(
            options,
            {"path": None, "min_turns": 1, "max_turns": None, "max_output_len": None},
            source,
        )
        items, info = conv.load_sharegpt_conversations(opts["path"])
        df = conv.conversation_rows(items, min_turns=int(opts["min_turns"]))
        if opts["max_turns"] is not None:
            df = df[df["call_index"] < int(opts["max_turns"])]
        if opts["max_output_len"] is not None:
            # vLLM bench's --sharegpt-output-len, as a cap: a call asks for at most N tokens;
            # the history still carries the recorded reply, so prompts are unchanged
            cap = int(opts["max_output_len"])
            if cap < 1:
                raise TraceError(f"{source}: max_output_len must be >= 1, got {cap}")
            df = df.assign(output_len=df["output_len"].clip(upper=cap))
            meta["max_output_len"] = cap
        df = conv.sample_sessions(df, n or DEFAULT_NUM_SESSIONS, seed)
        meta["sharegpt"] = info
        if info.get("truncated") and not quiet:
            announce(
                f"sharegpt-conv: {info['conversations_recovered']} conversations recovered; "
                f"{conv.SHAREGPT_NOTE}"
            )
    elif source == "lmsys-conv" and _real_lmsys(options, meta, n, seed, quiet):
        df = meta.pop("_frame")
    elif source in ("synthetic-conv", "lmsys-conv"):
        base = dict(conv.LMSYS_CONV_PROFILE) if source == "lmsys-conv" else {}
        allowed = {
            "turns": 4.0,
            "prompt_len": 100.0,
            "output_len": 200.0,
            "sigma": 0.8,
            "system_len": 0,
            "max_turns": 64,
        }
        allowed.update(base)
        opts = take_options(options, allowed, source)
        df = conv.synthetic_conversations(n or DEFAULT_NUM_SESSIONS, seed, **opts)
        meta["profile"] = opts
        if source == "lmsys-conv":
            meta["fallback"] = (
                "LMSYS-Chat-1M conversation PROFILE (mean 2.0 turns, first prompt ~70 tokens, "
                f"reply ~215 tokens), not the dataset: {meta.pop('_why', 'unavailable')}"
            )
            if not quiet:
                announce(f"lmsys-conv: {meta['fallback']}")
    else:
        path = Path(source).expanduser()
        if not path.is_file():
            raise TraceError(f"{source}: no such session trace")
        if _is_frozen(path):  # a frozen session trace replays exactly as built
            from harness.workload.frozen import load_trace

            take_options(options, {}, source)
            trace = load_trace(path)
            sessions_from_frame(trace.df)
            return trace
        if (
            path.suffix.lower() in conv.AGENT_SUFFIXES
            and path.suffix.lower() != ".json"
            or (path.suffix.lower() == ".json" and conv.is_session_source(source))
        ):
            # target=run: every agent on the run's own target; target=URL: every agent there
            opts = take_options(options, {"target": None}, source)
            spec = conv.load_agent_graph(path)
            df = conv.agent_sessions(spec, n or DEFAULT_NUM_SESSIONS, seed, str(path))
            if opts["target"] is not None:
                df["target"] = None if opts["target"] == "run" else str(opts["target"])
            meta["agent_graph"] = {"file": str(path), "name": spec.get("name")}
            if opts["target"] is not None:
                meta["agent_graph"]["target_override"] = opts["target"]
        else:
            take_options(options, {}, source)
            df = conv.load_session_file(path)
            if n is not None:
                df = conv.sample_sessions(df, n, seed, shuffle=False)
    if think_time is not None:
        draw = think_times(think_time, len(df), np.random.default_rng([seed, 5]))
        has = df["think_s"].notna() & (df["think_s"] > 0) if "think_s" in df.columns else None
        roots = df["call_index"].astype(int) == 0
        keep = roots if has is None else (roots | has)
        old = df["think_s"] if "think_s" in df.columns else 0.0
        df = df.assign(think_s=np.where(keep, old, draw))
    if session_rate is None and "arrival_s" not in df.columns and not quiet:
        announce(
            f"{source}: no session rate and no timestamps: every session arrives at t=0 "
            "(give --session-rate, or cap with --max-active-sessions)"
        )
    frame = finish_frame(
        df,
        tiers=tier_list,
        seed=seed,
        session_rate=session_rate,
        arrival=arrival,
        burstiness=burstiness,
    )
    trace = Trace.from_frame(frame, tier_list, meta)
    sessions = sessions_from_frame(trace.df)  # validates every graph (cycles, parents)
    trace.meta["num_sessions"] = len(sessions)
    trace.meta["num_calls"] = len(trace)
    return trace


def _is_frozen(path: Path) -> bool:
    if path.suffix.lower() != ".parquet":
        return False
    import pyarrow.parquet as pq

    from harness.workload.frozen import PARQUET_META_KEY

    return PARQUET_META_KEY in (pq.read_schema(path).metadata or {})


def _real_lmsys(
    options: dict[str, Any], meta: dict[str, Any], n: int | None, seed: int, quiet: bool
) -> bool:
    """Load real LMSYS conversations into ``meta["_frame"]`` when ``path=`` is given or the
    gated hub is reachable (``fallback=always`` skips, ``never`` makes absence an error);
    otherwise leave the reason in ``meta["_why"]`` and strip these options for the profile."""
    path, dataset = options.pop("path", None), options.pop("dataset", None)
    mode = options.pop("fallback", "auto")
    max_rows = int(options.pop("max_rows", 20000))
    if mode not in ("auto", "never", "always"):
        raise TraceError(f"lmsys-conv: fallback must be auto, never or always, got {mode!r}")
    if mode == "always":
        meta["_why"] = "fallback=always"
        return False
    got = conv.load_lmsys_conversations(path, dataset, max_rows)
    if isinstance(got, str):
        if mode == "never":
            raise TraceError(f"lmsys-conv: real dataset not available ({got})")
        meta["_why"] = got
        return False
    items, info = got
    df = conv.conversation_rows(items)
    meta["_frame"] = conv.sample_sessions(df, n or DEFAULT_NUM_SESSIONS, seed)
    meta["lmsys"] = info
    return True
