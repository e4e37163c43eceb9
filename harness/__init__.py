"""Trace-replay benchmarking harness and scheduler lab for LLM serving."""

from harness import compiled as _compiled

__version__ = "0.1.0"

# the compiled hot modules run only where their build matches their source (harness/compiled.py)
_compiled.install()
