#!/usr/bin/env bash
# A CPU venv (.venv-sglang) in which a real sglang 0.5.23 server runs on a CPU-only machine
# (`python -m adapters.sglang.launch`), for the SGLang adapter tests. Cached: nothing is
# installed when the venv already imports the pinned sglang and carries the done-marker.
#
# Recipe (/work/shared/notes/sglang-cpu.md, verified on a 2-core AVX-512 box without AMX):
# - torch==2.14.1 + torchvision==0.29.* (the CUDA wheels run on CPU; the CPU torch wheel does
#   not, since SGLang imports torchvision at start-up and PyPI's torchvision needs libc10_cuda);
# - sglang==0.5.23 --no-deps, then its runtime needs, constrained to that torch;
# - NO sgl_kernel: the PyPI sglang-kernel wheel is CUDA-only and the CPU build is not on PyPI.
#   The launcher puts adapters/sglang/kernel_path (a pure-torch stand-in with the one op SGLang
#   calls without AMX) on PYTHONPATH instead.
# About 6.7 GB (3.2 GB of NVIDIA libraries), a few minutes with a warm pip cache.
#
# Usage: adapters/sglang/setup_cpu_venv.sh
# Env:   SGLANG_VENV (default <repo>/.venv-sglang), PYTHON (default python3),
#        TINY_MODEL_DIR (default <repo>/.cache/tiny-llama; built here when absent)
set -euo pipefail
SGLANG_VERSION="0.5.23"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${SGLANG_VENV:-$ROOT/.venv-sglang}"
MODEL_DIR="${TINY_MODEL_DIR:-$ROOT/.cache/tiny-llama}"
PY="${PYTHON:-python3}"
MARK="$VENV/.harness-serve-ok"

if [[ -x "$VENV/bin/python" && -f "$MARK" ]] && "$VENV/bin/python" -c \
  "import sglang; assert sglang.__version__ == '$SGLANG_VERSION'" >/dev/null 2>&1; then
  echo "[setup] sglang==$SGLANG_VERSION already in $VENV (cached)"
else
  echo "[setup] creating $VENV and installing sglang==$SGLANG_VERSION (CPU serving)"
  [[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
  PIP=("$VENV/bin/pip" install -q)
  "${PIP[@]}" "torch==2.14.1" "torchvision==0.29.*"
  "${PIP[@]}" --no-deps "sglang==$SGLANG_VERSION"
  # SGLang's runtime needs (a superset that served; pinned where sglang 0.5.23 pins), kept
  # from moving torch.
  "${PIP[@]}" "torch==2.14.1" "torchvision==0.29.*" \
    numpy orjson pydantic fastapi pyzmq psutil requests packaging msgspec pybase64 \
    setproctitle uvloop aiohttp tqdm regex einops pillow prometheus-client xxhash \
    "transformers==5.19.0" "tokenizers==0.23.2" python-multipart "uvicorn>=0.51" interegular \
    partial_json_parser zstandard IPython "apache-tvm-ffi==0.1.11" dill "sentencepiece==0.2.1" \
    "compressed-tensors==0.18.0" gguf "openai==2.8.0" "xgrammar==0.2.7" "llguidance>=1.7.6,<2" \
    scipy tiktoken "openai-harmony==0.0.4" watchfiles distro "blobfile==3.0.0" easydict \
    "python-dateutil<3" anthropic ninja numba triton jsonschema soundfile
  # The harness (policies, tiers) imports inside SGLang's scheduler process: editable, no
  # deps, then its own deps constrained to what SGLang just got (nothing SGLang needs moves).
  "$VENV/bin/pip" freeze --exclude-editable | grep -v '^-e' > "$VENV/sglang-frozen.txt"
  HARNESS_COMPILE=0 "$VENV/bin/pip" install -q --no-deps -e "$ROOT"
  "$VENV/bin/python" - "$ROOT/pyproject.toml" > "$VENV/harness-requirements.txt" <<'PY'
import sys, tomllib
deps = tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]
print("\n".join(d for d in deps if not d.startswith(("rich", "nvidia-ml-py"))))
PY
  "$VENV/bin/pip" install -q -c "$VENV/sglang-frozen.txt" -r "$VENV/harness-requirements.txt"
  PYTHONPATH="$ROOT/adapters/sglang/kernel_path" SGLANG_USE_CPU_ENGINE=1 "$VENV/bin/python" -c \
    "import sglang.srt.managers.scheduler, sglang.srt.entrypoints.http_server, harness.policies"
  touch "$MARK"
  echo "[setup] ok: sglang $SGLANG_VERSION serves on CPU from $VENV"
fi

if [[ -f "$MODEL_DIR/config.json" && -f "$MODEL_DIR/tokenizer.json" ]]; then
  echo "[setup] tiny model present at $MODEL_DIR (cached)"
else
  echo "[setup] building tiny random Llama at $MODEL_DIR"
  "$VENV/bin/python" "$ROOT/scripts/vllm-cpu/build_tiny_model.py" "$MODEL_DIR"
fi
echo "[setup] done"
