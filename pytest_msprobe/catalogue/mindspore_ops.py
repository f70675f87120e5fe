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
import warnings
from typing import Any

import numpy as np

from probes.core.accumulation import accumulation_ratio
from probes.core.errors import ConfigError
from probes.core.ulps import ulp_errors
from pytest_msprobe.catalogue import accumulating
from pytest_msprobe.catalogue.draws import draw_examples
from pytest_msprobe.catalogue.measurement import (
    Failure,
    ProbeCannotJudge,
    Unscorable,
    free_benchmark_verdict_of,
    measure_samples,
)
from pytest_msprobe.catalogue.records import SAMPLES, CatalogueCase, CatalogueResult

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


class MindSporeFramework:
    """MindSpore's part of the shared measurement (pytest_msprobe.catalogue.measurement): a sample
    is (args, kwargs, ref_args), the device inputs in the case's dtype and the same in float64;
    outputs are compared as float64 NumPy arrays, since NumPy has no bfloat16."""

    device = "cpu"  # MindSpore runs on its configured target, the CPU build here

    def __init__(self, key: str, dtype: str) -> None:
        self.key = key
        self.dtype = dtype

    def reference(self, sample: tuple[list[Any], dict, list[Any]]) -> np.ndarray:
        _, kwargs, ref_args = sample
        return _host(_callable(self.key)(*ref_args, **kwargs))

    def run(self, sample: tuple[list[Any], dict, list[Any]]) -> np.ndarray:
        args, kwargs, _ = sample
        return _host(_callable(self.key)(*args, **kwargs))

    def errors(self, out: np.ndarray, ref: np.ndarray) -> list[np.ndarray]:
        if out.shape != ref.shape:
            raise Unscorable(f"output shape {out.shape} differs from the reference's {ref.shape}")
        return [ulp_errors(out, ref, self.dtype).reshape(-1)]

    def ratios(self, kind: str, sample: tuple[list[Any], dict, list[Any]], out: np.ndarray,
               ref: np.ndarray) -> list[np.ndarray]:
        _, kwargs, ref_args = sample
        return [_ratios(kind, self.key, ref_args, kwargs, out, ref, self.dtype)]

    def nothing_to_measure(self, case: CatalogueCase, failures: list[Failure]) -> str:
        # no kernel for this dtype on this target (or another signature): a skip, never a broken row
        return f"{case.api} ({case.dtype}) on MindSpore: {failures[0].text if failures else 'no sample'}"

    def verdict(self, case: CatalogueCase, samples: list[tuple[list[Any], dict, list[Any]]]) -> tuple[str, str]:
        from probes.mindspore import PrecisionDebugger

        def debugger_for(dump_path: str) -> Any:
            try:
                return PrecisionDebugger(config={"task": "free_benchmark", "dump_path": dump_path, "free_benchmark": {
                    "pert_mode": "improve_precision", "list": [_full_name(case.key)], "rule": "scaled"}})
            except ConfigError:
                raise ProbeCannotJudge(f"{_full_name(case.key)} is not in MindSpore free_benchmark's whitelist") from None

        return free_benchmark_verdict_of(case.key, debugger_for,
                                         (functools.partial(_rerun, case.key, args, kwargs) for args, kwargs, _ in samples))


def _rerun(key: str, args: list[Any], kwargs: dict) -> Any:
    return _callable(key)(*args, **kwargs)  # looked up at the call, once the probe has hooked the name


def measure_mindspore(case: CatalogueCase, samples: int = SAMPLES) -> CatalogueResult:
    """Measure a MindSpore case as measure.measure_torch does a PyTorch one (module docstring)."""
    import mindspore as ms

    from probes.backends import mindspore_xp
    from pytest_msprobe.api.strategies import api_inputs

    mindspore_xp.warm_up()  # MindSpore with NumPy 2 fails its first operator once
    dtype = {"float32": ms.float32, "float16": ms.float16, "bfloat16": ms.bfloat16}[case.dtype]
    drawn = draw_examples(api_inputs(case.ref, case.dtype), samples + 1, case.seed)[1:]  # not the all-zero first
    inputs = [([_to_ms(a, dtype) for a in args], kwargs, [_to_ms(a, ms.float64) for a in args])
              for args, kwargs in drawn]
    return measure_samples(case, MindSporeFramework(case.key, case.dtype), inputs)


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
