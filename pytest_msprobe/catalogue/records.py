"""What the catalogue measures and what it found: a case, its result, and the verdict words.

A leaf of the catalogue: it imports none of the catalogue's other modules, so each of them (the
case lists, the PyTorch and MindSpore measurements, the plugin's run) can share these without a
cycle between them.
"""

from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from probes.core.number_format import short_number

DTYPES = ("float32", "float16", "bfloat16")
SAMPLES = 4  # sample inputs per API x dtype: bounded, so the catalogue fits a CI job

# free_benchmark's verdict of one case (improve_precision)
PASS, FLAGGED, NOT_CHECKED, NOT_APPLICABLE = "pass", "flagged", "not checked", "n/a"


@dataclass(frozen=True)
class CatalogueCase:
    """One test: an API in one dtype, from one source of inputs."""

    api: str  # the catalogue's name: free_benchmark's key ("Torch.rsqrt"), an OpInfo variant in [...]
    dtype: str
    source: str  # "opinfo", "table", "mindspore", "npu" (torch_npu's fused operators) or "fp8"
    ref: str  # the OpInfo entry name, or the API table's name
    key: str  # the free_benchmark key the probe checks (the public name called)
    skip: str | None = None
    exclusion: str | None = None  # why free_benchmark never re-runs this API (its verdict is then n/a)

    @property
    def framework(self) -> str:
        return "mindspore" if self.source == "mindspore" else "torch"

    @property
    def id(self) -> str:
        return f"{self.api}-{self.dtype}"

    @property
    def seed(self) -> int:
        """The seed of the case's inputs: the same on every run and machine, so goldens compare."""
        return zlib.crc32(f"{self.ref}|{self.dtype}".encode())


@dataclass
class CatalogueResult:
    """One API x dtype on one device: the catalogue.csv row before the golden's status is added."""

    api: str
    dtype: str
    device: str
    source: str
    samples: int  # samples measured (device and reference both ran)
    elements: int
    max_ulp: float
    p99_ulp: float
    verdict: str  # free_benchmark improve_precision: pass / flagged / not checked / n/a
    verdict_detail: str = ""
    ratio: float | None = None  # largest accumulation test ratio (accumulating APIs only)
    error: str = ""  # the device run raised on every sample (the API is broken there)
    status: str = ""  # set by the gate: ok, regressed, newly flagged, ...
    message: str = ""
    golden_max_ulp: float | None = None
    golden_p99_ulp: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class NothingToMeasure(Exception):
    """The case has no floating output, or no sample the reference could run: a skipped test."""


def largest(arrays: list[np.ndarray]) -> float | None:
    """The largest value of any array, None when there is none (NaN counts as infinite)."""
    values = [np.nan_to_num(a, nan=np.inf).max() for a in arrays if a.size]
    return float(max(values)) if values else None


def first_line(exc: BaseException) -> str:
    """An exception's first line, bounded: what a row's message and a skip reason can hold."""
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else ""


def summary_verdict(key: str, summary: dict[str, Any]) -> tuple[str, str]:
    """(verdict, detail) of API `key` from a free_benchmark summary (both frameworks' probes)."""
    stats = summary.get("apis", {}).get(key, {})
    checked, flagged = int(stats.get("checked", 0) or 0), int(stats.get("flagged", 0) or 0)
    if flagged:
        worst, limit = short_number(stats.get("worst_max_rel"), 3), short_number(stats.get("threshold"), 3)
        return FLAGGED, f"{flagged} of {checked} calls flagged (worst {worst} > {limit})"
    if checked:
        return PASS, f"{checked} calls checked"
    reasons = [r for r, apis in summary.get("not_checked", {}).items() if key in apis]
    errors = [e.get("error", "") for e in summary.get("errors", [])]
    return NOT_CHECKED, "; ".join(reasons + errors)[:200] or f"{key} was not called through its public name"
