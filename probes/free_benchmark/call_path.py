"""free_benchmark's per-call path, written once for every framework.

hooked call → probe running for this step and rank? → API excluded or not selected? → run the
original → build perturbed inputs → re-run the original with hooks suspended, without autograd and
with the random generators replayed → compare leaf by leaf → check: record rows; fix: substitute.

The user's model is never touched in check mode: inputs are copied before they are perturbed,
in-place and state-mutating APIs are never re-run (or re-run on copies), the random stream
continues as if the probe were absent, and the original output object is returned unchanged.
An error inside the probe is recorded and the call goes on, unless the config asks for strict mode.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any, NamedTuple

from probes.core import thresholds as th
from probes.core.config import ProbeConfig
from probes.core.errors import NotMeasurable, ProbeError
from probes.core.leaf_verdicts import StructureMismatch, drive
from probes.core.metrics import RatioVerdict
from probes.core.trees import tree_map
from probes.free_benchmark import exclusions
from probes.free_benchmark.backward import PASS_ENTRIES, BackwardCheck
from probes.free_benchmark.compare import at_once, compare_outputs, comparison
from probes.free_benchmark.deferred import VerdictQueue, held_bytes
from probes.free_benchmark.fix_handler import substitute
from probes.free_benchmark.fp8 import with_range_use
from probes.free_benchmark.ledger import ApiStats, Ledger
from probes.free_benchmark.perturbations import Cancelled, Perturbation, PerturbedCall, make_perturbation
from probes.free_benchmark.preheat import CENSUS, Preheat
from probes.free_benchmark.replay import perturbed_replay, replay
from probes.free_benchmark.selection import FP8_CASTS, Selection

log = logging.getLogger("probes.free_benchmark")

PREHEAT_CENSUS = "preheat's first step: the call is counted to plan the samples, not judged"
# the modes whose re-run changes the dtype or the device: a compiled graph re-runs its eager program
REFERENCE_MODES = ("improve_precision", "to_cpu")


class Checked(NamedTuple):
    """A forward call that ran and is now checked: a tuple, as one is made per checked call."""

    meta: Any  # the API's catalogue entry
    name: str  # its call name, Functional.add.0.forward
    stats: ApiStats
    original: Callable[..., Any]
    args: tuple
    kwargs: dict
    out: Any
    snapshot: Any  # the random state the call ran with, replayed by the re-runs
    sampled: bool  # a preheat CPU sample is due
    # a DTensor call (the backend's LocalCall): args, kwargs and out are then its plain local
    # tensors, and a re-run that fails or does not match them in shape is a skip, not an error
    # (unless a re-run through DTensor communicated: that is an error)
    local: Any = None


class CallPath:
    """The per-call path of a free_benchmark run (FreeBenchmarkProbe adds its steps and files).
    One object holds both, as every hooked call reads the run's state: which step, whether calls
    are probed now, the call counters."""

    def __init__(self, config: ProbeConfig, backend: Any, call_exclusion: Callable[[Any, tuple, dict], str | None],
                 ledger: Ledger) -> None:
        self.config = config
        self.fb = config.free_benchmark
        self.backend = backend
        self.call_exclusion = call_exclusion
        self.ledger = ledger
        self.perturbation = make_perturbation(self.fb.pert_mode, backend, self.fb.add_noise_style, self.fb.rule)
        self.selection = Selection(self.fb.scope, self.fb.api_list, self.fb.fuzz_stage)
        self.backward = BackwardCheck(self) if self.fb.fuzz_stage == "backward" else None
        self.current_step = 0
        self.active = False  # calls are probed now (the run's step and rank filters)
        self.counters: Counter[str] = Counter()
        self.preheat: Preheat | None = None
        self.preheat_note: str | None = None  # why a requested preheat is not applied
        self._cpu_reference: Perturbation | None = None
        # checked calls' comparisons, settled together at step()/stop() (deferred.py); preheat
        # judges each call at once (its thresholds move with every sample)
        self.verdicts = VerdictQueue(backend)
        self._optimizer_steps = 0  # > 0 while an optimizer step runs (frameworks that can tell set it)
        self._optimizer_calls: dict[str, int] = {}  # API key -> calls in the optimizer step now running
        # verdicts made at the call where they can be (_judge, compare.at_once): no_change's
        # equal outputs, and small CPU outputs under either rule
        self._at_once = self.fb.pert_mode != "to_cpu"

    def enable_preheat(self) -> None:
        """Learn the thresholds against the CPU (`if_preheat`; the frameworks that support it
        call this). Forward check stage with a ratio mode only: the backward stage has no CPU
        reference for a vector-Jacobian product (the reference counts it as consistent, which only
        tightens), and to_cpu has no ratio to tune."""
        fb = self.fb
        if fb.fuzz_stage != "forward" or fb.handler_type != "check" or fb.pert_mode == "to_cpu":
            why = ("the backward stage has no CPU reference for gradients" if fb.fuzz_stage != "forward"
                   else "to_cpu is judged by the CPU rule, not a ratio threshold" if fb.pert_mode == "to_cpu"
                   else "preheat tunes the check handler only")
            self.preheat_note = f"not applied: {why}; the default thresholds are used"
            log.warning("free_benchmark: if_preheat is %s", self.preheat_note)
            return
        self.preheat = Preheat(fb.preheat_step, fb.max_sample)
        self._cpu_reference = make_perturbation("to_cpu", self.backend)

    # the per-call path -------------------------------------------------------------------------
    def on_call(self, meta: Any, original: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        if not self.active:
            return original(*args, **kwargs)
        key = meta.key
        backward = self.backward
        if backward is not None and backward.opened() and key not in FP8_CASTS and not backward.fp8_vjp(args, kwargs):
            return original(*args, **kwargs)  # a backward pass opened for its FP8 matmuls only (backward.py)
        if self._optimizer_steps:  # counted here, told to the ledger when the step ends (hundreds a step)
            calls = self._optimizer_calls
            calls[key] = calls.get(key, 0) + 1
            return original(*args, **kwargs)
        if meta.exclusion is not None:
            self.ledger.skip(key, meta.exclusion)
            if backward is not None and key in PASS_ENTRIES:
                with backward.resumed_pass():  # its FP8 matmuls are judged (backward.py)
                    return original(*args, **kwargs)
            if key not in FP8_CASTS:
                return original(*args, **kwargs)
            out = original(*args, **kwargs)
            try:  # a cast to FP8: its range use, for the matmuls that read it (free_benchmark/fp8.py)
                self.backend.note_fp8_cast(args, kwargs, out)
            except Exception as exc:
                if self.config.strict:
                    raise
                self.ledger.error(key, f"{key} (FP8 range use)", exc)
            return out
        index = self.counters[key]
        self.counters[key] = index + 1
        why = self.call_exclusion(meta, args, kwargs)
        if why is not None:
            self.ledger.skip(key, why)
            return original(*args, **kwargs)
        if self.selection.static(key) is False:  # most calls of a listed run: no name to build
            return original(*args, **kwargs)
        name = f"{key}.{index}{self.selection.suffix}"
        if not self.selection.selects(key, name):
            return original(*args, **kwargs)
        by_api = self.ledger.stats
        stats = by_api.get(key)
        if stats is None:
            stats = by_api[key] = ApiStats()
        stats.calls += 1
        transformed = self.backend.in_transform()
        if transformed and (self.backward is not None or self.fb.handler_type == "fix"):
            self.ledger.skip(key, exclusions.TRANSFORM_BACKWARD if self.backward is not None else exclusions.TRANSFORM_FIX)
            return original(*args, **kwargs)
        local = self.backend.local_call(args, kwargs)
        if local is not None:
            why = (local if isinstance(local, str) else exclusions.DISTRIBUTED_GRAPH if meta.review is not None
                   else exclusions.DISTRIBUTED_BACKWARD if self.backward is not None
                   else exclusions.DISTRIBUTED_FIX if self.fb.handler_type == "fix" else None)
            if why is not None:
                self.ledger.skip(key, why)
                return original(*args, **kwargs)
        if backward is not None and not backward.fp8_vjp(args, kwargs):  # (an FP8 VJP matmul: judged below)
            why = self.backend.backward_reason(args, kwargs)
            if why is not None:
                self.ledger.skip(key, why)
                return original(*args, **kwargs)
            return self.backward.on_call(meta, name, stats, original, args, kwargs)
        sampled = False
        if self.preheat is not None:
            phase, sampled = self.preheat.on_call(key, self.current_step)
            if phase == CENSUS:  # the call census: counted, not compared (see preheat.py)
                self.ledger.skip(key, PREHEAT_CENSUS)
                return original(*args, **kwargs)
            sampled = sampled and not transformed  # the CPU sample re-runs outside the transform's values
        snapshot = self.backend.rng_snapshot(args)
        if local is None:
            out = original(*args, **kwargs)
        else:
            with local.watching():  # what DTensor does around its local kernels decides the re-run
                out = original(*args, **kwargs)
        try:
            if local is None:
                self._check(Checked(meta, name, stats, original, args, kwargs, out, snapshot, sampled))
            else:
                self._check_local(Checked(meta, name, stats, original, args, kwargs, out, snapshot, sampled, local))
        except Exception as exc:  # never let the probe break the user's model
            self.failed(key, name, exc)
        return out

    def _check(self, call: Checked) -> None:
        b = self.backend
        meta, name, stats, original, args, kwargs, out, snapshot, sampled, local = call
        too_large = b.copies_too_large(args, kwargs, out)
        if too_large is not None:
            self.ledger.skip(meta.key, too_large)
            return
        if meta.mutates_inputs:
            args, kwargs = tree_map(_cloner(b), args), tree_map(_cloner(b), kwargs)
        fp8_reference = (b.fp8_reference(meta.qualname, meta.prefix) if self.fb.pert_mode == "improve_precision"
                         else None)
        if fp8_reference is not None:  # FP8 operands and scales: their float64 product (torch_fp8)
            pert: Any = PerturbedCall(args, kwargs)
        else:
            pert = self.perturbation.build(args, kwargs)
        if isinstance(pert, Cancelled):
            self.ledger.skip(meta.key, pert.reason)
            return
        rerun = fp8_reference or self.rerun_of(meta, original, pert.on_cpu)
        if isinstance(rerun, str):
            self.ledger.skip(meta.key, rerun)
            return
        if local is not None:  # a call DTensor redistributed is re-run through DTensor
            rerun = local.rerunner(rerun)
        try:
            pert_out = (replay(b, snapshot, rerun, pert.args, pert.kwargs) if local is not None else
                        perturbed_replay(b, snapshot, rerun, pert.args, pert.kwargs, args, kwargs, self.fb.pert_mode))
        except NotMeasurable as exc:  # a reference that does not model this call, values the API rejects
            self.ledger.skip(meta.key, str(exc))
            return
        except Exception as exc:
            why = None if local is None else local.rerun_failed(exc)
            if why is None:  # a re-run through DTensor that communicated is an error, never a skip
                raise
            self.ledger.skip(meta.key, why)
            return
        if local is not None:
            why = local.mismatch(out, pert_out, same_dtype=self.fb.pert_mode not in REFERENCE_MODES)
            if why is not None:
                self.ledger.skip(meta.key, why)
                return
        if self.fb.handler_type == "fix":  # fix substitutes; it writes no rows (as the reference)
            substitute(b, out, pert_out)
            self.ledger.fixed(stats)
            return
        # figures are plain tensors computed outside any torch.func transform (on the values
        # below its wrappers): they can be read after the transform ends, and it never sees them
        with b.outside_transforms():
            move = self.input_move(pert)
            pert = None  # free the perturbed (e.g. upcast) inputs before comparing
            self._judge(call, args, kwargs, pert_out, move)

    def _check_local(self, call: Checked) -> None:
        """A DTensor call: checked as a call on the plain local tensors the rank computed with,
        when DTensor did nothing else around its local kernels or only redistributed without a
        collective (then re-run through DTensor), else skipped, with why."""
        seen = call.local.after(call.out)
        if isinstance(seen, str):
            self.ledger.skip(call.meta.key, seen)
            return
        args, kwargs, out = seen
        # the preheat's CPU sample re-runs the API on the plain local tensors: another computation
        # when DTensor redistributed them
        sampled = call.sampled and not call.local.through
        self._check(call._replace(args=args, kwargs=kwargs, out=out, sampled=sampled))

    def _judge(self, call: Checked, args: tuple, kwargs: dict, pert_out: Any, move: Any) -> None:
        """Compare the re-run with the original (`args`/`kwargs`: the call's inputs, copies when
        the API mutates them, which the compiled graph's eager review re-runs on)."""
        b = self.backend
        meta, name, stats, _original, _args, _kwargs, out, snapshot, sampled, _local = call
        deferred = self.preheat is None and meta.review is None
        stage = self.fb.fuzz_stage  # "backward": an FP8 matmul of a backward pass (backward.py fp8_vjp)
        tolerance = th.BACKWARD_TOLERANCE if stage == "backward" else None
        if deferred and self._at_once:
            # the usual no_change call (its output matched, which the host knows already) or a
            # small CPU output's figures, taken on the host
            verdicts = at_once(b, out, pert_out, pert_mode=self.fb.pert_mode, rule=self.fb.rule, tolerance=tolerance,
                               stage=stage, input_move=move, pointwise=getattr(meta, "pointwise", False))
            if verdicts is not None and not b.fp8_inputs(args, kwargs):
                self.verdicts.add_recorded(self.ledger, meta.key, name, stats, verdicts, self.current_step)
                return
        try:
            check = comparison(b, out, pert_out, pert_mode=self.fb.pert_mode, rule=self.fb.rule, input_move=move,
                               tolerance=tolerance, stage=stage,
                               pointwise=getattr(meta, "pointwise", False),
                               version=b.autodiff.version if deferred else None, exact=meta.review is not None)
            fp8_inputs = b.fp8_inputs(args, kwargs)
            if fp8_inputs:  # the range their casts used, judged beside the output (free_benchmark/fp8.py)
                check = with_range_use(check, fp8_inputs)
            if deferred:
                step, key, ledger = self.current_step, meta.key, self.ledger
                self.verdicts.add(check, lambda verdicts: ledger.record(key, name, stats, verdicts, step),
                                  lambda exc: ledger.check_failed(key, name, exc), held_bytes(b, out, pert_out))
                return
            verdicts = drive(b, check)
            if meta.review is not None:  # a compiled graph; its eager program's result on demand, for the review
                verdicts = meta.review("forward", name, (args, kwargs),
                                       lambda: replay(b, snapshot, meta.reference, args, kwargs), out, pert_out, verdicts)
        except StructureMismatch as exc:
            self.ledger.skip(meta.key, f"perturbed output has another structure ({exc})")
            return
        except NotMeasurable as exc:
            self.ledger.skip(meta.key, str(exc))
            return
        preheat_row = False
        if self.preheat is not None:
            if sampled:
                try:
                    self._preheat_sample(call, verdicts)
                except Exception as exc:  # no sample; the ratio verdicts still count
                    if self.config.strict:
                        raise
                    self.ledger.error(meta.key, f"{name} (preheat CPU reference)", exc)
            preheat_row = self.preheat.in_preheat(meta.key)
            verdicts = [self._preheat_judged(meta.key, v) for v in verdicts]
        self.ledger.record(meta.key, name, stats, verdicts, self.current_step, preheat=preheat_row)

    def rerun_of(self, meta: Any, original: Callable[..., Any], on_cpu: bool) -> Any:
        """What the perturbed call runs: the API itself, its host math on the CPU (torch_npu's
        fused operators), or a compiled graph's eager program when the mode changes the dtype or
        the device (improve_precision, to_cpu); a str says why it cannot run."""
        base = meta.reference if meta.reference is not None and self.fb.pert_mode in REFERENCE_MODES else original
        return self.backend.host_callable(meta.prefix, meta.qualname, base) if on_cpu else base

    def input_move(self, pert: Any) -> Any:
        """How far add_noise / bit_noise moved their input, at its scale (the scaled rule's
        allowance for the output's move): the mode's bound (one ulp: eps) or, for msprobe's
        x + v style, device figures measured here; None for the other modes and rules."""
        if self.fb.rule != "scaled" or self.fb.pert_mode not in ("add_noise", "bit_noise") or pert.moved is None:
            return None
        if pert.move is not None:
            return pert.move
        b = self.backend
        original, moved = (b.measured_leaves(x)[0][1] for x in pert.moved)  # plain values below a transform
        return b.scaled_figures(moved, original, th.machine_eps(b.dtype_name(original)))

    # preheat (see preheat.py) ------------------------------------------------------------------
    def _preheat_sample(self, call: Checked, verdicts: list[Any]) -> None:
        """Run the call on the CPU (inputs copied there, half types as float32) and give every
        ratio leaf's figure to the preheat with the CPU rule's verdict for that leaf. A failed
        CPU run records nothing (the reference counted it as consistent, which can only widen)."""
        b = self.backend
        assert self._cpu_reference is not None and self.preheat is not None
        meta, name, _stats, original, args, kwargs, out, snapshot, _sampled, _local = call
        if meta.mutates_inputs:  # copies of the user's inputs: the CPU run must not see the re-run's updates
            args, kwargs = tree_map(_cloner(b), args), tree_map(_cloner(b), kwargs)
        key = meta.key
        cpu_call = self._cpu_reference.build(args, kwargs)
        on_host = b.host_callable(meta.prefix, meta.qualname, original)
        if isinstance(cpu_call, Cancelled) or isinstance(on_host, str):
            return
        cpu_out = replay(b, snapshot, on_host, cpu_call.args, cpu_call.kwargs)
        cpu_call = None
        cpu_ok = {v.path: v.consistent for v in compare_outputs(b, out, cpu_out, pert_mode="to_cpu")}
        log.info("free_benchmark: preheat sample in step %s, %s", self.current_step, name)
        for v in verdicts:
            if "ratio" in v.detail and v.path in cpu_ok:
                self.preheat.record(key, v.dtype_repr, v.figure, cpu_ok[v.path], floor=1.0 + v.threshold)

    def _preheat_judged(self, key: str, v: Any) -> Any:
        """A ratio leaf's verdict under the preheat threshold of its API and dtype."""
        if "ratio" not in v.detail:
            return v  # integer and bool leaves are compared exactly
        assert self.preheat is not None
        t = self.preheat.threshold(key, v.dtype_repr, default=1.0 + v.threshold)
        d = v.detail
        rv = RatioVerdict(d["ratio"], bool(d.get("symbol_flipping")), bool(d.get("nan_mismatch")),
                          bool(d.get("inf_mismatch")))
        return replace(v, consistent=rv.consistent(t), threshold=round(t - 1.0, 12))

    # failures and the run's files -------------------------------------------------------------
    def cancelled_by_framework(self, key: str, name: str, exc: BaseException) -> bool:
        """True when `exc` means the framework cannot run this check (recorded as a skip)."""
        return False

    def failed(self, key: str, name: str, exc: BaseException) -> None:
        """A check of `name` that raised: a skip when the framework cannot run it, else an error
        (raised in strict mode; otherwise recorded, and the user's call goes on)."""
        if self.cancelled_by_framework(key, name, exc):
            return
        if self.config.strict:
            raise ProbeError(f"free_benchmark failed on {name}: {exc}") from exc
        self.ledger.error(key, name, exc)

    def optimizer_step(self, entering: bool | None) -> None:
        """An optimizer step begins (True) or ends (False); None: the hooks are going away, so a
        step that raised (its end never reported) is closed too. Its calls are not checked
        (exclusions.IN_OPTIMIZER_STEP)."""
        if entering is None:
            self._optimizer_steps = 0
        else:
            self._optimizer_steps = self._optimizer_steps + 1 if entering else max(0, self._optimizer_steps - 1)
        if not self._optimizer_steps and self._optimizer_calls:
            calls, self._optimizer_calls = self._optimizer_calls, {}
            for key, count in calls.items():
                self.ledger.skip(key, exclusions.IN_OPTIMIZER_STEP, count)


def _cloner(backend: Any) -> Callable[[Any], Any]:
    def clone(x: Any) -> Any:
        return backend.clone(x) if backend.is_tensor(x) else x

    return clone
