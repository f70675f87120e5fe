"""The signs (``g > 0``) of a step's gradients for the direction files, and whether NumPy can read a
gradient in place: on the CPU NumPy compares a gradient's memory straight into the step's host
array, where torch would make a bool tensor (slow on the CPU), concatenate and copy it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["HOST_SIGNS_ELEMENTS", "host_signs", "host_view", "signs"]


#: NumPy's comparison costs ~2 us a tensor and ~0.1 ns an element, torch's (a concatenation, a
#: bool kernel, bytes in the host copy) ~9 us in all and ~0.7 ns an element: NumPy's is cheaper once
#: the gradients average this many elements
HOST_SIGNS_ELEMENTS = 4096


def signs(flats: list[torch.Tensor]) -> Any:
    """The direction files' ``g > 0`` of flat gradients, concatenated: on the host when NumPy can
    read them in place and they are large enough for that to pay (`host_signs`), else by torch on
    their device (its bytes then travel in the step's one host copy)."""
    if sum(f.numel() for f in flats) >= HOST_SIGNS_ELEMENTS * len(flats):
        try:
            host = host_signs(flats)
        except (RuntimeError, TypeError, ValueError):  # a tensor NumPy refuses after all: torch's way
            host = None
        if host is not None:
            return host
    return (torch.cat(flats) if len(flats) > 1 else flats[0]) > 0


#: bfloat16's bit patterns of the positive non-NaN values, shifted down by one, are those below this
_BF16_POSITIVE_BELOW = np.uint16(0x7F80)


def host_signs(flats: list[torch.Tensor]) -> np.ndarray | None:
    """``g > 0`` of flat CPU gradients into one new host array, by NumPy reading the gradients'
    memory in place: torch's CPU comparison into a bool tensor costs several additions' time, and
    its result needs a concatenation and a host copy besides. NumPy's ``>`` has IEEE semantics
    (NaN and -0.0 are not positive), so the bytes are torch's. bfloat16, which NumPy lacks, is
    read by its bits: ``x > 0`` exactly when ``bits - 1`` (unsigned, wrapping) is below 0x7F80,
    i.e. the bits lie in [0x0001, 0x7F80], the positive numbers up to +inf. None when some
    gradient is not a plain CPU tensor NumPy can view."""
    for f in flats:
        if not host_view(f, _HOST_SIGN_DTYPES):
            return None
    out = np.empty(sum(f.numel() for f in flats), dtype=bool)
    pos = 0
    for f in flats:
        n = f.numel()
        if f.dtype == torch.bfloat16:
            bits = f.view(torch.int16).numpy().view(np.uint16)
            np.less(bits - np.uint16(1), _BF16_POSITIVE_BELOW, out=out[pos : pos + n])
        else:
            np.greater(f.numpy(), 0, out=out[pos : pos + n])
        pos += n
    return out


_HOST_SIGN_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_NUMPY_FLOATS = (torch.float16, torch.float32, torch.float64)  # the dtypes NumPy has


def host_view(g: torch.Tensor, dtypes: tuple[torch.dtype, ...] = _NUMPY_FLOATS) -> bool:
    """Whether NumPy can read ``g``'s memory in place: a plain CPU tensor of one of ``dtypes``."""
    return (
        type(g) is torch.Tensor
        and g.dtype in dtypes
        and g.device.type == "cpu"
        and not g.requires_grad
        and not g.is_neg()
    )
