"""The engine core and the simulator.

- :mod:`harness.engine.core`: ``EngineCore`` (the reference host of the policy contract),
  ``EngineRequest`` (a ``RequestView``), ``StepOutcome``; ``EngineConfig`` lives in
  :mod:`harness.engine.config`.
- :mod:`harness.engine.costmodel`: step-time models, presets, ``get_cost_model``,
  ``fit_cost_model``.
- :mod:`harness.engine.simulate`: ``SimulateConfig``, ``simulate``, ``run_simulation``
  (virtual-time DES, one run directory per policy); :mod:`harness.engine.fastsim` is its
  vectorised kernel for budget-rule policies (``vllm``, FCFS ``sarathi``): one
  ``ArrayEngine``, also driven by :mod:`harness.engine.cluster_fast`.
- :mod:`harness.engine.cluster` (+ ``cluster_run``, ``cluster_split``, ``cluster_fast``,
  ``cluster_config``): N engines on one virtual clock behind a router;
  :mod:`harness.engine.vsessions`: sessions in virtual time.
- :mod:`harness.engine.prefix_cache`: vLLM v1's prefix cache for the engine core.
- :mod:`harness.engine.conformance`: host conformance scenarios for any host.

The built-in HTTP server is :mod:`harness.server`.
"""
