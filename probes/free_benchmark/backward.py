"""free_benchmark's backward stage, written once for every framework.

msprobe 8.3.3 compared a tensor's accumulated gradient with stale recomputations through hooks it
never removed, kept host copies of records whose backward never ran, and on MindSpore used ones as
the cotangent; this module fixes all of that, as described below.

At a selected call: run the original (its output object is returned unchanged), keep the inputs
(on their device, detached, shared storage) and ask the backend's autodiff for a one-shot callback
that receives the real cotangents of the call's outputs during the user's backward pass. There,
with hooks suspended and the forward's random state replayed:

    g_orig = vjp(original at the saved inputs,     real cotangent)
    g_pert = vjp(original at the perturbed inputs, real cotangent)

and the two are compared leaf by leaf with the ratio rule at the backward clamp floor (1e-3),
one row per inconsistent gradient, `output_index` = its position among the differentiable inputs.
Both sides are recomputed from the same call with the same cotangent, so a gradient accumulated
over several consumers or a stale recomputation of another step is never compared.

FP8 matmuls are differentiated differently: torchao runs them inside its own autograd Function,
whose forward calls them unrecorded (no graph to hook) and whose backward computes the gradients
with FP8 matmuls of its own, on the gradient cast to e5m2. Those backward-pass calls are the
matmul's vector-Jacobian product, so the stage judges each as a call (`fp8_vjp`): the re-run
the mode builds (improve_precision: the float64 product of its own dequantised operands, the
e5m2 gradient included; the noise modes: an operand moved in its FP8 grid) against its output,
under the backward stage's limits. The e5m2 cast's own error is the recipe's, not the kernel's:
it is reported as that input's cast error and range use, beside the verdict. The pass that
`Tensor.backward` (a hooked API) runs is opened to the hooks for these calls alone
(`resumed_pass`); every other call in it passes through as a nested call.

Nothing outlives the graph or the step: the callback and what it keeps belong to hooks inside the
outputs' autograd graph (they die with it when backward never runs), the callback drops its
inputs when it fires, and at the end of each step every call still waiting is released and its
hooks removed. The only record of waiting calls is a weak set.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from probes.backends.patching import resumed, suspended
from probes.core import thresholds as th
from probes.core.leaf_verdicts import StructureMismatch, drive
from probes.core.trees import iter_leaves, replace_at, tree_map
from probes.free_benchmark.compare import comparison
from probes.free_benchmark.deferred import held_bytes
from probes.free_benchmark.perturbations import Cancelled
from probes.free_benchmark.replay import replay

NOT_RECORDED = "its backward is not recorded (gradient recording is off, e.g. no_grad or inference)"
NO_GRAD_INPUT = "no floating-point input requires a gradient"
NO_GRAD_OUTPUT = "no floating-point output carries a gradient"
RETURNS_INPUT = "returns one of its inputs: its gradient is not this call's own"
MODIFIED = "an input was modified in place before the backward pass: its gradient cannot be recomputed"
LATE = "its backward ran after the step of the forward call had ended"
NO_BACKWARD = "no backward pass reached its outputs before the step ended"
# the hooked APIs that run a backward pass (their original runs as the hooked call's nested code)
PASS_ENTRIES = frozenset({"Tensor.backward"})


def _get(args: tuple, kwargs: dict, where: str, path: tuple) -> Any:
    node: Any = args if where == "args" else kwargs
    for p in path:
        node = node[p]
    return node


def _put(args: tuple, kwargs: dict, where: str, path: tuple, value: Any) -> tuple[tuple, dict]:
    if where == "args":
        return replace_at(args, path, value), kwargs
    return args, replace_at(kwargs, path, value)


class _Call:
    """What one selected call keeps until its backward: saved inputs, where the differentiable
    inputs and outputs are, the random state and autocast context of the forward."""

    __slots__ = ("key", "name", "step", "stats", "original", "on_host", "rerun", "args", "kwargs", "mutates", "grad_at",
                 "out_paths", "versions", "rng", "context", "hooks", "check", "review", "__weakref__")

    def release(self, unhook: bool = False) -> None:
        """Drop the inputs and the callback; `unhook` also unregisters the hooks (only outside a
        backward pass). Idempotent."""
        hooks, self.hooks = self.hooks() if self.hooks is not None else None, None
        self.args = self.kwargs = self.rng = self.context = self.original = self.on_host = self.check = None
        self.rerun = self.review = None
        if hooks is not None and unhook:
            hooks.release()
        elif hooks is not None:
            hooks.remove()


class BackwardCheck:
    """The backward stage of one FreeBenchmarkProbe (what it finds goes to the probe's ledger)."""

    def __init__(self, probe: Any) -> None:
        self.probe = probe
        self.backend = probe.backend
        self.autodiff = probe.backend.autodiff
        self.waiting: weakref.WeakSet[_Call] = weakref.WeakSet()
        # calls of the step whose hooks were attached, and whose backward ran: the difference is
        # counted under NO_BACKWARD at the step's end (a call whose graph was freed unused too)
        self.attached: Counter[str] = Counter()
        self.fired: Counter[str] = Counter()
        self._opened = threading.local()  # passes opened to the hooks on this thread (resumed_pass)

    # FP8 matmuls of a backward pass (module docstring) -------------------------------------------
    @contextlib.contextmanager
    def resumed_pass(self) -> Iterator[None]:
        """Run a hooked backward entry's pass with the hooks let through for its FP8 matmuls."""
        opened = self._opened
        opened.depth = getattr(opened, "depth", 0) + 1
        try:
            with resumed():
                yield
        finally:
            opened.depth -= 1

    def opened(self) -> bool:
        """True in a pass `resumed_pass` opened on this thread: calls other than FP8 matmuls (and
        the casts whose range use they report) pass through as the nested calls they are."""
        return getattr(self._opened, "depth", 0) > 0

    def fp8_vjp(self, args: tuple, kwargs: dict) -> bool:
        """A call that a backward pass makes, unrecorded, on FP8 inputs: a kernel of an FP8
        matmul's vector-Jacobian product, judged as a call."""
        ad, b = self.autodiff, self.backend
        in_pass = getattr(ad, "in_backward_pass", None)
        if in_pass is None or not in_pass() or ad.recording():
            return False
        return any(b.is_tensor(x) and (b.is_scaled_fp8(x) or b.dtype_name(x) in th.FLOAT8_DTYPES)
                   for _path, x in iter_leaves((args, kwargs)))

    # forward side ------------------------------------------------------------------------------
    def on_call(self, meta: Any, name: str, stats: Any, original: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        probe, b, ad = self.probe, self.backend, self.autodiff
        if not ad.recording():
            probe.ledger.skip(meta.key, NOT_RECORDED)
            return original(*args, **kwargs)
        grad_at = [(where, path) for where, path, leaf in _float_inputs(b, args, kwargs) if ad.requires_grad(leaf)]
        if not grad_at:
            probe.ledger.skip(meta.key, NO_GRAD_INPUT)
            return original(*args, **kwargs)
        try:
            call = self._save(meta, name, stats, original, args, kwargs, grad_at)
        except Exception as exc:
            self.probe.failed(meta.key, name, exc)
            return original(*args, **kwargs)
        out = original(*args, **kwargs)
        try:
            self._attach(call, out, args, kwargs)
        except Exception as exc:
            call.release(unhook=True)
            self.probe.failed(meta.key, name, exc)
        return out

    def _save(self, meta: Any, name: str, stats: Any, original: Callable[..., Any], args: tuple, kwargs: dict,
              grad_at: list[tuple[str, tuple]]) -> _Call:
        b, ad = self.backend, self.autodiff
        copy = bool(meta.mutates_inputs)

        def keep(x: Any) -> Any:
            return ad.save_input(x, copy) if b.is_tensor(x) else x

        call = _Call()
        call.key, call.name, call.step, call.stats = meta.key, name, self.probe.current_step, stats
        call.original, call.mutates, call.grad_at = original, copy, grad_at
        call.review = (meta.review, meta.reference) if meta.review is not None else None
        call.on_host = self.probe.rerun_of(meta, original, True)
        call.rerun = self.probe.rerun_of(meta, original, False)
        call.args, call.kwargs = tree_map(keep, args), tree_map(keep, kwargs)
        call.versions = None if copy else [
            (where, path, ad.version(leaf)) for where, path, leaf in _tensor_inputs(b, args, kwargs)
        ]
        call.rng = b.rng_snapshot(args)
        call.context = ad.forward_context()
        call.hooks = None
        call.check = self._check
        return call

    def _attach(self, call: _Call, out: Any, args: tuple, kwargs: dict) -> None:
        b, ad, probe = self.backend, self.autodiff, self.probe
        inputs = {id(leaf) for _p, leaf in iter_leaves((args, kwargs)) if b.is_tensor(leaf)}
        paths, outs = [], []
        for path, leaf in iter_leaves(out):
            if b.is_tensor(leaf) and b.is_float(leaf) and ad.requires_grad(leaf):
                if id(leaf) in inputs:
                    call.release()
                    probe.ledger.skip(call.key, RETURNS_INPUT)
                    return
                paths.append(path)
                outs.append(leaf)
        if not outs:
            call.release()
            probe.ledger.skip(call.key, NO_GRAD_OUTPUT)
            return
        call.out_paths = paths
        # ownership runs one way: graph -> hooks -> _Fire -> call, and the call sees its hooks
        # through a weak reference, so no cycle keeps the inputs alive once the graph is gone
        call.hooks = weakref.ref(ad.on_backward(outs, _Fire(call)))
        self.waiting.add(call)
        self.attached[call.key] += 1

    def end_step(self) -> None:
        """Release every call of the ending step whose backward has not run (its hooks too)."""
        for call in list(self.waiting):
            call.release(unhook=True)
        self.waiting.clear()
        for key, n in self.attached.items():
            if n > self.fired[key]:
                self.probe.ledger.skip(key, NO_BACKWARD, n - self.fired[key])
        self.attached.clear()
        self.fired.clear()

    # backward side -----------------------------------------------------------------------------
    def _check(self, call: _Call, cotangents: list[Any]) -> None:
        probe, b = self.probe, self.backend
        if call.step != probe.current_step:
            probe.ledger.skip(call.key, LATE)
            return
        if call.versions is not None:
            for where, path, v in call.versions:
                if v is not None and self.autodiff.version(_get(call.args, call.kwargs, where, path)) != v:
                    probe.ledger.skip(call.key, MODIFIED)
                    return
        pert = probe.perturbation.build(call.args, call.kwargs)
        if isinstance(pert, Cancelled):
            probe.ledger.skip(call.key, pert.reason)
            return
        rerun = call.on_host if pert.on_cpu else call.rerun
        if isinstance(rerun, str):
            probe.ledger.skip(call.key, rerun)
            return
        # the perturbed (e.g. float32) inputs are built again after the original VJP, so they and
        # the original recomputation's graph are never alive together (peak memory)
        pert = None
        recompute = self.autodiff.recompute
        g_orig = replay(b, call.rng, self._vjp, (call, call.args, call.kwargs, cotangents), {},
                        recompute(call.context))
        pert = probe.perturbation.build(call.args, call.kwargs)
        g_pert = replay(b, call.rng, self._vjp, (call, pert.args, pert.kwargs, cotangents, rerun), {},
                        recompute(call.context))
        move = probe.input_move(pert)
        pert = None  # free the perturbed inputs before comparing
        pairs = [(i, g, h) for i, (g, h) in enumerate(zip(g_orig, g_pert)) if g is not None or h is not None]
        if any(g is None or h is None for _i, g, h in pairs):
            probe.ledger.skip(call.key, "the perturbed and the original call do not reach the same inputs")
            return
        original = {i: g for i, g, _h in pairs}
        perturbed = {i: h for i, _g, h in pairs}
        key, name, stats, step, ledger = call.key, call.name, call.stats, call.step, probe.ledger
        try:
            check = comparison(b, original, perturbed, pert_mode=probe.fb.pert_mode, tolerance=th.BACKWARD_TOLERANCE,
                               rule=probe.fb.rule, input_move=move, stage="backward", exact=call.review is not None)
            if call.review is not None:  # a compiled graph: judged now, with its eager kernels' gradients
                review, reference = call.review
                verdicts = review("backward", name, (call.args, call.kwargs),
                                  lambda: self._eager_vjp(call, reference, cotangents), original, perturbed,
                                  drive(b, check))
                ledger.record(key, name, stats, verdicts, step)
                return
            # settled with the step's other checks (deferred.py); the gradients are private to
            # the check, so a later pass reads them as they were
            probe.verdicts.add(check, lambda verdicts: ledger.record(key, name, stats, verdicts, step),
                               lambda exc: ledger.check_failed(key, name, exc), held_bytes(b, original, perturbed))
        except StructureMismatch as exc:
            probe.ledger.skip(call.key, f"perturbed gradients have another structure ({exc})")

    def _eager_vjp(self, call: _Call, reference: Callable[..., Any], cotangents: list[Any]) -> dict[int, Any]:
        """The gradients of a compiled graph's eager program at the saved inputs (its eager
        kernels' result, for the review), numbered as the compared ones."""
        grads = replay(self.backend, call.rng, self._vjp, (call, call.args, call.kwargs, cotangents, reference), {},
                       self.autodiff.recompute(call.context))
        return {i: g for i, g in enumerate(grads) if g is not None}

    def _vjp(self, call: _Call, args: tuple, kwargs: dict, cotangents: list[Any],
             original: Callable[..., Any] | None = None) -> list[Any]:
        b = self.backend
        if call.mutates:  # each recomputation mutates its own copies
            def fresh(x: Any) -> Any:
                return b.clone(x) if b.is_tensor(x) else x

            args, kwargs = tree_map(fresh, args), tree_map(fresh, kwargs)
        if kwargs.get("inplace"):
            kwargs = dict(kwargs, inplace=False)
        grad_at, out_paths = call.grad_at, call.out_paths
        original = call.original if original is None else original
        primals = [_get(args, kwargs, where, path) for where, path in grad_at]

        def fn(*xs: Any) -> list[Any]:
            a, k = args, kwargs
            for (where, path), x in zip(grad_at, xs):
                a, k = _put(a, k, where, path, x)
            out = original(*a, **k)
            leaves = dict(iter_leaves(out))
            return [leaves.get(p) for p in out_paths]

        return self.autodiff.vjp(fn, primals, cotangents)


class _Fire:
    """The one-shot callback handed to the backend: takes the call out of the waiting set,
    drops its inputs whatever happens, and never raises into the backward pass unless strict."""

    __slots__ = ("call",)

    def __init__(self, call: _Call) -> None:
        self.call = call

    def __call__(self, cotangents: list[Any]) -> None:
        call, self.call = self.call, None
        if call is None or call.check is None:
            return
        check = call.check
        driver = check.__self__
        driver.waiting.discard(call)
        driver.fired[call.key] += 1
        try:
            with suspended():  # the check's own tensor operations are not API calls of the model
                check(call, cotangents)
        except Exception as exc:
            driver.probe.failed(call.key, call.name, exc)
        finally:
            call.release()


def _float_inputs(backend: Any, args: tuple, kwargs: dict) -> Iterator[tuple[str, tuple, Any]]:
    for where, tree in (("args", args), ("kwargs", kwargs)):
        for path, leaf in iter_leaves(tree):
            if backend.is_tensor(leaf) and backend.is_float(leaf):
                yield where, path, leaf


def _tensor_inputs(backend: Any, args: tuple, kwargs: dict) -> Iterator[tuple[str, tuple, Any]]:
    for where, tree in (("args", args), ("kwargs", kwargs)):
        for path, leaf in iter_leaves(tree):
            if backend.is_tensor(leaf):
                yield where, path, leaf
