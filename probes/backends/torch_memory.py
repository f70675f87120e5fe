"""Whether a probe's extra copies of one call fit in the memory left.

A probe re-runs a call (free_benchmark) or copies its tensors to a float64 reference
(online_dispatch): its tensors exist twice, or more, for a moment. A test that already uses most
of the machine's memory would then be killed by the kernel's out-of-memory killer, taking the
whole pytest session, its report and every later test with it. Calls whose copies are large are
first measured against the memory left on their device, and skipped with the reason when they
would not fit. Small calls (most) pay one sum of sizes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

_STRIDED = torch.strided

#: calls whose extra copies stay under this size are never measured against the memory left
SMALL_BYTES = 64 << 20
#: the copies may take at most this share of the memory left
SHARE = 0.5
TOO_LARGE = ("too large for the memory left: its copies need about {need:.1f} GiB with {left:.1f} GiB available "
             "on {device}")


def tensor_bytes(tensors: Iterable[Any]) -> int:
    return sum(t.nbytes for t in tensors if isinstance(t, torch.Tensor) and t.layout is _STRIDED and not t.is_nested)


def available_bytes(device: torch.device) -> int | None:
    """Free memory of the device (the host's MemAvailable for the CPU); None when unknown."""
    try:
        if device.type == "cuda":
            return torch.cuda.mem_get_info(device)[0]
        if device.type == "cpu":
            with open("/proc/meminfo", encoding="ascii") as fh:
                for line in fh:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
    except Exception:
        return None
    return None


def too_large(need: int, device: torch.device) -> str | None:
    """The skip reason when `need` bytes of copies would not fit on `device`, else None."""
    if need < SMALL_BYTES:
        return None
    left = available_bytes(device)
    if left is None or need <= SHARE * left:
        return None
    return TOO_LARGE.format(need=need / 2**30, left=left / 2**30, device=device)
