"""Named datasets: ``lmsys``, ``sharegpt``, ``azure-conv``; real data, else a bundled profile.

Real data (anchors-harness.md §2.1 "Datasets" and §7 "ShareGPT/LMSYS filtering"):

- ``lmsys``: HF ``lmsys/lmsys-chat-1m`` (gated: needs an HF token) through ``datasets``,
  streaming; or ``path=`` a local copy (a ``save_to_disk`` folder, JSON, JSONL or Parquet).
- ``sharegpt``: ``ShareGPT_V3_unfiltered_cleaned_split.json`` (HF
  ``anon8231489123/ShareGPT_Vicuna_unfiltered``) or the openchat ShareGPT-4 file
  (``openchat/openchat_sharegpt4_dataset``, ``sharegpt_gpt4.json``); or ``path=``.
- ``azure-conv``: ``path=`` the Azure LLM inference trace CSV (raw ``TIMESTAMP,
  ContextTokens,GeneratedTokens`` or Vidur's ``arrived_at,num_prefill_tokens,...``).

Conversations become requests: **each user turn is one request** whose output length is the
next assistant message's length (``turns="first"`` keeps only the first pair, as vLLM
does for ShareGPT). The prompt is **the turn alone by default** (``prompt_mode="turn"``,
vLLM's convention and what the bundled profiles measure); ``prompt_mode="conversation"``
sends the conversation so far (what a chat server receives on a later turn). Lengths are
in tokens of ``tokenizer=`` (a tokenizer.json or a HF name loadable offline) or, without
one, the documented approximation ``ceil(utf8_bytes / 4)`` (prompts.py ``approx_tokens``).
``filter="vllm"`` applies vLLM's ``is_valid_sequence`` (prompt 4..1024, output >= 4, prompt
+ output <= 2048); the default ``filter="none"`` keeps every turn. Either way the choice is
recorded in the trace meta.

Fallback: when the real data cannot be had (no ``path=``, hub unreachable, gated, no
``datasets``), the bundled length profile of that dataset is used (profile.py). This is
announced on the terminal and recorded in the trace meta (``fallback: true``, ``profile``,
``reason``), which run.json and the report carry. ``fallback="never"`` turns it into an
error, ``fallback="always"`` skips the attempt.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.workload.sources.base import SourceData, take_options
from harness.workload.trace import TraceError

HUB_IDS = {
    "lmsys": ("lmsys/lmsys-chat-1m", None),
    "sharegpt": (
        "anon8231489123/ShareGPT_Vicuna_unfiltered",
        "ShareGPT_V3_unfiltered_cleaned_split.json",
    ),
}
_USER = {"user", "human"}
_ASSISTANT = {"assistant", "gpt", "chatgpt", "bard", "bing", "model"}


def fallback(name: str, reason: str) -> SourceData:
    """The bundled profile of ``name``, announced and recorded (never silent)."""
    from harness.workload.profile import load_profile

    prof = load_profile(name)
    return SourceData(
        df=pd.DataFrame(columns=["prompt_len", "output_len"]),
        meta={
            "source": name,
            "fallback": True,
            "profile": prof.name,
            "profile_origin": prof.origin,
            "reason": reason,
        },
        notes=[
            f"{name}: real dataset not available ({reason}); using the bundled length "
            f"profile {prof.name!r} ({prof.origin})"
        ],
        sampler=prof.sample_frame,
        timed=prof.gap_q is not None,
    )


def load_named(name: str, options: dict[str, Any], seed: int | None) -> SourceData:
    if name == "azure-conv":
        opts = take_options(options, {"path": None, "fallback": "auto"}, name)
        return _azure(opts)
    opts = take_options(
        options,
        {
            "path": None,
            "dataset": None,
            "split": "train",
            "tokenizer": None,
            "prompt_mode": "turn",
            "turns": "all",
            "filter": "none",
            "language": None,
            "max_rows": 20000,
            "fallback": "auto",
        },
        name,
    )
    if opts["prompt_mode"] not in ("turn", "conversation"):
        raise TraceError(f"{name}: prompt_mode must be 'turn' or 'conversation'")
    if opts["turns"] not in ("all", "first"):
        raise TraceError(f"{name}: turns must be 'all' or 'first'")
    if opts["filter"] not in ("none", "vllm"):
        raise TraceError(f"{name}: filter must be 'none' or 'vllm'")
    if opts["fallback"] not in ("auto", "never", "always"):
        raise TraceError(f"{name}: fallback must be 'auto', 'never' or 'always'")
    if opts["fallback"] == "always":
        return fallback(name, "fallback=always")
    try:
        records, where = _open_records(name, opts)
    except _Unavailable as e:
        if opts["fallback"] == "never":
            raise TraceError(f"{name}: real dataset not available ({e})") from None
        return fallback(name, str(e))
    return _to_rows(name, records, where, opts)


class _Unavailable(Exception):
    """The real dataset cannot be reached (a reason for the fallback, not a user error)."""


def _open_records(name: str, opts: dict[str, Any]) -> tuple[Iterable[dict[str, Any]], str]:
    if opts["path"] is not None:
        return _local_records(Path(opts["path"]).expanduser(), opts["split"]), str(opts["path"])
    hub_id, data_file = HUB_IDS[name]
    hub_id = opts["dataset"] or hub_id
    if os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1":
        raise _Unavailable("HF_HUB_OFFLINE is set")
    try:
        import datasets  # noqa: F401
    except ImportError:
        raise _Unavailable("the 'datasets' package is not installed") from None
    import httpx

    try:  # a quick reachability probe, so an offline machine does not wait on retries
        httpx.head("https://huggingface.co", timeout=3.0)
    except httpx.HTTPError as e:
        raise _Unavailable(f"HF hub unreachable: {type(e).__name__}") from None
    try:
        from datasets import load_dataset

        kw: dict[str, Any] = {"split": opts["split"], "streaming": True}
        if data_file is not None and opts["dataset"] is None:
            kw["data_files"] = data_file
        return load_dataset(hub_id, **kw), f"hf:{hub_id}"
    except Exception as e:  # gated / missing token / network: many exception types
        raise _Unavailable(f"{hub_id}: {str(e).splitlines()[0][:200]}") from None


def _local_records(path: Path, split: str) -> Iterable[dict[str, Any]]:
    if not path.exists():
        raise TraceError(f"{path}: no such dataset file or folder")
    if path.is_dir():
        try:
            from datasets import DatasetDict, load_from_disk
        except ImportError:
            raise TraceError(f"{path}: reading a dataset folder needs 'datasets'") from None
        try:
            ds = load_from_disk(str(path))
        except Exception as e:  # datasets raises FileNotFoundError or its own errors
            raise TraceError(f"{path}: not a datasets save_to_disk folder ({e})") from None
        if isinstance(ds, DatasetDict):
            if split not in ds:
                raise TraceError(f"{path}: no split {split!r} (has {', '.join(ds)})")
            ds = ds[split]
        return ds
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return pd.read_parquet(path).to_dict("records")
    if suffix in (".jsonl", ".ndjson"):
        return _jsonl(path)
    if suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise TraceError(f"{path}: line {e.lineno}: not valid JSON ({e.msg})") from None
        if isinstance(data, dict):  # {"train": [...]} or a single record
            data = data.get(split, [data])
        if not isinstance(data, list):
            raise TraceError(f"{path}: expected a JSON list of conversations")
        return data
    raise TraceError(f"{path}: unknown dataset file type {suffix!r} (.json, .jsonl, .parquet)")


def _jsonl(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as e:
                    raise TraceError(f"{path}: line {n}: not valid JSON ({e.msg})") from None


def _messages(rec: dict[str, Any], where: str, idx: int) -> list[tuple[str, str]]:
    """(role, text) pairs from an LMSYS (``conversation``: role/content) or ShareGPT
    (``conversations``/``items``: from/value) record."""
    conv = None
    for key in ("conversation", "conversations", "items", "messages"):
        if key in rec:
            conv = rec[key]
            break
    if isinstance(conv, np.ndarray):  # nested lists read back from Parquet
        conv = conv.tolist()
    if not isinstance(conv, list):
        raise TraceError(
            f"{where}: record {idx}: no 'conversation'/'conversations' list of messages"
        )
    out: list[tuple[str, str]] = []
    for m in conv:
        if not isinstance(m, dict):
            raise TraceError(f"{where}: record {idx}: a message is not an object")
        role = str(m.get("role", m.get("from", ""))).lower()
        text = m.get("content", m.get("value"))
        if not isinstance(text, str):
            raise TraceError(f"{where}: record {idx}: message without text ('content'/'value')")
        out.append((role, text))
    return out


def _to_rows(
    name: str, records: Iterable[dict[str, Any]], where: str, opts: dict[str, Any]
) -> SourceData:
    from harness.workload.prompts import approx_tokens, load_tokenizer

    if opts["tokenizer"] is not None:
        tok = load_tokenizer(str(opts["tokenizer"]))
        count = tok.count
        tok_name = tok.name
    else:
        count = approx_tokens
        tok_name = "approx: ceil(utf8_bytes/4)"
    max_rows = int(opts["max_rows"])
    prompts: list[str] = []
    plen: list[int] = []
    olen: list[int] = []
    scanned = filtered = 0
    for idx, rec in enumerate(records):
        if len(plen) >= max_rows:
            break
        scanned += 1
        if opts["language"] is not None and rec.get("language") != opts["language"]:
            continue
        msgs = _messages(rec, where, idx)
        history: list[str] = []
        for k, (role, text) in enumerate(msgs):
            if role in _USER and k + 1 < len(msgs) and msgs[k + 1][0] in _ASSISTANT:
                prompt = (
                    "\n".join([*history, text]) if opts["prompt_mode"] == "conversation" else text
                )
                reply = msgs[k + 1][1]
                p, o = count(prompt), count(reply) if reply else 0
                keep = p >= 1 and o >= 1
                if keep and opts["filter"] == "vllm":
                    # vLLM is_valid_sequence (anchors-harness.md §2.1 ShareGPT).
                    keep = 4 <= p <= 1024 and o >= 4 and p + o <= 2048
                if keep:
                    prompts.append(prompt)
                    plen.append(p)
                    olen.append(o)
                else:
                    filtered += 1
                if opts["turns"] == "first" or len(plen) >= max_rows:
                    break
            history.append(text)
    if not plen:
        raise TraceError(f"{where}: no usable user/assistant turns (after filter={opts['filter']})")
    df = pd.DataFrame(
        {
            "prompt_len": np.asarray(plen, dtype=np.int64),
            "output_len": np.asarray(olen, dtype=np.int64),
            "prompt": prompts,
        }
    )
    meta = {
        "source": name,
        "dataset": where,
        "fallback": False,
        "tokenizer": tok_name,
        "prompt_mode": opts["prompt_mode"],
        "turns": opts["turns"],
        "filter": opts["filter"],
        "language": opts["language"],
        "conversations_scanned": scanned,
        "turns_filtered_out": filtered,
        "rows": int(len(df)),
    }
    return SourceData(df=df, meta=meta)


def _azure(opts: dict[str, Any]) -> SourceData:
    if opts["fallback"] not in ("auto", "never", "always"):
        raise TraceError("azure-conv: fallback must be 'auto', 'never' or 'always'")
    if opts["path"] is None or opts["fallback"] == "always":
        if opts["fallback"] == "never":
            raise TraceError("azure-conv: give path= the Azure conversation trace CSV")
        reason = "fallback=always" if opts["path"] else "no path= to the Azure trace CSV given"
        return fallback("azure-conv", reason)
    path = Path(opts["path"]).expanduser()
    from harness.workload.sources.files import load_azure, load_vidur_csv

    if not path.exists():
        raise TraceError(f"{path}: no such trace file")
    with path.open(encoding="utf-8", errors="replace") as f:
        header = f.readline()
    src = load_azure(path, {}) if "ContextTokens" in header else load_vidur_csv(path, {})
    src.meta["source"] = "azure-conv"
    src.meta["fallback"] = False
    return src
