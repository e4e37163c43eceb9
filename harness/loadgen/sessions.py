"""Session load generator: sessions arrive open-loop, their calls run closed-loop (issue 15).

:class:`SessionDispatcher` is a :class:`~harness.loadgen.dispatcher.Dispatcher` whose unit of
work is a :class:`~harness.workload.sessions.Session`: the parent class keeps the absolute
schedule (each session released at ``t0 + arrival_s``, late wake-ups never shift later ones),
the duration bound, the flusher and the Ctrl-C path; this class runs each session's call
graph inside its task:

- a call is released at ``max(parents' finish) + think_s`` (roots: session start +
  ``think_s``); that time is the row's ``target_s`` and the release its ``arrival_s``, so
  ``arrival_s - target_s`` is the dispatcher's lag inside sessions too;
- ``max_active_sessions`` caps sessions in progress: an arriving session waits for a slot
  (its ``start_s`` in the sessions table is later than its ``target_s``);
- history (:func:`~harness.workload.sessions.compose`): ``trace`` uses the trace's own reply
  text (reproducible, identical prefixes every run), ``reply`` the server's real answer (what
  a chat client does);
- reactive users (no peer models them, peers-2026-11.md rows 7-10, 29): ``patience_s``
  abandons the session when a call's first chunk has not come ``patience_s`` after its
  release (the call is cut and recorded ``abandoned``); ``max_retries`` re-sends a failed call
  after ``retry_backoff_s * 2**attempt`` (each attempt is its own request row);
- a call whose composed prompt + output exceeds ``max_context`` tokens is not sent and is
  recorded ``context_overflow``; its descendants are not sent; the rest of the run goes on.

Every request row carries ``session_id``, ``call_index``, ``parents`` and ``attempt``; the
per-session outcome goes to ``sessions.parquet`` (:mod:`harness.results.sessions`).
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from harness import clock
from harness.loadgen.client import RequestResult, encode_body, stream_request
from harness.loadgen.dialects import Endpoint
from harness.loadgen.dispatcher import Dispatcher
from harness.loadgen.sse import DONE
from harness.results import schema
from harness.results.sessions import SessionRecord, sessions_table, write_sessions
from harness.workload.prompts import synthesize_prompt, words
from harness.workload.session_options import SessionOptions, is_session_run
from harness.workload.sessions import Call, Session, compose, format_parents


@dataclass
class _CallState:
    done: asyncio.Event = field(default_factory=asyncio.Event)
    ok: bool = False
    end: float = math.nan
    reply_text: str | None = None
    output_tokens: int = 0


def _reply_texts(payloads: list[bytes], out: list[str]) -> None:
    """Append the text the stream's chunks carry (completions ``text``, chat ``delta``).

    SGLang's native ``/generate`` stream has no ``choices``: its top-level ``text`` is the
    reply so far (cumulative, :func:`harness.loadgen.client.interpret_sglang_generate`), so a
    text that extends the one held replaces it; otherwise (``--incremental-streaming-output``)
    it is appended."""
    for p in payloads:
        if p == DONE:
            continue
        try:
            obj = json.loads(p)
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        ch = obj.get("choices")
        if ch is None and "meta_info" in obj and isinstance(obj.get("text"), str):
            text = obj["text"]
            if len(out) <= 1 and text.startswith(out[0] if out else ""):
                out[:] = [text]
            else:
                out.append(text)
            continue
        if not ch or not isinstance(ch[0], dict):
            continue
        c0 = ch[0]
        delta = c0.get("delta")
        text = delta.get("content") if isinstance(delta, dict) else c0.get("text")
        if isinstance(text, str):
            out.append(text)


class SessionDispatcher(Dispatcher):
    """Runs sessions (each an arrival of the parent's schedule) against one or more targets."""

    def __init__(
        self,
        sessions: list[Session],
        *,
        options: SessionOptions,
        seed: int = 0,
        run_dir: Path | None = None,
        max_model_len: int | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(sessions, **kw)  # type: ignore[arg-type]
        self.options = options
        self.seed = seed
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.stats.planned = sum(len(s.calls) for s in sessions)
        self.active = (
            asyncio.Semaphore(options.max_active_sessions) if options.max_active_sessions else None
        )
        self.records: dict[str, SessionRecord] = {}
        self._cols: dict[int, tuple[str, int, str, int]] = {}
        self._next_req = 1 + max((c.req for s in sessions for c in s.calls), default=-1)
        # --max-context, else the max_model_len replay's readiness check read from /v1/models;
        # with neither, the engine's own 400 ("maximum context length") is the check.
        self.max_context = options.max_context
        self.max_context_from = "--max-context"
        if self.max_context is None and max_model_len:
            self.max_context, self.max_context_from = max_model_len, "max_model_len of /v1/models"

    # -- text ---------------------------------------------------------------------------------
    def _text(self, c: Call) -> str:
        return (
            c.prompt if c.prompt is not None else synthesize_prompt(c.prompt_len, self.seed, c.req)
        )

    def _trace_reply(self, c: Call) -> str:
        if c.reply is not None:
            return c.reply
        return synthesize_prompt(c.output_len, self.seed, 1_000_003 + c.req)

    # -- one session ------------------------------------------------------------------------
    async def _one(self, job: Any, target: float) -> None:  # type: ignore[override]
        s: Session = job
        rec = SessionRecord(s.session_id, s.tier, len(s.calls), target)
        self.records[s.session_id] = rec
        if self.active is not None:
            async with self.active:
                await self._session(s, rec)
        else:
            await self._session(s, rec)

    async def _session(self, s: Session, rec: SessionRecord) -> None:
        rec.start = clock.now()
        rec.end_reason = "running"
        states = {c.index: _CallState() for c in s.calls}
        tasks = [asyncio.create_task(self._call_when_ready(s, c, states, rec)) for c in s.calls]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            rec.end_reason = "cancelled"
            raise
        finally:
            ends = [st.end for st in states.values() if not math.isnan(st.end)]
            rec.end = max(ends) if ends else clock.now()
        if rec.end_reason == "running":
            rec.end_reason = "complete" if rec.calls_done == rec.calls_planned else "failed"

    async def _call_when_ready(
        self, s: Session, c: Call, states: dict[int, _CallState], rec: SessionRecord
    ) -> None:
        st = states[c.index]
        try:
            for p in c.parents:
                await states[p].done.wait()
            if rec.abandoned or not all(states[p].ok for p in c.parents):
                return  # not sent: a parent failed or the user left
            base = max((states[p].end for p in c.parents), default=rec.start)
            target = base + c.think_s
            delay = target - clock.now()
            if delay > 0:
                await asyncio.sleep(delay)
            await self._call(s, c, states, rec, target)
        finally:
            st.done.set()

    def _history_pieces(
        self, s: Session, c: Call, states: dict[int, _CallState]
    ) -> tuple[str, int, list[dict[str, str]] | None]:
        """The call's prompt text, its token hint, and (chat endpoint, ``history`` context)
        the same history as chat messages: system, then user/assistant turns."""
        real = self.options.history == "reply"
        by = {x.index: x for x in s.calls}

        def reply_of(a: Call) -> str:
            if real:
                return states[a.index].reply_text or ""
            return self._trace_reply(a)

        prompt, pieces = compose(s, c, self._text, reply_of)
        messages = None
        if self.endpoint is Endpoint.CHAT and c.context == "history":
            role = {"system": "system", "user": "user", "new": "user", "reply": "assistant"}

            def content(kind: str, i: int) -> str:
                if kind == "system":
                    return s.system or ""
                return reply_of(by[i]) if kind == "reply" else self._text(by[i])

            messages = [{"role": role[k], "content": content(k, i)} for k, i in pieces]
        n = 0
        for kind, i in pieces:
            if kind == "system":
                n += words(s.system or "")
            elif kind in ("user", "new"):
                n += by[i].prompt_len
            elif real:
                n += states[i].output_tokens
            else:
                n += by[i].output_len
        return prompt, max(1, n), messages

    async def _call(
        self,
        s: Session,
        c: Call,
        states: dict[int, _CallState],
        rec: SessionRecord,
        target: float,
    ) -> None:
        st = states[c.index]
        opts = self.options
        prompt, plen, messages = self._history_pieces(s, c, states)
        attempt = 0
        req, rid = c.req, c.request_id
        while True:
            res = RequestResult(
                req=req,
                request_id=rid,
                tier=s.tier,
                prompt_len=plen,
                output_len=c.output_len,
                target=target,
                arrival=clock.now(),
            )
            self._cols[req] = (s.session_id, c.index, format_parents(c.parents), attempt)
            lag = res.arrival - target
            if lag > self.stats.max_lag_s:
                self.stats.max_lag_s = lag
            ctx = self.max_context
            if ctx is not None and plen + c.output_len > ctx:
                res.fail(
                    schema.ERROR_CONTEXT,
                    f"history {plen} + output {c.output_len} tokens exceed the model's context "
                    f"of {ctx} ({self.max_context_from})",
                )
                res.prompt_tokens = plen
                res.output_tokens = 0
                self._finish(res, st, rec)
                rec.end_reason = schema.ERROR_CONTEXT
                return
            captured: list[str] = []
            await self._send(s, c, prompt, res, captured, messages)
            if res.error_kind == schema.ERROR_REJECTED and "context length" in (res.error or ""):
                # the engine's own check (vLLM: "maximum context length is N tokens")
                res.error_kind = schema.ERROR_CONTEXT
                self._finish(res, st, rec)
                rec.end_reason = schema.ERROR_CONTEXT
                return
            if res.success:
                st.reply_text = "".join(captured)
                st.output_tokens = res.output_tokens or 0
            self._finish(res, st, rec)
            if res.success or res.error_kind in (schema.ERROR_ABANDONED, schema.ERROR_CANCELLED):
                return
            if attempt >= opts.max_retries:
                return
            attempt += 1
            rec.retries += 1
            await asyncio.sleep(opts.retry_backoff_s * 2 ** (attempt - 1))
            req, rid = self._next_req, f"{c.request_id}#retry{attempt}"
            self._next_req += 1
            target = clock.now()

    def _finish(self, res: RequestResult, st: _CallState, rec: SessionRecord) -> None:
        end = res.last_chunk if res.success else clock.now()
        st.end = end if not math.isnan(end) else clock.now()
        st.ok = res.success
        if res.success:
            rec.calls_done += 1
        else:
            rec.calls_failed += 1
            k = res.error_kind or "unknown"
            rec.errors[k] = rec.errors.get(k, 0) + 1
        self._record(res)

    async def _send(
        self,
        s: Session,
        c: Call,
        prompt: str,
        res: RequestResult,
        captured: list[str],
        messages: list[dict[str, str]] | None = None,
    ) -> None:
        stats = self.stats
        extra = self.extra_body
        if messages is not None:  # chat: the history as turns, not one user message
            extra = {**(extra or {}), "messages": messages}
        body = self.dialect.body(
            self.endpoint,
            self.model,
            prompt,
            res.prompt_len,
            c.output_len,
            self.tiers.get(s.tier) if s.tier is not None else None,
            extra,
        )
        headers = dict(self.headers)
        headers["x-request-id"] = res.request_id
        headers["x-session-id"] = s.session_id
        url = self.url if c.target is None else c.target + self.dialect.path(self.endpoint)
        base = self.interpret
        interp = base  # the plain interpreter keeps the client's byte-scan fast path
        if self.options.history == "reply":  # the server's reply text is the next history

            def interp(payloads: list[bytes], t: float, r: RequestResult, state: Any) -> None:
                base(payloads, t, r, state)
                _reply_texts(payloads, captured)

        async def post() -> None:
            stats.sent += 1
            rec = self.records[s.session_id]
            rec.calls_sent += 1
            await stream_request(self.session, url, encode_body(body), headers, res, interp)

        async def gated() -> None:
            if self.sem is not None:
                async with self.sem:
                    await post()
            else:
                await post()

        if self._over_budget(res):  # the open-file budget holds for session calls too
            return
        stats.in_flight += 1
        patience = self.options.patience_s
        task: asyncio.Task[None] | None = None
        try:
            if patience is None:
                await gated()  # in this task: no extra loop hops before the children's release
                return
            task = asyncio.create_task(gated())
            done, _ = await asyncio.wait({task}, timeout=patience)
            if done or res.chunk_t:
                await asyncio.shield(task)
                return
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            res.fail(
                schema.ERROR_ABANDONED,
                f"no first token within the user's patience of {patience:g} s",
            )
            rec = self.records[s.session_id]
            rec.abandoned = True
            rec.end_reason = schema.ERROR_ABANDONED
        except asyncio.CancelledError:
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            if res.error_kind is None:
                res.fail(schema.ERROR_CANCELLED, "cancelled before it was sent")
            raise
        finally:
            stats.in_flight -= 1

    # -- writing ------------------------------------------------------------------------------
    def _tables(self, results: list[RequestResult]) -> tuple[pa.Table | None, pa.Table | None]:
        req_tbl, chunk_tbl = super()._tables(results)
        if req_tbl is None:
            return req_tbl, chunk_tbl
        cols = [self._cols.get(r.req, (None, None, None, None)) for r in results]
        for j, f in enumerate(schema.SESSION_FIELDS):
            req_tbl = req_tbl.append_column(f, pa.array([x[j] for x in cols], f.type))
        return req_tbl, chunk_tbl

    def sessions_table(self) -> pa.Table:
        """The sessions table on the run clock (``t0`` = 0)."""
        return sessions_table(self.records.values(), self.t0)

    async def run(self, t0: float) -> Any:
        """The parent's run; ``sessions.parquet`` is written however it ends (Ctrl-C too)."""
        try:
            return await super().run(t0)
        finally:
            if self.run_dir is not None:
                write_sessions(self.run_dir, self.sessions_table())


# -- the live side of a session replay (harness.loadgen.replay) --------------------------------
def session_factory(cfg: Any, trace: Any, run_dir: Path, max_model_len: int | None = None) -> Any:
    """A callable with :func:`harness.loadgen.workers.make_dispatcher`'s signature that builds
    a :class:`SessionDispatcher` (one process: a session's calls stay one unit), or None.
    ``max_model_len``: the model's context from ``/v1/models`` (replay's readiness check)."""
    if not is_session_run(cfg, trace):
        return None
    from harness.workload.sessions import sessions_from_frame

    sessions = sessions_from_frame(trace.df)
    opts = cfg.sessions or SessionOptions()

    def make(_workers: Any, _jobs: Any, *, shard_keys: Any = None, **kw: Any) -> SessionDispatcher:
        # Only what the in-process Dispatcher takes (make_dispatcher's own knobs, e.g. workers
        # or a cluster address, do not apply: a session runs in one process).
        import inspect

        known = set(inspect.signature(Dispatcher.__init__).parameters) - {"prompt_fn"}
        kw = {k: v for k, v in kw.items() if k in known}
        return SessionDispatcher(
            sessions,
            options=opts,
            seed=cfg.seed,
            run_dir=run_dir,
            max_model_len=max_model_len,
            **kw,
        )

    return make
