"""harness.results: the run directory (writer/reader), vLLM-compatible metrics, summaries."""

from harness.results.rundir import Run, RunWriter, read_run, read_table, write_json

__all__ = ["Run", "RunWriter", "read_run", "read_table", "write_json"]
