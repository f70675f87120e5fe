"""A probe's own run of a call, as if it had not happened: every re-run of free_benchmark (the
perturbed call, the CPU sample, a compiled graph's eager program, the backward recomputations)
draws the random numbers the user's call drew, and the user's random stream then continues from
where it was, so the probe never changes what the model computes next."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def replay(backend: Any, snapshot: Any, fn: Callable[..., Any], args: tuple, kwargs: dict,
           within: Any = None) -> Any:
    """`fn(*args, **kwargs)` with the generators at `snapshot` (the call's `rng_snapshot`),
    inside `within` (a context manager; default: the backend's no_grad, as a forward re-run
    records no graph), the generators put back afterwards whatever happens."""
    if within is None:
        one_frame = getattr(backend, "replayed", None)  # the same steps, as the backend takes them at once
        if one_frame is not None:
            return one_frame(snapshot, fn, args, kwargs)
    after = backend.rng_snapshot(None)
    backend.rng_restore(snapshot)
    try:
        with backend.no_grad() if within is None else within:
            return fn(*args, **kwargs)
    finally:
        backend.rng_restore(after)
