"""Build SYNTHETIC Vidur profiling inputs (real A100 profiles are not obtainable offline).

Usage: python make_synthetic_profiles.py VIDUR_CACHE_DIR   (see README.md beside this file)

Schema follows Vidur's profiling CSVs (mlp.csv / attention.csv); values are an analytic
approximation anchored on a few real A100 Llama-2-7B TP1 medians at 4096 tokens.
The files are laid out as a pre-populated HuggingFace hub cache so that Vidur's
snapshot_download() resolves them with HF_HUB_OFFLINE=1.
"""

import json
import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd

CACHE = sys.argv[1]  # vidur cache_dir
COMPUTE_REPO = "local/synthetic-llama-2-7b-hf-a100"
NETWORK_REPO = "local/synthetic-a100-dgx"
REV = "0" * 40


def snap(kind, repo):
    org, name = repo.split("/")
    base = f"{CACHE}/profiling_data/{kind}/datasets--{org}--{name}"
    os.makedirs(f"{base}/refs", exist_ok=True)
    Path(f"{base}/refs/main").write_text(REV)
    d = f"{base}/snapshots/{REV}"
    os.makedirs(d, exist_ok=True)
    return d


def stats(prefix, med):
    med = np.asarray(med, dtype=float)
    return {
        f"time_stats.{prefix}.min": med * 0.98,
        f"time_stats.{prefix}.max": med * 1.02,
        f"time_stats.{prefix}.mean": med,
        f"time_stats.{prefix}.median": med,
        f"time_stats.{prefix}.std": med * 0.01,
    }


# ---- mlp.csv (per-layer op times in ms vs num_tokens) ----
# (floor_ms, median_ms_at_4096_tokens); anchors from a real A100 Llama-2-7b TP1 profile row
ops = {
    "emb": (0.01, 0.234),
    "input_layernorm": (0.005, 0.105),
    "attn_pre_proj": (0.067, 1.911),
    "attn_rope": (0.005, 0.149),
    "attn_post_proj": (0.022, 0.611),
    "post_attention_layernorm": (0.005, 0.104),
    "mlp_up_proj": (0.12, 3.3655),
    "mlp_act": (0.005, 0.266),
    "mlp_down_proj": (0.06, 1.604),
    "add": (0.003, 0.055),
}
n = np.unique(np.concatenate([np.arange(1, 129), np.arange(160, 4097, 32)]))
cols = {}
for op, (floor, at4k) in ops.items():
    cols.update(stats(op, floor + (at4k - floor) * n / 4096.0))
mlp = pd.DataFrame(cols)
for k, v in dict(
    n_head=32,
    n_kv_head=32,
    n_embd=4096,
    n_expanded_embd=11008,
    vocab_size=32768,
    use_gated_mlp=True,
    num_tensor_parallel_workers=1,
).items():
    mlp[k] = v
mlp["num_tokens"] = n

# ---- attention.csv ----
rows = []
HBM = 1.5e12
FLOPS = 150e12
KV_BYTES_PER_TOK = 2 * 4096 * 2  # K+V, fp16, per layer
for b in sorted(set([1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256])):
    for kv in range(0, 4097, 128):
        kvc = max(kv, 1)
        t = 0.006 + 0.0014 * b + b * kvc * KV_BYTES_PER_TOK / HBM * 1e3
        rows.append(
            dict(
                batch_size=b,
                kv_cache_size=kv,
                prefill_chunk_size=0,
                is_prefill=False,
                dec=t,
                pre=np.nan,
                save=0.002 + b * 2e-6,
            )
        )
for c in [32, 64, 96, 128] + list(range(256, 4097, 128)):
    for kv in range(0, 4097, 256):
        t = 0.01 + 4 * c * (kv + c / 2) * 4096 / FLOPS * 1e3
        rows.append(
            dict(
                batch_size=1,
                kv_cache_size=kv,
                prefill_chunk_size=c,
                is_prefill=True,
                dec=np.nan,
                pre=t,
                save=0.002 + c * 2e-6,
            )
        )
r = pd.DataFrame(rows)
att = pd.DataFrame(
    {
        **stats("attn_input_reshape", np.zeros(len(r))),
        **stats("attn_decode", r.dec),
        **stats("attn_output_reshape", np.full(len(r), 0.002)),
        **stats("attn_prefill", r.pre),
        **stats("attn_kv_cache_save", r.save),
    }
)
for k, v in dict(
    n_embd=4096,
    n_q_head=32,
    n_kv_head=32,
    block_size=16,
    num_tensor_parallel_workers=1,
    max_model_len=4096,
).items():
    att[k] = v
for k in ["batch_size", "prefill_chunk_size", "kv_cache_size", "is_prefill"]:
    att[k] = r[k]
att["attention_backend"] = "AttentionBackend.FLASH_ATTENTION"

d = snap("compute", COMPUTE_REPO)
mlp.to_csv(f"{d}/mlp.csv.xz", index=False, compression="xz")
att.to_csv(f"{d}/attention.csv.xz", index=False, compression="xz")
Path(f"{d}/config.json").write_text(
    json.dumps({"model": "meta-llama/Llama-2-7b-hf", "device_sku": "a100", "synthetic": True})
)

# ---- network (unused at TP1/PP1 but must exist) ----
d = snap("network", NETWORK_REPO)
sizes = 2 ** np.arange(10, 28)
for coll, fn in [("all_reduce", "all_reduce.csv.xz"), ("send_recv", "send_recv.csv.xz")]:
    recs = []
    for w, dpn in [(1, 1), (2, 2), (4, 4), (8, 8), (2, 1)]:
        for s in sizes:
            recs.append(
                {
                    "size": s,
                    "num_workers": w,
                    "devices_per_node": dpn,
                    "collective": coll,
                    f"time_stats.{coll}.median": 0.01 + s / 200e9 * 1e3,
                }
            )
    pd.DataFrame(recs).to_csv(f"{d}/{fn}", index=False, compression="xz")
Path(f"{d}/config.json").write_text(json.dumps({"sku": "a100_dgx", "synthetic": True}))
print("mlp rows", len(mlp), "attention rows", len(att), "->", CACHE)
