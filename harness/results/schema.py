"""The run directory format: one schema for live replays and simulations alike (design.md).

```
<run_dir>/
  run.json          config, versions, trace info, seed, target, policy, tiers, status
  requests.parquet  one row per request (REQUESTS)
  chunks.parquet    one row per streamed chunk (CHUNKS); simulations write one row per token
  samples.parquet   time series from the engine / Prometheus / NVML (SAMPLES)
  summary.json      vLLM ``bench serve`` keys + per-tier SLOs + stability + send fidelity
  report.html       self-contained report
```

All times are seconds on the run's clock: 0 is the moment the dispatch loop started (``t0``),
so ``target_s`` is exactly the trace's arrival offset. ``run.json`` keeps ``t0_unix`` to map
back to wall time. ``run.json.status`` is ``running`` while writing, then ``complete``, or
``partial`` after Ctrl-C / a crash (everything flushed so far stays readable).
"""

from __future__ import annotations

import pyarrow as pa

RUN_JSON = "run.json"
REQUESTS_FILE = "requests.parquet"
CHUNKS_FILE = "chunks.parquet"
SAMPLES_FILE = "samples.parquet"
SUMMARY_JSON = "summary.json"
REPORT_HTML = "report.html"
FAULTS_FILE = "faults.jsonl"  # built-in server's log of injected faults (replays with --faults)

STATUS_RUNNING = "running"
STATUS_COMPLETE = "complete"
STATUS_PARTIAL = "partial"

# error_kind values (requests.parquet); None for a successful request.
ERROR_CONNECT = "connect"  # could not connect / connection refused / DNS
ERROR_HTTP = "http_status"  # non-200 response
ERROR_TIMEOUT = "timeout"  # no byte within the request timeout
ERROR_STREAM_CUT = "stream_cut"  # connection closed before [DONE] / final chunk
ERROR_BAD_PAYLOAD = "bad_payload"  # a chunk that is not valid JSON / not the expected shape
ERROR_NO_CHOICES = "no_choices"  # HTTP 200 but no choices-bearing chunk (vLLM counts it failed)
ERROR_REJECTED = "rejected"  # refused by the engine before running (e.g. longer than KV capacity)
ERROR_CANCELLED = "cancelled"  # still in flight when the run was stopped (Ctrl-C / duration)
# not sent: the client's open-file budget was used up by requests in flight (ulimit -n)
ERROR_CLIENT_LIMIT = "client_limit"
# session calls (harness.loadgen.sessions, harness.engine.vsessions)
ERROR_ABANDONED = "abandoned"  # the user gave up: no first chunk within patience
ERROR_CONTEXT = "context_overflow"  # history + output would exceed the model's context
ERROR_KINDS = (
    ERROR_CONNECT,
    ERROR_HTTP,
    ERROR_TIMEOUT,
    ERROR_STREAM_CUT,
    ERROR_BAD_PAYLOAD,
    ERROR_NO_CHOICES,
    ERROR_REJECTED,
    ERROR_CANCELLED,
    ERROR_CLIENT_LIMIT,
    ERROR_ABANDONED,
    ERROR_CONTEXT,
)

REQUESTS = pa.schema(
    [
        pa.field("req", pa.int64(), nullable=False),  # row index in the trace (join key)
        pa.field("request_id", pa.string(), nullable=False),  # sent as x-request-id
        pa.field("tier", pa.string()),
        pa.field("prompt_len", pa.int64()),  # from the trace
        pa.field("output_len", pa.int64()),  # requested max_tokens
        pa.field("prompt_tokens", pa.int64()),  # usage.prompt_tokens, else prompt_len
        pa.field("output_tokens", pa.int64()),  # usage.completion_tokens, else counted chunks
        pa.field("target_s", pa.float64()),  # scheduled arrival (trace arrival_s)
        pa.field("arrival_s", pa.float64()),  # released by the dispatcher (vLLM arrival_time)
        pa.field("send_s", pa.float64()),  # just before POST, after the concurrency gate
        pa.field("first_chunk_s", pa.float64()),  # first choices-bearing chunk (NaN if none)
        pa.field("last_chunk_s", pa.float64()),  # last choices-bearing chunk (NaN if none)
        pa.field("num_chunks", pa.int64()),
        pa.field("success", pa.bool_()),
        pa.field("error_kind", pa.string()),  # one of ERROR_KINDS, null when success
        pa.field("error", pa.string()),  # short human-readable message
        pa.field("http_status", pa.int64()),  # null when no response
    ]
)

# Session runs (issue 15, harness.loadgen.sessions) add these to every request row; plain runs
# keep REQUESTS exactly (a plain request is a session of one call: the columns are implied).
SESSION_FIELDS = (
    pa.field("session_id", pa.string()),
    pa.field("call_index", pa.int64()),  # index of the call in its session
    pa.field("parents", pa.string()),  # comma-separated call indices it waited for
    pa.field("attempt", pa.int64()),  # 0, then 1.. for retries (each its own row)
)
REQUESTS_SESSIONS = pa.schema([*REQUESTS, *SESSION_FIELDS])
SESSIONS_FILE = "sessions.parquet"  # one row per session (harness.results.sessions.SESSIONS)
SESSIONS = pa.schema(
    [
        pa.field("session_id", pa.string(), nullable=False),
        pa.field("tier", pa.string()),
        pa.field("target_s", pa.float64()),  # scheduled arrival
        pa.field("start_s", pa.float64()),  # admitted (after --max-active-sessions)
        pa.field("end_s", pa.float64()),  # last call finished
        pa.field("calls_planned", pa.int64()),
        pa.field("calls_sent", pa.int64()),
        pa.field("calls_done", pa.int64()),
        pa.field("calls_failed", pa.int64()),
        pa.field("retries", pa.int64()),
        pa.field("abandoned", pa.bool_()),
        pa.field("end_reason", pa.string()),  # complete|failed|abandoned|context_overflow|...
        pa.field("errors", pa.string()),  # JSON {error_kind: count}
    ]
)


def requests_schema(names: list[str] | tuple[str, ...] | None = None) -> pa.Schema:
    """REQUESTS, or REQUESTS_SESSIONS when ``names`` (a file's columns) has session columns."""
    return REQUESTS_SESSIONS if names is not None and "session_id" in names else REQUESTS


CHUNKS = pa.schema(
    [
        pa.field("req", pa.int64(), nullable=False),
        pa.field("t_s", pa.float64(), nullable=False),  # receipt time (perf_counter - t0)
        pa.field("tokens", pa.int32(), nullable=False),  # tokens carried by this chunk
    ]
)

SAMPLES = pa.schema(
    [
        pa.field("t_s", pa.float64(), nullable=False),
        pa.field("source", pa.string(), nullable=False),  # "engine" | "prometheus" | "gpu"
        pa.field("num_steps", pa.int64()),  # engine: steps covered by this row (fast-forward)
        pa.field("step_duration_s", pa.float64()),
        pa.field("prefill_tokens", pa.int64()),
        pa.field("decode_tokens", pa.int64()),
        pa.field("kv_used_tokens", pa.int64()),
        pa.field("kv_usage", pa.float64()),  # 0..1
        pa.field("num_waiting", pa.int64()),
        pa.field("num_running", pa.int64()),
        pa.field("preemptions_total", pa.int64()),
        pa.field("gpu_index", pa.int64()),
        pa.field("gpu_mem_used_mib", pa.float64()),
        pa.field("gpu_mem_total_mib", pa.float64()),
        pa.field("gpu_util_perc", pa.float64()),
        # NVML total energy since the driver loaded, joules (Volta+); deltas give a run's energy
        pa.field("gpu_energy_j", pa.float64()),
        # engine name in a cluster (simulated replicas/agents, serve --replicas); null: one
        pa.field("engine", pa.string()),
    ]
)
