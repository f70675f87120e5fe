"""FP8 in the catalogue: ``torch._scaled_mm`` and the casts to FP8, in ulps of their output dtype.

``_scaled_mm`` has no float64 kernel, so its reference is its definition, the dequantised
operands multiplied in float64 (probes.backends.fp8_references.scaled_mm, the one
online_dispatch uses). Its cases are named by operand formats and scaling, its dtype is the
output's (bfloat16, float16, float32); the operands are made as FP8 training makes them (amax
scaling per tensor, or one scale per row of the left operand and column of the right), with
K from 64 to 1,024 terms, so the accumulating family's test ratio (a limit that holds on every
machine) applies. The casts' dtype is the source's; their output, FP8, is measured in FP8 ulps
(0.5 is correctly rounded on every machine), on values across the format's normal and
subnormal range.

free_benchmark has no FP8 rule yet: its verdict is n/a.
"""

from __future__ import annotations

from typing import Any, Callable

from pytest_msprobe.catalogue.records import DTYPES, CatalogueCase

# API name -> (left operand format, right operand format, scaling)
MATMULS = {
    f"Torch._scaled_mm[{a}-{b}-{scaling}]": (f"float8_{a}", f"float8_{b}", scaling)
    for scaling in ("tensorwise", "rowwise") for a, b in (("e4m3fn", "e4m3fn"), ("e4m3fn", "e5m2"))
}
# API name -> target format
CASTS = {f"Tensor.to[{fmt}]": fmt for fmt in ("float8_e4m3fn", "float8_e5m2")}
NO_FREE_BENCHMARK = "free_benchmark has no FP8 rule yet (planned)"
_SHAPES = ((16, 64, 32), (16, 256, 32), (8, 1024, 16), (32, 512, 8))  # (M, K, N) per sample


def cases() -> list[CatalogueCase]:
    """One case per FP8 API x dtype (the matmuls' output dtype, the casts' source dtype)."""
    import torch

    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        return []
    out = [CatalogueCase(name, dtype, "fp8", name, "Torch._scaled_mm", exclusion=NO_FREE_BENCHMARK)
           for name in MATMULS for dtype in DTYPES]
    out += [CatalogueCase(name, dtype, "fp8", name, "Tensor.to", exclusion=NO_FREE_BENCHMARK)
            for name in CASTS for dtype in DTYPES]
    return out


def call(name: str) -> Callable[..., Any]:
    """The device call of an FP8 case; on float64 inputs (the reference, the ratio's magnitudes
    and term counts) its float64 definition."""
    import torch

    from probes.online_dispatch.reference import scaled_mm

    if name in CASTS:
        return lambda inp, args, kwargs: inp.to(*args, **kwargs)

    def run(inp: Any, args: tuple, kwargs: dict) -> Any:
        if inp.dtype == torch.float64:
            return scaled_mm(inp, *args, **kwargs)
        return torch._scaled_mm(inp, *args, **kwargs)

    return run


def samples(case: CatalogueCase, count: int) -> list[tuple[Any, tuple, dict]]:
    """(inp, args, kwargs) per sample, on the CPU, seeded by the case."""
    import torch

    gen = torch.Generator().manual_seed(case.seed)
    if case.api in CASTS:
        target = getattr(torch, CASTS[case.api])
        top, tiny = torch.finfo(target).max, torch.finfo(target).smallest_normal
        out = []
        for _ in range(count):  # magnitudes log-uniform from the subnormals to the largest value
            exponent = torch.empty(32, 64).uniform_(float(torch.log2(torch.tensor(tiny))) - 3,
                                                    float(torch.log2(torch.tensor(top))), generator=gen)
            sign = torch.where(torch.rand(32, 64, generator=gen) < 0.5, -1.0, 1.0)
            x = (sign * torch.exp2(exponent)).clamp(-top, top).to(getattr(torch, case.dtype))
            out.append((x, (), {"dtype": target}))
        return out
    a_fmt, b_fmt, scaling = MATMULS[case.api]
    out_dtype = getattr(torch, case.dtype)
    out = []
    for i in range(count):
        m, k, n = _SHAPES[i % len(_SHAPES)]
        a, b = torch.randn(m, k, generator=gen) * 4, torch.randn(n, k, generator=gen) / 4
        if scaling == "tensorwise":
            sa, sb = a.abs().max() / torch.finfo(getattr(torch, a_fmt)).max, b.abs().max() / torch.finfo(
                getattr(torch, b_fmt)).max
        else:
            sa = a.abs().amax(dim=1, keepdim=True) / torch.finfo(getattr(torch, a_fmt)).max
            sb = (b.abs().amax(dim=1, keepdim=True) / torch.finfo(getattr(torch, b_fmt)).max).t()
        qa = (a / sa).to(getattr(torch, a_fmt))
        qb = (b / sb.reshape(-1, 1) if scaling == "rowwise" else b / sb).to(getattr(torch, b_fmt)).t()
        kwargs: dict[str, Any] = {"out_dtype": out_dtype}
        if i % 2 and out_dtype != torch.float32:  # a bias on half the samples (fp32 outputs take none on CUDA)
            kwargs["bias"] = torch.randn(n, generator=gen).to(out_dtype)
        out.append((qa, (qb, sa.float(), sb.float()), kwargs))
    return out
