"""free_benchmark on MindSpore (PyNative): the generic probe wired to MindSpore's whitelist.

Same config keys, per-call path, perturbations, comparison and output files as PyTorch
(probes.free_benchmark.call_path): one CSV per step and rank with the `pert_mode` header (the
reference's MindSpore front-end wrote one `pert_type` CSV for all steps and ranks), the
symmetric, NaN-aware ratio rule (its one-sided masks missed values going to or from ~0, and one NaN
hid a whole tensor), validated `list` names (it dropped unknown names silently). Only what is MindSpore's
own lives here:

* `list` holds full dotted names (`mindspore.ops.add`, `mindspore.Tensor.__add__`,
  `mindspore.mint.matmul`, `mindspore.mint.nn.functional.relu`), matched exactly;
* a kernel the MindSpore target lacks for a dtype (bf16 Abs/Greater/MatMul on the CPU, ...)
  cancels that check with a log line and a `not_checked` entry in summary.json;
* preheat, to_cpu and fuzz_device "cpu" are not available (the reference's MindSpore front-end
  has no to_cpu and ignores preheat);
* the backward stage uses the real cotangent, read by tensor hooks inside the user's grad function
  (probes.backends.mindspore_autodiff), like PyTorch's.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from probes.backends import api_exclusions, mindspore_compiled
from probes.backends.mindspore_apis import build_catalog, call_exclusion, full_name
from probes.backends.mindspore_backend import BACKEND
from probes.backends.patching import ApiPatcher
from probes.core.config import ProbeConfig
from probes.core.errors import ConfigError
from probes.free_benchmark import exclusions
from probes.free_benchmark.lifecycle import FreeBenchmarkRun
from probes.free_benchmark.selection import Selection, note_never_rerun, reject_unmatched
from probes.free_benchmark.service import FreeBenchmarkProbe

log = logging.getLogger("probes.free_benchmark")
_UNSUPPORTED = re.compile(r"Select (\w+) operator\[(\w+)\] fail! Unsupported data type", re.S)


class ExactSelection(Selection):
    """`list` of MindSpore full dotted names: an API is selected when its name is listed."""

    def __init__(self, keys: frozenset[str], stage: str = "forward") -> None:
        super().__init__((), (), stage)
        self.keys = keys

    def static(self, key: str) -> bool | None:
        return key in self.keys

    def selects(self, key: str, name: str) -> bool:
        return key in self.keys


class _MindSporeProbe(FreeBenchmarkProbe):
    """The generic probe plus MindSpore's "no kernel for this dtype" cancellation."""

    def cancelled_by_framework(self, key: str, name: str, exc: BaseException) -> bool:
        found = _UNSUPPORTED.search(str(exc)) if isinstance(exc, (TypeError, RuntimeError, ValueError)) else None
        if found is None:
            return False
        self.backend.drain_errors()
        device, kernel = found.groups()
        reason = f"MindSpore's {device} target has no {kernel} kernel for the dtypes of this call; check cancelled"
        if (key, reason) not in self.ledger.skipped:
            log.warning("free_benchmark: %s: %s", name, reason)
        self.ledger.skip(key, reason)
        return True


class _CompiledCalls:
    """Counts the compiled calls (mindspore.jit functions, Cells in GRAPH_MODE) made while the probe
    runs: their APIs are not checked, and summary.json's not_checked says so, per function (or
    Cell)."""

    def __init__(self, probe: Any) -> None:
        self.probe = probe

    def install(self) -> None:
        mindspore_compiled.subscribe(self._called)

    def uninstall(self) -> None:
        mindspore_compiled.unsubscribe(self._called)

    def _called(self, name: str, owner: Any) -> None:
        import mindspore as ms

        # an optimizer's own jit-compiled construct: its update is excluded anyway (a fused
        # optimizer kernel), so it is no compiled *model* code left unchecked
        if self.probe.active and not isinstance(owner, ms.nn.Optimizer):
            self.probe.ledger.skip(f"Graph.{name}", exclusions.COMPILED)


class MindSporeFreeBenchmark(FreeBenchmarkRun):
    """start()/stop()/step() of free_benchmark for MindSpore (mirrors TorchFreeBenchmark)."""

    def __init__(self, config: ProbeConfig) -> None:
        import mindspore as ms

        fb = config.free_benchmark
        if fb.pert_mode == "to_cpu" or fb.fuzz_device == "cpu":
            raise ConfigError("free_benchmark.pert_mode" if fb.pert_mode == "to_cpu" else "free_benchmark.fuzz_device",
                              fb.pert_mode if fb.pert_mode == "to_cpu" else fb.fuzz_device,
                              "MindSpore supports improve_precision, add_noise, bit_noise, change_value and "
                              'no_change with fuzz_device "npu" (the same device as the call)',
                              "to_cpu is PyTorch only, as in msprobe")
        if fb.if_preheat:
            log.warning("free_benchmark: if_preheat is not supported on MindSpore and is ignored (as in msprobe)")
        if ms.get_context("mode") != ms.PYNATIVE_MODE:
            log.warning("free_benchmark: MindSpore runs in GRAPH_MODE: compiled calls are not checked (listed in "
                        "summary.json's not_checked); free_benchmark checks PyNative calls, as msprobe")
        self.config = config
        self.catalog = build_catalog()
        # a failed check's queued operators are drained before its error is recorded, so they do not
        # fail later in the user's code
        self.probe = _MindSporeProbe(config, BACKEND, call_exclusion, "mindspore", BACKEND.drain_errors)
        self._select()
        self.patcher = ApiPatcher(tuple(m for m in self.catalog if m.exclusion != api_exclusions.ACCESSOR),
                                  self.probe.selection.static)
        self.graphs = _CompiledCalls(self.probe)
        self._register()

    def _select(self) -> None:
        fb = self.config.free_benchmark
        keys = [m.key for m in self.catalog]
        if fb.api_list:
            by_name = {full_name(k): k for k in keys}
            reject_unmatched("free_benchmark.list", [e for e in fb.api_list if e not in by_name], by_name,
                             "it is not an API of the MindSpore free_benchmark whitelist in this MindSpore",
                             "entries are full names such as mindspore.ops.add, mindspore.Tensor.__add__, "
                             "mindspore.mint.matmul, mindspore.mint.nn.functional.relu")
            chosen = frozenset(by_name[e] for e in fb.api_list)
            self.probe.selection = ExactSelection(chosen, fb.fuzz_stage)
            note_never_rerun((full_name(m.key), m.exclusion) for m in self.catalog if m.key in chosen and m.exclusion)
        elif fb.scope:  # PyTorch-style exact call names (Functional.add.0.forward)
            reject_unmatched("free_benchmark.scope", self.probe.selection.unmatched(keys), (),
                             "it names no MindSpore API that free_benchmark hooks",
                             "scope entries are call names such as Functional.add.0.forward")
