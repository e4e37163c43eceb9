"""harness.workload: traces, arrival processes, tiers, trace sources.

``build_trace(source, ...)`` is the one entry point; ``save_trace`` / ``load_trace`` freeze a
replay to Parquet and read it back.
"""

from harness.workload.build import build_trace, save_trace
from harness.workload.frozen import load_trace
from harness.workload.tiers import Tier, parse_tiers
from harness.workload.trace import Trace, TraceError

__all__ = ["Tier", "Trace", "TraceError", "build_trace", "load_trace", "parse_tiers", "save_trace"]
