"""free_benchmark: perturb an API's inputs, re-run it, judge how much the output moved.

No reference data is needed. The framework-free per-call path is in `service`; the perturbations
in `perturbations`; the rules in `compare` (over `probes.core.metrics`).
"""
