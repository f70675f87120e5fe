"""Reading the report's inline SVG plots in tests: parsed as the XML they must be, and their
elements found by the classes plots.py gives them (p-bar, p-off, p-ref, p-label, ...)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

NS = "{http://www.w3.org/2000/svg}"


def parsed(svg: str) -> ET.Element:
    """A plot as the XML it must be (a name that escaped its escaping fails here), with its
    accessible name (aria-label and title) and its pixel size checked."""
    root = ET.fromstring(svg)
    assert root.tag == f"{NS}svg" and root.get("role") == "img" and root.get("class") == "plot"
    assert root.findtext(f"{NS}title") == root.get("aria-label") != ""
    w, h = int(root.get("width")), int(root.get("height"))
    assert w > 0 and h > 0 and root.get("viewBox") == f"0 0 {w} {h}"
    return root


def having(root: ET.Element, cls: str) -> list[ET.Element]:
    """A plot's elements of one kind."""
    return [e for e in root.iter() if cls in (e.get("class") or "").split()]


def texts(root: ET.Element, cls: str) -> list[str]:
    return ["".join(e.itertext()).replace("\u00a0", " ") for e in having(root, cls)]
