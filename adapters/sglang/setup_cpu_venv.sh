#!/usr/bin/env bash
# A CPU-only venv in which sglang 0.5.23's scheduler modules import, for the adapter tests
# (tests/adapters/test_sglang_real.py, test_sglang_compose.py). Nothing here can serve a model:
# SGLang's kernels (sglang-kernel, flashinfer, ...) are GPU-only and are not installed.
#
# Recipe (what worked on the CPU dev box, Python 3.11): the sglang wheel with --no-deps, its
# torch pin, then the import-time dependencies of sglang.srt.managers.{scheduler,
# schedule_policy,schedule_batch}, found by importing until nothing was missing. About 6 GB
# (torch's CUDA wheel: it imports and runs on CPU).
#
# Usage: adapters/sglang/setup_cpu_venv.sh      Env: SGLANG_VENV (default <repo>/.venv-sglang)
set -euo pipefail
SGLANG_VERSION="0.5.23"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${SGLANG_VENV:-$ROOT/.venv-sglang}"
PY="${PYTHON:-python3}"

if [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" -c \
  "import sglang, sglang.srt.managers.scheduler; assert sglang.__version__ == '$SGLANG_VERSION'" \
  >/dev/null 2>&1; then
  echo "[setup] sglang==$SGLANG_VERSION already importable in $VENV (cached)"
  exit 0
fi
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/pip" install -q)
"${PIP[@]}" --no-deps "sglang==$SGLANG_VERSION"
"${PIP[@]}" "torch==2.14.1" torchvision numpy
"${PIP[@]}" orjson pydantic fastapi pyzmq psutil requests packaging msgspec pybase64 \
  setproctitle uvloop aiohttp tqdm regex einops pillow prometheus-client xxhash \
  "transformers==5.19.0" python-multipart uvicorn interegular partial_json_parser triton \
  zstandard IPython "apache-tvm-ffi==0.1.11" dill sentencepiece compressed-tensors gguf openai
# The harness itself (policies, tiers) for the adapter code.
"${PIP[@]}" -e "$ROOT"
"$VENV/bin/python" -c "import sglang.srt.managers.scheduler, sglang.srt.managers.schedule_policy" \
  2>/dev/null && echo "[setup] ok: sglang $SGLANG_VERSION scheduler imports on CPU in $VENV"
