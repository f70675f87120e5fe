"""The reference side of a comparison: which device is under test, and the CPU inputs of the re-run.

The device under test is where the op's tensors are. The reference always runs on the CPU:
half-precision inputs (fp16, bf16, fp8) are raised to float32 there; when the device under test
*is* the CPU, every floating input is raised to float64 instead (and complex to complex128), so a
CPU-only CI compares float32 kernels against something more exact (msprobe needed torch_npu and
did nothing without it).

The copies themselves (casts or clones of every tensor argument, never views) are
probes.online_dispatch.host_copies.

The fused attention kernels (``ATTENTION``) are the exception to "the reference is the op re-run":
their reference is `attention`, the computation written out (see there and `host_reference`).
So is the FP8 matmul ``_scaled_mm``, which has no float64 kernel: `scaled_mm`, the dequantised
operands multiplied in float64 (on any device: FP8 and float32 values are exact in it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from probes.online_dispatch.call_scan import CPU, scan  # noqa: F401  (CPU: the device callers test by identity)
from probes.online_dispatch.host_copies import (  # noqa: F401  (the reference's copies, named here as before)
    ReferenceCall,
    build_reference,
    copied_call,
    reference_dtype,
)


def device_under_test(args: tuple, kwargs: dict) -> torch.device | None:
    """The device of the first non-CPU tensor argument, else CPU; None without tensors."""
    return scan(args, kwargs)[0]


def input_bytes(args: tuple, kwargs: dict) -> int:
    """Bytes of the call's dense tensor arguments (what the reference copies, before widening)."""
    return scan(args, kwargs)[2]


def half_to_float_index(func: Any) -> int | None:
    """Position of a ``half_to_float`` argument (``_softmax``, ``_log_softmax``), else None."""
    for i, a in enumerate(func._schema.arguments):
        if a.name == "half_to_float":
            return i
    return None


def written_arguments(func: Any) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Positions and names of the arguments the op writes into (``add_``'s self, ``out=``)."""
    pos: list[int] = []
    names: list[str] = []
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            pos.append(i)
            names.append(a.name)
    return tuple(pos), tuple(names)


# attention ---------------------------------------------------------------------------------------
# The fused attention kernels are not re-run: an accelerator's flash kernels have no CPU kernel,
# and the CPU flash kernel re-run in float64 would be checked against itself. Their reference is
# attention written out in the reference dtype (`attention`), forward and backward; outputs that
# are not values of attention (RNG state, sequence bookkeeping, debug masks) are not compared.


@dataclass(frozen=True)
class NotCompared:
    """The reference of a device output that is not a value of the computation (RNG state,
    bookkeeping for packed sequences, a debug mask): a reference can only differ from it by design."""

    reason: str


@dataclass
class PerQuery:
    """The reference of a per-query value (attention's logsumexp). Kernels store it in their own
    layout (padded to a block of queries, with a trailing unit dimension), and a query whose every
    key is masked has no logsumexp (kernels write 0, inf or -inf there), so only the defined
    values, in the reference's (..., L) layout, are compared."""

    value: torch.Tensor

    def align(self, dev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(device, reference) on the reference's shape, undefined entries zero on both sides;
        None when the device did not compute it (empty) or stores it in a layout not known here."""
        ref = self.value
        if dev.numel() == 0:
            return None
        if dev.shape != ref.shape:
            if dev.dim() == ref.dim() + 1 and dev.shape[-1] == 1 and dev.shape[:-1] == ref.shape:
                dev = dev.squeeze(-1)
            elif dev.dim() == ref.dim() and dev.shape[:-1] == ref.shape[:-1] and dev.shape[-1] > ref.shape[-1]:
                dev = dev[..., : ref.shape[-1]]
            else:
                return None
        undefined = ref == float("-inf")
        return dev.masked_fill(undefined, 0), ref.masked_fill(undefined, 0)


# score elements per block of queries: bounds the reference's memory on long sequences
_BLOCK_ELEMENTS = 1 << 22
_NOT_VALUES = {
    "cum": NotCompared("cumulative sequence lengths of packed inputs: bookkeeping, not a value"),
    "len": NotCompared("maximum sequence length: bookkeeping, not a value"),
    "rng": NotCompared("random-number state (philox seed and offset)"),
    "unused": NotCompared("unused output"),
    "debug": NotCompared("debug attention mask"),
}


@dataclass(frozen=True)
class _Attention:
    """Where an attention op's operands are and what it returns."""

    mask: str | None  # the additive (or boolean) mask argument
    outputs: tuple[str, ...]  # forward: "out", "lse" or a _NOT_VALUES key; backward: q, k, v, mask
    lower_right: bool = False  # is_causal aligned to the last key (CUDA flash), else to the first
    grad_mask: str | None = None  # the backward's bool[4] of requested gradients
    backward: bool = False


_PACKED = ("out", "lse", "cum", "cum", "len", "len", "rng", "rng", "debug")
ATTENTION: dict[str, _Attention] = {
    "_scaled_dot_product_flash_attention_for_cpu": _Attention("attn_mask", ("out", "lse")),
    "_scaled_dot_product_flash_attention": _Attention(
        None, ("out", "lse", "cum", "cum", "len", "len", "rng", "unused", "debug"), lower_right=True),
    "_scaled_dot_product_efficient_attention": _Attention("attn_bias", ("out", "lse", "rng", "rng")),
    "_scaled_dot_product_cudnn_attention": _Attention("attn_bias", _PACKED),
    "_scaled_dot_product_fused_attention_overrideable": _Attention("attn_bias", _PACKED),
    "_scaled_dot_product_flash_attention_for_cpu_backward": _Attention(
        "attn_mask", ("q", "k", "v"), backward=True),
    "_scaled_dot_product_flash_attention_backward": _Attention(
        None, ("q", "k", "v"), lower_right=True, backward=True),
    "_scaled_dot_product_efficient_attention_backward": _Attention(
        "attn_bias", ("q", "k", "v", "mask"), grad_mask="grad_input_mask", backward=True),
    "_scaled_dot_product_cudnn_attention_backward": _Attention("attn_bias", ("q", "k", "v"), backward=True),
    "_scaled_dot_product_fused_attention_overrideable_backward": _Attention(
        "attn_bias", ("q", "k", "v", "mask"), grad_mask="grad_input_mask", backward=True),
}


def host_reference(func: Any) -> Callable[..., tuple[Any, ...]] | None:
    """The CPU reference of an op that is not its own CPU re-run (the fused attention kernels),
    called like the op on the reference's arguments; None for every other op (the ``quantized``
    overloads too: their descaling factors are not modelled, so they are re-run like any op)."""
    if func.namespace != "aten" or func._overloadname != "default":
        return None
    if func._opname == "_scaled_mm":
        return scaled_mm
    spec = ATTENTION.get(func._opname)
    if spec is None:
        return None
    arguments = func._schema.arguments
    names = [a.name for a in arguments]
    defaults = {a.name: a.default_value for a in arguments if a.has_default_value()}

    def attention_reference(*args: Any, **kwargs: Any) -> tuple[Any, ...]:
        bound = {**defaults, **dict(zip(names, args)), **kwargs}
        return _attention_call(spec, bound, bound[names[0]] if spec.backward else None)

    return attention_reference


def _attention_call(spec: _Attention, bound: dict[str, Any], grad: torch.Tensor | None) -> tuple[Any, ...]:
    q, k, v = bound["query"], bound["key"], bound["value"]
    mask = bound.get(spec.mask) if spec.mask is not None else None
    out, lse, grads = attention(q, k, v, mask, bool(bound.get("is_causal", False)), bound.get("scale"),
                                spec.lower_right, grad, bound.get("out") if spec.backward else None)
    if grads is None:
        values = {"out": out, "lse": PerQuery(lse)}
        return tuple(values[kind] if kind in values else _NOT_VALUES[kind] for kind in spec.outputs)
    wanted = bound.get(spec.grad_mask) if spec.grad_mask is not None else None
    result: list[Any] = []
    for i, g in enumerate(grads[: len(spec.outputs)]):
        if g is None or (wanted is not None and not wanted[i]):
            result.append(NotCompared("gradient not requested"))
        else:
            result.append(g)
    return tuple(result)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, causal: bool,
              scale: float | None, lower_right: bool = False, grad: torch.Tensor | None = None,
              saved_out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, tuple[Any, ...] | None]:
    """softmax(q kᵀ · scale + mask) v written out, its logsumexp per query and, given the output's
    gradient, the gradients of q, k, v and the mask: the reference of every fused attention kernel.

    The backward takes the softmax's correction rowsum(grad · out) from `saved_out`, the forward
    output the device's backward received, as that kernel does: the backward is judged on its own
    inputs like every op, and a forward output rounded to bf16 (its error, cancelling in
    dP - rowsum, reached 6 bf16 ulps in dq against 2.5 with the saved output) is not blamed on it.

    Computed in blocks of queries (the score matrix of a long sequence does not fit in memory in
    float64). A query whose every key is masked attends to nothing: output 0, logsumexp -inf,
    zero gradients (the convention of PyTorch's safe softmax). Key and value heads fewer than the
    query heads (grouped-query attention) are shared by consecutive query heads."""
    dtype = q.dtype
    seq_q, seq_k = q.shape[-2], k.shape[-2]
    groups = q.shape[-3] // k.shape[-3] if q.dim() >= 3 and k.dim() >= 3 and k.shape[-3] != q.shape[-3] else 1
    kx = k.repeat_interleave(groups, dim=-3) if groups > 1 else k
    vx = v.repeat_interleave(groups, dim=-3) if groups > 1 else v
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    bias = None
    if mask is not None:
        bias = mask if mask.dtype != torch.bool else torch.zeros(mask.shape, dtype=dtype).masked_fill(
            ~mask, float("-inf"))
        bias = bias.to(dtype)
        if bias.dim() < 2:
            bias = bias.reshape(1, -1)
    lead = torch.broadcast_shapes(q.shape[:-2], kx.shape[:-2])
    block = max(1, _BLOCK_ELEMENTS // max(1, math.prod(lead) * seq_k))
    out = torch.empty(lead + (seq_q, v.shape[-1]), dtype=dtype)
    lse = torch.empty(lead + (seq_q,), dtype=dtype)
    if grad is not None:
        dq = torch.empty(q.shape, dtype=dtype)
        dk, dv = torch.zeros(kx.shape, dtype=dtype), torch.zeros(vx.shape, dtype=dtype)
        dbias = torch.zeros(bias.shape, dtype=dtype) if bias is not None and mask.dtype != torch.bool else None
    kt, vt = kx.transpose(-2, -1), vx.transpose(-2, -1)
    saved = saved_out.to(dtype) if saved_out is not None and grad is not None and saved_out.shape == grad.shape else None
    shift = seq_k - seq_q if lower_right else 0
    zero = torch.zeros((), dtype=dtype)
    for start in range(0, seq_q, block):
        n = min(block, seq_q - start)
        # the block's temporaries are its own, so each step writes in place (the same operations
        # and values as out of place, without a score-sized buffer per step)
        qc = q.narrow(-2, start, n)
        scores = (qc @ kt).mul_(scale)
        bc = None
        if bias is not None:
            bc = bias.narrow(-2, start, n) if bias.shape[-2] != 1 else bias
            scores = scores.add_(bc) if torch.broadcast_shapes(scores.shape, bc.shape) == scores.shape else scores + bc
        if causal:
            rows = torch.arange(start, start + n).unsqueeze(-1) + shift
            scores.masked_fill_(torch.arange(seq_k) > rows, float("-inf"))
        top = scores.amax(-1, keepdim=True)
        top = torch.where(top == float("-inf"), zero, top)
        p = scores.sub_(top).exp_()
        total = p.sum(-1, keepdim=True)
        lse.narrow(-1, start, n).copy_((top + total.log()).squeeze(-1))
        positive = total > 0  # a query with no key to attend to (total 0) attends to nothing
        p = p.div_(total) if bool(positive.all()) else torch.where(positive, p / total, zero)
        oc = p @ vx
        out.narrow(-2, start, n).copy_(oc)
        if grad is None:
            continue
        go = grad.to(dtype).narrow(-2, start, n)
        oc = saved.narrow(-2, start, n) if saved is not None else oc
        ds = (go @ vt).sub_((go * oc).sum(-1, keepdim=True)).mul_(p)
        dq.narrow(-2, start, n).copy_((ds @ kx).mul_(scale).sum_to_size(qc.shape))
        dk += (ds.transpose(-2, -1) @ qc).mul_(scale).sum_to_size(dk.shape)
        dv += (p.transpose(-2, -1) @ go).sum_to_size(dv.shape)
        if dbias is not None:
            if bias.shape[-2] != 1:
                dbias.narrow(-2, start, n).add_(ds.sum_to_size(bc.shape))
            else:
                dbias += ds.sum_to_size(dbias.shape)
    if grad is None:
        return out, lse, None
    if groups > 1:
        dk = dk.unflatten(-3, (k.shape[-3], groups)).sum(-3)
        dv = dv.unflatten(-3, (v.shape[-3], groups)).sum(-3)
    dmask = dbias.reshape(mask.shape) if dbias is not None else None
    return out, lse, (dq, dk.sum_to_size(k.shape), dv.sum_to_size(v.shape), dmask)


# the FP8 matmul ------------------------------------------------------------------------------------


# the FP8 matmuls, (namespace, op): aten's and torch_npu's quantised one
_ROUNDED_ONCE = frozenset({("aten", "_scaled_mm"), ("npu", "npu_quant_matmul")})


def rounds_once(func: Any) -> bool:
    """Whether the op is one of the FP8 matmuls (asked once per overload: OpInfo)."""
    return (getattr(func, "namespace", None), getattr(func, "_opname", None)) in _ROUNDED_ONCE


def rounded_once_terms(func: Any, args: tuple) -> int:
    """For the FP8 matmuls (whose reference is exact and which a correct kernel rounds once), the
    number of products per output element; 0 for every other op."""
    if not rounds_once(func):
        return 0
    first = args[0] if args else None
    return int(first.shape[-1]) if isinstance(first, torch.Tensor) and first.dim() >= 2 else 0


def scaled_mm(*args: Any, **kwargs: Any) -> Any:
    """The reference of ``aten._scaled_mm``: the float64 product of the call's own FP8 operands and
    scales (probes.backends.fp8_references.scaled_mm); a layout it does not model is not compared."""
    from probes.backends.fp8_references import scaled_mm as exact_scaled_mm

    try:
        return exact_scaled_mm(*args, **kwargs)
    except NotImplementedError as exc:
        return NotCompared(str(exc))
