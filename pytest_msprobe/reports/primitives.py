"""The report's building blocks: escaping, formatting, tables, badges, cards and evidence links.

A leaf (no section, no plot) so that every section, the catalogue's included, draws
with the same pieces without importing the page that assembles them. Every string from a session
goes through `esc`: API names, test ids, paths and messages come from user code. Cells handed to
`table` are HTML already, escaped by whoever built them.
"""

from __future__ import annotations

import hashlib
import html
import math
import os
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from probes.core.number_format import short_number

# Bounds that keep a report of a huge suite readable and small; what is left out is counted.
TABLE_MAX_ROWS = 500
CELL_LIST_MAX = 5
LABEL_MAX_CHARS = 56

RED, BLUE, DARK_RED = "#c0392b", "#3b6ea8", "#7b1010"
MISSING = '<span class="muted">\u2014</span>'
EVIDENCE_KEYS = ("csv_files", "dump_paths")


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def mapping(value: Any) -> Mapping[str, Any]:
    """A summary value that should be a mapping, or an empty one: an old or hand-edited
    summary.json must cost a section its content, not the whole report."""
    return value if isinstance(value, Mapping) else {}


def as_list(value: Any) -> list[Any]:
    """A summary value that should be a list (one string is one item, not its characters)."""
    if value is None or isinstance(value, (str, bytes, Mapping)):
        return [] if value is None or value == "" else [value]
    try:
        return list(value)
    except TypeError:
        return [value]


def finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def as_int(v: Any) -> int:
    return int(v) if finite(v) else 0


def fmt(v: Any) -> str:
    return short_number(v, missing="\u2014")


def shorten(text: str, limit: int = LABEL_MAX_CHARS) -> str:
    """Keep both ends of a long name: the module prefix and the call index both matter."""
    if len(text) <= limit:
        return text
    keep = limit - 1
    return text[: keep // 2] + "\u2026" + text[len(text) - (keep - keep // 2):]


def code(value: Any) -> str:
    """A name in monospace that may wrap after its separators (API names, test ids)."""
    text = esc(value)
    for sep in (".", "/", "::", "_"):
        text = text.replace(sep, sep + "<wbr>")
    return f"<code>{text}</code>"


def cell_list(items: Sequence[Any], limit: int = CELL_LIST_MAX) -> str:
    """Names in a cell, the first `limit` of them and a count of the rest (a cell stays short)."""
    shown = [code(x) for x in items[:limit]]
    if len(items) > limit:
        shown.append(f'<span class="muted">+{len(items) - limit} more</span>')
    return "<br>".join(shown) if shown else MISSING


def more(n: int, what: str) -> str:
    """The line that says how much a bounded list left out (nothing when it left nothing)."""
    return f'<p class="muted">\u2026 and {n} more {esc(what)} (all of them are in summary.json).</p>' if n > 0 else ""


def table(header: Sequence[str], rows: Iterable[Sequence[str]], cls: str = "", raw_header: bool = False) -> str:
    """``rows`` hold HTML already escaped by the caller (``header`` too with ``raw_header``)."""
    head = "".join(f"<th>{h if raw_header else esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def badge(text: str, kind: str) -> str:
    return f'<span class="badge {kind}">{esc(text)}</span>'


def cards(counts: Sequence[tuple[str, int, str]]) -> str:
    """Big numbers in a row: (label, count, kind), kind one of "", "good", "bad", "warn"."""
    inner = "".join(f'<div class="card {kind}"><div class="num">{n}</div><div>{esc(label)}</div></div>'
                    for label, n, kind in counts)
    return f'<div class="cards">{inner}</div>'


def anchor(nodeid: str) -> str:
    """A short id for a test's place in the page: test ids hold characters an id must not."""
    return hashlib.sha1(nodeid.encode("utf-8", "replace")).hexdigest()[:12]


def href(path: Any, base: Path) -> str:
    """A link to an evidence file relative to the report's folder (URL-quoted, so a path can
    never turn into a ``javascript:`` or other scheme)."""
    text = str(path)
    p = Path(text)
    if p.is_absolute():
        try:
            text = os.path.relpath(p, base)
        except ValueError:  # another drive (Windows): no relative path exists
            return esc(p.as_uri())
    return esc(urllib.parse.quote(text.replace(os.sep, "/"), safe="/"))


def link_text(path: Any, base: Path) -> str:
    p = Path(str(path))
    if p.is_absolute():
        try:
            return os.path.relpath(p, base)
        except ValueError:
            return str(p)
    return str(p)


def evidence_links(entry: Mapping[str, Any], base: Path) -> str:
    """A test's evidence files and folders, linked relative to the report (so the dump can move)."""
    files = [f for key in EVIDENCE_KEYS for f in as_list(entry.get(key))]
    links = [f'<a href="{href(f, base)}">{esc(shorten(link_text(f, base), 80))}</a>' for f in files[:CELL_LIST_MAX]]
    if len(files) > CELL_LIST_MAX:
        links.append(f'<span class="muted">+{len(files) - CELL_LIST_MAX} more</span>')
    return "<br>".join(links) if links else MISSING
