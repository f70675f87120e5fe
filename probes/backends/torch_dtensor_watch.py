"""The watch on torch's DTensor dispatcher that tells what one DTensor call did (the
redistributions it made, a custom handler or random op it ran), which probes/backends/torch_dtensor.py
reads to decide how, or whether, the call can be re-run; kept apart because these wrappers reach
into torch's private dispatcher, which changes between torch releases.

The watch is a few wrappers inside torch's DTensor dispatcher, installed at the first DTensor call
a probe checks and put back with the probe's other wrappers (torch_dtensor.release); they pass
straight through on any thread that is not inside a watched call.
"""

from __future__ import annotations

import threading
from typing import Any

# reasons a DTensor call is not re-run (summary.json's not_checked keys) that the watch notes itself
CUSTOM_HANDLER = ("DTensor ran {what} through its own handler (which may communicate or compute apart from the "
                  "local kernel): a re-run on the local tensors would compute something else")
RANDOM_OP = ("DTensor drew random numbers for {what} through its RNG tracker (offsets per shard): a re-run on "
             "the local tensors would draw others")

CURRENT = threading.local()  # .watch: the Watch of the DTensor call running on this thread, if any
_LOCK = threading.Lock()

_KEPT = 64  # redistributions remembered per call (compared between the call and its re-run)


class Watch:
    """What DTensor's dispatcher did during one watched call: the first thing that rules out any
    re-run, and the redistributions it made (which send the re-run through DTensor)."""

    __slots__ = ("reason", "redistributions")

    def __init__(self) -> None:
        self.reason: str | None = None
        self.redistributions: list[str] = []

    def note(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason


def _noting(reason: str, *details: Any) -> None:
    """Note why the watched call on this thread cannot be re-run (`reason` formatted with the
    details, joined by arrows: a redistribution's source and target); a no-op on other threads.
    Called inside DTensor's dispatch, so it never raises."""
    watch = getattr(CURRENT, "watch", None)
    if watch is not None and watch.reason is None:
        try:
            watch.note(reason.format(what=" -> ".join(map(_described, details))))
        except Exception:
            watch.note(reason.format(what="?"))


def _redistributing(src: Any, dst: Any) -> None:
    """Remember a redistribution of the watched call on this thread (its placements, "src -> dst");
    a no-op on other threads. Called inside DTensor's dispatch, so it never raises."""
    watch = getattr(CURRENT, "watch", None)
    if watch is not None and len(watch.redistributions) < _KEPT:
        try:
            watch.redistributions.append(f"{_described(src)} -> {_described(dst)}")
        except Exception:
            watch.redistributions.append("?")


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
                _redistributing(src_spec, dst_spec)
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
