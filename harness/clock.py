"""The one clock of the harness: every wall-clock timestamp comes from here."""

import time

now = time.perf_counter
"""Monotonic high-resolution seconds (``time.perf_counter``); only differences are meaningful."""


def now_ns() -> int:
    """Same clock in integer nanoseconds."""
    return time.perf_counter_ns()
