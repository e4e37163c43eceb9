"""The engine core and the simulator.

- :mod:`harness.engine.core`: ``EngineCore`` (the reference host of the policy contract),
  ``EngineRequest`` (a ``RequestView``), ``StepOutcome``; ``EngineConfig`` lives in
  :mod:`harness.engine.config`.
- :mod:`harness.engine.costmodel`: step-time models, presets, ``get_cost_model``,
  ``fit_cost_model``.
- :mod:`harness.engine.simulate`: ``SimulateConfig``, ``simulate``, ``run_simulation``
  (virtual-time DES, one run directory per policy); :mod:`harness.engine.fastsim` is its
  vectorised kernel for ``vllm`` and ``sarathi``.
- :mod:`harness.engine.conformance`: host conformance scenarios for any host.
- ``server*.py``: the built-in OpenAI-compatible server (wall-clock host).
"""
