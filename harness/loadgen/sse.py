"""Incremental Server-Sent Events decoder for the streaming client's hot path.

Only what OpenAI-compatible servers use: messages separated by a blank line, ``data:`` fields
(several are joined with ``\\n`` as the SSE spec says), ``:`` comment lines (keep-alive pings)
skipped, other fields (``event:``, ``id:``, ``retry:``) ignored. Same splitting rule as vLLM's
``StreamedResponseHandler`` (anchors-harness.md §2.1: split on a blank line, skip ``:`` pings,
stop at ``[DONE]``), but on bytes, so no decode happens for a message until it is complete.
"""

from __future__ import annotations

DONE = b"[DONE]"


class SSEDecoder:
    """Feed raw bytes as they arrive; get back the ``data`` payloads of completed messages.

    A message is complete once its terminating blank line has arrived; a partial message stays
    buffered until the next :meth:`feed`. ``\\r\\n`` line ends are normalised to ``\\n``.
    """

    __slots__ = ("_buf", "_cr")

    def __init__(self) -> None:
        self._buf = b""
        self._cr = False

    def feed(self, data: bytes) -> list[bytes]:
        """Return the data payloads (without the ``data:`` prefix) of messages completed by
        ``data``; messages without a data field (comments, bare events) yield nothing."""
        if self._cr or b"\r" in data:
            # Rare (most servers write \n); a \r\n split across reads is kept whole by
            # normalising the joined buffer.
            self._cr = True
            buf = (self._buf + data).replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        else:
            buf = self._buf + data if self._buf else data
        parts = buf.split(b"\n\n")
        self._buf = parts.pop()
        # Fast path: every message is one ``data: `` line, the shape every OpenAI-compatible
        # server writes; anything else (comments, other fields, multi-line data) goes the
        # slow way, message by message, in order.
        fast = [m[6:] for m in parts if m.startswith(b"data: ") and b"\n" not in m]
        if len(fast) == len(parts):
            return fast
        out: list[bytes] = []
        for msg in parts:
            if not msg:
                continue
            if msg.startswith(b"data: ") and b"\n" not in msg:
                out.append(msg[6:])
                continue
            payload = _slow_message(msg)
            if payload is not None:
                out.append(payload)
        return out

    @property
    def pending(self) -> bytes:
        """Bytes of an unfinished message (non-empty at EOF means the stream was cut)."""
        return self._buf


def _slow_message(msg: bytes) -> bytes | None:
    data_lines: list[bytes] = []
    for line in msg.split(b"\n"):
        if not line or line.startswith(b":"):
            continue
        name, sep, value = line.partition(b":")
        if name != b"data":
            continue
        if not sep:
            value = b""
        elif value.startswith(b" "):
            value = value[1:]
        data_lines.append(value)
    if not data_lines:
        return None
    return b"\n".join(data_lines)
