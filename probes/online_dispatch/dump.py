""".npy dumps of one op call, with the reference's file names.

* inputs -> ``npu/{op}_{idx}_input.{i}[.{j}].npy`` (kwargs: ``{op}_{idx}_input_{key}``): the values the
  op received, taken before anything ran (the reference dumped in-place ops' inputs after the
  CPU run had mutated them), in the device dtype (bf16 / fp8 as float32,
  which numpy can hold; the reference copies are exact upcasts, so nothing is lost);
* outputs -> ``npu/{op}_{idx}_output[.{i}].npy`` (device result) and ``cpu/…`` (reference result).

Python bool/int/float scalars are saved as 0-d arrays; None, strings, dtypes are not saved.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

FILE_MODE = 0o640
_NUMPY_UNSUPPORTED = {torch.bfloat16}
for _name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"):
    if hasattr(torch, _name):
        _NUMPY_UNSUPPORTED.add(getattr(torch, _name))


def _array(x: Any, like_dtype: torch.dtype | None = None) -> np.ndarray | None:
    if isinstance(x, torch.Tensor):
        t = x.detach()
        if like_dtype is not None and like_dtype != t.dtype:
            t = t.to(like_dtype)
        if t.dtype in _NUMPY_UNSUPPORTED:
            t = t.to(torch.float32)
        return t.to("cpu").resolve_conj().resolve_neg().numpy()
    if isinstance(x, (bool, int, float)):
        return np.asarray(x)
    return None


def _save(path: Path, arr: np.ndarray) -> None:
    with open(path, "wb") as fh:
        np.save(fh, arr, allow_pickle=False)
    try:
        os.chmod(path, FILE_MODE)
    except OSError:
        pass


def _save_tree(folder: Path, name: str, ref: Any, dev: Any) -> int:
    """Save `ref` (a reference copy) in `dev`'s dtype; lists/tuples recurse with `.{i}`."""
    if isinstance(ref, (list, tuple)):
        devs = dev if isinstance(dev, (list, tuple)) else [None] * len(ref)
        return sum(_save_tree(folder, f"{name}.{i}", r, d) for i, (r, d) in enumerate(zip(ref, devs)))
    arr = _array(ref, dev.dtype if isinstance(dev, torch.Tensor) else None)
    if arr is None:
        return 0
    _save(folder / f"{name}.npy", arr)
    return 1


def dump_inputs(run_dir: Path, prefix: str, ref_args: tuple, ref_kwargs: dict, dev_args: tuple, dev_kwargs: dict) -> int:
    folder = run_dir / "npu"
    n = 0
    for i, (r, d) in enumerate(zip(ref_args, dev_args)):
        n += _save_tree(folder, f"{prefix}_input.{i}", r, d)
    for k, r in ref_kwargs.items():
        n += _save_tree(folder, f"{prefix}_input_{k}", r, dev_kwargs.get(k))
    return n


def dump_outputs(run_dir: Path, leaves: list[tuple[str, torch.Tensor, torch.Tensor]]) -> int:
    """(name, device leaf, reference leaf) -> npu/name.npy and cpu/name.npy."""
    for name, dev, ref in leaves:
        _save(run_dir / "npu" / f"{name}.npy", _array(dev))
        _save(run_dir / "cpu" / f"{name}.npy", _array(ref))
    return 2 * len(leaves)
