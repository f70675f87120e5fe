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

from probes.backends.torch_flat import flat_call, total

_STRIDED = torch.strided
_PLAIN = (torch.Tensor, torch.nn.Parameter)

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


def copies_too_large(args: tuple, kwargs: dict, out: Any) -> str | None:
    """Why re-running this call would not fit: a re-run holds about twice the call's tensors
    again (a raised dtype, the perturbed output, the figures' temporaries); None when it fits."""
    if type(out) in _PLAIN and flat_call(args, kwargs):  # the usual call, summed in C (torch_flat)
        try:  # (a plain tensor of a sparse layout has no nbytes)
            need = 2 * (total(args, "nbytes") + (total(kwargs.values(), "nbytes") if kwargs else 0) + out.nbytes)
        except RuntimeError:
            need = None
        if need is not None and need < SMALL_BYTES:
            return None
    tensors: list[torch.Tensor] = []
    for tree in (args, kwargs, out):
        _tensors_in(tree, tensors)
    if not tensors:
        return None
    return too_large(2 * tensor_bytes(tensors), tensors[0].device)


def _tensors_in(tree: Any, found: list[torch.Tensor]) -> None:
    """The tensors of an argument or output tree, appended to `found` (no paths: only sizes are
    wanted)."""
    if isinstance(tree, torch.Tensor):
        found.append(tree)
    elif isinstance(tree, (list, tuple)):
        for x in tree:
            _tensors_in(x, found)
    elif isinstance(tree, dict):
        for x in tree.values():
            _tensors_in(x, found)
