"""free_benchmark's snapshots of MindSpore's default generator, kept apart from the backend because
they shadow the generator's own methods: what is installed on it, and when it comes off, is one
concern, read in one place.

``mindspore.get_rng_state()`` waits for every queued operator (a synchronisation, several ms on a
busy CPU), and free_benchmark takes two snapshots and two restores per checked call, although no
checked API draws random numbers (random APIs are never re-run). So a snapshot reads the state
only when something is about to change it.
"""

from __future__ import annotations

import weakref
from typing import Any

import mindspore as ms


class LazyState:
    """A snapshot of the default generator, taken when its state is first about to change."""

    __slots__ = ("state", "__weakref__")

    def __init__(self) -> None:
        self.state: Any = None


class GeneratorWatch:
    """Snapshots of MindSpore's default generator that cost nothing when nothing draws from it.

    Everything that changes the default generator's state goes through four of its methods
    (``_step``, called by every random operator when it is dispatched, ``set_state``,
    ``manual_seed``, ``seed``). While a snapshot is pending, those methods are shadowed on the
    generator instance by wrappers that read the state before the first change; a restore sets
    that state back, or does nothing when the state never changed. The wrappers are removed as
    soon as no snapshot is pending (restored, or dropped on an exception path)."""

    MUTATORS = ("_step", "set_state", "manual_seed", "seed")

    def __init__(self, generator: Any) -> None:
        self.generator = generator
        self.pending: weakref.WeakSet[LazyState] = weakref.WeakSet()
        self.installed = False

    @classmethod
    def of_default_generator(cls) -> GeneratorWatch | None:
        """None when this MindSpore's generator does not look as described (then snapshots are eager)."""
        try:
            from mindspore.common import generator as gen_module

            gen = gen_module.default_generator
        except Exception:  # pragma: no cover - MindSpore without a default generator
            return None
        if not all(callable(getattr(type(gen), m, None)) for m in (*cls.MUTATORS, "get_state")):
            return None
        if not hasattr(gen, "__dict__") or getattr(ms, "get_rng_state", None) is None:
            return None
        return cls(gen)

    def arm(self) -> LazyState:
        token = LazyState()
        self.pending.add(token)
        weakref.finalize(token, self._release)
        if not self.installed:
            for name in self.MUTATORS:
                setattr(self.generator, name, self._wrapper(getattr(self.generator, name)))
            self.installed = True
        return token

    def restore(self, token: LazyState) -> None:
        self.pending.discard(token)
        if token.state is not None:
            self.generator.set_state(token.state)  # through the wrapper: later snapshots see the change
        self._release()

    def _release(self) -> None:
        if self.installed and not any(True for _ in self.pending):
            for name in self.MUTATORS:
                self.generator.__dict__.pop(name, None)
            self.installed = False

    def _wrapper(self, method: Any) -> Any:
        def before_change(*args: Any, **kwargs: Any) -> Any:
            waiting = [t for t in self.pending if t.state is None]
            if waiting:
                state = type(self.generator).get_state(self.generator)
                for t in waiting:
                    t.state = state
            return method(*args, **kwargs)

        return before_change
