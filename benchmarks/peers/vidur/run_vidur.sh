#!/usr/bin/env bash
# Usage: run_vidur.sh {vllm|sarathi} NUM_REQUESTS
# Runs Vidur 0.0.26 end-to-end: Llama-2-7b-hf, a100, TP1/PP1, 1 replica, Poisson 45.3 req/s,
# request lengths from the lmsys sample (100k rows, sampled with replacement, seed 0).
# NOTE: compute profiles are SYNTHETIC (see make_synthetic_profiles.py); real A100 profiles
# are downloaded by Vidur from the HF hub at run time, which is unreachable here.
set -euo pipefail
SCHED=${1:?scheduler vllm|sarathi}; NREQ=${2:?num requests}
ROOT=${VIDUR_DIR:-/tmp/vidur}
export HF_HUB_OFFLINE=1 WANDB_MODE=disabled
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
OUT=$ROOT/out/${SCHED}_${NREQ}
mkdir -p "$OUT"
P=--random_forrest_execution_time_predictor_config
case "$SCHED" in
  vllm) SCHED_ARGS=(--vllm_scheduler_config_batch_size_cap 256 --vllm_scheduler_config_max_tokens_in_batch 2048) ;;
  sarathi) SCHED_ARGS=(--sarathi_scheduler_config_batch_size_cap 256 --sarathi_scheduler_config_chunk_size 512) ;;
  *) echo "unknown scheduler $SCHED" >&2; exit 2 ;;
esac
cd "$ROOT"
"$ROOT/venv/bin/python" -m vidur.main \
  --replica_config_model_name meta-llama/Llama-2-7b-hf \
  --replica_config_device a100 --replica_config_network_device a100_dgx \
  --replica_config_tensor_parallel_size 1 --replica_config_num_pipeline_stages 1 \
  --cluster_config_num_replicas 1 --global_scheduler_config_type round_robin \
  --replica_scheduler_config_type "$SCHED" "${SCHED_ARGS[@]}" \
  --cache_config_block_size 16 --cache_config_memory_margin_fraction 0.1 \
  --request_generator_config_type synthetic \
  --synthetic_request_generator_config_num_requests "$NREQ" \
  --length_generator_config_type trace \
  --trace_request_length_generator_config_trace_file "$ROOT/lmsys_lengths_100k.csv" \
  --trace_request_length_generator_config_max_tokens 4096 \
  --trace_request_length_generator_config_seed 0 \
  --interval_generator_config_type poisson \
  --poisson_request_interval_generator_config_qps 45.3 \
  --poisson_request_interval_generator_config_seed 0 \
  --execution_time_predictor_config_type random_forrest \
  ${P}_model_profiling_dataset local/synthetic-llama-2-7b-hf-a100 \
  ${P}_network_profiling_dataset local/synthetic-a100-dgx \
  ${P}_cache_dir "$ROOT/vidur_cache" \
  ${P}_num_training_job_threads 1 \
  ${P}_prediction_max_batch_size 256 \
  ${P}_prediction_max_tokens_per_request 4096 \
  ${P}_prediction_max_prefill_chunk_size 4096 \
  --metrics_config_output_dir "$OUT" \
  --no-metrics_config_enable_chrome_trace \
  --no-metrics_config_store_plots \
  --no-metrics_config_write_json_trace \
  --no-metrics_config_save_table_to_wandb \
  --no-metrics_config_store_batch_metrics \
  --no-metrics_config_store_utilization_metrics \
  --metrics_config_store_request_metrics \
  --metrics_config_write_metrics
echo "Vidur output written under: $OUT/$(ls -t "$OUT" | head -1)"
