"""The catalogue on MindSpore (PyNative): the API table's rows that mint has, measured like PyTorch's.

A table row "Torch.exp" is ``mindspore.mint.exp`` (free_benchmark key "Mint.exp"), a row
"Functional.softmax" is ``mindspore.mint.nn.functional.softmax`` ("MintFunctional.softmax"),
for the forms whose arguments mean the same in both frameworks (one tensor, one tensor and a dim,
broadcasting operands, reductions). Inputs are the table's Hypothesis draws (exact in the dtype),
handed to MindSpore as NumPy arrays; the reference is the same mint API on the inputs in float64.
MindSpore runs on its configured device target (CPU here); its CPU build has no kernel for some
dtypes (bfloat16 notably): such a case is a skipped test with MindSpore's reason.
"""

from __future__ import annotations

import functools
import tempfile
import warnings
from typing import Any

import numpy as np

from probes.core.accumulation import accumulation_ratio
from probes.core.errors import ConfigError
from probes.core.ulps import UlpSummary, ulp_errors
from pytest_msprobe.catalogue import accumulating
from pytest_msprobe.catalogue.draws import draw_examples
from pytest_msprobe.catalogue.records import (
    NOT_APPLICABLE,
    SAMPLES,
    CatalogueCase,
    CatalogueResult,
    NothingToMeasure,
    first_line,
    largest,
    summary_verdict,
)

FORMS = ("unary", "unary_dim", "binary", "reduce")
_FAMILIES = {"Torch": ("", "Mint."), "Functional": ("nn.functional", "MintFunctional.")}


@functools.lru_cache(maxsize=1)
def mint_rows() -> list[tuple[str, Any]]:
    """(free_benchmark key, API table row) of every table row mint implements with these forms."""
    import mindspore.mint as mint
    import mindspore.mint.nn.functional as mint_functional

    from pytest_msprobe.api.inputs import API_TABLE

    modules = {"": mint, "nn.functional": mint_functional}
    out = []
    for row in API_TABLE:
        if row.form not in FORMS:
            continue
        for name in row.names:
            family, _, attr = name.partition(".")
            if family not in _FAMILIES or "." in attr:
                continue
            where, prefix = _FAMILIES[family]
            if callable(getattr(modules[where], attr, None)):
                out.append((prefix + attr, row))
                break
    return out


def _full_name(key: str) -> str:
    """free_benchmark's `list` spelling of a key: "Mint.exp" -> "mindspore.mint.exp"."""
    family, _, attr = key.partition(".")
    return ("mindspore.mint.nn.functional." if family == "MintFunctional" else "mindspore.mint.") + attr


def _callable(key: str) -> Any:
    import mindspore.mint as mint
    import mindspore.mint.nn.functional as mint_functional

    family, _, attr = key.partition(".")
    return getattr(mint_functional if family == "MintFunctional" else mint, attr)  # looked up now: hooked or not


def _to_ms(x: Any, dtype: Any) -> Any:
    import mindspore as ms
    import torch

    if isinstance(x, torch.Tensor):
        arr = x.detach().to(torch.float64).numpy() if x.is_floating_point() else x.numpy()
        t = ms.Tensor(arr)
        return t.astype(dtype) if x.is_floating_point() else t
    return x


def _host(t: Any) -> np.ndarray:
    import mindspore as ms

    return t.astype(ms.float32).asnumpy().astype(np.float64) if t.dtype == ms.bfloat16 else t.asnumpy().astype(
        np.float64)


def measure_mindspore(case: CatalogueCase, samples: int = SAMPLES) -> CatalogueResult:
    """Measure a MindSpore case as measure.measure_torch does a PyTorch one (module docstring)."""
    import mindspore as ms

    from probes.backends import mindspore_xp
    from pytest_msprobe.api.strategies import api_inputs

    mindspore_xp.warm_up()  # MindSpore with NumPy 2 fails its first operator once
    dtype = {"float32": ms.float32, "float16": ms.float16, "bfloat16": ms.bfloat16}[case.dtype]
    drawn = draw_examples(api_inputs(case.ref, case.dtype), samples + 1, case.seed)[1:]  # not the all-zero first
    fn_key = case.key
    inputs = [([_to_ms(a, dtype) for a in args], kwargs) for args, kwargs in drawn]
    kind = accumulating.family(case.api)
    errors, ratios, measured, failures = [], [], 0, []
    for (args, kwargs), (targs, _) in zip(inputs, drawn):
        ref_args = [_to_ms(a, ms.float64) for a in targs]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ref = _callable(fn_key)(*ref_args, **kwargs)
                out = _callable(fn_key)(*args, **kwargs)
                got, want = _host(out), _host(ref)
        except Exception as exc:  # no kernel for this dtype on this target, or another signature
            failures.append(f"{type(exc).__name__}: {first_line(exc)}")
            continue
        if got.shape != want.shape:
            failures.append(f"output shape {got.shape} differs from the reference's {want.shape}")
            continue
        errors.append(ulp_errors(got, want, case.dtype).reshape(-1))
        if kind:
            ratios.append(_ratios(kind, fn_key, ref_args, kwargs, got, want, case.dtype))
        measured += 1
    if not measured:
        raise NothingToMeasure(f"{case.api} ({case.dtype}) on MindSpore: {failures[0] if failures else 'no sample'}")
    summary = UlpSummary.of(errors)
    result = CatalogueResult(case.api, case.dtype, "cpu", case.source, measured, summary.elements, summary.max_ulp,
                             summary.p99_ulp, NOT_APPLICABLE, ratio=largest(ratios))
    result.verdict, result.verdict_detail = _verdict(case, inputs)
    return result


def _ratios(kind: str, key: str, ref_args: list[Any], kwargs: dict[str, Any], got: np.ndarray, want: np.ndarray,
            dtype: str) -> np.ndarray:
    """The accumulation test ratios of one sample (measure.sample_ratios on PyTorch)."""
    import mindspore as ms
    from mindspore import ops

    def floats(fn: Any, args: list[Any]) -> list[Any]:
        return [fn(a) if isinstance(a, ms.Tensor) and a.dtype == ms.float64 else a for a in args]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        magnitude = _host(_callable(key)(*floats(ops.abs, ref_args), **accumulating.positive_coefficients(kwargs)))
        ones = _host(_callable(key)(*floats(ops.ones_like, ref_args), **kwargs)) if kind == accumulating.PRODUCTS else None
    first = next((a for a in ref_args if isinstance(a, ms.Tensor)), None)
    count = accumulating.term_count(kind, ones, int(first.size) if first is not None else 1, int(got.size))
    return accumulation_ratio(got, want, magnitude, count, dtype)


def _verdict(case: CatalogueCase, inputs: list[tuple[list[Any], dict]]) -> tuple[str, str]:
    from probes.mindspore import PrecisionDebugger

    with tempfile.TemporaryDirectory(prefix="msprobe-catalogue-") as tmp:
        try:
            debugger = PrecisionDebugger(config={"task": "free_benchmark", "dump_path": tmp, "free_benchmark": {
                "pert_mode": "improve_precision", "list": [_full_name(case.key)], "rule": "scaled"}})
        except ConfigError:
            return NOT_APPLICABLE, f"{_full_name(case.key)} is not in MindSpore free_benchmark's whitelist"
        debugger.start()
        try:
            for args, kwargs in inputs:
                try:
                    _callable(case.key)(*args, **kwargs)
                except Exception:  # noqa: S112 - reported by the measurement
                    continue
        finally:
            debugger.stop()
        return summary_verdict(case.key, debugger.summary())
