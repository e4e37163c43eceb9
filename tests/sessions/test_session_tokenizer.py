"""`harness simulate --tokenizer` on a session trace (issue 16): prompt lengths in the model's
tokens and prefix-cache hits from the composed prompts' real token ids.

A session trace's lengths are hints (ShareGPT: UTF-8 bytes / 4, system prompt: words); vLLM
counts and hashes the composed prompt's tokens. With ``--tokenizer`` and ``--history trace``
each call's prompt length must be the tokenizer's count of exactly the text replay sends
(system + earlier turns and the trace's replies + the new question, joined as
:func:`harness.workload.sessions.compose` joins them, special tokens included), and every hit
must be the longest whole-block common prefix of those ids with a prompt computed earlier.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from harness.cli.main import app
from harness.results.prefix_hits import PREFIX_HITS_FILE
from harness.workload.sessions import SEPARATOR

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / ".cache" / "tiny-llama"
BLOCK = 16
SYSTEM = "You are a careful assistant. Answer briefly and cite the manual where you can."
TURNS = [
    ("How do I reset the router to its factory settings?", "Hold the reset button for ten "
     "seconds until the lights blink, then wait two minutes for it to restart."),
    ("And after that, how do I set a new wifi password?", "Open the admin page at the address "
     "on the label, log in, and change the key under wireless security."),
    ("Which address is on the label exactly?", "It is usually 192.168.0.1 or 192.168.1.1; "
     "the label on the bottom says which."),
]  # fmt: skip


def _trace(tmp_path: Path) -> Path:
    """Three 3-turn conversations with the same system prompt, 100 s apart (no overlap: each
    call is admitted after every earlier one finished), think time 1 s."""
    rows = []
    for s in range(3):
        for k, (q, a) in enumerate(TURNS):
            q = q if s == 0 else f"({s}) {q}"  # different questions, same system prompt
            rows.append(
                {
                    "session_id": f"s{s}",
                    "call_index": k,
                    "arrival_s": 100.0 * s,
                    "think_s": 0.0 if k == 0 else 1.0,
                    "prompt": q,
                    "prompt_len": len(q.split()),  # the trace's own hint, not tokens
                    "reply": a,
                    "output_len": 12,
                    "system": SYSTEM,
                }
            )
    p = tmp_path / "sessions.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def _trained_tokenizer(tmp_path: Path) -> Path:
    """A small byte-level BPE (the tiny model's kind) that adds a BOS token, trained here."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([SYSTEM] + [q + " " + a for q, a in TURNS] * 5, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return path


def _expected_ids(trace: Path, tokenizer: Path) -> dict[tuple[str, int], list[int]]:
    """Each call's prompt as replay composes it (--history trace), encoded independently of
    the harness, as the server encodes a completions prompt."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer))
    df = pd.read_json(trace, lines=True)
    out: dict[tuple[str, int], list[int]] = {}
    for sid, g in df.groupby("session_id"):
        g = g.sort_values("call_index")
        parts = [SYSTEM]
        for row in g.itertuples():
            text = SEPARATOR.join([*parts, row.prompt])
            out[(str(sid), int(row.call_index))] = tok.encode(text).ids
            parts += [row.prompt, row.reply]
    return out


def _simulate(trace: Path, out: Path, *extra: str) -> pd.DataFrame:
    res = CliRunner().invoke(
        app,
        [
            "simulate", "--trace", str(trace), "--block-size", str(BLOCK),
            "--kv-tokens", "65536", "--history", "trace", "--no-report", "--out", str(out),
            *extra,
        ],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    (run_dir,) = [d for d in out.iterdir() if d.is_dir()]
    req = pd.read_parquet(run_dir / "requests.parquet")
    hits = pd.read_parquet(run_dir / PREFIX_HITS_FILE)
    return req.merge(hits, on="req").sort_values(["arrival_s", "call_index"])


def _lcp_blocks(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n // BLOCK * BLOCK


def _check(trace: Path, tokenizer: Path, tmp_path: Path) -> None:
    ids = _expected_ids(trace, tokenizer)
    got = _simulate(trace, tmp_path / "tok", "--tokenizer", str(tokenizer))
    assert got["success"].all() and len(got) == len(ids)
    keys = list(zip(got["session_id"], got["call_index"].astype(int), strict=True))
    # prompt lengths: the tokenizer's counts of the composed prompts, not the trace's hints
    assert got["prompt_len"].tolist() == [len(ids[k]) for k in keys]
    assert got["queries"].tolist() == [len(ids[k]) for k in keys]
    # hits follow the token ids: the longest whole-block prefix shared with an earlier prompt
    # (the last prompt token is always recomputed, as vLLM does)
    expected = []
    for i, k in enumerate(keys):
        best = max((_lcp_blocks(ids[k], ids[j]) for j in keys[:i]), default=0)
        expected.append(min(best, (len(ids[k]) - 1) // BLOCK * BLOCK))
    assert got["hits"].astype(int).tolist() == expected
    assert got["hits"].iloc[3] > 0  # the shared system prompt hits on a later first turn
    # without a tokenizer the lengths are the trace's hints: fewer, and other block edges
    plain = _simulate(trace, tmp_path / "plain")
    assert plain["prompt_len"].tolist() != got["prompt_len"].tolist()


def test_tokenizer_counts_and_hits_follow_token_ids(tmp_path: Path) -> None:
    _check(_trace(tmp_path), _trained_tokenizer(tmp_path), tmp_path)


@pytest.mark.skipif(
    not (TINY / "tokenizer.json").is_file(),
    reason=f"the tiny model's tokenizer is absent ({TINY}; scripts/vllm-cpu/setup.sh builds it)",
)
def test_tiny_model_tokenizer(tmp_path: Path) -> None:
    _check(_trace(tmp_path), TINY / "tokenizer.json", tmp_path)


def test_tokenizer_on_a_plain_trace_is_one_line_exit_2(tmp_path: Path) -> None:
    csv = tmp_path / "plain.csv"
    csv.write_text("num_prefill_tokens,num_decode_tokens\n10,5\n20,5\n")
    res = CliRunner().invoke(
        app,
        ["simulate", "--trace", str(csv), "--rate", "1", "--tokenizer", str(tmp_path),
         "--no-report", "--out", str(tmp_path / "o")],
    )  # fmt: skip
    assert res.exit_code == 2
    assert "--tokenizer" in res.output and "no sessions" in res.output


def test_reply_history_counts_own_text_and_system_in_tokens(tmp_path: Path) -> None:
    """--history reply: the server's replies are unknown text, so they stay generated-token
    runs (output_len each); the system prompt and each question are counted in tokens."""
    from tokenizers import Tokenizer

    trace, tokenizer = _trace(tmp_path), _trained_tokenizer(tmp_path)
    tok = Tokenizer.from_file(str(tokenizer))
    n = lambda t: len(tok.encode(t, add_special_tokens=False).ids)  # noqa: E731
    res = CliRunner().invoke(
        app,
        ["simulate", "--trace", str(trace), "--history", "reply", "--tokenizer", str(tokenizer),
         "--no-report", "--out", str(tmp_path / "r")],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    (run_dir,) = [d for d in (tmp_path / "r").iterdir() if d.is_dir()]
    req = pd.read_parquet(run_dir / "requests.parquet").sort_values(["arrival_s", "call_index"])
    s0 = req[req["session_id"] == "s0"]["prompt_len"].tolist()
    q = [n(t) for t, _ in TURNS]
    assert s0 == [n(SYSTEM) + q[0], n(SYSTEM) + q[0] + 12 + q[1], n(SYSTEM) + sum(q) + 24]


def test_texts_the_trace_lacks_are_replays_synthesised_ones(tmp_path: Path) -> None:
    """A length-only session trace: the tokenized trace holds the words replay would send
    (harness.loadgen.sessions.SessionDispatcher), and counts those."""
    from harness.loadgen.sessions import SessionDispatcher
    from harness.workload.prompts import load_tokenizer
    from harness.workload.sessions import sessions_from_frame
    from harness.workload.tiers import parse_tiers
    from harness.workload.token_identity import tokenize_session_trace
    from harness.workload.trace import Trace

    rows = [
        {"session_id": "a", "call_index": k, "parents": "" if k == 0 else str(k - 1),
         "prompt_len": 20 + k, "output_len": 7, "arrival_s": 0.0, "tier": "default",
         "request_id": f"a/{k}"}
        for k in range(3)
    ]  # fmt: skip
    trace = Trace.from_frame(pd.DataFrame(rows), parse_tiers("default:1"), {"sessions": True})
    tok = load_tokenizer(str(_trained_tokenizer(tmp_path)))
    got = tokenize_session_trace(trace, tok, history="trace", seed=5)
    disp = SessionDispatcher.__new__(SessionDispatcher)
    disp.seed = 5  # only the text synthesis of a dispatcher is used
    (s,) = sessions_from_frame(trace.df)
    (t,) = sessions_from_frame(got.df)
    for c, ct in zip(s.calls, t.calls, strict=True):
        assert ct.prompt == disp._text(c) and ct.reply == disp._trace_reply(c)
        assert ct.prompt_len == tok.count(ct.prompt)
    assert t.calls[2].token_ids is not None
    c0, c1, c2 = t.calls
    text = SEPARATOR.join([c0.prompt, c0.reply, c1.prompt, c1.reply, c2.prompt])
    assert list(c2.token_ids) == tok.encode_prompt(text)
    assert got.meta["token_counts"]["history"] == "trace"


def test_tokenized_calls_meet_the_servers_context_rule(tmp_path: Path) -> None:
    """Counted as the server counts, a call meets vLLM's rule (get_max_tokens): a prompt
    longer than the context is refused, otherwise max_tokens is clipped to what is left
    (replay's own prompt + max_tokens check runs on the smaller hints and sends it)."""
    trace, tokenizer = _trace(tmp_path), _trained_tokenizer(tmp_path)
    ids = _expected_ids(trace, tokenizer)
    ctx = len(ids[("s0", 2)]) + 5  # s0's last turn fits with 5 of its 12 tokens
    assert len(ids[("s1", 2)]) > ctx  # s1's and s2's last turns do not fit at all
    res = CliRunner().invoke(
        app,
        ["simulate", "--trace", str(trace), "--history", "trace", "--tokenizer", str(tokenizer),
         "--max-context", str(ctx), "--no-report", "--out", str(tmp_path / "c")],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    (run_dir,) = [d for d in (tmp_path / "c").iterdir() if d.is_dir()]
    req = pd.read_parquet(run_dir / "requests.parquet").set_index("request_id")
    assert req.loc["s0/2", "success"] and req.loc["s0/2", "output_tokens"] == 5
    assert req.loc["s0/1", "output_tokens"] == 12  # room left: not clipped
    for rid in ("s1/2", "s2/2"):
        assert not req.loc[rid, "success"] and req.loc[rid, "error_kind"] == "context_overflow"
