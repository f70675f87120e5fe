"""Replacing framework attributes with hooked wrappers and putting them back (framework-free).

Shared by the PyTorch and MindSpore API catalogs: one ApiMeta per hookable attribute, one wrapper
per API that hands outermost calls (a per-thread depth counter) to the single active handler, and
an ApiPatcher that installs wrappers and restores the very same original objects.
"""

from __future__ import annotations

import functools
import inspect
import threading
import types
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from probes.backends import api_exclusions


@dataclass(eq=False)
class ApiMeta:
    """One hookable attribute and what the probe knows of it."""

    prefix: str  # Torch, Tensor, Functional, NPU
    qualname: str  # matmul, linalg.norm, __add__
    owner: Any  # module or class holding the attribute
    attr: str
    original: Callable[..., Any]
    own_value: Any = None  # what owner.__dict__ held (None when inherited)
    had_own: bool = True
    exclusion: str | None = None
    inplace_pos: int | None = None  # position of an `inplace` parameter, for F.relu(x, True)
    mutates_inputs: bool = False
    # each output element depends on the inputs' elements at its own position only (aten's
    # pointwise tag): improve_precision / to_cpu judge such an API element by element
    pointwise: bool = False
    wrapper: Callable[..., Any] | None = field(default=None, repr=False)
    # installed only to keep nested calls out (outermost-only) while the running probe never
    # selects this API: its wrapper calls the original straight away
    passthrough: bool = False
    # a compiled graph (probes/compiled): the eager program the precision-changing modes re-run
    # (the compiled function takes its compiled dtypes and device only), and a look at every
    # judged call before it is recorded (the eager kernels' error, the failing node)
    reference: Callable[..., Any] | None = field(default=None, repr=False)
    review: Callable[..., Any] | None = field(default=None, repr=False)

    @functools.cached_property
    def key(self) -> str:  # read on every hooked call: made once
        return f"{self.prefix}.{self.qualname}"


# The metas of earlier catalogs, by key. A probe's catalog is read afresh (a library may have
# patched an attribute since), but an attribute that still holds the object an earlier catalog
# saw gets that catalog's meta again: its classification and its wrapper are made once per
# process, not once per probe (a pytest session starts one probe per test).
_KNOWN: dict[str, ApiMeta] = {}


def catalog_meta(prefix: str, qual: str, owner: Any, attr: str, value: Any, own_value: Any, had_own: bool,
                 classify: Callable[[ApiMeta], None]) -> ApiMeta:
    """The meta of one hookable attribute: an earlier catalog's while the attribute holds the same
    object (or our wrapper of it, installed now), else a new one that `classify` fills in."""
    known = _KNOWN.get(f"{prefix}.{qual}")
    if known is not None and known.owner is owner and known.attr == attr and holds(known, value, own_value, had_own):
        return known
    meta = ApiMeta(prefix, qual, owner, attr, value, own_value=own_value, had_own=had_own)
    classify(meta)
    _KNOWN[meta.key] = meta
    return meta


def holds(meta: ApiMeta, value: Any, own_value: Any, had_own: bool) -> bool:
    """Whether an attribute that now reads `value` (`own_value` in its owner's own dictionary,
    `had_own` whether it is there) still holds the object `meta` was read from, or our wrapper of it."""
    wrapper = meta.wrapper
    return (had_own == meta.had_own
            and (value is meta.original or (wrapper is not None and value is wrapper))
            and (own_value is meta.own_value or (wrapper is not None and own_value is wrapper)))


def call_exclusion(meta: ApiMeta, args: tuple, kwargs: dict) -> str | None:
    """Exclusions that depend on how the API is called (out=, inplace=True)."""
    if kwargs:
        if kwargs.get("out") is not None:
            return api_exclusions.OUT_ARG
        if kwargs.get("inplace"):
            return api_exclusions.IN_PLACE
    pos = meta.inplace_pos
    if pos is not None and len(args) > pos and args[pos] is True:
        return api_exclusions.IN_PLACE
    return None


def inplace_position(fn: Any) -> int | None:
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None
    return params.index("inplace") if "inplace" in params else None


def is_op_callable(value: Any) -> bool:
    return callable(value) and not inspect.isclass(value) and not inspect.ismodule(value)


class _Depth(threading.local):
    depth = 0


TLS = _Depth()
# The one active call handler (a bound method of the running probe), or None.
HANDLER: list[Callable[..., Any] | None] = [None]
# Whether a compiler is tracing the calling code (torch.compiler.is_compiling for PyTorch). A
# wrapper then calls the original at once, with nothing a compiler cannot trace (no thread-local,
# no RNG state, no try): a compiled program gets the same graphs with the probe on as without it,
# and the probe judges compiled graphs at the compiler's backend instead.
_COMPILING: list[Callable[[], bool]] = [lambda: False]


def set_compiling_check(check: Callable[[], bool]) -> None:
    """Install the framework's "is a compiler tracing?" query (wrappers made afterwards use it)."""
    _COMPILING[0] = check


def make_wrapper(meta: ApiMeta) -> Callable[..., Any]:
    original = meta.original
    compiling = _COMPILING[0]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if compiling():
            return original(*args, **kwargs)
        handler = HANDLER[0]
        tls = TLS
        if handler is None or tls.depth:
            return original(*args, **kwargs)
        tls.depth = 1
        try:
            if meta.passthrough:
                return original(*args, **kwargs)
            return handler(meta, original, args, kwargs)
        finally:
            tls.depth = 0

    try:
        functools.update_wrapper(wrapper, original)
    except (AttributeError, TypeError):
        pass
    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    wrapper.__msprobe_meta__ = meta  # type: ignore[attr-defined]
    return wrapper


_C_CALLABLES = (types.BuiltinFunctionType, types.BuiltinMethodType, types.MethodDescriptorType,
                types.WrapperDescriptorType, types.MethodWrapperType, types.ClassMethodDescriptorType)


def _calls_python(fn: Any) -> bool:
    """Whether `fn` may run Python code that calls other hooked APIs (anything but a C function)."""
    return not isinstance(fn, _C_CALLABLES)


class suspended:
    """Run code with every hook passing straight through (the probe's own re-runs, tests)."""

    def __enter__(self) -> None:
        self._saved = TLS.depth
        TLS.depth = self._saved + 1

    def __exit__(self, *exc: Any) -> None:
        TLS.depth = self._saved


class resumed:
    """Inside a hooked call's original, let the enclosed code's calls reach the handler again as
    outermost calls (the backward stage, for the FP8 matmuls of a pass that Tensor.backward runs)."""

    def __enter__(self) -> None:
        self._saved = TLS.depth
        TLS.depth = 0

    def __exit__(self, *exc: Any) -> None:
        TLS.depth = self._saved


_ABSENT = object()  # the owner had no attribute of its own: restoring deletes ours
_FLAGS_SET_BY: list[Any] = [None]  # the patcher whose selection the metas' passthrough flags hold


def _by_namespace(entries: Any) -> tuple[tuple[dict[str, Any], dict[str, Any]], ...]:
    """(module.__dict__, {attr: value}) per module, from (module, attr, value) entries."""
    grouped: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}
    for owner, attr, value in entries:
        grouped.setdefault(id(owner), (vars(owner), {}))[1][attr] = value
    return tuple(grouped.values())


def _restore(restores: Any) -> None:
    for owner, attr, value in restores:
        if value is _ABSENT:
            try:
                delattr(owner, attr)
            except AttributeError:
                pass
        else:
            setattr(owner, attr, value)


def _apply(fn: Callable[..., Any], rows: tuple[tuple[Any, ...], ...]) -> None:
    """fn(*row) for every row, looped in C (map): ~1,500 attributes at every start and stop."""
    if rows:
        deque(map(fn, *zip(*rows)), maxlen=0)


class ApiPatcher:
    """Installs wrappers for a set of APIs and restores the originals, even after errors."""

    def __init__(self, metas: tuple[ApiMeta, ...], selects: Callable[[str], bool | None] | None = None) -> None:
        """`selects(key)`: False for an API the probe never checks (a `list`/`scope` run). Such an
        API is not wrapped at all when it is a C function, which cannot call another hooked API;
        a Python-level one gets a pass-through wrapper, so calls nested in it stay unchecked
        (outermost only) as when every API is wrapped. Install and restore then touch the
        selected APIs and the ~170 Python-level ones instead of ~1,500."""
        self._never: frozenset[int] = frozenset()
        if selects is not None:
            never = {id(m) for m in metas if selects(m.key) is False}
            metas = tuple(m for m in metas if id(m) not in never or _calls_python(m.original))
            self._never = frozenset(never)
        self.metas = metas
        self.installed = False
        self._sets: tuple[tuple[Any, str, Any], ...] | None = None
        self._restores: tuple[tuple[Any, str, Any], ...] = ()
        self._resets: tuple[tuple[Any, str, Any], ...] = ()
        self._deletes: tuple[tuple[Any, str], ...] = ()
        self._module_sets: tuple[tuple[dict[str, Any], dict[str, Any]], ...] = ()
        self._module_restores: tuple[tuple[dict[str, Any], dict[str, Any]], ...] = ()

    def install(self, handler: Callable[..., Any]) -> None:
        if HANDLER[0] is not None:
            from probes.core.errors import ProbeError

            raise ProbeError(
                "another free_benchmark probe is already running in this process; stop it first "
                "(PrecisionDebugger.stop()) before starting a second one"
            )
        # a probe starts and stops around every training step: what install and restore set is
        # computed once (a meta's wrapper and original stay the same for its life). A plain
        # module's attributes are its dictionary's entries: one update per module (~900 of them,
        # a quarter of a millisecond as setattr calls); classes take a tight loop of setattr
        if self._sets is None:
            for meta in self.metas:
                if meta.wrapper is None:
                    meta.wrapper = make_wrapper(meta)
            in_modules = [m for m in self.metas if type(m.owner) is types.ModuleType and m.had_own]
            self._module_sets = _by_namespace((m.owner, m.attr, m.wrapper) for m in in_modules)
            self._module_restores = _by_namespace((m.owner, m.attr, m.own_value) for m in in_modules)
            on_classes = [m for m in self.metas if not (type(m.owner) is types.ModuleType and m.had_own)]
            self._sets = tuple((meta.owner, meta.attr, meta.wrapper) for meta in on_classes)
            self._restores = tuple((meta.owner, meta.attr, meta.own_value if meta.had_own else _ABSENT)
                                   for meta in on_classes)
            self._resets = tuple(r for r in self._restores if r[2] is not _ABSENT)
            self._deletes = tuple(r[:2] for r in self._restores if r[2] is _ABSENT)
        if _FLAGS_SET_BY[0] is not self:  # the catalog's metas are shared by probes
            never = self._never
            for meta in self.metas:
                meta.passthrough = id(meta) in never
            _FLAGS_SET_BY[0] = self
        try:
            for namespace, values in self._module_sets:
                namespace.update(values)
            _apply(setattr, self._sets)
        except BaseException:  # put back what was set: the attributes before the first that fails
            done = next((i for i, (owner, attr, wrapper) in enumerate(self._sets)
                         if getattr(owner, attr, None) is not wrapper), len(self._sets))
            _restore(self._restores[:done])
            for namespace, values in self._module_restores:
                namespace.update(values)
            raise
        HANDLER[0] = handler
        self.installed = True

    def uninstall(self) -> None:
        HANDLER[0] = None
        if self.installed:
            _apply(setattr, self._resets)
            try:
                _apply(delattr, self._deletes)
            except AttributeError:  # one the user deleted meanwhile: the others one by one
                _restore(tuple((owner, attr, _ABSENT) for owner, attr in self._deletes))
            for namespace, values in self._module_restores:
                namespace.update(values)
            self.installed = False
