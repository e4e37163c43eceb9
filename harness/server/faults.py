"""Seeded fault injection for the built-in server, with a JSONL log of every injected fault.

Spec: ``--faults error=0.01,drop=0.01,stall=0.01:2s,malformed=0.01,slow_first=0.01:1s[,seed=N]``.

Each request draws at most one fault. The draw is a hash of ``(seed, request id)``, not a
shared RNG stream, so which requests fail does not depend on arrival interleaving: the same
trace with the same request ids and seed gets the same faults. Rates are the probabilities of
mutually exclusive kinds (they must sum to <= 1).

What each kind does and what a client sees (error kinds of harness.results.schema):

- ``error``: HTTP 500 with an OpenAI error body, no stream -> ``http_status``.
- ``drop``: the connection is closed mid-stream, after >= 1 token chunk and before the final
  one (which carries ``finish_reason``), so neither ``[DONE]`` nor a finish arrives ->
  ``stream_cut``. With max_tokens = 1 the cut comes right after the response headers.
- ``malformed``: one extra event whose JSON is truncated, at the same position; the stream
  then continues normally -> ``bad_payload``.
- ``stall:D``: the stream pauses D seconds at the same position (tokens produced meanwhile
  are sent coalesced afterwards) -> ``timeout`` when the client's read timeout < D, otherwise
  a slow success.
- ``slow_first:D``: response headers are held back D seconds (the engine keeps generating)
  -> ``timeout`` when the client's timeout < D, otherwise a slow success.

Every injected fault is appended to the log at the moment it takes effect:
``{"request_id", "kind", "t_unix", "at_token", "param_s"}``.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.workload.tiers import TierSpecError, parse_duration

FAULT_KINDS = ("error", "drop", "stall", "malformed", "slow_first")
_NEEDS_DURATION = {"stall": 2.0, "slow_first": 1.0}  # default durations (s)


class FaultSpecError(ValueError):
    """A malformed ``--faults`` spec; the message says which part is wrong."""


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """Rates per kind (probability per request), durations for stall/slow_first, and a seed."""

    rates: dict[str, float] = field(default_factory=dict)
    durations: dict[str, float] = field(default_factory=dict)
    seed: int = 0

    @property
    def active(self) -> bool:
        return any(r > 0 for r in self.rates.values())

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_faults(spec: str | None) -> FaultSpec:
    """Parse ``kind=rate[:duration]`` items joined by commas, plus an optional ``seed=N``."""
    if spec is None or not spec.strip():
        return FaultSpec()
    rates: dict[str, float] = {}
    durations: dict[str, float] = {}
    seed = 0
    for part in spec.split(","):
        part = part.strip()
        key, sep, val = part.partition("=")
        key = key.strip()
        if not sep or not val.strip():
            raise FaultSpecError(f"fault {part!r}: expected kind=rate (e.g. drop=0.01)")
        if key == "seed":
            try:
                seed = int(val)
            except ValueError:
                raise FaultSpecError(f"fault seed {val!r} is not an integer") from None
            continue
        if key not in FAULT_KINDS:
            raise FaultSpecError(
                f"unknown fault kind {key!r}; choose from {', '.join(FAULT_KINDS)}"
            )
        if key in rates:
            raise FaultSpecError(f"fault kind {key!r} given twice")
        rate_s, _, dur_s = val.partition(":")
        try:
            rate = float(rate_s)
        except ValueError:
            raise FaultSpecError(f"fault {key!r}: rate {rate_s!r} is not a number") from None
        if not 0.0 <= rate <= 1.0:
            raise FaultSpecError(f"fault {key!r}: rate {rate} outside [0, 1]")
        rates[key] = rate
        if dur_s:
            if key not in _NEEDS_DURATION:
                raise FaultSpecError(f"fault {key!r} takes no duration")
            try:
                durations[key] = parse_duration(dur_s)
            except TierSpecError as e:
                raise FaultSpecError(f"fault {key!r}: {e}") from None
        elif key in _NEEDS_DURATION:
            durations[key] = _NEEDS_DURATION[key]
    total = sum(rates.values())
    if total > 1.0 + 1e-9:
        raise FaultSpecError(f"fault rates sum to {total:g} > 1")
    return FaultSpec(rates=rates, durations=durations, seed=seed)


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """The fault chosen for one request: kind, position (token index) and duration."""

    kind: str
    at_token: int  # mid-stream faults act just before sending output token #at_token (0-based)
    duration_s: float = 0.0


def _unit(seed: int, request_id: str, salt: str) -> float:
    h = hashlib.blake2b(f"{seed}\x00{salt}\x00{request_id}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2.0**64


def choose_fault(spec: FaultSpec, request_id: str, max_tokens: int) -> FaultPlan | None:
    """Deterministic per-request draw (see module docstring); None means no fault."""
    if not spec.active:
        return None
    u = _unit(spec.seed, request_id, "kind")
    acc = 0.0
    kind = None
    for k in FAULT_KINDS:
        acc += spec.rates.get(k, 0.0)
        if u < acc:
            kind = k
            break
    if kind is None:
        return None
    # Mid-stream position: after >= 1 token and before the last token when there are >= 2.
    at = 0  # max_tokens == 1: right after the headers (the only chunk carries finish_reason)
    if max_tokens >= 2:
        at = min(1 + int(_unit(spec.seed, request_id, "pos") * (max_tokens - 1)), max_tokens - 1)
    return FaultPlan(kind=kind, at_token=at, duration_s=spec.durations.get(kind, 0.0))


class FaultLog:
    """Append-only record of injected faults: in memory and, optionally, a JSONL file."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._fh = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = path.open("a", encoding="utf-8")

    def record(self, request_id: str, plan: FaultPlan) -> None:
        ev = {
            "request_id": request_id,
            "kind": plan.kind,
            "t_unix": time.time(),
            "at_token": plan.at_token if plan.kind not in ("error", "slow_first") else None,
            "param_s": plan.duration_s if plan.kind in _NEEDS_DURATION else None,
        }
        with self._lock:
            self.events.append(ev)
            if self._fh is not None:
                self._fh.write(json.dumps(ev) + "\n")
                self._fh.flush()

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for ev in self.events:
            out[ev["kind"]] = out.get(ev["kind"], 0) + 1
        return out

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def read_fault_log(path: Path) -> list[dict[str, Any]]:
    """Read a JSONL fault log written by :class:`FaultLog`."""
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]
