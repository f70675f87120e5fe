"""CPU references for torch_npu's fused operators.

torch_npu's ``npu_*`` operators have no CPU kernel, so a probe that re-runs a call on the CPU
(free_benchmark's to_cpu, improve_precision of a float32 call on a device without float64,
preheat's CPU sample; online_dispatch's reference) cannot call the operator itself. For the
operators below it runs their documented math instead, written with ATen operators in the
inputs' dtype: given float64 inputs it is a float64 reference. An operator not listed here is
reported as having no CPU reference (a skip with that reason), never as a failure.

The formulas follow torch_npu's operator documentation; they are the definition the fused
kernel approximates, not a copy of any kernel.
"""

from __future__ import annotations

from typing import Any, Callable

import torch


def npu_rms_norm(x: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """(x * rstd * gamma, rstd), rstd = 1 / sqrt(mean(x^2 over gamma's trailing dims) + epsilon)."""
    dims = tuple(range(x.dim() - gamma.dim(), x.dim()))
    compute = torch.promote_types(x.dtype, torch.float32)
    xc = x.to(compute)
    rstd = torch.rsqrt(xc.pow(2).mean(dim=dims, keepdim=True) + epsilon)
    return (xc * rstd * gamma.to(compute)).to(x.dtype), rstd


def npu_swiglu(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """silu(a) * b for the two halves a, b of x along dim."""
    a, b = torch.chunk(x, 2, dim=dim)
    return torch.nn.functional.silu(a) * b


def npu_rotary_mul(x: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor, rotary_mode: str = "half") -> torch.Tensor:
    """x * r1 + rotate(x) * r2: rotate_half (-x2, x1) for rotary_mode "half", the pairwise
    (-x_odd, x_even) interleave for "interleave"."""
    if rotary_mode == "half":
        x1, x2 = torch.chunk(x, 2, dim=-1)
        rotated = torch.cat((-x2, x1), dim=-1)
    elif rotary_mode == "interleave":
        pairs = x.unflatten(-1, (-1, 2))
        rotated = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    else:
        raise ValueError(f"npu_rotary_mul reference: rotary_mode={rotary_mode!r}; allowed: 'half', 'interleave'")
    return x * r1 + rotated * r2


_REFERENCES: dict[str, Callable[..., Any]] = {
    "npu_rms_norm": npu_rms_norm,
    "npu_swiglu": npu_swiglu,
    "npu_rotary_mul": npu_rotary_mul,
}

#: the fused operators that have a CPU reference here
SUPPORTED = tuple(sorted(_REFERENCES))


def reference_for(name: str) -> Callable[..., Any] | None:
    """The CPU reference of a torch_npu operator, by its Python name (``npu_rms_norm``) or its op
    name (``npu::npu_rms_norm``, ``npu::npu_rms_norm.default``); None when there is none."""
    base = name.split("::")[-1].split(".")[0]
    return _REFERENCES.get(base)


def no_reference_reason(name: str) -> str:
    return (f"{name} has no CPU kernel and no CPU reference in probes/backends/npu_references.py "
            f"(references exist for {', '.join(SUPPORTED)})")
