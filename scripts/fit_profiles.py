"""Re-fit the bundled length profiles from the real length samples in /work/shared/data.

Usage: python scripts/fit_profiles.py [--data /work/shared/data] [--out harness/workload/profiles]

Only summaries are written (quantile tables + a rank-copula histogram, see
harness/workload/profile.py); the raw rows never enter the repository. Prints, per profile,
the two-sample KS statistic of a 100k-pair sample against the real data and the Spearman
correlations, so a re-fit can be checked at a glance.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import ks_2samp, spearmanr

from harness.shared_data import shared_data_dir
from harness.workload.profile import fit_profile

SOURCES = {
    # name: (file, origin description)
    "lmsys": (
        "lmsys_sample_lengths.csv",
        "LMSYS-Chat-1M sample (lmsys_sample_lengths.csv), prompt/reply token lengths",
    ),
    "sharegpt": (
        "sharegpt4_lengths_llama2.csv",
        "openchat ShareGPT-4 (sharegpt4_lengths_llama2.csv), Llama-2 tokenizer lengths",
    ),
    "azure-conv": (
        "azure_conv_2023.csv",
        "Azure LLM inference trace 2023, conversation (azure_conv_2023.csv), with arrival gaps",
    ),
}


def real_pairs(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Positive (prompt, output) pairs and, when the file has arrivals, the gaps."""
    df = pd.read_csv(path)
    keep = (df["num_prefill_tokens"] >= 1) & (df["num_decode_tokens"] >= 1)
    gaps = None
    if "arrived_at" in df.columns:
        gaps = np.diff(np.sort(df["arrived_at"].to_numpy(dtype=float)))
    df = df.loc[keep]
    return df["num_prefill_tokens"].to_numpy(), df["num_decode_tokens"].to_numpy(), gaps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=shared_data_dir())
    ap.add_argument("--out", type=Path, default=Path("harness/workload/profiles"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, (fname, origin) in SOURCES.items():
        p, o, gaps = real_pairs(args.data / fname)
        prof = fit_profile(p, o, name=name, origin=origin, gaps_s=gaps)
        (args.out / f"{name}.json").write_text(json.dumps(prof.to_json(), separators=(",", ":")))
        sp, so = prof.sample(100_000, np.random.default_rng(1))
        print(
            f"{name:11s} n={p.size:6d}  KS prompt={ks_2samp(sp, p).statistic:.4f} "
            f"output={ks_2samp(so, o).statistic:.4f}  spearman real={spearmanr(p, o).statistic:.3f}"
            f" profile={spearmanr(sp, so).statistic:.3f}  -> {args.out / (name + '.json')}"
        )


if __name__ == "__main__":
    main()
