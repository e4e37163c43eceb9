"""benchmarks/kernel_instructions.py: its child runs the kernel on the current API, and the
count it reads from valgrind's summary. (Counting itself needs valgrind, a system tool the
project does not install: the benchmark is run by hand.)"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from benchmark_modules import ROOT, load_benchmark

from harness.shared_data import shared_data_dir


def _bench():  # type: ignore[no-untyped-def]
    return load_benchmark("kernel_instructions")


def test_parse_ir_reads_cachegrind_summary() -> None:
    bench = _bench()
    err = "==123== \n==123== I   refs:      2,884,663,436\n"
    assert bench.parse_ir(err) == 2_884_663_436
    with pytest.raises(ValueError, match="I refs"):
        bench.parse_ir("==123== ERROR SUMMARY: 0 errors")


@pytest.mark.skipif(
    not (shared_data_dir() / "lmsys_sample_lengths.csv").exists(), reason="shared data absent"
)
@pytest.mark.parametrize("reps", [0, 2])
def test_child_runs_the_kernel_outside_valgrind(reps: int) -> None:
    """The child script the benchmark counts (imports, trace, ``reps`` kernel runs) works on
    this checkout: a drift in the APIs it calls fails here, not in a long valgrind run."""
    bench = _bench()
    env = dict(os.environ, PYTHONPATH=str(ROOT), **bench._ONE_THREAD)
    proc = subprocess.run(
        [sys.executable, "-c", bench._CHILD, "wait", "50", "lmsys", str(reps)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
