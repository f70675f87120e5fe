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


def npu_fusion_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, head_num: int,
                         input_layout: str, pse: Any = None, padding_mask: Any = None, atten_mask: Any = None,
                         scale: float = 1.0, keep_prob: float = 1.0, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
    """softmax(q k^T * scale, masked where atten_mask is True) v, per head, in the given layout
    (BSH, SBH, BSND, BNSD); with softmax_max / softmax_sum broadcast to (B, N, S, 8) as torch_npu
    returns them. Dropout (keep_prob < 1), pse, sparse modes and variable lengths have no
    reference here: the call is then skipped with that reason."""
    extra = {k: v for k, v in kwargs.items() if k in ("sparse_mode", "prefix", "actual_seq_qlen", "actual_seq_kvlen")
             and v not in (None, 0)}
    if keep_prob != 1.0 or pse is not None or padding_mask is not None or extra:
        raise NotImplementedError("npu_fusion_attention reference: only dense, dropout-free attention without "
                                  "pse is implemented")

    def bnsd(t: torch.Tensor) -> torch.Tensor:
        if input_layout == "BSH":
            return t.unflatten(-1, (head_num, -1)).permute(0, 2, 1, 3)
        if input_layout == "SBH":
            return t.unflatten(-1, (head_num, -1)).permute(1, 2, 0, 3)
        if input_layout == "BSND":
            return t.permute(0, 2, 1, 3)
        if input_layout == "BNSD":
            return t
        raise ValueError(f"npu_fusion_attention reference: input_layout={input_layout!r}; allowed: BSH, SBH, BSND, BNSD")

    compute = torch.promote_types(query.dtype, torch.float32)
    q, k, v = (bnsd(t).to(compute) for t in (query, key, value))
    scores = (q @ k.transpose(-2, -1)) * scale
    if atten_mask is not None:
        scores = scores.masked_fill(atten_mask.to(torch.bool), float("-inf"))
    top = scores.amax(-1, keepdim=True)
    p = (scores - top).exp()
    total = p.sum(-1, keepdim=True)
    out = (p / total) @ v
    b, n, s, d = out.shape
    if input_layout == "BSH":
        out = out.permute(0, 2, 1, 3).reshape(b, s, n * d)
    elif input_layout == "SBH":
        out = out.permute(2, 0, 1, 3).reshape(s, b, n * d)
    elif input_layout == "BSND":
        out = out.permute(0, 2, 1, 3)
    stats = (b, n, s, 8)
    return (out.to(query.dtype), top.expand(stats).to(torch.float32), total.expand(stats).to(torch.float32),
            out.new_zeros(0), 0, 0, 0)


def npu_quant_matmul(x1: torch.Tensor, x2: torch.Tensor, scale: torch.Tensor, *, offset: Any = None,
                     pertoken_scale: Any = None, bias: Any = None, output_dtype: Any = None) -> torch.Tensor:
    """(x1 @ x2) * scale [* pertoken_scale, one per row of x1] [+ bias] in float64, whatever the
    inputs' dtype: FP8 operands (or their exact float32/float64 copies) multiply exactly there and
    the sum's rounding is far below any output dtype's, so this is the value a correct kernel
    rounds once to ``output_dtype``; it is returned unrounded, as the reference of ``_scaled_mm`` is.

    ``scale`` is torch_npu's dequantisation scale, (1,) or one per column of x2, and a
    floating-point bias is added after it, as torch_npu documents for float scales. Not modelled
    (the call is then skipped with this reason): ``offset`` (the int8-output path), int64 scales
    from npu_trans_quant_param, and int32 bias, which is added before scaling."""
    if offset is not None or scale.dtype in (torch.int64, torch.uint64):
        raise NotImplementedError("npu_quant_matmul reference: offset and int64 (npu_trans_quant_param) scales "
                                  "are not modelled")
    if bias is not None and not bias.dtype.is_floating_point:
        raise NotImplementedError("npu_quant_matmul reference: an integer bias (added before scaling) is not modelled")
    out = torch.matmul(x1.to(torch.float64), x2.to(torch.float64)) * scale.to(torch.float64)
    if pertoken_scale is not None:
        out = out * pertoken_scale.to(torch.float64).unsqueeze(-1)
    if bias is not None:
        out = out + bias.to(torch.float64)
    return out


_REFERENCES: dict[str, Callable[..., Any]] = {
    "npu_fusion_attention": npu_fusion_attention,
    "npu_rms_norm": npu_rms_norm,
    "npu_swiglu": npu_swiglu,
    "npu_rotary_mul": npu_rotary_mul,
    "npu_quant_matmul": npu_quant_matmul,
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
