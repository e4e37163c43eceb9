"""The request lengths Vidur replays: 100,000 rows drawn with replacement (seed 0) from the
shared LMSYS-Chat-1M length sample (Vidur's trace-length generator stops at the file's end,
so the file needs a row per request). Usage: python make_trace.py SRC.csv OUT.csv [N]"""

import sys

import pandas as pd

src, out = sys.argv[1], sys.argv[2]
n = int(sys.argv[3]) if len(sys.argv) > 3 else 100_000
pd.read_csv(src).sample(n=n, replace=True, random_state=0).to_csv(out, index=False)
