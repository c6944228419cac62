"""Workloads and a replay simulator for Hybrid Spark.

* ``workloads`` / ``workloads_cli``: build code-editing and chat workloads from released package sources
  (one JSONL format: ``{"id", "kind", "prompt", "output"}``), with a manifest of their sources.
* ``simulator`` / ``simulate_cli``: replay a workload through the real n-gram drafter, calibration and
  selection (CPU torch), with the model drafter represented by a declared acceptance model or a recorded trace,
  and the step cost taken from an SPS table.
"""
