"""The report's findings sections by name: what a tool descriptor's ``report_sections`` names.

A tool says which of these draw its findings (`pytest_msprobe.tools.base.Tool.report_sections`),
so the report never branches on a tool's name: a new tool with a new table adds its section
here and names it in its descriptor. Each section reads one key of summary.json (`key`): a
section of another tool than the session's own is drawn only when the session carries that key
(a merged summary, or a fixture of another tool run inside the session).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from probes.core.session_tables import ApiRow, OpRow, ParamRow, read_table
from pytest_msprobe.reports.primitives import mapping
from pytest_msprobe.reports.sections.apis import apis_section
from pytest_msprobe.reports.sections.fp8 import fp8_section
from pytest_msprobe.reports.sections.grad_probe import params_section, similarities_section
from pytest_msprobe.reports.sections.ops import ops_section


@dataclass(frozen=True)
class FindingsContext:
    """What a findings section may read of the session it is drawn for."""

    session: Mapping[str, Any]  # the summary.json dictionary
    tests: Mapping[str, Any]  # its per-test (or per-rank) entries
    unit: str  # what those entries are: "test", or "rank" for a merged multi-rank run
    base: Path  # the report's folder: evidence links are relative to it
    checked: int | None  # what the session's own probe checked (its account), if it had one
    own: bool  # the section belongs to the session's own tool

    def data(self, key: str) -> Any:
        return self.session.get(key)


@dataclass(frozen=True)
class FindingsSection:
    key: str  # the summary.json key the section reads
    build: Callable[[FindingsContext], str]


FINDINGS: dict[str, FindingsSection] = {
    "apis": FindingsSection("apis", lambda c: apis_section(read_table(ApiRow, c.data("apis")), bool(c.tests), c.unit)),
    "params": FindingsSection(
        "params", lambda c: params_section(read_table(ParamRow, c.data("params")), bool(c.tests), c.unit)),
    "similarities": FindingsSection("similarities", lambda c: similarities_section(mapping(c.data("similarities")))),
    # grad_probe's FP8 health columns sit in the per-test summary CSVs, beside the params table
    "fp8_health": FindingsSection("params", lambda c: fp8_section(c.tests, c.base, c.unit)),
    "ops": FindingsSection("ops", lambda c: ops_section(read_table(OpRow, c.data("ops")), bool(c.tests), c.unit,
                                                        c.checked if c.own else None)),
}


def findings_parts(ctx_for: Callable[[bool], FindingsContext], tools: list[Any], own: Any) -> list[str]:
    """The findings sections of `tools` (descriptors), the session's own tool's first and always
    drawn, another's where the session carries its data."""
    parts = []
    for t in [own] + [t for t in tools if t is not own]:
        ctx = ctx_for(t is own)
        for name in t.report_sections:
            section = FINDINGS[name]
            if ctx.own or ctx.session.get(section.key):
                parts.append(section.build(ctx))
    return parts
