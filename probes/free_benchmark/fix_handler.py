"""fix mode's substitution: the re-run's (upcast) result put into the user's output tensors."""

from __future__ import annotations

from typing import Any

from probes.core.leaf_verdicts import StructureMismatch
from probes.core.trees import iter_leaves


def substitute(b: Any, out: Any, pert_out: Any) -> None:
    """Substitute the upcast result in the user's output tensors (their autograd graph is kept).
    Every replacement is computed before any is assigned, so a failure leaves the output whole
    (msprobe's fix left it half-modified)."""
    pairs = []
    pert_leaves = dict(iter_leaves(pert_out))
    for path, leaf in iter_leaves(out):
        new = pert_leaves.get(path)
        if b.is_tensor(leaf) and b.is_float(leaf) and b.is_tensor(new):
            if b.shape(new) != b.shape(leaf):
                raise StructureMismatch(f"fix: output {path} has shape {b.shape(new)}, expected {b.shape(leaf)}")
            pairs.append((leaf, b.cast_like(new, leaf)))
    for leaf, new in pairs:
        b.replace_data(leaf, new)
