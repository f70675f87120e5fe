"""The usual checked call, handled without the general path's questions.

Most checked calls of a training step are alike: a plain call (plain tensors and scalar-like values,
outside any tracer, dispatch mode and torch.func transform: the backend's `usual_call`) of an API
that is neither excluded, nor compiled, nor mutating its inputs, nor called with out= or
inplace=True, in a run that checks the forward stage without preheat. For such a call the general
path (call_path.CallPath.on_call and _check) asks some two dozen questions whose answers are then
known: is it a DTensor call, under a transform, in a backward pass, a preheat sample, an FP8 call,
a fix. Each question is cheap, but together they cost about 10 us of the training thread's time a
checked call (a no_change check of a tiny linear: 62 us over the call itself, 51-55 us here). Most
of it is in the check's body: this handler calling the general _check still took 64 us.

This handler asks what the usual call needs and nothing more: the same counters, names, exclusions,
random-state replay, re-run, verdict at the call and ledger record as the general path, in the
same order. Every other call, and every check whose verdict is not known at the call (an output
that needs the full comparison), goes to the general path, which writes the same rows; a test runs
a corpus of calls through both and compares the files byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from probes.backends.patching import call_exclusion
from probes.core.errors import NotMeasurable
from probes.free_benchmark.compare import at_once
from probes.free_benchmark.ledger import ApiStats
from probes.free_benchmark.perturbations import Cancelled
from probes.free_benchmark.replay import perturbed_replay
from probes.free_benchmark.selection import FP8_CASTS

Handler = Callable[[Any, Callable[..., Any], tuple, dict], Any]


def usual_handler(path: Any) -> Handler:
    """The call handler to install for the run of `path` (a CallPath): its general `on_call`, or,
    when the run's configuration leaves only the usual check to make, one that takes the usual
    calls itself and hands it the others. It is made at every start: what stays the same for
    the run (the ledger, the counters, the selection) is read once here, not on every call."""
    fb = path.fb
    backend = path.backend
    usual = getattr(backend, "usual_call", None)
    general: Handler = path.on_call
    if (usual is None or fb.handler_type != "check" or fb.fuzz_stage != "forward" or path.preheat is not None
            or not path._at_once):
        return general
    static = path.selection.static
    suffix = path.selection.suffix
    counters = path.counters
    ledger = path.ledger
    by_api = ledger.stats
    skip = ledger.skip
    rng_snapshot = backend.rng_snapshot

    def on_call(meta: Any, original: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        if not path.active:
            return original(*args, **kwargs)  # (as the general path does first)
        key = meta.key
        if path._optimizer_steps:  # counted, as the general path counts them (hundreds a step)
            calls = path._optimizer_calls
            calls[key] = calls.get(key, 0) + 1
            return original(*args, **kwargs)
        why = meta.exclusion
        if why is not None and key not in FP8_CASTS:  # an excluded API: the general path's skip
            skip(key, why)
            return original(*args, **kwargs)
        if (why is not None or meta.review is not None or meta.mutates_inputs
                or ((kwargs or meta.inplace_pos is not None) and call_exclusion(meta, args, kwargs) is not None)
                or not usual(args, kwargs) or static(key) is not True):
            return general(meta, original, args, kwargs)
        index = counters[key]
        counters[key] = index + 1
        name = f"{key}.{index}{suffix}"
        stats = by_api.get(key)
        if stats is None:
            stats = by_api[key] = ApiStats()
        stats.calls += 1
        snapshot = rng_snapshot(args)
        out = original(*args, **kwargs)
        try:
            _check(path, meta, name, stats, original, args, kwargs, out, snapshot)
        except Exception as exc:  # never let the probe break the user's model
            path.failed(key, name, exc)
        return out

    return on_call


def _check(path: Any, meta: Any, name: str, stats: ApiStats, original: Callable[..., Any], args: tuple,
           kwargs: dict, out: Any, snapshot: Any) -> None:
    """CallPath._check for the usual call: no DTensor, fix, compiled review or copies of mutated
    inputs to handle, and no transform to step outside of."""
    b, fb, ledger, key = path.backend, path.fb, path.ledger, meta.key
    too_large = b.copies_too_large(args, kwargs, out)
    if too_large is not None:
        ledger.skip(key, too_large)
        return
    pert_mode = fb.pert_mode
    if pert_mode == "improve_precision" and b.fp8_reference(meta.qualname, meta.prefix) is not None:
        return path._check(_checked(meta, name, stats, original, args, kwargs, out, snapshot))
    pert = path.perturbation.build_usual(args, kwargs)
    if isinstance(pert, Cancelled):
        ledger.skip(key, pert.reason)
        return
    rerun = original if meta.reference is None and not pert.on_cpu else path.rerun_of(meta, original, pert.on_cpu)
    if isinstance(rerun, str):
        ledger.skip(key, rerun)
        return
    try:
        pert_out = perturbed_replay(b, snapshot, rerun, pert.args, pert.kwargs, args, kwargs, pert_mode)
    except NotMeasurable as exc:
        ledger.skip(key, str(exc))
        return
    move = None if fb.rule != "scaled" else path.input_move(pert)  # (the reference rule measures no move)
    pert = None  # free the perturbed inputs before comparing
    verdicts = at_once(b, out, pert_out, pert_mode=pert_mode, rule=fb.rule, tolerance=None, stage="forward",
                       input_move=move, pointwise=meta.pointwise)
    if verdicts is None:  # the full comparison, deferred as the general path defers it
        path._judge(_checked(meta, name, stats, original, args, kwargs, out, snapshot), args, kwargs, pert_out, move)
        return
    path.verdicts.add_recorded(ledger, key, name, stats, verdicts, path.current_step)


def _checked(meta: Any, name: str, stats: ApiStats, original: Callable[..., Any], args: tuple, kwargs: dict,
             out: Any, snapshot: Any) -> Any:
    from probes.free_benchmark.call_path import Checked

    return Checked(meta, name, stats, original, args, kwargs, out, snapshot, False)
