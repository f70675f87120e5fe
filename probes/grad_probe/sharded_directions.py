"""The direction data of a sharded run, reassembled for the comparator (numpy only).

Under FSDP2 or tensor parallelism each rank writes the signs of its own slice of a parameter's
gradient (``rank{R}/step{N}/{param}.npy``) and, beside them, ``shards.json`` saying where the slice
sits in the full parameter (see :func:`probes.grad_probe.csv_format.slice_entry`). A replicated
slice is written by one rank only. To compare such a run with any other (a DDP run, another
sharding) the comparator needs the signs of the full parameter: :class:`ShardedRun` puts every
rank's slices of one parameter and step back together, with a mask of the elements some rank
wrote (all of them, unless a rank filter left ranks out or a rank's files are missing).
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from probes.grad_probe.csv_format import SLICES_JSON, file_name_for_param, slice_indices

log = logging.getLogger("probes.grad_probe.comparator")

#: reassembled parameters kept for the next rank's comparison, at most this many bytes
CACHE_BYTES = 256 << 20


class Assembled(NamedTuple):
    """A parameter's full direction data at one step of a sharded run (read on demand)."""

    run: ShardedRun
    step: int
    param: str

    def load(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(signs, covered) in the full shape; None when a slice is unreadable or inconsistent."""
        return self.run.assemble(self.step, self.param)


class ShardedRun:
    """Every rank's ``shards.json`` of one dump: which slices of which parameter each step holds."""

    def __init__(self, ranks: dict[int, Path], step_dirs: Any) -> None:
        self.slices: dict[int, dict[str, list[tuple[Path, dict[str, Any]]]]] = {}
        self.notes: list[str] = []
        self._cache: OrderedDict[tuple[int, str], tuple[np.ndarray, np.ndarray] | None] = OrderedDict()
        self._cached_bytes = 0
        for rank, folder in sorted(ranks.items()):
            for step, step_dir in step_dirs(folder).items():
                path = step_dir / SLICES_JSON
                if not path.is_file():
                    continue
                try:
                    params = json.loads(path.read_text(encoding="utf-8"))["params"]
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    self.notes.append(f"rank {rank} step {step}: {SLICES_JSON} unreadable ({exc}); its slices are left out")
                    continue
                for name, entry in params.items():
                    where = step_dir / f"{file_name_for_param(name)}.npy"
                    self.slices.setdefault(step, {}).setdefault(name, []).append((where, entry))

    @classmethod
    def of(cls, ranks: dict[int, Path], step_dirs: Any) -> ShardedRun | None:
        """The sharded data of a dump, or None when no rank wrote any (an unsharded run)."""
        run = cls(ranks, step_dirs)
        return run if run.slices else None

    @property
    def steps(self) -> list[int]:
        return sorted(self.slices)

    def params(self, step: int) -> list[str]:
        return list(self.slices.get(step, {}))

    def assembled(self, step: int, param: str) -> Assembled:
        return Assembled(self, step, param)

    def assemble(self, step: int, param: str) -> tuple[np.ndarray, np.ndarray] | None:
        key = (step, param)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        value = self._assemble(step, param)
        size = 0 if value is None else 2 * value[0].size
        if size <= CACHE_BYTES:
            self._cache[key] = value
            self._cached_bytes += size
            while self._cached_bytes > CACHE_BYTES:
                _old, dropped = self._cache.popitem(last=False)
                self._cached_bytes -= 0 if dropped is None else 2 * dropped[0].size
        return value

    def _assemble(self, step: int, param: str) -> tuple[np.ndarray, np.ndarray] | None:
        pieces = self.slices.get(step, {}).get(param, [])
        shapes = {tuple(int(s) for s in entry.get("shape", ())) for _path, entry in pieces}
        if len(shapes) != 1:
            log.warning("%s at step %d: the ranks' slices disagree on the full shape %s", param, step, sorted(shapes))
            return None
        shape = shapes.pop()
        signs = np.zeros(shape, dtype=bool)
        covered = np.zeros(shape, dtype=bool)
        for path, entry in pieces:
            try:
                index = slice_indices(entry)
                part = np.load(path, allow_pickle=False)
            except (OSError, ValueError, EOFError) as exc:
                log.warning("%s at step %d: cannot read the slice %s: %s", param, step, path, exc)
                return None
            if isinstance(index, range):  # positions in the flattened parameter
                if part.dtype != np.bool_ or part.size != len(index):
                    log.warning("%s at step %d: %s holds %s %s, shards.json says %d elements", param, step, path,
                                part.dtype, part.shape, len(index))
                    return None
                signs.reshape(-1)[index.start : index.stop] = part.reshape(-1)
                covered.reshape(-1)[index.start : index.stop] = True
                continue
            want = tuple(len(i) for i in index)
            if part.dtype != np.bool_ or part.shape != want:
                log.warning("%s at step %d: %s holds %s %s, shards.json says %s", param, step, path, part.dtype,
                            part.shape, want)
                return None
            where = _where(index)
            signs[where] = part
            covered[where] = True
        return signs, covered


def _where(index: tuple[Any, ...]) -> Any:
    """A numpy index selecting the slice: plain slices when every dimension is a contiguous run."""
    if all(isinstance(i, range) for i in index):
        return tuple(slice(i.start, i.stop) for i in index)
    return np.ix_(*[np.asarray(i, dtype=np.int64) for i in index])
