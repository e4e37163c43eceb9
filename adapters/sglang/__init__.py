"""Harness policies inside SGLang's scheduler, through SGLang's own plugin framework.

Supported SGLang: exactly ``0.5.23`` (the PyPI wheel and the ``lmsysorg/sglang:v0.5.23``
image). The adapter hooks private scheduler methods (anchors-engines.md §3.1, §3.3), so other
versions are refused at start-up unless ``HARNESS_SGLANG_ANY_VERSION=1``.

How it is loaded: sglang 0.5.23 calls ``sglang.srt.plugins.load_plugins()`` at the top of
every scheduler process (``managers/scheduler.py`` ``run_scheduler_process``); it runs each
``sglang.srt.plugins`` entry point, whose ``register()`` puts AROUND hooks in
``HookRegistry``. The entry point is declared by the ``plugin_path/*.dist-info`` folder here,
which ``importlib.metadata`` finds on ``PYTHONPATH``, so nothing is pip-installed::

    PYTHONPATH=<repo>:<repo>/adapters/sglang/plugin_path HARNESS_POLICY=wait \
    python -m sglang.launch_server --model-path DIR --disable-overlap-schedule \
        --schedule-policy fcfs --disable-radix-cache --enable-metrics

Modules: ``view`` (SGLang ``Req`` as a :class:`~harness.policies.base.RequestView`), ``host``
(the per-step logic, duck-typed on the scheduler so it is testable with SGLang's real ``Req``
objects and without a GPU), ``plugin`` (the entry point; the only module that imports
SGLang). The policy choice reuses ``adapters.vllm.config`` (``HARNESS_POLICY``,
``HARNESS_POLICY_PARAMS``). ``launch`` starts a real server on a CPU-only machine
(``--device cpu``, with the pure-torch ``sgl_kernel`` stand-in in ``kernel_path/``);
``CONFORMANCE.md`` lists which host rules SGLang's loop can and cannot express.
"""

SUPPORTED_SGLANG_VERSION = "0.5.23"
ENTRY_POINT = "harness"  # the name to list in SGLANG_PLUGINS when that whitelist is used
