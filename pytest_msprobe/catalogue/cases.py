"""Which API x dtype tests the catalogue has, and where each one's inputs come from.

PyTorch: every deterministic OpInfo entry reachable through a public name (opinfo_ops) when
`torch.testing._internal` imports (it needs `expecttest`); otherwise every row of the project's
API table (pytest_msprobe.api.inputs), inputs drawn by Hypothesis. And the FP8 matmul and casts
(fp8_ops), which OpInfo's float64-less entries cannot give a reference. MindSpore: the table rows whose
name MindSpore's mint has (mindspore_cases). One case per API x dtype, float32, float16 and
bfloat16; a dtype without a CPU kernel is a skipped test with the reason, so the matrix is the
same on every machine.

Cases are built at collection, without drawing a single input (sample inputs are made in the
test), so collecting ~2,000 tests takes a few seconds.
"""

from __future__ import annotations

import functools
import importlib.util
import os

from probes.core.errors import ConfigError
from pytest_msprobe.catalogue import fp8_ops, mindspore_ops, npu_ops
from pytest_msprobe.catalogue.records import DTYPES, CatalogueCase

SOURCE_ENV = "MSPROBE_CATALOGUE_SOURCE"  # "opinfo", "table", "mindspore" or "auto" (default)
SOURCES = ("auto", "opinfo", "table", "mindspore", "npu", "fp8")


def wanted_source() -> str:
    source = os.environ.get(SOURCE_ENV, "auto").strip() or "auto"
    if source not in SOURCES:
        raise ConfigError(SOURCE_ENV, source, ", ".join(SOURCES))
    return source


def opinfo_available() -> bool:
    try:
        import expecttest  # noqa: F401
        import torch.testing._internal.common_methods_invocations  # noqa: F401
    except Exception:  # ImportError, or an OpInfo module that fails on this torch
        return False
    return True


@functools.lru_cache(maxsize=1)
def opinfo_cases() -> list[CatalogueCase]:
    import torch

    from pytest_msprobe.catalogue.opinfo_ops import build_corpus

    entries, _outside = build_corpus()
    cases: list[CatalogueCase] = []
    seen: dict[str, int] = {}
    for entry in entries:
        if entry.random or entry.uninitialised:
            continue  # no reference to compare with: another draw, or memory never written
        op = entry.opinfo
        cpu = op.supported_dtypes("cpu")
        if torch.float64 not in cpu:
            continue  # no float64 kernel on the CPU: no reference
        variant = op.variant_test_name
        label = f"{entry.key}[{variant}]" if variant else entry.key
        seen[label] = seen.get(label, 0) + 1
        if seen[label] > 1:  # two OpInfo entries through one public name: keep both, apart
            label = f"{label}#{entry.name}"
        for dtype in DTYPES:
            skip = None
            if getattr(torch, dtype) not in cpu:
                skip = f"{entry.name} has no CPU kernel for {dtype} in this torch (OpInfo)"
            cases.append(CatalogueCase(label, dtype, "opinfo", entry.name, entry.key, skip, entry.exclusion))
    return cases


@functools.lru_cache(maxsize=1)
def table_cases() -> list[CatalogueCase]:
    from pytest_msprobe.api.inputs import API_TABLE

    cases = []
    for row in API_TABLE:
        for dtype in DTYPES:
            skip = f"{row.name} has no CPU kernel for {dtype} in this torch" if dtype in row.no_cpu else None
            cases.append(CatalogueCase(row.name, dtype, "table", row.name, row.name, skip))
    return cases


def mindspore_cases() -> list[CatalogueCase]:
    cases = []
    for name, row in mindspore_ops.mint_rows():
        for dtype in DTYPES:
            cases.append(CatalogueCase(name, dtype, "mindspore", row.name, name))
    return cases


def npu_cases() -> list[CatalogueCase]:
    return [CatalogueCase(f"NPU.{name}", dtype, "npu", name, f"NPU.{name}") for name in npu_ops.available()
            for dtype in DTYPES]


def all_cases() -> list[CatalogueCase]:
    """The catalogue's tests for the installed frameworks and the chosen source."""
    source = wanted_source()
    cases: list[CatalogueCase] = []
    has_torch = importlib.util.find_spec("torch") is not None
    has_ms = importlib.util.find_spec("mindspore") is not None
    if has_torch and source in ("auto", "opinfo", "table"):
        if source == "opinfo" or (source == "auto" and opinfo_available()):
            cases += opinfo_cases()
        else:
            cases += table_cases()
    if has_torch and source in ("auto", "npu"):
        cases += npu_cases()
    if has_torch and source in ("auto", "fp8"):
        cases += fp8_ops.cases()
    if has_ms and source in ("auto", "mindspore"):
        cases += mindspore_cases()
    return cases
