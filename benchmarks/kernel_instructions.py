"""Instructions the simulator kernel executes, counted under valgrind: an A/B measure that does
not move with the machine's load.

Why: wall time on a shared machine moves by 10-15% from one run to the next (more from one day
to the next), so a 3% change to the kernel needs many paired runs to show; the count of
instructions a process executes is the same from run to run to ~0.1% (the same code, trace and
seed take the same path). It is not time (a cache miss costs more than an add), so speed
figures still come from whole-process timing (``bench_simulator.py``, paired runs); this tells
which of two versions of the kernel does less work, and by how much, in one run each.

Usage (needs ``valgrind`` on the PATH; a run is ~20-50x slower than without it)::

    python benchmarks/kernel_instructions.py [--policies wait,vllm] [--requests 3000]
        [--workload lmsys|azure] [--vs OTHER_CHECKOUT] [--json OUT.json]

Per policy: the instructions of one :func:`~harness.engine.simulate.simulate` call on the
workload's trace (the child process imports, builds the trace, then runs the kernel once; a
child that stops before the kernel is the baseline subtracted, so imports and the trace build
are not counted), and per request. ``--vs``: the same for another checkout of the project (its
root, put first on ``PYTHONPATH``) and the ratio this / other.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# The child: import, build the trace, run the kernel ``reps`` times (0: the baseline).
_CHILD = """
import sys
from harness.engine.costmodel import get_cost_model
from harness.engine.simulate import SimulateConfig, simulate
from harness.policies import make_policy
from harness.shared_data import shared_data_dir
from harness.workload import build_trace
policy, n, workload, reps = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
name, rate = {"lmsys": ("lmsys_sample_lengths.csv", 45.3), "azure": ("azure_conv_2023.csv", 4.0)}[
    workload
]
src = str(shared_data_dir() / name)
econf = SimulateConfig(trace=src, cost_model="a100-llama2-7b").engine_config()
trace = build_trace(src, num_requests=n, rate=rate, seed=0, quiet=True)
model = get_cost_model("a100-llama2-7b")
make_policy(policy)  # the policy's module imported in the baseline too
for _ in range(reps):
    simulate(trace, make_policy(policy), model, econf)
"""

_ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "ARROW_NUM_THREADS": "1"}
_IR = re.compile(r"I\s+refs:\s+([\d,]+)")


def parse_ir(valgrind_stderr: str) -> int:
    """The instruction count of cachegrind's summary line (``I refs: 1,234``)."""
    m = _IR.search(valgrind_stderr)
    if m is None:
        raise ValueError("no 'I refs' line in valgrind's output")
    return int(m.group(1).replace(",", ""))


def count(tree: Path, policy: str, n: int, workload: str, reps: int) -> int:
    """Instructions of the child process run from checkout ``tree``."""
    # one thread: a BLAS or Arrow pool's idle threads would add a varying count
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONHASHSEED="0", **_ONE_THREAD)
    cmd = [
        "valgrind",
        "--tool=cachegrind",
        "--cache-sim=no",
        "--cachegrind-out-file=/dev/null",
        sys.executable,
        "-c",
        _CHILD,
        policy,
        str(n),
        workload,
        str(reps),
    ]
    # run in the tree: ``python -c`` puts its working directory before PYTHONPATH on sys.path
    proc = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-3:]
        raise RuntimeError(f"{policy}: the child failed ({'; '.join(tail)})")
    return parse_ir(proc.stderr)


def kernel_instructions(tree: Path, policy: str, n: int, workload: str) -> int:
    """Instructions of one kernel run: the child with the kernel minus the child without,
    after a child outside valgrind has compiled every module the run imports (a stale
    ``.pyc`` recompiled inside one of the counted runs would be counted)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    subprocess.run(
        [sys.executable, "-c", _CHILD, policy, "1", workload, "1"], env=env, cwd=tree, check=True
    )
    return count(tree, policy, n, workload, 1) - count(tree, policy, n, workload, 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policies", default="vllm,wait", help="comma-separated policy names")
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--workload", choices=("lmsys", "azure"), default="lmsys")
    ap.add_argument("--vs", type=Path, default=None, help="another checkout to compare with")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("error: valgrind is not on the PATH (e.g. apt install valgrind)")
    rows: list[dict[str, Any]] = []
    print(f"kernel instructions, {args.requests} {args.workload} requests")
    for policy in args.policies.split(","):
        this = kernel_instructions(ROOT, policy, args.requests, args.workload)
        row: dict[str, Any] = {"policy": policy, "instructions": this}
        line = f"{policy:18s} {this / 1e9:7.3f} G  {this / args.requests / 1e3:6.1f} k/request"
        if args.vs is not None:
            other = kernel_instructions(args.vs.resolve(), policy, args.requests, args.workload)
            row |= {"vs_instructions": other, "ratio": this / other}
            line += f"  vs {other / 1e9:7.3f} G  ratio {this / other:.3f}"
        rows.append(row)
        print(line, flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
