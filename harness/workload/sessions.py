"""Sessions: multi-turn conversations and agent workflows as graphs of calls (issue 15).

A trace row is one *call*. Rows that share a ``session_id`` form a session: a small DAG whose
edges are ``parents`` (call indices in the same session). A call is released when all its
parents have finished, plus its ``think_s`` (user think time or tool latency); a root call is
released ``think_s`` after the session arrives. Sessions arrive open-loop (the trace's
``arrival_s``: every call of a session carries its session's arrival); inside a session the
replay is closed-loop. A plain request is a session of one call: a trace without session
columns reads as such (:func:`sessions_from_frame`), so there is one model and one code path.

Prompt composition of a call (what :func:`compose` sends):
``system`` (a shared prefix, may be empty) + context + the call's own new text (``prompt``),
where context is

- ``history``: every ancestor call, in call-index order, as its new text followed by its reply
  (a chat conversation: the prompt of turn k holds turns < k);
- ``replies``: only the parents' replies (an agent hand-off, seed 004 §4: each hop is a full
  LLM call fed the previous agent's output);
- ``none``: nothing.

A reply is the trace's own text (``reply`` column; synthesised from ``output_len`` words when
absent: reproducible) or, in ``reply`` history mode, the server's real answer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from harness.workload.trace import TraceError

# Optional Trace columns (absent in plain traces: each row is then a session of one call).
SESSION_COLUMNS: dict[str, str] = {
    "session_id": "str: rows sharing it form one session",
    "call_index": "int >= 0: the call's index in its session (unique per session)",
    "parents": "str: comma-separated call indices this call waits for ('' = a root)",
    "think_s": "float >= 0: delay after the last parent finished (roots: after arrival)",
    "context": "str: history | replies | none (what of earlier calls the prompt holds)",
    "system": "str|None: shared system prefix of the session",
    "reply": "str|None: the trace's own reply text (history in 'trace' mode)",
    "agent": "str|None: the agent that serves this call (agent graphs)",
    "target": "str|None: base URL serving this call (None = the run's target)",
    "prompt_token_ids": "list[int]|None: the model's token ids of the call's composed prompt "
    "with the trace's replies (token_identity.tokenize_session_trace)",
    "system_len": "int|None: the system prefix in the model's tokens (else counted in words)",
}
CONTEXTS = ("history", "replies", "none")
SEPARATOR = "\n\n"


@dataclass(frozen=True, slots=True)
class Call:
    """One call of a session, as the load generator needs it (no pandas in the loop)."""

    req: int  # trace row (the run's join key)
    request_id: str
    index: int
    parents: tuple[int, ...]
    think_s: float
    prompt: str | None  # the call's own new text (None: synthesise prompt_len words)
    prompt_len: int  # tokens of the new text
    output_len: int
    reply: str | None = None
    context: str = "history"
    agent: str | None = None
    target: str | None = None
    # the composed prompt (``--history trace``) as the model's tokenizer encodes it, special
    # tokens included; None: counted from the lengths (harness.workload.token_identity)
    token_ids: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class Session:
    """A unit of work: calls released closed-loop after an open-loop arrival. Workers that
    shard a schedule shard by session (the calls of a session never split)."""

    session_id: str
    arrival_s: float
    tier: str | None
    calls: tuple[Call, ...]  # in call-index order
    system: str | None = None
    system_len: int | None = None  # the system prefix in model tokens (None: in words)

    def ancestors(self, index: int) -> list[int]:
        """Call indices ``index`` depends on, directly or not, in increasing order."""
        by = {c.index: c for c in self.calls}
        seen: set[int] = set()
        stack = list(by[index].parents)
        while stack:
            p = stack.pop()
            if p not in seen:
                seen.add(p)
                stack.extend(by[p].parents)
        return sorted(seen)


def has_sessions(df: pd.DataFrame) -> bool:
    """Whether the trace carries sessions (else every row is a session of one call)."""
    return "session_id" in df.columns


def parse_parents(value: Any) -> tuple[int, ...]:
    """``"0,2"`` / ``[0, 2]`` / ``""`` / None -> ``(0, 2)`` / ``()``."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ()
    if isinstance(value, str):
        parts = [p.strip() for p in value.replace(";", ",").split(",")]
        try:
            return tuple(int(p) for p in parts if p)
        except ValueError:
            raise TraceError(f"parents {value!r} is not a list of call indices") from None
    if isinstance(value, Iterable):
        return tuple(int(p) for p in value)
    return (int(value),)


def format_parents(parents: Iterable[int]) -> str:
    """``(0, 2)`` -> ``"0,2"``: the ``parents`` column as stored (:func:`parse_parents`)."""
    return ",".join(str(int(p)) for p in parents)


def validate_graph(session_id: str, calls: list[Call]) -> None:
    """One-line errors for a duplicate index, an unknown parent, or a cycle."""
    idx = [c.index for c in calls]
    if len(set(idx)) != len(idx):
        dup = next(i for i in idx if idx.count(i) > 1)
        raise TraceError(f"session {session_id!r}: call index {dup} appears twice")
    known = set(idx)
    for c in calls:
        for p in c.parents:
            if p not in known:
                raise TraceError(
                    f"session {session_id!r}: call {c.index} has unknown parent {p} "
                    f"(calls: {sorted(known)})"
                )
    # Kahn's algorithm: whatever cannot be ordered lies on (or behind) a cycle.
    indeg = {c.index: len(set(c.parents)) for c in calls}
    children: dict[int, list[int]] = {i: [] for i in idx}
    for c in calls:
        for p in set(c.parents):
            children[p].append(c.index)
    ready = [i for i, d in indeg.items() if d == 0]
    done = 0
    while ready:
        i = ready.pop()
        done += 1
        for ch in children[i]:
            indeg[ch] -= 1
            if indeg[ch] == 0:
                ready.append(ch)
    if done != len(calls):
        cyc = sorted(i for i, d in indeg.items() if d > 0)
        raise TraceError(f"session {session_id!r}: the call graph has a cycle through {cyc}")


def _col(df: pd.DataFrame, name: str, default: Any) -> list[Any]:
    if name not in df.columns:
        return [default] * len(df)
    out = []
    for v in df[name].tolist():
        if v is None or (isinstance(v, float) and math.isnan(v)):
            out.append(default)
        else:
            out.append(v)
    return out


def sessions_from_frame(df: pd.DataFrame) -> list[Session]:
    """Trace rows -> sessions in arrival order (``req`` = row index). Without a
    ``session_id`` column every row is a session of one call named by its request id."""
    n = len(df)
    rids = df["request_id"].astype(str).tolist()
    arr = df["arrival_s"].astype(float).tolist()
    plen = df["prompt_len"].astype(int).tolist()
    olen = df["output_len"].astype(int).tolist()
    prompts = _col(df, "prompt", None)
    tiers = _col(df, "tier", None)
    sids = [str(s) for s in _col(df, "session_id", None)] if has_sessions(df) else rids
    cidx = [int(x) for x in _col(df, "call_index", -1)]
    think = [float(x) for x in _col(df, "think_s", 0.0)]
    context = [str(x) for x in _col(df, "context", "history")]
    systems = _col(df, "system", None)
    replies = _col(df, "reply", None)
    agents = _col(df, "agent", None)
    targets = _col(df, "target", None)
    parents_raw = _col(df, "parents", None)
    token_ids = _col(df, "prompt_token_ids", None)
    system_lens = _col(df, "system_len", None)
    groups: dict[str, list[int]] = {}
    for i in range(n):
        groups.setdefault(sids[i], []).append(i)
    out: list[Session] = []
    for sid, rows in groups.items():
        calls: list[Call] = []
        for pos, i in enumerate(rows):
            index = cidx[i] if cidx[i] >= 0 else pos
            if "parents" in df.columns:
                parents = parse_parents(parents_raw[i])
            else:  # a conversation: each turn follows the previous one
                parents = (index - 1,) if index > 0 else ()
            if think[i] < 0 or not math.isfinite(think[i]):
                raise TraceError(f"row {i}: think_s={think[i]!r} is not a finite value >= 0")
            if context[i] not in CONTEXTS:
                raise TraceError(f"row {i}: context={context[i]!r} (use {', '.join(CONTEXTS)})")
            p = prompts[i]
            calls.append(
                Call(
                    req=i,
                    request_id=rids[i],
                    index=index,
                    parents=parents,
                    think_s=think[i],
                    prompt=p if isinstance(p, str) else None,
                    prompt_len=plen[i],
                    output_len=olen[i],
                    reply=replies[i] if isinstance(replies[i], str) else None,
                    context=context[i],
                    agent=None if agents[i] is None else str(agents[i]),
                    target=None if targets[i] is None else str(targets[i]).rstrip("/"),
                    token_ids=None if token_ids[i] is None else tuple(map(int, token_ids[i])),
                )
            )
        validate_graph(sid, calls)
        calls.sort(key=lambda c: c.index)
        first = rows[0]
        sys_text = systems[first]
        out.append(
            Session(
                session_id=sid,
                arrival_s=min(arr[i] for i in rows),
                tier=None if tiers[first] is None else str(tiers[first]),
                calls=tuple(calls),
                system=sys_text if isinstance(sys_text, str) and sys_text else None,
                system_len=None if system_lens[first] is None else int(system_lens[first]),
            )
        )
    out.sort(key=lambda s: s.arrival_s)
    return out


def compose(
    session: Session,
    call: Call,
    text_of: Any,
    reply_of: Any,
) -> tuple[str, list[tuple[str, int]]]:
    """The prompt of ``call`` and its pieces ``(kind, call index)`` (kind: system, user,
    reply, new). ``text_of(call)`` gives a call's new text and ``reply_of(call)`` its reply
    (trace text or the server's real answer): the caller decides which."""
    parts: list[str] = []
    pieces: list[tuple[str, int]] = []
    if session.system:
        parts.append(session.system)
        pieces.append(("system", -1))
    by = {c.index: c for c in session.calls}
    if call.context == "history":
        for a in session.ancestors(call.index):
            parts.append(text_of(by[a]))
            parts.append(reply_of(by[a]))
            pieces += [("user", a), ("reply", a)]
    elif call.context == "replies":
        for p in call.parents:
            parts.append(reply_of(by[p]))
            pieces.append(("reply", p))
    parts.append(text_of(call))
    pieces.append(("new", call.index))
    return SEPARATOR.join(parts), pieces


# -- building session traces ----------------------------------------------------------------
def session_arrivals(
    n: int, rate: float | None, process: str, burstiness: float, seed: int
) -> np.ndarray:
    """Open-loop session arrival offsets (Poisson/gamma/constant at ``rate`` sessions/s)."""
    from harness.workload.arrivals import arrival_times

    if rate is None:
        return np.zeros(n)
    return arrival_times(n, rate, process, burstiness, seed=seed)


def finish_frame(
    df: pd.DataFrame,
    *,
    tiers: list[Any],
    seed: int,
    session_rate: float | None,
    arrival: str = "poisson",
    burstiness: float = 1.0,
    num_sessions: int | None = None,
) -> pd.DataFrame:
    """Give a frame of calls (with ``session_id``; ``arrival_s`` optional: the sessions' own
    timestamps) per-session arrivals, tiers and request ids ``<session>/<index>``."""
    from harness.workload.tiers import assign_tiers

    df = df.copy()
    order = list(dict.fromkeys(df["session_id"].astype(str)))
    if num_sessions is not None:
        order = order[:num_sessions]
        df = df[df["session_id"].astype(str).isin(set(order))]
    if session_rate is not None or "arrival_s" not in df.columns:
        t = session_arrivals(len(order), session_rate, arrival, burstiness, seed)
        at = dict(zip(order, t.tolist(), strict=True))
    else:
        first = df.groupby(df["session_id"].astype(str), sort=False)["arrival_s"].min()
        at = {k: float(v) for k, v in first.items()}
    sid = df["session_id"].astype(str)
    df["arrival_s"] = sid.map(at).astype(float)
    if "tier" not in df.columns or df["tier"].isna().any():
        names = assign_tiers(len(order), list(tiers), seed)
        df["tier"] = sid.map(dict(zip(order, names.tolist(), strict=True)))
    if "call_index" not in df.columns:
        df["call_index"] = df.groupby(sid, sort=False).cumcount()
    df["session_id"] = sid
    if "request_id" not in df.columns:
        df["request_id"] = sid + "/" + df["call_index"].astype(int).astype(str)
    for col, default in (("think_s", 0.0), ("context", "history")):
        if col not in df.columns:
            df[col] = default
    if "parents" not in df.columns:
        df["parents"] = ["" if int(k) == 0 else str(int(k) - 1) for k in df["call_index"].tolist()]
    return df.sort_values(["arrival_s"], kind="stable").reset_index(drop=True)


def think_times(spec: str | float | None, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` think times from ``spec``: a number (constant, s), ``exp:MEAN``,
    ``lognormal:MEDIAN:SIGMA`` or ``uniform:LO:HI``; None = 0."""
    if spec is None:
        return np.zeros(n)
    if isinstance(spec, int | float):
        if spec < 0:
            raise TraceError(f"think time {spec} must be >= 0")
        return np.full(n, float(spec))
    kind, _, rest = str(spec).partition(":")
    try:
        args = [float(x) for x in rest.split(":")] if rest else []
        if kind == "exp" and len(args) == 1 and args[0] >= 0:
            return rng.exponential(args[0], size=n) if args[0] > 0 else np.zeros(n)
        if kind == "lognormal" and len(args) == 2 and args[0] > 0 and args[1] >= 0:
            return rng.lognormal(math.log(args[0]), args[1], size=n)
        if kind == "uniform" and len(args) == 2 and 0 <= args[0] <= args[1]:
            return rng.uniform(args[0], args[1], size=n)
        if not rest:
            v = float(kind)
            if v >= 0:
                return np.full(n, v)
    except ValueError:
        pass
    raise TraceError(
        f"think time {spec!r}: use seconds, exp:MEAN, lognormal:MEDIAN:SIGMA or uniform:LO:HI"
    )
