"""The measurement of one catalogue case, written once for every framework.

PyTorch's cases (pytest_msprobe.catalogue.measure) and MindSpore's (mindspore_ops) are scored the
same way: each sample runs as the float64 reference and on the device, the device output is scored
in ulps (and, for an accumulating API, by its accumulation test ratio), the figures are summarised
into one CatalogueResult, and free_benchmark re-runs the samples for its verdict. Only how a
framework builds its inputs, calls the API and brings outputs to the host differs: a Framework
adapter supplies those, so a change to the scoring or to the verdict is made in one place and both
frameworks' goldens keep meaning the same thing.
"""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, Protocol, TypeVar

import numpy as np

from probes.core.ulps import UlpSummary
from pytest_msprobe.catalogue import accumulating
from pytest_msprobe.catalogue.records import (
    NOT_APPLICABLE,
    CatalogueCase,
    CatalogueResult,
    NothingToMeasure,
    first_line,
    largest,
    summary_verdict,
)

Sample = TypeVar("Sample")


class Unscorable(Exception):
    """A device output the reference cannot score (its shape differs): counted as a failed device
    run with this text, since the API answered something other than what was asked."""


class ProbeCannotJudge(Exception):
    """free_benchmark cannot give this case a verdict (excluded API, a rule with nothing to
    upcast, an API outside the framework's whitelist): the verdict is n/a with this text."""


class Failure(NamedTuple):
    """A sample that was not scored: on the reference run, or on the device."""

    on_reference: bool
    text: str


class Framework(Protocol[Sample]):
    """What the shared measurement needs from a framework, for one case's samples."""

    device: str  # the device column of the result

    def reference(self, sample: Sample) -> Any:
        """The API on the sample's inputs raised to float64, as `errors` reads it."""
        ...

    def run(self, sample: Sample) -> Any:
        """The API on the sample's inputs on the device under test, as `errors` reads it."""
        ...

    def errors(self, out: Any, ref: Any) -> list[np.ndarray]:
        """ulp errors of each floating output leaf ([] when there is none to score); raises
        Unscorable when the outputs cannot be compared."""
        ...

    def ratios(self, kind: str, sample: Sample, out: Any, ref: Any) -> list[np.ndarray]:
        """Accumulation test ratios of each floating output leaf (an API of family `kind`)."""
        ...

    def nothing_to_measure(self, case: CatalogueCase, failures: list[Failure]) -> str | None:
        """Why the case is a skipped test when no sample was scored; None when its failures make
        it a row of its own (the device run raises: broken on a machine whose golden measured it)."""
        ...

    def verdict(self, case: CatalogueCase, samples: list[Sample]) -> tuple[str, str]:
        """free_benchmark's (verdict, detail) of the samples re-run on the device."""
        ...


def _failure_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {first_line(exc)}"


_FAILED = object()


def _quietly(run: Callable[[Any], Any], sample: Any, reference: bool, failures: list[Failure]) -> Any:
    """`run(sample)` with its warnings silenced; a failure is recorded (on the reference side or
    the measured one) and answered with _FAILED."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return run(sample)
    except Exception as exc:
        failures.append(Failure(reference, _failure_text(exc)))
        return _FAILED


def measure_samples(case: CatalogueCase, framework: Framework[Sample], samples: list[Sample],
                    verdict: bool = True) -> CatalogueResult:
    """Score every sample, summarise the figures and take free_benchmark's verdict (module
    docstring); NothingToMeasure when the framework says the case has nothing to score."""
    kind = accumulating.family(case.api)
    errors: list[np.ndarray] = []
    ratios: list[np.ndarray] = []
    failures: list[Failure] = []
    measured = 0
    for sample in samples:
        ref = _quietly(framework.reference, sample, True, failures)
        if ref is _FAILED:
            continue
        out = _quietly(framework.run, sample, False, failures)
        if out is _FAILED:
            continue
        try:
            leaf_errors = framework.errors(out, ref)
        except Unscorable as exc:
            failures.append(Failure(False, str(exc)))
            continue
        if leaf_errors:
            measured += 1
            errors += leaf_errors
            if kind:
                ratios += framework.ratios(kind, sample, out, ref)
    if not measured:
        why = framework.nothing_to_measure(case, failures)
        if why is not None:
            raise NothingToMeasure(why)
    summary = UlpSummary.of(errors)
    result = CatalogueResult(case.api, case.dtype, framework.device, case.source, measured, summary.elements,
                             summary.max_ulp, summary.p99_ulp, NOT_APPLICABLE, ratio=largest(ratios))
    device_failures = [f.text for f in failures if not f.on_reference]
    if device_failures and not measured:
        result.error = device_failures[0]
    if verdict and measured:
        result.verdict, result.verdict_detail = framework.verdict(case, samples)
    return result


def free_benchmark_verdict_of(key: str, debugger_for: Callable[[str], Any],
                              reruns: Iterable[Callable[[], Any]]) -> tuple[str, str]:
    """(verdict, detail) of API `key` from the debugger `debugger_for(dump_path)` started around
    `reruns`: a re-run that raises is left to the measurement to report, so it is skipped here."""
    with tempfile.TemporaryDirectory(prefix="msprobe-catalogue-") as tmp:
        try:
            debugger = debugger_for(tmp)
        except ProbeCannotJudge as exc:
            return NOT_APPLICABLE, str(exc)
        debugger.start()
        try:
            for rerun in reruns:
                try:
                    rerun()
                except Exception:  # noqa: S112 - the device run's own failure is reported by the measurement
                    continue
        finally:
            debugger.stop()
        summary = debugger.summary()
    return summary_verdict(key, summary)
