"""Build of the optional C extensions; the project's metadata is in pyproject.toml.

- ``harness.loadgen._sse_scan``: the load generator's SSE byte scan (issue 18);
- ``harness.engine._rows``: the simulator kernel's scalar loops over its running arrays
  (issue 13);
- ``harness.policies._planops``: the column policies' per-decode passes (issue 13);
- ``harness.results._chunkgroup``: the summary's grouping of the chunk log by request
  (issue 13);
- ``harness.results._orderstats``: the summary's percentiles by radix selection (issue 13).

``optional=True``: where an extension cannot be compiled (no compiler, no Python headers)
the install still succeeds and its module uses the pure-Python code that does the same
(:mod:`harness.loadgen.fastscan`, :mod:`harness.engine.fastsim`,
:mod:`harness.policies.planops`, :mod:`harness.results.chunklog`,
:mod:`harness.results.metrics`).
"""

import sys

from setuptools import Extension, setup

# The kernel's and the policies' C passes repeat Python's float arithmetic operation by
# operation (step times, attention work, deadlines): a fused multiply-add would round once
# where Python rounds twice (aarch64 compilers fuse by default), so none is allowed.
_EXACT = [] if sys.platform == "win32" else ["-ffp-contract=off"]

setup(
    ext_modules=[
        Extension(
            "harness.loadgen._sse_scan",
            sources=["harness/loadgen/_sse_scan.c"],
            optional=True,
        ),
        Extension(
            "harness.engine._rows",
            sources=["harness/engine/_rows.c"],
            extra_compile_args=_EXACT,
            optional=True,
        ),
        Extension(
            "harness.policies._planops",
            sources=["harness/policies/_planops.c"],
            extra_compile_args=_EXACT,
            optional=True,
        ),
        Extension(
            "harness.results._chunkgroup",
            sources=["harness/results/_chunkgroup.c"],
            optional=True,
        ),
        Extension(
            "harness.results._orderstats",
            sources=["harness/results/_orderstats.c"],
            optional=True,
        ),
    ]
)
