"""The PyTorch APIs free_benchmark can hook, and the wrapping that hooks them.

Families and name prefixes follow the reference (msprobe 8.3.3): `torch` and its submodules
linalg, fft, special, masked → Torch, `torch.Tensor` methods → Tensor, `torch.nn.functional` →
Functional, torch_npu → NPU. Names are qualified (`Torch.linalg.norm`, `Torch.masked.softmax`;
the reference used the last segment only, so `torch.linalg.norm` and `torch.norm` shared
`Torch.norm` and its counter). The catalog is built from the installed framework, so an API that
does not exist is simply absent. Wrapping replaces attributes at start and puts the very same
objects back at stop: after `uninstall()`, `torch.nn.functional.linear is torch._C._nn.linear`.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections import deque
from itertools import repeat
from typing import Any

import torch

from probes.backends import api_exclusions, patching, torch_dtensor, torch_leaves
from probes.backends.patching import (  # noqa: F401 - re-exported for the torch probe
    HANDLER,
    TLS,
    ApiMeta,
    ApiPatcher,
    inplace_position,
    is_op_callable,
    make_wrapper,
    set_compiling_check,
    suspended,
)

set_compiling_check(torch.compiler.is_compiling)  # Dynamo traces the original: compiled graphs are judged at the backend


def call_exclusion(meta: ApiMeta, args: tuple, kwargs: dict) -> str | None:
    """Why this call is not re-run: how it is called (out=, inplace=True), the state it runs in
    (a tracer, a user's dispatch mode) or its inputs (no values, an unknown tensor subclass)."""
    return patching.call_exclusion(meta, args, kwargs) or torch_leaves.call_reason(args, kwargs)

_ALLOWED_DUNDERS = {
    "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__matmul__", "__rmatmul__",
    "__truediv__", "__rtruediv__", "__div__", "__rdiv__", "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__",
    "__pow__", "__rpow__", "__neg__", "__pos__", "__abs__", "__and__", "__rand__", "__or__", "__ror__",
    "__xor__", "__rxor__", "__lshift__", "__rlshift__", "__rshift__", "__rrshift__", "__invert__",
    "__getitem__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__",
    # in-place dunders and item assignment: wrapped so that their exclusion is logged
    "__iadd__", "__isub__", "__imul__", "__imatmul__", "__itruediv__", "__idiv__", "__ifloordiv__", "__imod__",
    "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__", "__setitem__",
}
# Public torch namespaces whose functions are tensor math, hooked as `Torch.{sub}.{name}`.
# torch.masked: masked reductions and normalisations (softmax, log_softmax, normalize, sum,
# mean, var, std, norm, logsumexp, ...) computed in their own Python code, not through the
# hooked torch.* names (an inner call is not hooked anyway: outermost only). Deliberately not
# hooked: torch.sparse (sparse layouts in and out, which the dense perturbations and chunked
# comparisons do not handle), torch.nested (constructors and views), torch.signal.windows
# (factories without tensor inputs: nothing to perturb), torch.nn.init (in-place and random),
# torch.func/torch.autograd.functional (transforms of callables, whose inner calls are hooked),
# torch.distributions (classes over the hooked ops) and torch.nn.attention.flex_attention (a
# higher-order op meant for torch.compile, whose eager path is a debugging fallback).
_TORCH_SUBMODULES = ("linalg", "fft", "special", "masked")
# APIs that update some of their inputs as a side effect although their names do not end in "_":
# their re-run gets copies of every tensor argument.
_MUTATES_INPUTS = {"batch_norm", "instance_norm", "native_batch_norm", "embedding", "group_norm_stats"}


def _module_entries(module: Any, prefix: str, qual_prefix: str, names: list[str]) -> list[ApiMeta]:
    metas = []
    for name in names:
        value = module.__dict__.get(name)
        if value is None or not is_op_callable(value):
            continue
        mod = getattr(value, "__module__", "") or ""
        if mod.startswith(("typing", "torch.overrides", "torch._jit_internal")) or name.startswith("has_torch_function"):
            continue
        metas.append(_meta(prefix, qual_prefix + name, module, name, value, value, True))
    return metas


def _meta(prefix: str, qual: str, owner: Any, attr: str, value: Any, own_value: Any, had_own: bool) -> ApiMeta:
    return patching.catalog_meta(prefix, qual, owner, attr, value, own_value, had_own, _classify)


# Python operators and the aten op each computes
_DUNDER_OPS = {"add": "add", "radd": "add", "sub": "sub", "rsub": "sub", "mul": "mul", "rmul": "mul",
               "truediv": "div", "rtruediv": "div", "div": "div", "rdiv": "div", "pow": "pow", "rpow": "pow",
               "neg": "neg", "pos": "positive", "abs": "abs", "floordiv": "floor_divide",
               "rfloordiv": "floor_divide", "mod": "remainder", "rmod": "remainder"}


# Pointwise ops whose kernel adds rounded terms (a + w * (b - a)): an output near zero is the
# cancellation of larger terms, so its error is judged at the row's scale, not its own (a clean
# fp32 lerp is within half an ulp of its inputs' magnitude, yet thousands of its own ulps off)
_CANCELLING_POINTWISE = frozenset({"lerp", "addcmul", "addcdiv"})


@functools.cache  # aten's tags never change in a process; the catalog is rebuilt per probe
def _is_pointwise(name: str) -> bool:
    """Whether the aten op of this name carries aten's pointwise tag on its tensor overload."""
    if name.startswith("__") and name.endswith("__"):
        name = _DUNDER_OPS.get(name[2:-2], "")
    packet = getattr(torch.ops.aten, name, None) if name else None
    if packet is None or not hasattr(packet, "overloads"):
        return False
    pointwise = getattr(torch, "Tag", None) and torch.Tag.pointwise
    try:
        return any((o == "default" or o.startswith("Tensor")) and pointwise in getattr(packet, o).tags
                   for o in packet.overloads())
    except Exception:  # an op packet that cannot list its overloads: judge it as a whole tensor
        return False


def _classify(meta: ApiMeta) -> None:
    meta.exclusion = api_exclusions.exclusion_reason(meta.qualname)
    name = meta.qualname.rsplit(".", 1)[-1]
    meta.mutates_inputs = name in _MUTATES_INPUTS
    if meta.exclusion is None and "." not in meta.qualname:  # torch.special.x / linalg.x: not aten names
        meta.pointwise = _is_pointwise(name) and name not in _CANCELLING_POINTWISE
    if meta.prefix == "Functional":
        meta.inplace_pos = inplace_position(meta.original)


# private torch functions that are a user's math all the same: the FP8 matmul, called directly by
# FP8 training code (torchao calls it inside its subclass's dispatch, where it is not hooked)
_PRIVATE_MATH = ("_scaled_mm",)


def _torch_names() -> list[str]:
    names = {n for n in dir(torch._C._VariableFunctions) if not n.startswith("_")}
    names.update(n for n in getattr(torch.functional, "__all__", []) if not n.startswith("_"))
    names.update(_PRIVATE_MATH)
    return sorted(n for n in names if n in torch.__dict__)


def _public(module: Any) -> list[str]:
    return sorted(n for n in module.__dict__ if not n.startswith("_"))


def _tensor_entries() -> list[ApiMeta]:
    cls = torch.Tensor
    metas = []
    for name in sorted(dir(cls)):
        if name.startswith("_") and name not in _ALLOWED_DUNDERS:
            continue
        static = inspect.getattr_static(cls, name)
        if isinstance(static, (property, staticmethod, classmethod)) or type(static).__name__ in (
            "getset_descriptor", "member_descriptor", "classmethod_descriptor",
        ):
            continue
        value = getattr(cls, name)
        if not is_op_callable(value):
            continue
        metas.append(_meta("Tensor", name, cls, name, value, cls.__dict__.get(name), name in cls.__dict__))
    return metas


def build_catalog() -> tuple[ApiMeta, ...]:
    """Every hookable API of the installed torch (and torch_npu when it imports), read afresh so
    that attributes other libraries patched after import are the ones wrapped and restored. The
    last catalog is handed out again while it is still what a fresh read would give: its owners
    hold as many names as then and every attribute still holds its object."""
    owners = _owners()
    signature = tuple((id(o), len(o.__dict__)) for o in owners)
    if _LAST and _LAST[0][0] == signature and all(_current(m) for m in _LAST[0][1]):
        return _LAST[0][1]
    metas = _read_catalog()
    _LAST[:] = [(signature, metas)]
    return metas


_LAST: list[tuple[tuple, tuple[ApiMeta, ...]]] = []  # the last catalog, with its owners' name counts


def _owners() -> tuple[Any, ...]:
    import torch.nn.functional as F

    subs = tuple(m for m in (getattr(torch, sub, None) for sub in _TORCH_SUBMODULES) if m is not None)
    npu = sys.modules.get("torch_npu")
    return (torch, *subs, F, torch.Tensor) + ((npu,) if npu is not None else ())


def _current(meta: ApiMeta) -> bool:
    """The attribute still holds the object the meta was read from (or our wrapper of it)."""
    own = meta.owner.__dict__
    return patching.holds(meta, getattr(meta.owner, meta.attr, None), own.get(meta.attr), meta.attr in own)


def _read_catalog() -> tuple[ApiMeta, ...]:
    import torch.nn.functional as F

    metas: list[ApiMeta] = []
    metas += _module_entries(torch, "Torch", "", _torch_names())
    for sub in _TORCH_SUBMODULES:
        mod = getattr(torch, sub, None)
        if mod is not None:
            metas += _module_entries(mod, "Torch", sub + ".", _public(mod))
    metas += _module_entries(F, "Functional", "", _public(F))
    metas += _tensor_entries()
    metas += _npu_entries()
    return tuple(metas)


def _npu_entries() -> list[ApiMeta]:
    """torch_npu's own operators. Not exercised on machines without an Ascend NPU: the import
    fails there and the family is simply absent."""
    try:
        import torch_npu  # type: ignore[import-not-found]
    except Exception:
        return []
    names = [n for n in _public(torch_npu) if n.startswith("npu_")]
    return _module_entries(torch_npu, "NPU", "", names)


def _dynamo_rules() -> dict | None:
    """Dynamo's table of torch objects it puts in the graph, if it was built (once per process,
    from the objects torch's names hold at that moment). Built while the wrappers are installed, it
    holds them instead of torch's functions, and every later compiled program would break its graph
    at torch.einsum and the like, long after the probe stopped: uninstall puts torch's functions
    back in it. The probe never builds it (that imports much of torch)."""
    if "torch._dynamo" not in sys.modules:
        return None
    from torch._dynamo import trace_rules

    cached = trace_rules.get_torch_obj_rule_map
    return cached() if cached.cache_info().currsize else None


class TorchApiPatcher(ApiPatcher):
    """ApiPatcher that also tells the probe when a torch.optim optimizer step runs (global step
    pre/post hooks, installed and removed with the wrappers): the probe leaves those calls out
    (probes.free_benchmark.exclusions.IN_OPTIMIZER_STEP). A step that raised never runs its post
    hook, so uninstall closes whatever is still open."""

    def __init__(self, metas: tuple[ApiMeta, ...], selects: Any = None, window: Any = None) -> None:
        super().__init__(metas, selects)
        self._window = window
        self._hooks: tuple[Any, ...] = ()
        self._originals: dict[int, Any] | None = None  # wrapper id -> torch's function (TorchScript's view)
        self._builtins: dict[int, Any] | None = None  # wrapper id -> the aten op TorchScript maps it to
        self._wrapped_originals: dict[Any, Any] | None = None  # wrapper -> torch's function (Dynamo's rules)
        self._rules_before: dict | None = None  # Dynamo's table as install found it

    def install(self, handler: Any) -> None:
        super().install(handler)
        self._rules_before = _dynamo_rules()  # a table built before holds torch's own functions: no sweep
        self._script_transparent()
        self._script_view(True)
        if self._window is None:
            return
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        window = self._window
        self._hooks = (register_optimizer_step_pre_hook(lambda *_: window.optimizer_step(True)),
                       register_optimizer_step_post_hook(lambda *_: window.optimizer_step(False)))

    def _script_view(self, on: bool) -> None:
        """TorchScript resolves a Python-level function (F.pad, F.max_pool2d) through Python
        hooks: it would compile the wrapper's source lookup with the wrapper's globals, or miss the
        function's boolean dispatch. While installed, those hooks are handed torch's own function."""
        from torch import _jit_internal
        from torch.jit import _recursive

        if not on:
            for owner, name, value in getattr(self, "_script_hooks", ()):
                setattr(owner, name, value)
            self._script_hooks = ()
            return
        if self._originals is None:  # the wrappers stay the same for the patcher's life: once
            self._originals = {id(m.wrapper): m.original for m in self.metas if m.wrapper is not None}
        originals = self._originals

        def seen_through(hook: Any) -> Any:
            def hooked(obj: Any, *rest: Any, **kw: Any) -> Any:
                return hook(originals.get(id(obj), obj), *rest, **kw)

            return hooked

        self._script_hooks = tuple((owner, name, getattr(owner, name)) for owner, name in (
            (_recursive, "try_compile_fn"), (_jit_internal, "_try_get_dispatched_fn")) if hasattr(owner, name))
        for owner, name, value in self._script_hooks:
            setattr(owner, name, seen_through(value))

    def _script_transparent(self) -> None:
        """TorchScript maps torch's builtin functions to their aten ops by identity: a function
        scripted while the wrappers are installed (by the user, or torch itself: forward-mode AD's
        decompositions are scripted on first use) finds the wrapper instead and fails to compile
        it. Each wrapper of a builtin is registered as that same op while it is installed."""
        from torch.jit import _builtins

        table = _builtins._get_builtin_table()
        if self._builtins is None:  # which wrappers stand for a builtin op: the same at every install
            self._builtins = {id(m.wrapper): op for m in self.metas
                              if m.wrapper is not None and (op := table.get(id(m.original))) is not None}
        builtins = self._builtins
        if builtins.keys().isdisjoint(table.keys()):  # the usual install (views: the smaller side is walked)
            self._scripted = builtins
            table.update(builtins)
            return
        self._scripted = {key: op for key, op in builtins.items() if key not in table}
        table.update(self._scripted)

    def uninstall(self) -> None:
        self._script_view(False)
        if getattr(self, "_scripted", None):
            from torch.jit import _builtins

            table = _builtins._get_builtin_table()
            deque(map(table.pop, self._scripted, repeat(None)), maxlen=0)  # the loop in C
            self._scripted = {}
        for hook in self._hooks:
            hook.remove()
        self._hooks = ()
        rules = _dynamo_rules()
        if rules and rules is not self._rules_before:  # built while the wrappers were
            # installed: keyed by them, not by torch's objects (the table, once built, never changes)
            originals = self._wrapped_originals
            if originals is None:
                originals = self._wrapped_originals = {m.wrapper: m.original for m in self.metas if m.wrapper is not None}
            for wrapper in originals.keys() & rules.keys():
                rules.setdefault(originals[wrapper], rules.pop(wrapper))
        if self._window is not None:
            self._window.optimizer_step(None)
        torch_dtensor.release()  # the watch inside DTensor's dispatcher, if a DTensor call installed it
        super().uninstall()

