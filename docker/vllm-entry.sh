#!/usr/bin/env bash
# Start vLLM's OpenAI server; unless SCHEDULER_POLICY=stock, with the harness scheduler hosting
# that policy (adapters/vllm, synchronous scheduling as the adapter requires).
set -euo pipefail
args=(--model "$MODEL" --host 0.0.0.0 --port "${VLLM_PORT:-8000}"
      --max-num-seqs "${MAX_NUM_SEQS:-256}" --max-num-batched-tokens "${MAX_NUM_BATCHED_TOKENS:-2048}")
# Prefix caching is vLLM's default and the adapter supports it (cached prompt tokens count as
# computed in the policy's view); PREFIX_CACHING=0 turns it off.
[[ "${PREFIX_CACHING:-1}" == "0" ]] && args+=(--no-enable-prefix-caching)
[[ -n "${NUM_GPU_BLOCKS:-}" ]] && args+=(--num-gpu-blocks-override "$NUM_GPU_BLOCKS")
if [[ "${SCHEDULER_POLICY:-vllm}" != "stock" ]]; then
  export HARNESS_POLICY="${SCHEDULER_POLICY:-vllm}"
  export HARNESS_POLICY_PARAMS="${SCHEDULER_POLICY_PARAMS:-}"
  export HARNESS_STEP_LOG="/reports/${RUN_NAME:-gpu-run}.steps.jsonl"
  args+=(--scheduler-cls adapters.vllm.scheduler.HarnessScheduler --no-async-scheduling)
fi
# shellcheck disable=SC2206
extra=(${VLLM_EXTRA_ARGS:-})
exec python3 -m vllm.entrypoints.openai.api_server "${args[@]}" "${extra[@]}"
