"""Trace-replay benchmarking harness and scheduler lab for LLM serving."""

__version__ = "0.1.0"
