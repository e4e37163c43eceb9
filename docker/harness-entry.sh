#!/usr/bin/env bash
# Replay the trace against the vLLM service (already healthy: depends_on service_healthy),
# then render the HTML report. Output: /work/reports/$RUN_NAME (./reports on the host).
set -euo pipefail
out="/work/reports/${RUN_NAME:-gpu-run}"
args=(--trace "$TRACE" --target "$TARGET" --engine vllm --seed "${SEED:-0}" --out "$out"
      --no-progress --ready-timeout 60)
[[ -n "${RATE:-}" ]] && args+=(--rate "$RATE")
[[ -n "${NUM_REQUESTS:-}" ]] && args+=(--num-requests "$NUM_REQUESTS")
[[ -n "${TIERS:-}" ]] && args+=(--tiers "$TIERS")
# shellcheck disable=SC2206
extra=(${REPLAY_EXTRA_ARGS:-})
harness replay "${args[@]}" "${extra[@]}"
harness report "$out" --out "$out/report.html"
echo "policy ${SCHEDULER_POLICY:-?}: report at reports/${RUN_NAME:-gpu-run}/report.html"
