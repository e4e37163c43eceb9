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
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from harness.engine.prefix_cache import PromptIdentity
from harness.loadgen.sessions import words
from harness.workload.sessions import Call, Session


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
        segs.append((system_key(session.system), words(session.system)))
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
    """The call's prompt length in tokens (at least 1, like replay's hint)."""
    return max(1, sum(n for _, n in call_segments(session, call, reply_len, generated_replies)))


def call_identity(
    session: Session,
    call: Call,
    reply_len: Callable[[Call], int] | None = None,
    generated_replies: bool = True,
) -> PromptIdentity:
    """The call's :class:`PromptIdentity`: its segments, replying as ``reply_key``."""
    segs = call_segments(session, call, reply_len, generated_replies)
    if not segs:  # replay sends at least one token
        segs = [(text_key(session, call), 1)]
    return PromptIdentity.from_segments(segs, reply_key=reply_key(session, call))


__all__ = ["call_identity", "call_prompt_len", "call_segments", "reply_key", "system_key"]
