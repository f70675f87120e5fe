"""What a rank computes in a DTensor call, so that free_benchmark can re-run exactly that.

A DTensor op is a local kernel run on each rank's shard, behind a sharding propagation that may
first redistribute the inputs: an all-gather, an all-reduce of a partial sum, or a local division
(a replicated bias made a partial sum, in a row-wise parallel linear). free_benchmark re-runs a
hooked API on the plain local tensors and compares the result with the original output's local
tensor: that is the same computation only when DTensor ran the API's kernels on the local
tensors unchanged. A re-run on plain tensors cannot issue a collective, and every decision below
reads this rank's own metadata or its own dispatcher, never another rank's, so no rank ever
issues a collective the others do not. The call is judged only when:

- before the call, from its inputs: every DTensor is on one mesh this rank belongs to, none holds
  a partial sum (the op would reduce it first), and no plain tensor but a 0-d one is mixed in
  (DTensor would replicate it, or refuse the call);
- during the original call, DTensor's own dispatcher did nothing but run local kernels: no input
  redistributed (seen where DTensor checks implicit redistributions), no custom handler (a
  convolution's halo exchange, an argmax over a sharded dimension) and no random op drawn through
  its RNG tracker ran, and no collective was issued on the mesh's groups;
- after the re-run: its outputs have the local outputs' shapes (and dtypes, for the modes that
  keep them), so a redistribution nothing above saw still cannot be compared as if it were one.

An AsyncCollectiveTensor (a functional collective's result, which the row-wise layers return) is
the plain tensor the collective produced, waited for: a call on it is re-run on that tensor, which
the original call waited for already (its own dispatch waits before it computes).

The watch is a few wrappers inside torch's DTensor dispatcher, installed at the first DTensor call
a probe checks and put back with the probe's other wrappers (`release`); they pass straight through
on any thread that is not inside a watched call.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from typing import Any

import torch

from probes.core.trees import iter_leaves, tree_map

# reasons a DTensor call is not re-run (summary.json's not_checked keys)
PARTIAL_INPUT = ("a DTensor input holds a partial sum ({what} placement): the op reduces it across the mesh first, "
                 "so a re-run on the local tensors would compute something else")
MESHES_DIFFER = "its DTensor inputs are on different device meshes"
MIXED_INPUTS = ("a plain tensor with dimensions among DTensor inputs: DTensor replicates it (or refuses the call), "
                "which a re-run on the local tensors would not")
NOT_IN_MESH = "this rank is not part of the DTensor inputs' mesh: it computes nothing"
REDISTRIBUTED = ("the DTensor op redistributed an input ({what}) before its local kernel: a re-run on the local "
                 "tensors would compute something else")
CUSTOM_HANDLER = ("DTensor ran {what} through its own handler (which may communicate or compute apart from the "
                  "local kernel): a re-run on the local tensors would compute something else")
RANDOM_OP = ("DTensor drew random numbers for {what} through its RNG tracker (offsets per shard): a re-run on "
             "the local tensors would draw others")
COMMUNICATED = ("the DTensor call issued collectives on its mesh: a re-run on the local tensors would compute "
                "something else")
LOCAL_OUTPUT = ("an output of the DTensor call is not a plain local tensor ({what}): its local values cannot be "
                "compared")
LOCAL_MISMATCH = ("the re-run on the local tensors gave {what}: DTensor redistributed something, so the two are "
                  "not the same computation")
RERUN_FAILED = "the re-run on the local tensors failed ({what}): DTensor computed it some other way"
UNOBSERVABLE = ("this torch's DTensor dispatcher cannot be watched for redistributions, so a re-run on the local "
                "tensors might compute something else")

_TLS = threading.local()  # .watch: the _Watch of the DTensor call running on this thread, if any
_LOCK = threading.Lock()


def dtensor_class() -> type | None:
    """DTensor, when the program has imported it (never imported here: most programs do not use it)."""
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None) if module is not None else None


def async_class() -> type | None:
    """AsyncCollectiveTensor, when the program has imported the functional collectives."""
    module = sys.modules.get("torch.distributed._functional_collectives")
    return getattr(module, "AsyncCollectiveTensor", None) if module is not None else None


def handled(kind: type) -> bool:
    """A tensor type whose calls `local_call` decides (DTensor, AsyncCollectiveTensor)."""
    return any(cls is not None and issubclass(kind, cls) for cls in (dtensor_class(), async_class()))


class _Watch:
    """What DTensor's dispatcher did during one watched call (the first thing that rules out a re-run)."""

    __slots__ = ("reason",)

    def __init__(self) -> None:
        self.reason: str | None = None

    def note(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason


def _noting(reason: str, *details: Any) -> None:
    """Note why the watched call on this thread cannot be re-run (`reason` formatted with the
    details, joined by arrows: a redistribution's source and target); a no-op on other threads.
    Called inside DTensor's dispatch, so it never raises."""
    watch = getattr(_TLS, "watch", None)
    if watch is not None and watch.reason is None:
        try:
            watch.note(reason.format(what=" -> ".join(map(_described, details))))
        except Exception:
            watch.note(reason.format(what="?"))


def _described(x: Any) -> str:
    if hasattr(x, "placements"):
        return ", ".join(repr(p) for p in x.placements) or "?"
    return str(x)


# custom handlers that answer a question about the tensors and compute nothing
_QUERIES = frozenset({"is_same_size", "is_pinned"})


class _RecordingSet(set):
    """DTensor's set of random ops: a membership test that answers yes is noted (the op is about
    to draw through the RNG tracker)."""

    def __contains__(self, op: object) -> bool:
        found = set.__contains__(self, op)
        if found:
            _noting(RANDOM_OP, op)
        return found


class _Hooks:
    """The wrappers inside torch's DTensor dispatcher, and how to put back what they replaced."""

    def __init__(self) -> None:
        self.installed = False
        self.saved_observe: Any = None
        self.saved_random: Any = None
        self.handlers: list[tuple[dict, Any, Any, Any]] = []  # (dict, op, original, wrapper)
        self.wrappers: set[int] = set()

    @staticmethod
    def _parts() -> tuple[Any, Any] | None:
        try:
            from torch.distributed.tensor import DTensor
            from torch.distributed.tensor._utils import ExplicitRedistributionContext
        except ImportError:
            return None
        dispatcher = getattr(DTensor, "_op_dispatcher", None)
        if dispatcher is None or "observe_redistribution" not in vars(ExplicitRedistributionContext):
            return None
        return dispatcher, ExplicitRedistributionContext

    def install(self) -> bool:
        """Install (once); False when this torch offers nothing to watch."""
        with _LOCK:
            if self.installed:
                self._wrap_handlers()
                return True
            parts = self._parts()
            if parts is None:
                return False
            dispatcher, context = parts
            saved = vars(context)["observe_redistribution"]
            observe = saved.__func__ if isinstance(saved, classmethod) else None
            if observe is None:
                return False

            def observe_redistribution(cls: Any, src_spec: Any, dst_spec: Any, *rest: Any, **kw: Any) -> Any:
                _noting(REDISTRIBUTED, src_spec, dst_spec)
                return observe(cls, src_spec, dst_spec, *rest, **kw)

            context.observe_redistribution = classmethod(observe_redistribution)
            self.saved_observe = (context, saved)
            random_ops = getattr(dispatcher, "_random_ops", None)
            if isinstance(random_ops, set) and not isinstance(random_ops, _RecordingSet):
                self.saved_random = (dispatcher, random_ops)
                dispatcher._random_ops = _RecordingSet(random_ops)
            self.installed = True
            self._wrap_handlers()
            return True

    def _wrap_handlers(self) -> None:
        """Wrap the custom handlers DTensor holds now (loss_parallel and context parallel add theirs later)."""
        parts = self._parts()
        handlers = getattr(parts[0], "_custom_op_handlers", None) if parts is not None else None
        if not isinstance(handlers, dict):
            return
        for op, handler in list(handlers.items()):
            if id(handler) in self.wrappers or not callable(handler) or getattr(op, "_opname", None) in _QUERIES:
                continue
            wrapper = _handler_wrapper(op, handler)
            handlers[op] = wrapper
            self.wrappers.add(id(wrapper))
            self.handlers.append((handlers, op, handler, wrapper))

    def release(self) -> None:
        """Put back everything installed (entries changed since by torch or the user are left as they are)."""
        with _LOCK:
            if not self.installed:
                return
            context, saved = self.saved_observe
            context.observe_redistribution = saved
            if self.saved_random is not None:
                dispatcher, random_ops = self.saved_random
                if isinstance(getattr(dispatcher, "_random_ops", None), _RecordingSet):
                    dispatcher._random_ops = random_ops
            for handlers, op, handler, wrapper in self.handlers:
                if handlers.get(op) is wrapper:
                    handlers[op] = handler
            self.__init__()


def _handler_wrapper(op: Any, handler: Any) -> Any:
    def custom_handler(*args: Any, **kwargs: Any) -> Any:
        _noting(CUSTOM_HANDLER, op)
        return handler(*args, **kwargs)

    return custom_handler


HOOKS = _Hooks()


def release() -> None:
    """Put torch's DTensor dispatcher back as it was (the probe's wrappers are going away)."""
    HOOKS.release()


def _issued(mesh: Any) -> int | None:
    """Collectives this rank has issued on the mesh's process groups (their sequence numbers),
    or None where the backend does not count them."""
    try:
        return sum(group._get_sequence_number_for_group() for group in mesh.get_all_groups())
    except Exception:
        return None


class LocalCall:
    """A DTensor call that may be re-run on its local tensors (see the module docstring); `mesh`
    None: a call on waited collective results only, with no DTensor to watch."""

    def __init__(self, kinds: tuple[type, type | None], mesh: Any, args: tuple, kwargs: dict) -> None:
        self._dtensor, self._async = kinds
        self.mesh = mesh
        self.args, self.kwargs = args, kwargs
        self.reason: str | None = None

    def _local(self, x: Any) -> Any:
        if self._dtensor is not None and isinstance(x, self._dtensor):
            return x._local_tensor
        if self._async is not None and isinstance(x, self._async):
            with torch.no_grad():
                return x.trigger_wait()  # the original call waited already: the collective's result
        return x

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Around the original call: what DTensor's dispatcher does meanwhile decides the re-run."""
        if self.mesh is None:
            yield
            return
        try:
            watchable = HOOKS.install()
        except Exception:  # torch's dispatcher is not as expected: nothing is re-run, the call goes on
            watchable = False
        if not watchable:
            self.reason = UNOBSERVABLE
            yield
            return
        watch, outer = _Watch(), getattr(_TLS, "watch", None)
        before = _issued(self.mesh)
        _TLS.watch = watch
        try:
            yield
        finally:
            _TLS.watch = outer
            after = _issued(self.mesh) if before is not None else None
            self.reason = watch.reason or (COMMUNICATED if after != before else None)

    def after(self, out: Any) -> tuple[tuple, dict, Any] | str:
        """The call's plain local inputs and outputs, or why it cannot be re-run on them."""
        if self.reason is not None:
            return self.reason
        local_out = tree_map(self._local, out)
        for _path, leaf in iter_leaves(local_out):
            if isinstance(leaf, torch.Tensor) and type(leaf) is not torch.Tensor:
                return LOCAL_OUTPUT.format(what=type(leaf).__name__)
        return tree_map(self._local, self.args), tree_map(self._local, self.kwargs), local_out

    @staticmethod
    def mismatch(local_out: Any, rerun_out: Any, same_dtype: bool) -> str | None:
        """Why the re-run's outputs cannot be the local outputs' counterparts, or None."""
        theirs = dict(iter_leaves(rerun_out))
        for path, leaf in iter_leaves(local_out):
            other = theirs.get(path)
            if not isinstance(leaf, torch.Tensor) or not isinstance(other, torch.Tensor):
                continue
            if leaf.shape != other.shape:
                return LOCAL_MISMATCH.format(what=f"shape {tuple(other.shape)} where the rank's output is "
                                                  f"{tuple(leaf.shape)}")
            if same_dtype and leaf.dtype != other.dtype:
                return LOCAL_MISMATCH.format(what=f"{other.dtype} where the rank's output is {leaf.dtype}")
        return None

    @staticmethod
    def rerun_failed(exc: BaseException) -> str:
        return RERUN_FAILED.format(what=type(exc).__name__)


def local_call(args: tuple, kwargs: dict) -> LocalCall | str | None:
    """For a call with DTensor arguments: the LocalCall that re-runs it on this rank's local
    tensors, or why it cannot be; None for a call without DTensors (the usual case: no DTensor
    imported costs one dict lookup). Never raises: an input that cannot be inspected is judged
    unsafe."""
    kinds = dtensor_class(), async_class()
    if kinds == (None, None):
        return None
    try:
        return _decide(kinds, args, kwargs)
    except Exception as exc:
        return RERUN_FAILED.format(what=f"inspecting the DTensor inputs: {type(exc).__name__}")


def _decide(kinds: tuple[type | None, type | None], args: tuple, kwargs: dict) -> LocalCall | str | None:
    dtensor, waited = kinds
    dtensors, plain, results = [], False, False
    for _path, leaf in iter_leaves((args, kwargs)):
        if dtensor is not None and isinstance(leaf, dtensor):
            dtensors.append(leaf)
        elif waited is not None and isinstance(leaf, waited):
            results = True
        elif isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
            plain = True
    if not dtensors:
        return LocalCall(kinds, None, args, kwargs) if results else None
    if plain or results:
        return MIXED_INPUTS
    mesh = dtensors[0].device_mesh
    for t in dtensors:
        if t.device_mesh is not mesh and t.device_mesh != mesh:
            return MESHES_DIFFER
        for p in t.placements:
            if p.is_partial():
                return PARTIAL_INPUT.format(what=p)
    if mesh.get_coordinate() is None:
        return NOT_IN_MESH
    return LocalCall(kinds, mesh, args, kwargs)
