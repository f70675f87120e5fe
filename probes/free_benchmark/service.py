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
import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

from probes.backends.patching import suspended
from probes.core import thresholds as th
from probes.core.config import ProbeConfig
from probes.core.errors import NotMeasurable, ProbeError
from probes.core.metrics import RatioVerdict
from probes.core.records import FREE_BENCHMARK_COLUMNS, FreeBenchmarkRow
from probes.core.trees import format_path, iter_leaves, tree_map
from probes.core.writers import CsvAppender, write_json_atomic
from probes.free_benchmark import exclusions
from probes.free_benchmark.backward import PASS_ENTRIES, BackwardCheck
from probes.free_benchmark.compare import (
    OutputModified,
    StructureMismatch,
    compare_outputs,
    comparison,
    drive,
)
from probes.free_benchmark.deferred import VerdictQueue, held_bytes
from probes.free_benchmark.fp8 import with_range_use, worst_range_use
from probes.free_benchmark.perturbations import Cancelled, Perturbation, PerturbedCall, make_perturbation
from probes.free_benchmark.preheat import CENSUS, Preheat

log = logging.getLogger("probes.free_benchmark")
_CALL_INDEX = re.compile(r"\.\d+$")

CSV_NAME = "free_benchmark.csv"
# the excluded casts whose FP8 results get their range use recorded (the values before the cast
# are only at hand there)
FP8_CASTS = frozenset({"Tensor.to"})
PREHEAT_CENSUS = "preheat's first step: the call is counted to plan the samples, not judged"
# the modes whose re-run changes the dtype or the device: a compiled graph re-runs its eager program
REFERENCE_MODES = ("improve_precision", "to_cpu")
# Rows kept in memory for summary.json and the plugin; the CSV always gets every row, so a long
# run that flags the same API every step does not grow the process without bound.
ROWS_KEPT = 2000
# Rows repeated in summary.json (serialised once, when they are made): the file is rewritten at
# every step, so it must not grow with the run.
SUMMARY_ROWS = 100


@dataclass
class ApiStats:
    """What one API did over the run (the summary table's row)."""

    calls: int = 0
    checked: int = 0
    flagged: int = 0
    fixed: int = 0
    worst_figure: float = 0.0
    worst_max_rel: float | str | None = None
    threshold: float | None = None
    first_flagged: str | None = None
    dtypes: set[str] = field(default_factory=set)
    preheat_flagged: int = 0  # calls with rows during preheat (kept out of the CSV and `flagged`)
    # the largest error / threshold of any checked call, flagged or not (1 = at the threshold):
    # how close a clean API came
    worst_score: float | None = None
    fp8: dict[str, Any] | None = None  # its FP8 inputs' range use (free_benchmark/fp8.py), worst seen

    def to_dict(self) -> dict[str, Any]:
        extra = {} if self.fp8 is None else {"fp8": self.fp8}
        return extra | {
            "calls": self.calls, "checked": self.checked, "flagged": self.flagged, "fixed": self.fixed,
            "worst_max_rel": self.worst_max_rel, "threshold": self.threshold, "worst_score": self.worst_score,
            "first_flagged": self.first_flagged, "dtypes": sorted(self.dtypes),
            "preheat_flagged": self.preheat_flagged,
        }


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


class Selection:
    """msprobe's scope/list filter: scope = exact full names, list = substrings of them."""

    def __init__(self, scope: tuple[str, ...], api_list: tuple[str, ...], stage: str = "forward") -> None:
        self.suffix = "." + stage  # names are {key}.{index}.{stage}
        self.scope = frozenset(scope)
        self.scope_keys = frozenset(s.rsplit(".", 2)[0] for s in scope)
        self.api_list = api_list
        self.plain = tuple(e for e in api_list if not any(c.isdigit() for c in e))
        self.counted = tuple(e for e in api_list if any(c.isdigit() for c in e))
        self._cache: dict[str, bool | None] = {}
        if stage == "backward":  # never False: the hooks must see the passes they run and the FP8 casts
            self._cache.update(dict.fromkeys(PASS_ENTRIES | FP8_CASTS))  # of their matmuls (backward.py)

    def static(self, key: str) -> bool | None:
        """True/False when the decision is the same for every call of the API, None when the
        call counter matters."""
        if key in self._cache:
            return self._cache[key]
        if self.scope:
            decision: bool | None = None if key in self.scope_keys else False
        elif not self.api_list:
            decision = True
        elif any(e in key + "." or e in self.suffix for e in self.plain):
            decision = True
        else:
            decision = None if self.counted else False
        self._cache[key] = decision
        return decision

    def selects(self, key: str, name: str) -> bool:
        decision = self.static(key)
        if decision is not None:
            return decision
        if self.scope:
            return name in self.scope
        return any(e in name for e in self.counted)

    def unmatched(self, keys: list[str]) -> list[str]:
        """list/scope entries that can select no API of the catalog (typos)."""
        bad = []
        for e in self.api_list:
            probe = _CALL_INDEX.sub("", e.split(".forward")[0].split(".backward")[0])  # softsign.1 -> softsign
            if not any(e in k + "." or e in self.suffix or probe in k + "." or k.startswith(probe) for k in keys):
                bad.append(e)
        for s in self.scope:
            if s.rsplit(".", 2)[0] not in keys:
                bad.append(s)
        return bad


class FreeBenchmarkProbe:
    """State of one free_benchmark run: step, rank, counters, rows, statistics."""

    def __init__(
        self,
        config: ProbeConfig,
        backend: Any,
        call_exclusion: Callable[[Any, tuple, dict], str | None],
        framework: str,
    ) -> None:
        self.config = config
        self.fb = config.free_benchmark
        self.backend = backend
        self.call_exclusion = call_exclusion
        self.framework = framework
        self.perturbation = make_perturbation(self.fb.pert_mode, backend, self.fb.add_noise_style, self.fb.rule)
        self.selection = Selection(self.fb.scope, self.fb.api_list, self.fb.fuzz_stage)
        self.backward = BackwardCheck(self) if self.fb.fuzz_stage == "backward" else None
        self.dump_path = Path(config.dump_path)
        self.current_step = 0
        self.rank: int | None = None
        self.distributed = False
        self.running = False
        self.active = False
        self.finished = False
        self.counters: Counter[str] = Counter()
        self.stats: dict[str, ApiStats] = {}
        self.rows: list[FreeBenchmarkRow] = []
        self.rows_total = 0
        self._summary_rows: list[dict[str, Any]] = []
        self.preheat: Preheat | None = None
        self.preheat_note: str | None = None  # why a requested preheat is not applied
        self._cpu_reference: Perturbation | None = None
        self.preheat_rows_total = 0
        self._preheat_rows: list[dict[str, Any]] = []
        self._dirty = True
        self.skipped: Counter[tuple[str, str]] = Counter()
        self.errors: dict[tuple[str, str], dict[str, Any]] = {}
        self._writers: dict[int, CsvAppender] = {}
        self._logged: set[tuple[str, str]] = set()
        self.last_score = 0.0  # of the latest finished check (see _score)
        # checked calls' comparisons, settled together at step()/stop() (deferred.py); preheat
        # judges each call at once (its thresholds move with every sample)
        self.verdicts = VerdictQueue(backend)
        self._summary_written = False
        self._optimizer_steps = 0  # > 0 while an optimizer step runs (frameworks that can tell set it)
        self.graph_reports: dict[str, Any] = {}  # compiled graphs (probes/free_benchmark/graphs.py)

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

    # lifecycle -----------------------------------------------------------------------------
    def refresh(self) -> None:
        """Recompute whether calls are probed now (step and rank filters; a rank filter
        applies to rank 0 in a single process, where msprobe's PyTorch side disabled everything)."""
        if self.rank is None or not self.distributed:  # a process group may start after the probe
            self.rank = self.backend.rank()
            self.distributed = self.backend.is_distributed()
        steps = self.config.step
        if steps and self.current_step > max(steps):
            self.finished = True
        self.active = (
            self.running
            and not self.finished
            and self.config.selects_step(self.current_step)
            and self.config.selects_rank(self.rank)
        )

    def next_step(self) -> None:
        try:
            self.flush()  # settles the step's pending checks first: their rows belong to it
        finally:  # the step ends even when its flush failed (the caller records why)
            self._advance()

    def _advance(self) -> None:
        self.current_step += 1
        # steps_seen alone does not rewrite summary.json: it is brought up to date with the next
        # change, and at close (a step that checked nothing costs no file write)
        self.counters.clear()
        if self.backward is not None:
            self.backward.end_step()
        if self.preheat is not None:
            for api in self.preheat.end_step():
                learned = {d: s["threshold"] for d, s in self.preheat.describe(api)["dtypes"].items()}
                log.info("free_benchmark: preheat of %s ended after step %s; thresholds %s", api,
                         self.current_step, learned)
        self.refresh()

    # the per-call path -------------------------------------------------------------------------
    def on_call(self, meta: Any, original: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        if not self.active:
            return original(*args, **kwargs)
        key = meta.key
        backward = self.backward
        if backward is not None and backward.opened() and key not in FP8_CASTS and not backward.fp8_vjp(args, kwargs):
            return original(*args, **kwargs)  # a backward pass opened for its FP8 matmuls only (backward.py)
        if self._optimizer_steps:
            self._skip(key, exclusions.IN_OPTIMIZER_STEP)
            return original(*args, **kwargs)
        if meta.exclusion is not None:
            self._skip(key, meta.exclusion)
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
                self._error(key, f"{key} (FP8 range use)", exc)
            return out
        index = self.counters[key]
        self.counters[key] = index + 1
        why = self.call_exclusion(meta, args, kwargs)
        if why is not None:
            self._skip(key, why)
            return original(*args, **kwargs)
        if self.selection.static(key) is False:  # most calls of a listed run: no name to build
            return original(*args, **kwargs)
        name = f"{key}.{index}{self.selection.suffix}"
        if not self.selection.selects(key, name):
            return original(*args, **kwargs)
        stats = self.stats.get(key)
        if stats is None:
            stats = self.stats[key] = ApiStats()
        stats.calls += 1
        transformed = self.backend.in_transform()
        if transformed and (self.backward is not None or self.fb.handler_type == "fix"):
            self._skip(key, exclusions.TRANSFORM_BACKWARD if self.backward is not None else exclusions.TRANSFORM_FIX)
            return original(*args, **kwargs)
        local = self.backend.local_call(args, kwargs)
        if local is not None:
            why = (local if isinstance(local, str) else exclusions.DISTRIBUTED_GRAPH if meta.review is not None
                   else exclusions.DISTRIBUTED_BACKWARD if self.backward is not None
                   else exclusions.DISTRIBUTED_FIX if self.fb.handler_type == "fix" else None)
            if why is not None:
                self._skip(key, why)
                return original(*args, **kwargs)
        if backward is not None and not backward.fp8_vjp(args, kwargs):  # (an FP8 VJP matmul: judged below)
            why = self.backend.backward_reason(args, kwargs)
            if why is not None:
                self._skip(key, why)
                return original(*args, **kwargs)
            return self.backward.on_call(meta, name, stats, original, args, kwargs)
        sampled = False
        if self.preheat is not None:
            phase, sampled = self.preheat.on_call(key, self.current_step)
            if phase == CENSUS:  # the call census: counted, not compared (see preheat.py)
                self._skip(key, PREHEAT_CENSUS)
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
            if self.config.strict:
                raise ProbeError(f"free_benchmark failed on {name}: {exc}") from exc
            self._error(key, name, exc)
        return out

    def _check(self, call: Checked) -> None:
        b = self.backend
        meta, name, stats, original, args, kwargs, out, snapshot, sampled, local = call
        too_large = b.copies_too_large(args, kwargs, out)
        if too_large is not None:
            self._skip(meta.key, too_large)
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
            self._skip(meta.key, pert.reason)
            return
        rerun = fp8_reference or self.rerun_of(meta, original, pert.on_cpu)
        if isinstance(rerun, str):
            self._skip(meta.key, rerun)
            return
        if local is not None:  # a call DTensor redistributed is re-run through DTensor
            rerun = local.rerunner(rerun)
        after = b.rng_snapshot(None)
        b.rng_restore(snapshot)
        try:
            with b.no_grad():
                pert_out = rerun(*pert.args, **pert.kwargs)
        except NotMeasurable as exc:  # a reference that does not model this call (a layout of scales)
            self._skip(meta.key, str(exc))
            return
        except Exception as exc:
            why = None if local is None else local.rerun_failed(exc)
            if why is None:  # a re-run through DTensor that communicated is an error, never a skip
                raise
            self._skip(meta.key, why)
            return
        finally:
            b.rng_restore(after)
        if local is not None:
            why = local.mismatch(out, pert_out, same_dtype=self.fb.pert_mode not in REFERENCE_MODES)
            if why is not None:
                self._skip(meta.key, why)
                return
        if self.fb.handler_type == "fix":  # fix substitutes; it writes no rows (as the reference)
            self._fix(out, pert_out)
            stats.checked += 1
            stats.fixed += 1
            self._dirty = True
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
            self._skip(call.meta.key, seen)
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
        try:
            check = comparison(b, out, pert_out, pert_mode=self.fb.pert_mode, rule=self.fb.rule, input_move=move,
                               tolerance=th.BACKWARD_TOLERANCE if stage == "backward" else None, stage=stage,
                               pointwise=getattr(meta, "pointwise", False),
                               version=b.autodiff.version if deferred else None, exact=meta.review is not None)
            fp8_inputs = b.fp8_inputs(args, kwargs)
            if fp8_inputs:  # the range their casts used, judged beside the output (free_benchmark/fp8.py)
                check = with_range_use(check, fp8_inputs)
            if deferred:
                step, key = self.current_step, meta.key
                self.verdicts.add(check, lambda verdicts: self._record(key, name, stats, verdicts, step),
                                  lambda exc: self._settle_failed(key, name, exc), held_bytes(b, out, pert_out))
                return
            verdicts = drive(b, check)
            if meta.review is not None:
                verdicts = meta.review("forward", name, (args, kwargs), lambda: self._eager(meta, args, kwargs, snapshot),
                                       out, pert_out, verdicts)
        except StructureMismatch as exc:
            self._skip(meta.key, f"perturbed output has another structure ({exc})")
            return
        except NotMeasurable as exc:
            self._skip(meta.key, str(exc))
            return
        preheat_row = False
        if self.preheat is not None:
            if sampled:
                try:
                    self._preheat_sample(call, verdicts)
                except Exception as exc:  # no sample; the ratio verdicts still count
                    if self.config.strict:
                        raise
                    self._error(meta.key, f"{name} (preheat CPU reference)", exc)
            preheat_row = self.preheat.in_preheat(meta.key)
            verdicts = [self._preheat_judged(meta.key, v) for v in verdicts]
        self._record(meta.key, name, stats, verdicts, self.current_step, preheat=preheat_row)

    def _eager(self, meta: Any, args: tuple, kwargs: dict, snapshot: Any) -> Any:
        """A compiled graph's eager program on the call's own inputs (its eager kernels' result,
        for the review), with the random state of the call and without autograd."""
        b = self.backend
        after = b.rng_snapshot(None)
        b.rng_restore(snapshot)
        try:
            with b.no_grad():
                return meta.reference(*args, **kwargs)
        finally:
            b.rng_restore(after)

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
        after = b.rng_snapshot(None)
        b.rng_restore(snapshot)
        try:
            with b.no_grad():
                cpu_out = on_host(*cpu_call.args, **cpu_call.kwargs)
        finally:
            b.rng_restore(after)
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

    def _record(self, key: str, name: str, stats: ApiStats, verdicts: list[Any], step: int,
                preheat: bool = False) -> None:
        """Count a finished check and write a row per inconsistent leaf (both stages). Rows of a
        call judged during its API's preheat are kept out of the CSV and of `rows` (warm-up
        thresholds raise no alarm): summary.json counts them and lists the first ones."""
        stats.checked += 1
        self._dirty = True
        self.last_score = max((_score(v) for v in verdicts), default=0.0)
        if verdicts and not preheat and (stats.worst_score is None or self.last_score > stats.worst_score):
            stats.worst_score = self.last_score
        bad = [v for v in verdicts if not v.consistent]
        for v in verdicts:
            stats.dtypes.add(v.dtype_repr)
            if v.detail.get("rule") == "fp8_range":
                stats.fp8 = worst_range_use(stats.fp8, v.detail)
        if not bad:
            return
        if preheat:
            stats.preheat_flagged += 1
        else:
            stats.flagged += 1
        csv_path = self._csv_path(step)
        for v in bad:
            row = FreeBenchmarkRow(
                rank=self.rank or 0, pert_mode=self.fb.pert_mode, stage=self.fb.fuzz_stage, step=step,
                api_name=name, max_rel=v.max_rel, dtype=v.dtype_repr, shape=v.shape_repr,
                output_index=format_path(v.path), api=key, threshold=v.threshold, figure=v.figure,
                detail=dict(v.detail) if preheat else dict(v.detail, csv=str(csv_path)),
            )
            if preheat:
                self.preheat_rows_total += 1
                if len(self._preheat_rows) < SUMMARY_ROWS:
                    self._preheat_rows.append(dict(row.to_dict(), preheat=True))
                continue
            self._add_row(row)
            if v.figure > stats.worst_figure or stats.worst_max_rel is None:
                stats.worst_figure, stats.worst_max_rel, stats.threshold = v.figure, v.max_rel, v.threshold
        if preheat:
            return
        if stats.first_flagged is None:
            stats.first_flagged = name
            worst = stats.worst_max_rel
            if worst is None:  # to_cpu's single-benchmark rule has no max_rel: its own figures
                d = max(bad, key=lambda v: v.figure).detail
                shown = ", ".join(f"{k} {d[k]:.6g}" for k in ("rel_err", "abs_err", "error_balance")
                                  if isinstance(d.get(k), float))
                log.warning("free_benchmark: %s is inconsistent under %s: %s (rtol %s; rows in %s)",
                            name, self.fb.pert_mode, shown, stats.threshold, csv_path)
                return
            shown = f"{worst:.6g}" if isinstance(worst, float) else worst
            figure = "scaled error" if self.fb.rule == "scaled" else "max_rel"  # what the threshold bounds
            log.warning(
                "free_benchmark: %s is inconsistent under %s: %s %s > threshold %s (rows in %s)",
                name, self.fb.pert_mode, figure, shown, stats.threshold, csv_path,
            )

    def _fix(self, out: Any, pert_out: Any) -> None:
        """Substitute the upcast result in the user's output tensors (their autograd graph is
        kept). Every replacement is computed before any is assigned, so a failure leaves the
        output whole (msprobe's fix left it half-modified)."""
        b = self.backend
        pairs = []
        pert_leaves = dict(iter_leaves(pert_out))
        for path, leaf in iter_leaves(out):
            new = pert_leaves.get(path)
            if b.is_tensor(leaf) and b.is_float(leaf) and b.is_tensor(new):
                if b.shape(new) != b.shape(leaf):
                    raise StructureMismatch(f"fix: output {path} has shape {b.shape(new)}, expected {b.shape(leaf)}")
                pairs.append((leaf, b.cast_like(new, leaf)))
        for leaf, new in pairs:
            b.replace_data(leaf, new)

    # bookkeeping -------------------------------------------------------------------------------
    def _cancelled_by_framework(self, key: str, name: str, exc: BaseException) -> bool:
        """True when `exc` means the framework cannot run this check (recorded as a skip)."""
        return False

    def optimizer_step(self, entering: bool | None) -> None:
        """An optimizer step begins (True) or ends (False); None: the hooks are going away, so a
        step that raised (its end never reported) is closed too. Its calls are not checked
        (exclusions.IN_OPTIMIZER_STEP)."""
        if entering is None:
            self._optimizer_steps = 0
        else:
            self._optimizer_steps = self._optimizer_steps + 1 if entering else max(0, self._optimizer_steps - 1)

    def settle(self) -> None:
        """Finish the pending checks (their rows and counts): one host transfer for all of them.
        Hooks pass straight through meanwhile (the measure's own operators are not API calls)."""
        if len(self.verdicts):
            with suspended(), self.backend.outside_transforms():
                self.verdicts.settle()

    def _settle_failed(self, key: str, name: str, exc: BaseException) -> None:
        """A deferred check that could not finish: skipped when its output changed meanwhile,
        else an error (raised in strict mode, as a check at the call would be)."""
        if isinstance(exc, OutputModified):
            self._skip(key, str(exc))
        elif self.config.strict:
            raise ProbeError(f"free_benchmark failed on {name}: {exc}") from exc
        else:
            self._error(key, name, exc)

    def _skip(self, key: str, reason: str, count: int = 1) -> None:
        self.skipped[(key, reason)] += count
        self._dirty = True
        if (key, reason) not in self._logged:
            self._logged.add((key, reason))
            log.info("free_benchmark: %s is not checked: %s", key, reason)

    def _error(self, key: str, name: str, exc: BaseException) -> None:
        self._dirty = True
        entry = self.errors.get((key, type(exc).__name__))
        if entry is None:
            self.errors[(key, type(exc).__name__)] = {"api": key, "first_call": name, "error": f"{type(exc).__name__}: {exc}", "count": 1}
            log.warning("free_benchmark: could not check %s (%s: %s); the call itself went on unchanged",
                        name, type(exc).__name__, exc)
        else:
            entry["count"] += 1

    def _csv_path(self, step: int) -> Path:
        return self.dump_path / f"step{step}" / f"rank{self.rank or 0}" / CSV_NAME

    def _add_row(self, row: FreeBenchmarkRow) -> None:
        self.rows_total += 1
        self._dirty = True
        if len(self.rows) < ROWS_KEPT:
            self.rows.append(row)
        if len(self._summary_rows) < SUMMARY_ROWS:
            self._summary_rows.append(row.to_dict())
        writer = self._writers.get(row.step)
        if writer is None:
            writer = self._writers[row.step] = CsvAppender(self._csv_path(row.step), FREE_BENCHMARK_COLUMNS)
        writer.add(row.csv_values())

    @property
    def summary_path(self) -> Path:
        name = f"summary_rank{self.rank or 0}.json" if self.distributed else "summary.json"
        return self.dump_path / name

    def flush(self) -> None:
        """Settle the pending checks, append their rows and rewrite summary.json when something
        in it changed (called at stop, per step and at exit). On the training thread, on
        purpose: a step's files are on disk when stop() returns, which scripts and tests rely
        on; what it costs is kept small (rows are appended, summary.json only when changed)."""
        self.settle()
        for writer in self._writers.values():
            writer.flush()
        if self.rank is not None and (self._dirty or not self._summary_written):
            write_json_atomic(self.summary_path, self.summary())
            self._dirty = False
            self._summary_written = True

    def summary(self) -> dict[str, Any]:
        self.settle()
        by_reason: dict[str, dict[str, int]] = {}
        for (key, reason), n in sorted(self.skipped.items()):
            by_reason.setdefault(reason, {})[key] = n
        apis = {k: s.to_dict() for k, s in sorted(self.stats.items())}
        if self.preheat is not None:
            for k, entry in apis.items():
                entry["preheat"] = self.preheat.describe(k)
        summary = {
            "tool": "free_benchmark",
            "framework": self.framework,
            "rank": self.rank or 0,
            "config": self.config.to_dict(),
            "steps_seen": self.current_step + 1,
            "apis": apis,
            "flagged": list(self._summary_rows),
            "rows_total": self.rows_total,
            "not_checked": by_reason,
            "errors": [dict(e) for e in self.errors.values()],
            "csv_files": sorted(str(w.path) for w in self._writers.values() if w.written or w.pending),
        }
        if self.graph_reports:
            summary["graphs"] = [r.to_dict() for _name, r in sorted(self.graph_reports.items())]
        if self.preheat is not None or self.preheat_note is not None:
            summary["preheat"] = {
                "applied": self.preheat is not None, "note": self.preheat_note,
                "preheat_step": self.fb.preheat_step, "max_sample": self.fb.max_sample,
                "rows_total": self.preheat_rows_total, "rows": list(self._preheat_rows),
            }
        return summary


# a finite stand-in for "infinitely far over the threshold" (flips, NaN mismatches, no_change)
SCORE_CAP = 1e6


def _score(v: Any) -> float:
    """How far a leaf's figure is from its threshold: 1 at the threshold, above 1 inconsistent
    (the per-API tests feed it to Hypothesis' targeted search, which then climbs towards the
    inputs where an API is worst)."""
    if not math.isfinite(v.figure):
        return SCORE_CAP
    if "ratio" in v.detail or v.detail.get("rule") == "scaled":
        excess = v.figure - 1.0
        if v.threshold <= 0.0:
            return 0.0 if excess <= 0.0 else SCORE_CAP
        return min(max(excess, 0.0) / v.threshold, SCORE_CAP)
    return min(v.figure, SCORE_CAP)


def _cloner(backend: Any) -> Callable[[Any], Any]:
    def clone(x: Any) -> Any:
        return backend.clone(x) if backend.is_tensor(x) else x

    return clone
