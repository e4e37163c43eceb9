"""Sessions in virtual time: the live session replay's rules on the simulator's clock (issue 16).

The rules are those of :class:`harness.loadgen.sessions.SessionDispatcher` (its docstring is
the spec; issue 15), restated for events instead of asyncio tasks:

- a session starts at its arrival, or when a slot frees under ``max_active_sessions`` (its
  ``start_s`` is then later than its ``target_s``);
- a call is released at ``max(parents' end) + think_s`` (roots: session start + ``think_s``),
  plus ``call_overhead_s``: the time a live call spends between the client and the engine
  (the reply's last chunk reaching the client, the next request's HTTP and tokenization in
  the API server), which the simulated engine would otherwise skip: on vLLM CPU it was a
  median 74-393 ms per call in two sittings, enough to change which prefix blocks survive
  (issue 16). A retry's re-send is delayed the same way. The call's target and arrival are
  that later time, so per-request latencies stay engine-side (TTFT from the engine's
  arrival): the overhead moves when calls arrive, not what a call measures;
  a call whose parent failed, or whose session was abandoned by the time its parents are
  done, is never sent and leaves no request row;
- its prompt is the composed prompt (:func:`harness.workload.sessions.compose`): system +
  history/replies context + its own text, counted the way the replay counts it
  (:func:`harness.workload.token_identity.call_prompt_len`: the trace's length hints, or
  the model's tokens for a trace tokenized by ``harness simulate --tokenizer``; the simulated
  engine ignores EOS, so a reply has exactly ``output_len`` tokens);
- ``max_context``: a call whose prompt + output exceeds it is not sent
  (``context_overflow``), and its descendants are not sent. A call of a tokenized trace
  (``Call.token_ids``: its prompt counted as the server counts it) meets the server's rule
  instead, since replay's own check runs on the trace's smaller hints and passes: vLLM
  (``entrypoints/serve/utils/api_utils.get_max_tokens``) refuses a prompt longer than the
  context and otherwise clips ``max_tokens`` to what is left;
- ``patience_s``: no first token ``patience_s`` after the release abandons the session (the
  call is cut, recorded ``abandoned``); ``max_retries`` re-sends a failed call after
  ``retry_backoff_s * 2**(attempt-1)``, each attempt its own row (``#retryN`` request id);
- a call is judged on its last attempt (:mod:`harness.results.sessions`).

The driver owns request rows and session records; the cluster loop
(:mod:`harness.engine.cluster`) owns time, engines and routing and calls :meth:`send` /
:meth:`attempt_done` / :meth:`abandon`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from harness.results import schema
from harness.results.schema import ERROR_ABANDONED, ERROR_CONTEXT
from harness.results.sessions import SessionRecord, sessions_table
from harness.workload.session_options import SessionOptions
from harness.workload.sessions import Call, Session, format_parents
from harness.workload.token_identity import call_prompt_len

# Event priorities at one instant (simulate.py's rule, style-examples take-away 5): releases
# first (a step starting then sees them), then patience deadlines, then engine steps.
RELEASE = 0
DEADLINE = 1
STEP = 2


class Row:
    """One request row (one attempt of one call)."""

    __slots__ = (
        "req",
        "request_id",
        "tier",
        "prompt_len",
        "output_len",
        "target_s",
        "arrival_s",
        "first_s",
        "last_s",
        "out_tokens",
        "preemptions",
        "ok",
        "error_kind",
        "error",
        "attempt",
        "session",
        "call",
        "engine",
        "done",
        "deadline",
        "cache_queries",
        "cache_hits",
    )

    def __init__(self, req: int, request_id: str, sess: _SessionState, call: Call) -> None:
        self.req = req
        self.request_id = request_id
        self.session = sess
        self.call = call
        self.tier = sess.session.tier
        self.output_len = call.output_len
        self.prompt_len = 0
        self.target_s = self.arrival_s = math.nan
        self.first_s = self.last_s = math.nan
        self.out_tokens = 0
        self.preemptions = 0
        self.ok = False
        self.error_kind: str | None = None
        self.error: str | None = None
        self.attempt = 0
        self.engine = -1
        self.done = False
        self.deadline = math.inf
        # prefix-cache lookup at first admission (prompt tokens, of which cached); NaN while
        # unknown: no prefix cache, or never admitted (harness.results.prefix_hits)
        self.cache_queries = math.nan
        self.cache_hits = math.nan


@dataclass
class _SessionState:
    session: Session
    rec: SessionRecord
    by: dict[int, Call]
    children: dict[int, list[int]]
    pending: dict[int, int]  # parents not yet done, per call index
    ok: dict[int, bool] = field(default_factory=dict)
    end: dict[int, float] = field(default_factory=dict)
    unresolved: int = 0


class SessionDriver:
    """Session state machines of one simulated run (module docstring)."""

    def __init__(
        self,
        sessions: list[Session],
        options: SessionOptions,
        *,
        push: Callable[[float, int, int, Callable[[Any, float], None], Any], None],
        send: Callable[[Row, float], str | None],
        deadline: Callable[[Row, float], None],
    ) -> None:
        self.sessions = sessions
        self.options = options
        self.push = push
        self.send_fn = send
        self.deadline_fn = deadline  # checks the engine, then calls abandon() if no token
        self.rows: list[Row] = []
        self.records: dict[str, SessionRecord] = {}
        self.next_req = 1 + max((c.req for s in sessions for c in s.calls), default=-1)
        self.active = 0
        self.queue: list[_SessionState] = []
        self.calls_sent = 0
        cap = options.max_active_sessions
        self.cap = cap if cap is not None else math.inf

    # -- sessions ---------------------------------------------------------------------------
    def arrive(self, s: Session, t: float) -> None:
        """The session's scheduled arrival: start it now, or queue it for a free slot."""
        children: dict[int, list[int]] = {c.index: [] for c in s.calls}
        for c in s.calls:
            for p in set(c.parents):
                children[p].append(c.index)
        st = _SessionState(
            session=s,
            rec=SessionRecord(s.session_id, s.tier, len(s.calls), s.arrival_s),
            by={c.index: c for c in s.calls},
            children=children,
            pending={c.index: len(set(c.parents)) for c in s.calls},
            unresolved=len(s.calls),
        )
        self.records[s.session_id] = st.rec
        if self.active < self.cap:
            self._start(st, t)
        else:
            self.queue.append(st)

    def _start(self, st: _SessionState, t: float) -> None:
        self.active += 1
        st.rec.start = t
        st.rec.end_reason = "running"
        for c in st.session.calls:
            if not c.parents:
                self._ready(st, c, t)

    def _start_queued(self, _arg: Any, t: float) -> None:
        if self.queue and self.active < self.cap:
            self._start(self.queue.pop(0), t)

    # -- calls ------------------------------------------------------------------------------
    def _ready(self, st: _SessionState, c: Call, base: float) -> None:
        """Every parent is done (roots: the session started) at ``base``."""
        if st.rec.abandoned or not all(st.ok.get(p, False) for p in c.parents):
            self._resolve(st, c, base, sent=False)  # not sent: no request row
            return
        delay = c.think_s + self.options.call_overhead_s
        t = base + delay
        row = Row(c.req, c.request_id, st, c)
        row.prompt_len = call_prompt_len(
            st.session, c, generated_replies=self.options.history == "reply"
        )
        row.target_s = t
        if not c.parents and delay == 0:
            self._release(row, t)  # a root at its session's start: that is now
        else:
            self.push(t, RELEASE, c.req, self._release, row)

    def _release(self, row: Row, t: float) -> None:
        row.arrival_s = t
        self.rows.append(row)
        c = row.call
        rec = row.session.rec
        ctx = self.options.max_context
        if ctx is not None and c.token_ids is not None and row.prompt_len < ctx:
            row.output_len = min(c.output_len, ctx - row.prompt_len)  # the server's clip
        if ctx is not None and row.prompt_len + row.output_len > ctx:
            self._fail(
                row,
                t,
                ERROR_CONTEXT,
                f"history {row.prompt_len} + output {row.output_len} tokens exceed the model's "
                f"context of {ctx} (--max-context)",
            )
            return
        rec.calls_sent += 1
        self.calls_sent += 1
        if self.options.patience_s is not None:
            row.deadline = t + self.options.patience_s
            self.push(row.deadline, DEADLINE, row.req, self.deadline_fn, row)
        problem = self.send_fn(row, t)
        if problem is not None:
            self._fail(row, t, schema.ERROR_REJECTED, problem)

    def abandon(self, row: Row, t: float) -> None:
        """No first token within patience: the call is cut and the session abandoned. The
        cluster calls this only for a row whose first token has not come by ``t``."""
        rec = row.session.rec
        rec.abandoned = True
        rec.end_reason = ERROR_ABANDONED
        p = self.options.patience_s
        self._fail(row, t, ERROR_ABANDONED, f"no first token within the user's patience of {p:g} s")

    def attempt_done(self, row: Row, first_s: float, last_s: float, out_tokens: int) -> None:
        """The engine finished the attempt (its last token at ``last_s``)."""
        row.first_s, row.last_s, row.out_tokens = first_s, last_s, out_tokens
        row.ok = True
        row.done = True
        st = row.session
        st.rec.calls_done += 1
        self._settle(st, row.call, last_s, True)

    def _fail(self, row: Row, t: float, kind: str, msg: str) -> None:
        row.done = True
        row.ok = False
        row.error_kind, row.error = kind, msg
        st = row.session
        rec = st.rec
        rec.calls_failed += 1
        rec.errors[kind] = rec.errors.get(kind, 0) + 1
        if kind == ERROR_CONTEXT:
            rec.end_reason = ERROR_CONTEXT
        retry = kind not in (ERROR_ABANDONED, schema.ERROR_CANCELLED, ERROR_CONTEXT)
        if retry and row.attempt < self.options.max_retries:
            attempt = row.attempt + 1
            rec.retries += 1
            at = (
                t + self.options.retry_backoff_s * 2 ** (attempt - 1) + self.options.call_overhead_s
            )
            nxt = Row(self.next_req, f"{row.call.request_id}#retry{attempt}", st, row.call)
            self.next_req += 1
            nxt.attempt = attempt
            nxt.prompt_len = row.prompt_len
            nxt.target_s = at
            st.end[row.call.index] = t
            self.push(at, RELEASE, nxt.req, self._release, nxt)
            return
        self._settle(st, row.call, t, False)

    def _settle(self, st: _SessionState, c: Call, end: float, ok: bool) -> None:
        st.ok[c.index] = ok
        st.end[c.index] = end
        self._resolve(st, c, end, sent=True)

    def _resolve(self, st: _SessionState, c: Call, t: float, *, sent: bool) -> None:
        if not sent:
            st.ok[c.index] = False
        st.unresolved -= 1
        for ch in st.children[c.index]:
            st.pending[ch] -= 1
            if st.pending[ch] == 0:
                call = st.by[ch]
                base = max(st.end.get(p, t) for p in call.parents)
                self._ready(st, call, base)
        if st.unresolved == 0:
            self._session_done(st, t)

    def _session_done(self, st: _SessionState, t: float) -> None:
        rec = st.rec
        ends = [e for e in st.end.values() if not math.isnan(e)]
        rec.end = max(ends) if ends else t
        if rec.end_reason == "running":
            rec.end_reason = "complete" if rec.calls_done == rec.calls_planned else "failed"
        self.active -= 1
        if self.queue:
            self.push(rec.end, RELEASE, -1, self._start_queued, None)

    # -- the end ----------------------------------------------------------------------------
    def cancel_rest(self, stop_s: float, live: Callable[[Row], tuple[float, float, int]]) -> None:
        """The clock stopped: in-flight attempts are cancelled (``live`` gives what they
        produced), running sessions end ``cancelled``."""
        for row in self.rows:
            if not row.done:
                row.first_s, row.last_s, row.out_tokens = live(row)
                row.error_kind = schema.ERROR_CANCELLED
                row.error = "still in flight when the simulation stopped"
                row.done = True
        for st_rec in self.records.values():
            if st_rec.end_reason == "running":
                st_rec.end_reason = "cancelled"
                st_rec.end = stop_s

    # -- tables -----------------------------------------------------------------------------
    def prefix_hit_counts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """(req, queries, hits) per request row for ``prefix_hits.parquet``; None when no
        row was looked up in a prefix cache (no engine has one)."""
        rows = sorted(self.rows, key=lambda r: r.req)
        q = np.array([r.cache_queries for r in rows], dtype=float)
        if not np.isfinite(q).any():
            return None
        h = np.array([r.cache_hits for r in rows], dtype=float)
        return np.array([r.req for r in rows], dtype=np.int64), q, h

    def requests_table(self, with_sessions: bool) -> pa.Table:
        """REQUESTS rows (plus the session columns for a session trace), one per attempt."""
        rows = sorted(self.rows, key=lambda r: r.req)
        n = len(rows)

        def col(name: str, dtype: Any = None) -> np.ndarray:
            return np.array([getattr(r, name) for r in rows], dtype=dtype)

        arrival = col("arrival_s", np.float64)
        out_tokens = col("out_tokens", np.int64)
        plen = col("prompt_len", np.int64)
        cols: dict[str, Any] = {
            "req": col("req", np.int64),
            "request_id": pa.array([r.request_id for r in rows], pa.string()),
            "tier": pa.array([r.tier for r in rows], pa.string()),
            "prompt_len": plen,
            "output_len": col("output_len", np.int64),
            "prompt_tokens": plen,
            "output_tokens": out_tokens,
            "target_s": col("target_s", np.float64),
            "arrival_s": arrival,
            "send_s": arrival,
            "first_chunk_s": col("first_s", np.float64),
            "last_chunk_s": col("last_s", np.float64),
            "num_chunks": out_tokens,
            "success": col("ok", bool) if n else np.zeros(0, bool),
            "error_kind": pa.array([r.error_kind for r in rows], pa.string()),
            "error": pa.array([r.error for r in rows], pa.string()),
            "http_status": pa.nulls(n, pa.int64()),
        }
        sch = schema.REQUESTS
        if with_sessions:
            sch = schema.REQUESTS_SESSIONS
            cols["session_id"] = pa.array([r.session.session.session_id for r in rows])
            cols["call_index"] = pa.array([r.call.index for r in rows], pa.int64())
            cols["parents"] = pa.array([format_parents(r.call.parents) for r in rows])
            cols["attempt"] = pa.array([r.attempt for r in rows], pa.int64())
        return pa.table({f.name: cols[f.name] for f in sch}, schema=sch)

    def sessions_table(self) -> pa.Table:
        """sessions.parquet rows, as the live replay writes them (already on the run clock)."""
        return sessions_table(self.records.values())


__all__ = ["DEADLINE", "RELEASE", "STEP", "Row", "SessionDriver"]
