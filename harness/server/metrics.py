"""Prometheus metrics of the built-in server, under vLLM's names (anchors-engines.md §2).

Why vLLM's names: the Sampler and any dashboard built for vLLM read the built-in server
unchanged. Every app owns a :class:`CollectorRegistry` (tests start many servers in one
process; the global registry would collide). Labels are vLLM's ``model_name`` and ``engine``.

Gauges (``num_requests_running``/``waiting``, ``kv_cache_usage_perc``) are read from the engine
at scrape time; counters and histograms are updated by the engine loop as tokens are emitted.
Latency histograms are in wall-clock seconds as the client sees them (divided by ``--speed``).
Extras under ``harness:`` report the wall-clock host's own fidelity (step lateness) and the
injected faults. Counters and histograms touched per token are lock-free accumulators exported
by a collector (the engine loop is their only writer), to keep the streaming hot path short.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

# vLLM v1 loggers.py bucket boundaries (s).
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
E2E_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
LATENESS_BUCKETS = (
    0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0,
)  # fmt: skip


class _LiveGauges(Collector):
    """Running / waiting / KV usage read from the engine at scrape time (never stale)."""

    def __init__(self, read: Callable[[], tuple[int, int, float]], labels: dict[str, str]):
        self._read = read
        self._labels = labels

    def collect(self):  # noqa: D102
        running, waiting, kv = self._read()
        names = list(self._labels)
        vals = list(self._labels.values())
        for name, doc, v in (
            (
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
                running,
            ),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", waiting),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", kv),
        ):
            g = GaugeMetricFamily(name, doc, labels=names)
            g.add_metric(vals, float(v))
            yield g


class FastCounter:
    """A counter the engine loop bumps without a lock (one event loop thread writes it)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, n: float = 1.0) -> None:
        self.value += n


class FastHistogram:
    """A lock-free histogram (bisect into cumulative-at-export buckets): per-token ITL
    observations stay ~0.3 us instead of prometheus_client's locked ~2-3 us."""

    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        self.counts[bisect_left(self.bounds, v)] += 1
        self.sum += v
        self.count += 1

    def buckets(self) -> list[tuple[str, float]]:
        out = []
        acc = 0
        for b, c in zip(self.bounds, self.counts, strict=False):
            acc += c
            out.append((floatToGoString(b), float(acc)))
        out.append(("+Inf", float(self.count)))
        return out


class _Families(Collector):
    """Exports the fast counters and histograms under their Prometheus names."""

    def __init__(self, m: ServerMetrics) -> None:
        self.m = m

    def collect(self):  # noqa: D102
        m = self.m
        names = list(m.labels)
        vals = list(m.labels.values())
        for name, doc, ctr in m.counters:
            f = CounterMetricFamily(name, doc, labels=names)
            f.add_metric(vals, ctr.value)
            yield f
        f = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=[*names, "finished_reason"],
        )
        f.add_metric([*vals, "length"], m.success_length.value)
        f.add_metric([*vals, "abort"], m.success_abort.value)
        yield f
        for name, doc, h in m.histograms:
            f = HistogramMetricFamily(name, doc, labels=names)
            f.add_metric(vals, h.buckets(), h.sum)
            yield f


class ServerMetrics:
    """All metrics of one server app, in its own registry."""

    def __init__(
        self,
        *,
        model: str,
        read_gauges: Callable[[], tuple[int, int, float]],
        cache_info: dict[str, str],
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        lab = {"model_name": model, "engine": "0"}
        self.labels = lab
        ln = list(lab)
        r = self.registry
        r.register(_LiveGauges(read_gauges, lab))
        self.preemptions = FastCounter()
        self.prompt_tokens = FastCounter()
        self.generation_tokens = FastCounter()
        self.success_length = FastCounter()
        self.success_abort = FastCounter()
        self.counters = [
            ("vllm:num_preemptions", "Cumulative number of preemptions.", self.preemptions),
            ("vllm:prompt_tokens", "Number of prefill tokens processed.", self.prompt_tokens),
            (
                "vllm:generation_tokens",
                "Number of generation tokens processed.",
                self.generation_tokens,
            ),
        ]
        self.ttft = FastHistogram(TTFT_BUCKETS)
        self.itl = FastHistogram(ITL_BUCKETS)
        self.e2e = FastHistogram(E2E_BUCKETS)
        self.step_lateness = FastHistogram(LATENESS_BUCKETS)
        self.histograms = [
            (
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                self.ttft,
            ),
            (
                "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                self.itl,
            ),
            (
                "vllm:e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds.",
                self.e2e,
            ),
            (
                "harness:step_lateness_seconds",
                "Wall-clock lateness of engine step ends versus the modeled schedule.",
                self.step_lateness,
            ),
        ]
        r.register(_Families(self))
        info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            sorted(cache_info),
            registry=r,
        )
        info.labels(**cache_info).set(1)
        self.faults = Counter(
            "harness:faults_injected", "Injected faults by kind.", [*ln, "kind"], registry=r
        )
        self._lab = lab

    def fault(self, kind: str) -> None:
        self.faults.labels(**self._lab, kind=kind).inc()

    def render(self) -> bytes:
        """Prometheus text exposition of this app's registry."""
        return generate_latest(self.registry)
