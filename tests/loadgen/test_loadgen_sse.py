"""SSE decoding: message boundaries across reads, comments, CRLF, multi-line data."""

from harness.loadgen.sse import SSEDecoder


def test_split_across_reads_and_fast_path() -> None:
    d = SSEDecoder()
    assert d.feed(b'data: {"a"') == []
    assert d.pending == b'data: {"a"'
    assert d.feed(b": 1}\n") == []
    assert d.feed(b"\ndata: [DONE]\n\n") == [b'{"a": 1}', b"[DONE]"]
    assert d.pending == b""


def test_comments_and_other_fields_are_skipped() -> None:
    d = SSEDecoder()
    out = d.feed(b": ping\n\nevent: x\nid: 3\ndata: hello\n\n: keepalive\n\n")
    assert out == [b"hello"]


def test_crlf_and_multiline_data() -> None:
    d = SSEDecoder()
    assert d.feed(b"data: a\r\n") == []
    assert d.feed(b"data:b\r\n\r\ndata: c\r") == [b"a\nb"]
    assert d.feed(b"\n\r\n") == [b"c"]
