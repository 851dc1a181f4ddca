"""Real serving engines as the measurement: replay a scenario's workload through an engine that runs
in its own interpreter, and read back what it did.

- vllm_driver.py runs INSIDE the engine's venv (stdlib + vLLM only); capsim never imports it.
- vllm_replay.py builds the driver's request spec from a scenario, runs it, and turns its records into
  capsim's tables (requests, iterations, summary).
- composition.py compares what each iteration computed, vLLM against capsim's scheduler.
- validate_vllm.py is `capsim validate SCENARIO --engine vllm`.
"""
