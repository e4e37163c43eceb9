"""Arrival processes: when each request of a trace is sent (offsets from the run start, s).

Processes (anchors-harness.md §2.1 "Arrival scheduling" and §6.3):

- ``poisson``: exponential gaps with mean ``1/rate``.
- ``gamma``: vLLM ``--burstiness`` semantics: gaps ``gamma(shape=b, scale=1/(rate*b))``, so
  the mean gap stays ``1/rate`` and the squared coefficient of variation is ``1/b``;
  ``b=1`` is Poisson, ``b<1`` burstier, ``b>1`` smoother, ``b=inf`` constant.
- ``constant``: gaps exactly ``1/rate``.
- ``trace``: the source's own timestamps, shifted so the first is 0, times ``time_scale``.

Like vLLM the first request arrives after one gap (arrivals are the cumulative sum of the
gaps) and ``rate=inf`` sends everything at t=0. vLLM also *rescales* the cumulative gaps so
the last arrival lands exactly at ``N/rate`` (§6.3). That pins the run length but makes the
gaps no longer i.i.d. (for b=1 they become uniform spacings), so here it is an option
(``rescale=True``), off by default: the default is the textbook renewal process.

Time-varying load uses a :class:`RateSchedule` lambda(t) and the time-change theorem: draw
the renewal process at unit rate in "operational time" and map each point through the
inverse of Lambda(t) = integral of lambda from 0 to t. For Poisson that is exactly the
non-homogeneous Poisson process with intensity lambda(t); gamma and constant gaps keep their
shape in operational time.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from harness.workload.trace import TraceError

PROCESSES = ("poisson", "gamma", "constant", "trace")


def arrival_rng(seed: int | None) -> np.random.Generator:
    """The arrival stream ``[seed, 1]``; independent of sampling (2) and tiers (3)."""
    return np.random.default_rng(None if seed is None else [seed, 1])


def unit_gaps(n: int, process: str, burstiness: float, rng: np.random.Generator) -> np.ndarray:
    """``n`` gaps of a unit-rate renewal process of the given kind (mean 1)."""
    if n < 0:
        raise TraceError(f"negative request count {n}")
    if process == "poisson":
        return rng.exponential(1.0, size=n)
    if process == "gamma":
        if not burstiness > 0:
            raise TraceError(f"burstiness must be > 0, got {burstiness}")
        if math.isinf(burstiness):
            return np.ones(n)
        # anchors-harness.md §6.3: gamma(shape=b, scale=1/(rate*b)), here at rate 1.
        return rng.gamma(shape=burstiness, scale=1.0 / burstiness, size=n)
    if process == "constant":
        return np.ones(n)
    raise TraceError(f"unknown arrival process {process!r} (use {', '.join(PROCESSES)})")


def arrival_times(
    n: int,
    rate: float,
    process: str = "poisson",
    burstiness: float = 1.0,
    *,
    seed: int | None = 0,
    rescale: bool = False,
) -> np.ndarray:
    """Offsets of ``n`` arrivals at a constant ``rate`` (req/s); see the module docstring."""
    if not rate > 0:
        raise TraceError(f"rate must be > 0 req/s, got {rate}")
    if math.isinf(rate):
        return np.zeros(n)
    if process == "constant" or (process == "gamma" and math.isinf(burstiness)):
        # Exact multiples, no accumulated float error: gap i is exactly 1/rate.
        return np.arange(1, n + 1, dtype=float) / rate
    gaps = unit_gaps(n, process, burstiness, arrival_rng(seed))
    t = np.cumsum(gaps) / rate
    if rescale and n and t[-1] > 0:
        # vLLM serve.py get_request(): pin the last arrival at N/rate (anchors §2.1, §6.3).
        t *= (n / rate) / t[-1]
    return t


def arrivals_until(
    duration_s: float,
    rate: float,
    process: str = "poisson",
    burstiness: float = 1.0,
    *,
    seed: int | None = 0,
    limit: int | None = None,
) -> np.ndarray:
    """All arrivals in ``(0, duration_s]`` at ``rate`` (at most ``limit``)."""
    if not duration_s > 0:
        raise TraceError(f"duration must be > 0 s, got {duration_s}")
    if not rate > 0 or math.isinf(rate):
        raise TraceError(f"a duration bound needs a finite rate > 0, got {rate}")
    return schedule_arrivals(
        RateSchedule.constant(rate),
        process,
        burstiness,
        seed=seed,
        limit=limit,
        duration_s=duration_s,
    )


def trace_arrivals(timestamps: np.ndarray, time_scale: float = 1.0) -> np.ndarray:
    """The trace's own timestamps (s), shifted to start at 0 and multiplied by ``time_scale``.

    ``time_scale=0.5`` replays twice as fast; 2.0 half as fast.
    """
    if not time_scale > 0 or math.isinf(time_scale):
        raise TraceError(f"time_scale must be a finite number > 0, got {time_scale}")
    ts = np.asarray(timestamps, dtype=float)
    if ts.size == 0:
        return ts
    bad = ~np.isfinite(ts)
    if bad.any():
        raise TraceError(f"row {int(np.flatnonzero(bad)[0])}: timestamp is not a number")
    return (ts - ts.min()) * time_scale


# --------------------------------------------------------------------------- rate schedules


@dataclass(frozen=True)
class RateSchedule:
    """A request rate lambda(t) >= 0 (req/s), piecewise linear or sinusoidal.

    ``kind``: ``pwl`` (knots ``times``/``rates``, linear between knots, constant after the
    last; steps are two knots at the same time) or ``sine`` (``mean + amp*sin(2*pi*t/period
    + phase)``). Built by :func:`parse_rate_schedule`.
    """

    kind: str
    times: tuple[float, ...] = ()
    rates: tuple[float, ...] = ()
    mean: float = 0.0
    amp: float = 0.0
    period: float = 1.0
    phase: float = 0.0
    spec: str = ""

    @classmethod
    def constant(cls, rate: float) -> RateSchedule:
        return cls(kind="pwl", times=(0.0,), rates=(float(rate),), spec=f"{rate:g}")

    def rate(self, t: np.ndarray | float) -> np.ndarray:
        t = np.asarray(t, dtype=float)
        if self.kind == "sine":
            return self.mean + self.amp * np.sin(2 * np.pi * t / self.period + self.phase)
        return np.interp(t, self.times, self.rates)

    def cumulative(self, t: np.ndarray | float) -> np.ndarray:
        """Lambda(t) = expected arrivals in [0, t] (closed form for both kinds)."""
        t = np.asarray(t, dtype=float)
        if self.kind == "sine":
            w = 2 * np.pi / self.period
            return self.mean * t - self.amp / w * (np.cos(w * t + self.phase) - np.cos(self.phase))
        kt = np.asarray(self.times)
        kr = np.asarray(self.rates)
        seg = np.concatenate([[0.0], np.cumsum(np.diff(kt) * (kr[:-1] + kr[1:]) / 2)])
        i = np.clip(np.searchsorted(kt, t, side="right") - 1, 0, len(kt) - 1)
        dt = t - kt[i]
        nxt = np.minimum(i + 1, len(kt) - 1)
        span = kt[nxt] - kt[i]
        slope = np.where(span > 0, (kr[nxt] - kr[i]) / np.where(span > 0, span, 1.0), 0.0)
        slope = np.where(i == len(kt) - 1, 0.0, slope)
        return seg[i] + kr[i] * dt + 0.5 * slope * dt * dt

    def mean_rate(self, horizon_s: float) -> float:
        return float(self.cumulative(horizon_s)) / horizon_s if horizon_s > 0 else 0.0

    def invert(self, targets: np.ndarray) -> np.ndarray:
        """Earliest t with Lambda(t) >= target, for each target (vectorised bisection)."""
        targets = np.asarray(targets, dtype=float)
        if targets.size == 0:
            return targets
        hi = 1.0
        top = float(targets.max())
        while float(self.cumulative(hi)) < top:
            hi *= 2.0
            if hi > 1e12:
                raise TraceError(
                    f"rate schedule {self.spec!r} ends at rate 0 before all requests arrived; "
                    "give a duration or a final rate > 0"
                )
        lo_a = np.zeros_like(targets)
        hi_a = np.full_like(targets, hi)
        for _ in range(64):
            mid = 0.5 * (lo_a + hi_a)
            below = self.cumulative(mid) < targets
            lo_a = np.where(below, mid, lo_a)
            hi_a = np.where(below, hi_a, mid)
        return hi_a


_NUM = r"[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?"


def parse_rate_schedule(spec: str) -> RateSchedule:
    """Parse ``--rate-schedule``.

    - steps: ``0:10,60:50`` = 10 req/s from t=0, 50 req/s from t=60 s (piecewise constant);
    - ramp: ``ramp:10:50:120`` = linear 10 -> 50 req/s over 120 s, then 50;
      ``ramp:0:10,60:50,120:5`` = linear between the listed ``time:rate`` knots;
    - diurnal: ``sine:MEAN:AMP:PERIOD[:PHASE]`` = ``MEAN + AMP*sin(2*pi*t/PERIOD + PHASE)``
      req/s, AMP <= MEAN (a day compressed into PERIOD seconds).
    """
    s = spec.strip()
    if not s:
        raise TraceError("empty rate schedule")
    try:
        if s.startswith("sine:"):
            parts = [float(x) for x in s[5:].split(":")]
            if len(parts) not in (3, 4):
                raise ValueError("expected sine:MEAN:AMP:PERIOD[:PHASE]")
            mean, amp, period = parts[:3]
            phase = parts[3] if len(parts) == 4 else 0.0
            if not (mean > 0 and 0 <= amp <= mean and period > 0):
                raise ValueError("need MEAN > 0, 0 <= AMP <= MEAN, PERIOD > 0")
            return RateSchedule(kind="sine", mean=mean, amp=amp, period=period, phase=phase, spec=s)
        if s.startswith("ramp:"):
            body = s[5:]
            if re.fullmatch(rf"{_NUM}:{_NUM}:{_NUM}", body):
                r0, r1, dur = (float(x) for x in body.split(":"))
                if not dur > 0:
                    raise ValueError("ramp duration must be > 0")
                times, rates = (0.0, dur), (r0, r1)
            else:
                times, rates = _knots(body)
            return _pwl(times, rates, s)
        times, rates = _knots(s)
        # Steps: hold each rate until the next knot (duplicate knots make vertical edges).
        st: list[float] = []
        sr: list[float] = []
        for i, (t, r) in enumerate(zip(times, rates, strict=True)):
            if i:
                st.append(t)
                sr.append(rates[i - 1])
            st.append(t)
            sr.append(r)
        return _pwl(tuple(st), tuple(sr), s)
    except ValueError as e:
        raise TraceError(f"bad rate schedule {spec!r}: {e}") from None


def _knots(body: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    times: list[float] = []
    rates: list[float] = []
    for part in body.split(","):
        t, sep, r = part.strip().partition(":")
        if not sep:
            raise ValueError(f"{part!r} is not TIME:RATE")
        times.append(float(t))
        rates.append(float(r))
    if times[0] != 0.0:
        raise ValueError("the first knot must be at time 0")
    if any(b <= a for a, b in zip(times, times[1:], strict=False)):
        raise ValueError("knot times must increase")
    return tuple(times), tuple(rates)


def _pwl(times: tuple[float, ...], rates: tuple[float, ...], spec: str) -> RateSchedule:
    if any(r < 0 or not math.isfinite(r) for r in rates):
        raise ValueError("rates must be finite and >= 0")
    if not any(r > 0 for r in rates):
        raise ValueError("the rate is 0 everywhere")
    return RateSchedule(kind="pwl", times=times, rates=rates, spec=spec)


def schedule_arrivals(
    schedule: RateSchedule,
    process: str = "poisson",
    burstiness: float = 1.0,
    *,
    seed: int | None = 0,
    n: int | None = None,
    limit: int | None = None,
    duration_s: float | None = None,
) -> np.ndarray:
    """Arrivals under a time-varying rate (time change of a unit-rate renewal process).

    Give ``n`` (exactly that many) or ``duration_s`` (all in ``(0, duration_s]``, at most
    ``limit``). The unit gaps come from the arrival stream only, so the same seed gives the
    same operational-time points whatever the schedule.
    """
    rng = arrival_rng(seed)
    if n is not None:
        op = np.cumsum(unit_gaps(n, process, burstiness, rng))
        return schedule.invert(op)
    if duration_s is None:
        raise TraceError("a rate schedule needs a request count or a duration")
    total = float(schedule.cumulative(duration_s))
    # Draw in blocks until operational time passes Lambda(duration).
    pts: list[np.ndarray] = []
    acc = 0.0
    count = 0
    block = max(64, int(total * 1.2) + 16)
    while acc <= total and (limit is None or count < limit):
        op = acc + np.cumsum(unit_gaps(block, process, burstiness, rng))
        pts.append(op)
        acc = float(op[-1])
        count += block
    op = np.concatenate(pts) if pts else np.zeros(0)
    op = op[op <= total]
    if limit is not None:
        op = op[:limit]
    return schedule.invert(op)
