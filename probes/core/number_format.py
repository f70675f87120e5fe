"""How a figure reads in a report, a terminal line or a failure message: one rendering everywhere,
so the same number never shows as 0.0123 in one place and 1.23e-02 in another. (Files have their own,
exact formats: see the writers of each file.)"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["short_number"]


def short_number(value: Any, digits: int = 4, missing: str = "-", fixed: bool = False) -> str:
    """Floats to `digits` significant digits (inf/nan spelt out), None as `missing`, the rest as str.
    `fixed`: `digits` decimals instead, for a column of figures near 1 (similarities) that must
    line up and show how far below 1 each is."""
    if value is None:
        return missing
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.{digits}f}" if fixed else f"{value:.{digits}g}"
    return str(value)
