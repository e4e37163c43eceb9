"""A session call's prompt as named token runs, for the engine's prefix cache (issue 16).

The simulator has lengths, not token ids, so a call's prompt is named piece by piece the way
:func:`harness.workload.sessions.compose` builds it: the session's ``system`` prefix (named by
its text, so sessions sharing a system prompt share its blocks), then the context (``history``:
each ancestor's own text and its reply; ``replies``: the parents' replies), then the call's own
text. Lengths are the ones replay sends as its token hint
(:meth:`harness.loadgen.sessions.SessionDispatcher._history_pieces`): system in words, own text
``prompt_len``, replies ``output_len`` (or the tokens actually generated). A call's reply is
the run ``reply_key(session, call)``: the engine names the blocks of the tokens it generates
with it, so turn k+1, whose history holds turn k's reply, hits them. That is replay's
``--history reply`` on an engine whose replies round-trip through text; with ``--history trace``
the history holds the trace's reply text, which is not what the engine generated
(``generated_replies=False`` names it apart, so only earlier prompts' blocks hit).

Those lengths are the trace's hints (ShareGPT: UTF-8 bytes / 4; system: words), not the
model's tokens. :func:`tokenize_session_trace` (``harness simulate --tokenizer``) counts them
in the model's tokens instead, and under ``--history trace`` gives every call the token ids
of its whole composed prompt, encoded as the server encodes it (special tokens included), so
its blocks hash like vLLM's (``PromptIdentity.from_token_ids``) and the prefix cache sees
the token boundaries vLLM sees. Under ``--history reply`` the server's replies are unknown
text: the system prefix and each call's own text are counted in tokens, the replies stay
the generated-token runs, separators and BOS are not counted.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from harness.engine.prefix_cache import PromptIdentity
from harness.workload.prompts import words
from harness.workload.sessions import Call, Session, compose, sessions_from_frame

if TYPE_CHECKING:
    from harness.workload.prompts import TokenCounter
    from harness.workload.trace import Trace


def system_key(text: str) -> str:
    """Run name of a system prefix: its text's digest (equal texts share cached blocks)."""
    return "system:" + hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def text_key(session: Session, call: Call) -> str:
    """Run name of a call's own new text."""
    return f"{session.session_id}/{call.index}/text"


def reply_key(session: Session, call: Call) -> str:
    """Run name of a call's reply (the tokens the engine generates for it)."""
    return f"{session.session_id}/{call.index}/reply"


def _trace_reply_key(session: Session, call: Call) -> str:
    return f"{session.session_id}/{call.index}/trace-reply"


def call_segments(
    session: Session,
    call: Call,
    reply_len: Callable[[Call], int] | None = None,
    generated_replies: bool = True,
) -> list[tuple[str, int]]:
    """``(run name, tokens)`` of a call's prompt, in order (zero-length runs dropped).

    ``reply_len(call)`` is the length of a call's reply in tokens (default: its trace
    ``output_len``; a simulator passes the tokens really generated, e.g. after an abort).
    ``generated_replies``: the context's replies are the engine's generated tokens (True) or
    the trace's reply text (False, replay ``--history trace``).
    """
    rl = reply_len if reply_len is not None else (lambda c: c.output_len)
    rkey = reply_key if generated_replies else _trace_reply_key
    segs: list[tuple[str, int]] = []
    if session.system:
        n = session.system_len if session.system_len is not None else words(session.system)
        segs.append((system_key(session.system), n))
    by = {c.index: c for c in session.calls}
    if call.context == "history":
        for a in session.ancestors(call.index):
            segs.append((text_key(session, by[a]), by[a].prompt_len))
            segs.append((rkey(session, by[a]), rl(by[a])))
    elif call.context == "replies":
        for p in call.parents:
            segs.append((rkey(session, by[p]), rl(by[p])))
    segs.append((text_key(session, call), call.prompt_len))
    return [(k, int(n)) for k, n in segs if n > 0]


def call_prompt_len(
    session: Session,
    call: Call,
    reply_len: Callable[[Call], int] | None = None,
    generated_replies: bool = True,
) -> int:
    """The call's prompt length in tokens (at least 1, like replay's hint): its token ids'
    count when the trace was tokenized and the history is the trace's text."""
    if call.token_ids is not None and not generated_replies:
        return max(1, len(call.token_ids))
    return max(1, sum(n for _, n in call_segments(session, call, reply_len, generated_replies)))


def call_identity(
    session: Session,
    call: Call,
    reply_len: Callable[[Call], int] | None = None,
    generated_replies: bool = True,
) -> PromptIdentity:
    """The call's :class:`PromptIdentity`: its token ids (a tokenized trace under
    ``--history trace``) or its segments, replying as ``reply_key``."""
    if call.token_ids is not None and not generated_replies and call.token_ids:
        return PromptIdentity.from_token_ids(call.token_ids, reply_key=reply_key(session, call))
    segs = call_segments(session, call, reply_len, generated_replies)
    if not segs:  # replay sends at least one token
        segs = [(text_key(session, call), 1)]
    return PromptIdentity.from_segments(segs, reply_key=reply_key(session, call))


def tokenize_session_trace(
    trace: Trace, tokenizer: TokenCounter, *, history: str = "trace", seed: int = 0
) -> Trace:
    """``trace`` with its session lengths in ``tokenizer``'s tokens (module docstring).

    Each call's ``prompt_len`` becomes its own text's token count and ``system_len`` the
    system prefix's; with ``history="trace"`` every call also gets ``prompt_token_ids``, its
    composed prompt (:func:`~harness.workload.sessions.compose` with the trace's replies,
    what replay sends) encoded with special tokens, as a completions endpoint encodes it.
    Texts the trace lacks are synthesised as replay synthesises them for ``seed``
    (:class:`harness.loadgen.sessions.SessionDispatcher`) and written into ``prompt`` /
    ``reply``, so the result is self-contained. ``output_len`` (max_tokens) is unchanged.
    """
    from harness.workload.prompts import synthesize_prompt
    from harness.workload.trace import Trace

    if history not in ("trace", "reply"):
        raise ValueError(f"history must be 'trace' or 'reply', got {history!r}")
    df = trace.df.copy()
    sessions = sessions_from_frame(df)
    texts: dict[int, str] = {}
    replies: dict[int, str] = {}
    for s in sessions:
        for c in s.calls:
            texts[c.req] = (
                c.prompt if c.prompt is not None else synthesize_prompt(c.prompt_len, seed, c.req)
            )
            replies[c.req] = (
                c.reply
                if c.reply is not None
                else synthesize_prompt(c.output_len, seed, 1_000_003 + c.req)
            )
    n = len(df)
    counted = [tokenizer.count(texts[i]) for i in range(n)]
    df["prompt"] = [texts[i] for i in range(n)]
    df["reply"] = [replies[i] for i in range(n)]
    df["prompt_len"] = [max(1, k) for k in counted]  # a trace length is >= 1
    sys_len: dict[str, int] = {}
    for s in sessions:
        if s.system:
            sys_len[s.session_id] = tokenizer.count(s.system)
    if "session_id" in df.columns:
        df["system_len"] = [sys_len.get(sid) for sid in df["session_id"].astype(str)]
    if history == "trace":
        ids: list[list[int] | None] = [None] * n
        for s in sessions:
            for c in s.calls:
                prompt, _ = compose(s, c, lambda x: texts[x.req], lambda x: replies[x.req])
                ids[c.req] = tokenizer.encode_prompt(prompt)
        df["prompt_token_ids"] = ids
    else:
        df = df.drop(columns=["prompt_token_ids"], errors="ignore")
    meta = dict(trace.meta)
    meta["token_counts"] = {"tokenizer": tokenizer.name, "history": history}
    return Trace.from_frame(df, trace.tiers, meta)


__all__ = [
    "call_identity",
    "call_prompt_len",
    "call_segments",
    "reply_key",
    "system_key",
    "tokenize_session_trace",
]
