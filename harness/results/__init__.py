"""harness.results: the run directory (writer/reader), vLLM-compatible metrics, summaries."""

from harness.results.console import print_summary
from harness.results.metrics import parse_goodput, request_metrics
from harness.results.rundir import Run, RunWriter, read_run, read_table, write_json
from harness.results.summary import compute_summary, write_summary

__all__ = [
    "Run",
    "RunWriter",
    "compute_summary",
    "parse_goodput",
    "print_summary",
    "read_run",
    "read_table",
    "request_metrics",
    "write_json",
    "write_summary",
]
