"""A probe's own run of a call, as if it had not happened: every re-run of free_benchmark (the
perturbed call, the CPU sample, a compiled graph's eager program, the backward recomputations)
draws the random numbers the user's call drew, and the user's random stream then continues from
where it was, so the probe never changes what the model computes next."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from probes.core.errors import NotMeasurable

#: the perturbations that change input values (keeping dtypes, shapes and devices)
VALUE_MODES = ("add_noise", "bit_noise", "change_value")


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


def perturbed_replay(backend: Any, snapshot: Any, fn: Callable[..., Any], pert_args: tuple, pert_kwargs: dict,
                     args: tuple, kwargs: dict, pert_mode: str) -> Any:
    """`replay` of a perturbed call. An API may reject the values a perturbation made (a matrix
    that change_value leaves not positive-definite makes cholesky raise): where the perturbed
    re-run raises under a mode that changes values, the call is re-run with its own arguments
    (`args`, `kwargs`: copies where the API writes into its inputs), and if that succeeds the call is not measurable
    with this perturbation (NotMeasurable, the call skipped with the reason: not a probe error).
    Any other failure is raised as it was. Only for calls whose re-run is local: a re-run through
    DTensor may communicate, and the ranks must issue the same collectives."""
    try:
        return replay(backend, snapshot, fn, pert_args, pert_kwargs)
    except NotMeasurable:
        raise
    except Exception as exc:
        if pert_mode not in VALUE_MODES:
            raise
        try:
            replay(backend, snapshot, fn, args, kwargs)
        except Exception:
            raise exc from None  # the API fails on its own arguments too: an error of the check
        raise NotMeasurable(f"{pert_mode} takes its input outside what the API accepts (the perturbed re-run "
                            f"raised {type(exc).__name__}, the unperturbed one did not)") from exc
