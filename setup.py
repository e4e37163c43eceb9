"""Build of the optional C scanner (issue 18); the project's metadata is in pyproject.toml.

``optional=True``: where the extension cannot be compiled (no compiler, no Python headers)
the install still succeeds and :mod:`harness.loadgen.fastscan` uses its pure-Python scan.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "harness.loadgen._sse_scan",
            sources=["harness/loadgen/_sse_scan.c"],
            optional=True,
        )
    ]
)
