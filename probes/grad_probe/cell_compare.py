"""One cell of a comparison: one parameter at one step of two runs, judged by its direction files
(the share of elements whose gradient sign agrees) or, at L0, by its CRC-32 ``MD5`` cell.

Each function answers a status (:mod:`probes.grad_probe.comparison`) instead of raising, so one
missing file or shape mismatch never stops the comparison of the other parameters.
"""

from __future__ import annotations

import re

import numpy as np

from probes.grad_probe.comparison import (
    ABSENT,
    EMPTY,
    MD5_DIFFERS,
    MD5_EQUAL,
    MISSING_A,
    MISSING_B,
    NOT_BOOL,
    OK,
    SHAPE_MISMATCH,
    UNREADABLE,
)
from probes.grad_probe.dump_reader import Signs, StepCsv, load_signs


def compare_arrays(pa: Signs | None, pb: Signs | None) -> tuple[str, int, int]:
    """(status, same, total) for one parameter at one step. With a sharded run on either side,
    only the elements both runs hold count (all of them, unless slices are missing)."""
    if pa is None and pb is None:
        return ABSENT, 0, 0
    if pa is None:
        return MISSING_A, 0, 0
    if pb is None:
        return MISSING_B, 0, 0
    (a, held_a), (b, held_b) = load_signs(pa), load_signs(pb)
    if a is None or b is None or not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray):
        return UNREADABLE, 0, 0
    if a.shape != b.shape:
        return SHAPE_MISMATCH, 0, 0
    if a.dtype != np.bool_ or b.dtype != np.bool_:
        return NOT_BOOL, 0, 0
    if held_a is not None or held_b is not None:
        held = held_a if held_b is None else held_b if held_a is None else held_a & held_b
        total = int(np.count_nonzero(held))
        if total == 0:
            return (EMPTY, 0, 0) if a.size == 0 else (MISSING_A if held_a is not None and not held_a.any() else
                                                       MISSING_B, 0, 0)
        return OK, int(np.count_nonzero((a == b) & held)), total
    total = int(a.size)
    if total == 0:
        return EMPTY, 0, 0
    same = int(np.count_nonzero(a == b))
    return OK, same, total


def compare_md5(name: str, ca: StepCsv, cb: StepCsv) -> tuple[str, int, int]:
    """(status, same, total) of an L0 parameter: all or none of its elements, by hash equality,
    weighted by its element count so that the step summary is not ruled by the small ones."""
    in_a = name in ca.md5
    in_b = name in cb.md5
    if not in_a and not in_b:
        return ABSENT, 0, 0
    if not in_a:
        return MISSING_A, 0, 0
    if not in_b:
        return MISSING_B, 0, 0
    ha, hb = ca.md5[name], cb.md5[name]
    if not ha or not hb:
        return UNREADABLE, 0, 0
    sa, sb = ca.shape.get(name, ""), cb.shape.get(name, "")
    na, nb = numel(sa), numel(sb)
    if sa and sb and (na, sa.replace(" ", "")) != (nb, sb.replace(" ", "")):
        return SHAPE_MISMATCH, 0, 0
    weight = na if na is not None else 1
    return (MD5_EQUAL, weight, weight) if ha == hb else (MD5_DIFFERS, 0, weight)


def numel(shape_text: str) -> int | None:
    """The element count of a ``shape`` cell such as ``[3, 4]`` (``[]``: a scalar); None when the
    cell is not a shape."""
    text = shape_text.strip()
    if not (text.startswith("[") and text.endswith("]")):
        return None
    inner = text[1:-1].strip()
    if not inner:
        return 1
    dims = re.findall(r"-?\d+", inner)
    if not dims:
        return None
    return int(np.prod([int(d) for d in dims], dtype=np.int64))
