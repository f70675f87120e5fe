"""The fused operators' math, the simulated NPU's stand-in for torch_npu's kernels: the clean
computation and the seeded ``"reduced_precision"`` defect, which a precision tool is tested on.
Kept apart from how the operators are registered (:mod:`pytest_msprobe.testing.simulated_npu_torch_npu`)
so the numerics can be read, and changed, on their own."""

from __future__ import annotations

from typing import Any, Callable, Dict

import torch

from pytest_msprobe.testing.simulated_npu_device import SimulatedNPUError

# The fused kernels are written with ATen operators (torch.ops.aten), not torch.* functions or
# Tensor methods: a tool that hooks those (free_benchmark patches torch.rsqrt, Tensor.pow...)
# must see one fused call, as on the hardware, not the simulation's insides.
_aten = torch.ops.aten


def _compute_dtype(x: torch.Tensor, reduced: bool) -> torch.dtype:
    # the clean kernels accumulate in float32 (as Ascend's do for half inputs); the seeded defect
    # computes in bfloat16 whatever the input
    return torch.bfloat16 if reduced else torch.promote_types(x.dtype, torch.float32)


def _cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return _aten._to_copy.default(x, dtype=dtype)


def _rms_norm(x: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6, reduced: bool = False) -> Any:
    dims = list(range(x.dim() - gamma.dim(), x.dim()))
    compute = _compute_dtype(x, reduced)
    xc = _cast(x, compute)
    mean_sq = _aten.mean.dim(_aten.mul.Tensor(xc, xc), dims, True)
    rstd = _aten.rsqrt.default(_aten.add.Scalar(mean_sq, epsilon))
    y = _aten.mul.Tensor(_aten.mul.Tensor(xc, rstd), _cast(gamma, compute))
    return _cast(y, x.dtype), _cast(rstd, torch.float32)


def _swiglu(x: torch.Tensor, dim: int = -1, reduced: bool = False) -> torch.Tensor:
    a, b = _aten.chunk.default(_cast(x, _compute_dtype(x, reduced)), 2, dim)
    return _cast(_aten.mul.Tensor(_aten.silu.default(a), b), x.dtype)


def _rotary_mul(x: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor, reduced: bool = False) -> torch.Tensor:
    """torch_npu's rotary_mode "half": x * r1 + rotate_half(x) * r2."""
    compute = _compute_dtype(x, reduced)
    xc = _cast(x, compute)
    x1, x2 = _aten.chunk.default(xc, 2, -1)
    rotated = _aten.cat.default([_aten.neg.default(x2), x1], -1)
    out = _aten.add.Tensor(_aten.mul.Tensor(xc, _cast(r1, compute)), _aten.mul.Tensor(rotated, _cast(r2, compute)))
    return _cast(out, x.dtype)


_TO_BNSD = {"BNSD": None, "BSND": (0, 2, 1, 3), "BSH": "BSH", "SBH": "SBH"}


def _fusion_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, head_num: int, input_layout: str,
                      pse: Any = None, padding_mask: Any = None, atten_mask: Any = None, scale: float = 1.0,
                      keep_prob: float = 1.0, pre_tockens: int = 2147483647, next_tockens: int = 2147483647,
                      inner_precise: int = 0, prefix: Any = None, actual_seq_qlen: Any = None,
                      actual_seq_kvlen: Any = None, sparse_mode: int = 0, gen_mask_parallel: bool = True,
                      sync: bool = False, reduced: bool = False) -> Any:
    """The subset of torch_npu.npu_fusion_attention that is simulated: layouts BSH, SBH, BSND,
    BNSD; a boolean atten_mask (True: not attended); no dropout, pse, sparse modes or varlen."""
    if input_layout not in _TO_BNSD:
        raise SimulatedNPUError(f"npu_fusion_attention: input_layout={input_layout!r}; simulated: {sorted(_TO_BNSD)}")
    unsupported = {"keep_prob": keep_prob != 1.0, "pse": pse is not None, "padding_mask": padding_mask is not None,
                   "sparse_mode": sparse_mode != 0, "prefix": prefix is not None,
                   "actual_seq_qlen": actual_seq_qlen is not None, "actual_seq_kvlen": actual_seq_kvlen is not None}
    given = [k for k, bad in unsupported.items() if bad]
    if given:
        raise SimulatedNPUError(f"npu_fusion_attention: {', '.join(given)} not simulated (dropout-free, dense only)")
    compute = _compute_dtype(query, reduced)

    def bnsd(t: torch.Tensor) -> torch.Tensor:
        if input_layout == "BSH":
            b, s, h = t.shape
            return _aten.permute.default(_aten.reshape.default(t, [b, s, head_num, h // head_num]), [0, 2, 1, 3])
        if input_layout == "SBH":
            s, b, h = t.shape
            return _aten.permute.default(_aten.reshape.default(t, [s, b, head_num, h // head_num]), [1, 2, 0, 3])
        order = _TO_BNSD[input_layout]
        return t if order is None else _aten.permute.default(t, list(order))

    q, k, v = (_cast(bnsd(t), compute) for t in (query, key, value))
    scores = _aten.mul.Scalar(_aten.matmul.default(q, _aten.transpose.int(k, -2, -1)), scale)
    if atten_mask is not None:
        scores = _aten.masked_fill.Scalar(scores, _cast(atten_mask, torch.bool), float("-inf"))
    top = _aten.amax.default(scores, [-1], True)
    p = _aten.exp.default(_aten.sub.Tensor(scores, top))
    total = _aten.sum.dim_IntList(p, [-1], True)
    out = _aten.matmul.default(_aten.div.Tensor(p, total), v)  # B, N, S, D
    b, n, s, d = out.shape
    if input_layout == "BSH":
        out = _aten.reshape.default(_aten.permute.default(out, [0, 2, 1, 3]), [b, s, n * d])
    elif input_layout == "SBH":
        out = _aten.reshape.default(_aten.permute.default(out, [2, 0, 1, 3]), [s, b, n * d])
    elif input_layout == "BSND":
        out = _aten.permute.default(out, [0, 2, 1, 3])
    stats_shape = [b, n, s, 8]
    softmax_max = _cast(_aten.expand.default(top, stats_shape), torch.float32)
    softmax_sum = _cast(_aten.expand.default(total, stats_shape), torch.float32)
    empty = _aten.new_zeros.default(softmax_max, [0])
    return _cast(_aten.contiguous.default(out), query.dtype), softmax_max, softmax_sum, empty


_FP8 = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n))
_QUANT_OUTPUTS = (torch.float16, torch.bfloat16, torch.float32)


def _quant_matmul_refusal(x1: torch.Tensor, x2: torch.Tensor, scale: torch.Tensor, offset: Any,
                          pertoken_scale: Any, bias: Any, output_dtype: Any) -> str | None:
    """Why a call is outside the simulated subset of npu_quant_matmul, or None."""
    if x1.dtype not in _FP8 or x2.dtype not in _FP8:
        return f"x1/x2 of {x1.dtype}/{x2.dtype}; simulated: FP8 ({', '.join(map(str, _FP8))}), not int8/int4"
    if not (2 <= x1.dim() <= 6 and 2 <= x2.dim() <= 6) or x1.shape[-1] != x2.shape[-2]:
        return f"x1 {list(x1.shape)} and x2 {list(x2.shape)} are not (..., m, k) and (..., k, n), 2 to 6 dims"
    m, n = x1.shape[-2], x2.shape[-1]
    if scale.dim() != 1 or scale.numel() not in (1, n) or not scale.dtype.is_floating_point:
        return f"scale of shape {list(scale.shape)} and {scale.dtype}; simulated: float, (1,) or (n,) = ({n},)"
    if offset is not None:
        return "offset (the int8-output path) is not simulated"
    if pertoken_scale is not None and (pertoken_scale.dim() != 1 or pertoken_scale.numel() != m):
        return f"pertoken_scale of shape {list(pertoken_scale.shape)}; expected (m,) = ({m},)"
    if bias is not None and (bias.dim() not in (1, 3) or bias.shape[-1] != n or not bias.dtype.is_floating_point):
        return f"bias of shape {list(bias.shape)} and {bias.dtype}; simulated: float, (n,) or (batch, 1, n)"
    if output_dtype not in _QUANT_OUTPUTS:
        return f"output_dtype={output_dtype}; simulated: {', '.join(map(str, _QUANT_OUTPUTS))} (not int8)"
    return None


def _quant_matmul(x1: torch.Tensor, x2: torch.Tensor, scale: torch.Tensor, offset: Any = None,
                  pertoken_scale: Any = None, bias: Any = None, output_dtype: Any = None,
                  reduced: bool = False) -> torch.Tensor:
    """The FP8 subset of torch_npu.npu_quant_matmul: (x1 @ x2) * scale [* pertoken_scale per row]
    [+ bias], accumulated in float32 and rounded once to output_dtype. Floating-point bias is added
    after dequantisation, the convention torch_npu documents for float scales; whether Ascend's FP8
    kernels place it there too is not verified here. The seeded defect keeps the running sum, and
    the epilogue, in bfloat16 (one rounding per term), as a kernel with too narrow an accumulator."""
    why = _quant_matmul_refusal(x1, x2, scale, offset, pertoken_scale, bias, output_dtype)
    if why is not None:
        raise SimulatedNPUError(f"npu_quant_matmul: {why}")
    compute = torch.bfloat16 if reduced else torch.float32
    a, b = _cast(x1, compute), _cast(x2, compute)
    if reduced:  # FP8 products are exact in bfloat16; the sum is what rounds
        acc = _aten.mul.Tensor(_aten.narrow.default(a, -1, 0, 1), _aten.narrow.default(b, -2, 0, 1))
        for i in range(1, a.shape[-1]):
            acc = _aten.add.Tensor(acc, _aten.mul.Tensor(_aten.narrow.default(a, -1, i, 1),
                                                         _aten.narrow.default(b, -2, i, 1)))
    else:
        acc = _aten.matmul.default(a, b)
    acc = _aten.mul.Tensor(acc, _cast(scale, compute))
    if pertoken_scale is not None:
        acc = _aten.mul.Tensor(acc, _aten.unsqueeze.default(_cast(pertoken_scale, compute), -1))
    if bias is not None:
        acc = _aten.add.Tensor(acc, _cast(bias, compute))
    return _cast(acc, output_dtype)


#: operator name -> its math, called with ``reduced=`` for the seeded defect (the keys are the
#: operators the torch_npu stand-in defines)
KERNELS: Dict[str, Callable[..., Any]] = {"npu_fusion_attention": _fusion_attention,
                                          "npu_rms_norm": _rms_norm, "npu_swiglu": _swiglu,
                                          "npu_rotary_mul": _rotary_mul, "npu_quant_matmul": _quant_matmul}
