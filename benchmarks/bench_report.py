"""Report at scale: 100k requests and 30M chunks must render in < 30 s into < 20 MB (issue 7).

    python benchmarks/bench_report.py [--requests 100000] [--mean-output 300] [--dir DIR]

Writes a synthetic run directory (FCFS queue below capacity; one chunk per token, so chunks
≈ requests × mean output), then times: summary.json (compute_summary, as replay/simulate
write it), and ``write_report`` on the run with summary.json present (the normal case).
Prints one JSON line with the timings, peak RSS and the file size.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import tempfile
import time
from pathlib import Path

from harness.report import write_report
from harness.report.synthetic import synthetic_capacity_rps, write_synthetic_run
from harness.results.summary import write_summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--mean-output", type=float, default=300.0)
    ap.add_argument("--dir", type=Path, default=None, help="keep the run here")
    args = ap.parse_args()
    base = args.dir or Path(tempfile.mkdtemp(prefix="bench-report-"))
    run_dir = base / "big"
    slots, prompt, dec = 256, 200.0, 0.02
    cap = synthetic_capacity_rps(slots, prompt, args.mean_output, 2e-4, dec)
    t = time.perf_counter()
    write_synthetic_run(
        run_dir,
        num_requests=args.requests,
        rate=0.8 * cap,
        slots=slots,
        mean_prompt=prompt,
        mean_output=args.mean_output,
        decode_s_per_token=dec,
        fail_fraction=0.001,
    )
    gen_s = time.perf_counter() - t
    meta = json.loads((run_dir / "run.json").read_text())
    t = time.perf_counter()
    write_summary(run_dir)
    summary_s = time.perf_counter() - t
    t = time.perf_counter()
    out = write_report([run_dir])
    report_s = time.perf_counter() - t
    res = {
        "requests": args.requests,
        "chunks": meta["rows"]["chunks"],
        "generate_s": round(gen_s, 1),
        "summary_s": round(summary_s, 1),
        "report_s": round(report_s, 1),
        "report_mib": round(out.stat().st_size / 2**20, 2),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "report": str(out),
    }
    print(json.dumps(res))
    if args.dir is None:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
