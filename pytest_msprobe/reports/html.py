"""report.html: the session's self-contained HTML report, built from the summary.json dictionary.

One file that a CI artifact viewer or a mail attachment shows as is: inline CSS, plots as inline
SVG, no script and no external resource. It is built from the summary dictionary (never
from live probe objects), so an old summary.json can be re-rendered, and the report of an xdist
run is the report of its merged summary; grad_probe's FP8 health is read from the summary CSVs in
the dump folders the summary names. Evidence links are relative to the report, so the dump
directory can be moved or downloaded as a whole.

This module picks and orders the sections (`sections/`), drawn with the shared pieces of
`primitives` and `plots`; the style is the resource `report.css`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from probes.core.errors import ConfigError
from probes.core.session_tables import ProbeAccount
from probes.core.writers import write_text_atomic
from pytest_msprobe.reports.primitives import as_list, esc, mapping
from pytest_msprobe.reports.sections.api_checks import api_checks_section
from pytest_msprobe.reports.sections.findings import FindingsContext, findings_parts
from pytest_msprobe.reports.sections.header import catalogue_header, tool_header
from pytest_msprobe.reports.sections.probe import account_section, errors_section
from pytest_msprobe.reports.sections.tests import graphs_section, tests_section
from pytest_msprobe.tools import TOOLS

CATALOGUE = "catalogue"  # the "tool" of a session that ran the API precision catalogue only


def render_html(session: Mapping[str, Any], out_path: str | os.PathLike[str]) -> Path:
    """Write the report of one session (the summary.json dictionary) to ``out_path``.

    Sections: header, the tool's findings (table and plot), gradient similarities when the
    session has them, tests with links to their evidence, probe errors. Sections of the other
    tools appear too when the session carries their data (a merged summary).
    """
    tool = session.get("tool") if isinstance(session, Mapping) else None
    if tool not in TOOLS and tool != CATALOGUE:
        raise ConfigError("tool", tool, f"one of {', '.join(TOOLS)} or {CATALOGUE}",
                          hint="render_html takes the summary.json dictionary of a session")
    out = Path(out_path)
    if tool == CATALOGUE:  # a session without --msprobe-task: the catalogue and/or per-API checks
        parts = [catalogue_header(session)]
        if session.get("api_checks"):
            parts.append(api_checks_section(session.get("api_checks")))
        if session.get("catalogue"):
            parts.append(_catalogue(session.get("catalogue")))
        return _write_doc(out, "msprobe report", parts)
    base = out.parent.resolve()
    tests = mapping(session.get("tests"))
    # what the per-"test" entries are: pytest tests, or the ranks of a merged multi-rank run
    unit = str(session.get("unit") or "test")
    parts = [tool_header(session, tool, tests, unit)]
    account = ProbeAccount.from_dict("probe", session["probe"]) if "probe" in session else None
    checked = account.checked if account is not None else None
    parts += findings_parts(lambda own: FindingsContext(session, tests, unit, base, checked, own),
                            list(TOOLS.values()), TOOLS[tool])
    if session.get("api_checks"):
        parts.append(api_checks_section(session.get("api_checks")))
    if session.get("catalogue"):
        parts.append(_catalogue(session.get("catalogue")))
    if any(mapping(t).get("graphs") for t in tests.values()):
        parts.append(graphs_section(tests, base))
    parts.append(tests_section(tests, tool, base, unit))
    if account is not None:
        parts.append(account_section(account, tool, unit))
    parts.append(errors_section(tests, unit))
    return _write_doc(out, f"msprobe report: {tool}", [p for p in parts if p])


def _catalogue(results: Any) -> str:
    from pytest_msprobe.reports.sections.catalogue import catalogue_section

    return catalogue_section(as_list(results))


@functools.lru_cache(maxsize=1)
def _css() -> str:
    return resources.files("pytest_msprobe.reports").joinpath("report.css").read_text(encoding="utf-8")


def _write_doc(out: Path, title: str, parts: list[str]) -> Path:
    from pytest_msprobe.reports.sections.catalogue import CSS as CATALOGUE_CSS

    doc = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
           f'<meta name="viewport" content="width=device-width, initial-scale=1">'
           f"<title>{esc(title)}</title><style>\n{_css()}{CATALOGUE_CSS}</style></head>\n<body><main>\n"
           + "\n".join(parts) + "\n</main></body></html>\n")
    # atomic: a CI job reading the report never sees half of it; 0644: it is meant to be shared
    return write_text_atomic(out, doc, mode=0o644)
