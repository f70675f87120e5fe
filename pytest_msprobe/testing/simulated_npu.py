"""A simulated Ascend NPU for PyTorch on a CPU-only machine: the probes' NPU paths (device
tensors, torch_npu's fused operators, device-to-host transfers) are tested where no NPU exists.

Usage::

    with simulated_npu() as npu:
        import torch_npu                      # a stand-in, importable only inside the block

        x = torch.randn(4, 8, device="npu")
        y, rstd = torch_npu.npu_rms_norm(x, torch.ones(8, device="npu"))
        y.sum().backward()
        print(npu.host_transfers)             # device-to-host transfers so far

    with simulated_npu(defects={"npu_rms_norm": "reduced_precision"}):
        ...                                   # a known precision bug, to test a precision tool on

Simulated: the ``"npu"`` device (PyTorch's PrivateUse1 backend, renamed), whose tensors wrap CPU
tensors and run every ATen op with the CPU kernel (autograd, ``Module.to("npu")`` and optimizers
work, and so do FP8 tensors and ``torch._scaled_mm``, as on Ascend parts with FP8); ``torch.npu``
with one device; the hardware's refusals (no float64 and no AMD fnuz FP8 formats on the device, no
``.numpy()`` of a device tensor); a count of device-to-host transfers; and a ``torch_npu``
stand-in whose fused operators (the keys of `SUPPORTED_DEFECTS`, FP8 ``npu_quant_matmul``
among them) are ``npu::`` custom ops with, as on the hardware, no CPU kernel, and autograd where
torch_npu has a backward. A fused operator can be seeded with a defect: ``"reduced_precision"``
computes its forward in bfloat16, ``"wrong_backward"`` negates its gradients.

Not simulated: the hardware's numerics (results are the CPU's), asynchrony (streams and
``synchronize()`` do nothing), collectives, memory limits, autocast, ``torch.compile``, the rest of
torch_npu, and npu_fusion_attention beyond dense, dropout-free attention.

The first ``simulated_npu()`` or `prepare` changes the process for good: PrivateUse1 cannot be
renamed back, so ``torch.device("npu")`` parses from then on and ``torch.npu`` stays registered
(reporting no device outside a block). Autograd sizes its per-device queues at the process's first
backward pass, so call `prepare` in conftest.py when a backward may run before the first block.
The rest is installed on entry and removed on exit. Nesting, a real torch_npu, or a PrivateUse1
claimed by another backend raise `SimulatedNPUError`.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import sys
import threading
import types
from typing import Any, Callable, Dict, Iterator, Mapping, Tuple

import torch
from torch.utils._pytree import tree_map

__all__ = ["SimulatedNPU", "SimulatedNPUError", "SimulatedNPUTensor", "simulated_npu", "prepare", "active",
           "SUPPORTED_DEFECTS"]

DEVICE_TYPE = "npu"

#: operator name -> defect kinds that can be seeded into it.
SUPPORTED_DEFECTS: Dict[str, Tuple[str, ...]] = {
    "npu_rms_norm": ("reduced_precision", "wrong_backward"),
    "npu_swiglu": ("reduced_precision", "wrong_backward"),
    "npu_rotary_mul": ("reduced_precision", "wrong_backward"),
    "npu_fusion_attention": ("reduced_precision", "wrong_backward"),
    # inference only in torch_npu (no backward), so no "wrong_backward"
    "npu_quant_matmul": ("reduced_precision",),
}

_OP_SCHEMAS = {
    "npu_rms_norm": "npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)",
    "npu_swiglu": "npu_swiglu(Tensor self, int dim=-1) -> Tensor",
    "npu_rotary_mul": "npu_rotary_mul(Tensor self, Tensor r1, Tensor r2) -> Tensor",
    # torch_npu's signature; the op returns the four tensors, the Python function adds seed,
    # offset and numels (0: no dropout in the simulated subset)
    "npu_fusion_attention": (
        "npu_fusion_attention(Tensor query, Tensor key, Tensor value, int head_num, str input_layout, "
        "Tensor? pse=None, Tensor? padding_mask=None, Tensor? atten_mask=None, float scale=1., "
        "float keep_prob=1., int pre_tockens=2147483647, int next_tockens=2147483647, int inner_precise=0, "
        "int[]? prefix=None, int[]? actual_seq_qlen=None, int[]? actual_seq_kvlen=None, int sparse_mode=0, "
        "bool gen_mask_parallel=True, bool sync=False) -> (Tensor, Tensor, Tensor, Tensor)"),
    "npu_quant_matmul": (
        "npu_quant_matmul(Tensor x1, Tensor x2, Tensor scale, *, Tensor? offset=None, Tensor? pertoken_scale=None, "
        "Tensor? bias=None, ScalarType? output_dtype=None) -> Tensor"),
}

# dtypes the hardware has no storage or compute for, with why: a probe that asks the device for
# one fails here as it would on an Ascend NPU
_UNSUPPORTED_DTYPES: Dict[torch.dtype, str] = {
    torch.float64: "Ascend NPUs have no float64 compute; keep float64 tensors on the CPU",
    **{getattr(torch, name): ("an AMD FP8 variant; Ascend's FP8 formats are float8_e4m3fn and float8_e5m2 "
                              "(and HiFloat8, which PyTorch has no dtype for)")
       for name in ("float8_e4m3fnuz", "float8_e5m2fnuz") if hasattr(torch, name)},
}


class SimulatedNPUError(RuntimeError):
    """Raised for misuse of the simulated NPU and for operations the (simulated) hardware refuses."""


_lock = threading.Lock()
_process_setup_done = False
_device_module: _NPUModule | None = None
_active: SimulatedNPU | None = None


def _dtype_error(dtype: torch.dtype) -> SimulatedNPUError:
    alias = " (float64/double)" if dtype == torch.float64 else ""
    return SimulatedNPUError(
        f"{dtype}{alias} is not supported on the NPU: {_UNSUPPORTED_DTYPES[dtype]} "
        "(pytest_msprobe.testing.simulated_npu is strict like the hardware)"
    )


def _check_dtype(dtype: torch.dtype | None) -> None:
    if dtype in _UNSUPPORTED_DTYPES:
        raise _dtype_error(dtype)


def _count_host_transfer() -> None:
    if _active is not None:
        _active.host_transfers += 1


def _is_cpu_device(device: Any) -> bool:
    return device is not None and torch.device(device).type == "cpu"


# ops that may move a tensor between devices: aten.to is not decomposed into _to_copy when a
# TorchDispatchMode is active (a probe's), so both are seen here
_MOVES = (torch.ops.aten._to_copy, torch.ops.aten.to)


def _target_device(args: tuple, kwargs: dict) -> Any:
    """The device an aten.to / _to_copy call moves to (None: it stays)."""
    if kwargs.get("device") is not None:
        return kwargs["device"]
    for a in args[1:]:
        if isinstance(a, (torch.device, str)):
            return a
        if isinstance(a, torch.Tensor):  # to.other: the other tensor's device
            return a.device
    return None


class SimulatedNPUTensor(torch.Tensor):
    """A tensor that reports ``device.type == "npu"`` while its data is a CPU tensor (``._cpu``)."""

    _cpu: torch.Tensor
    #: Tells tools that intercept ops (a TorchDispatchMode sees this subclass in ``types``) that
    #: it stands for an ordinary tensor of this device type, to be treated as one.
    __simulated_device__ = DEVICE_TYPE

    @staticmethod
    def __new__(cls, cpu: torch.Tensor, requires_grad: bool = False) -> SimulatedNPUTensor:
        _check_dtype(cpu.dtype)
        return torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined]
            cls,
            cpu.size(),
            strides=cpu.stride(),
            storage_offset=cpu.storage_offset(),
            dtype=cpu.dtype,
            layout=cpu.layout,
            device=torch.device(DEVICE_TYPE, 0),
            requires_grad=requires_grad,
        )

    def __init__(self, cpu: torch.Tensor, requires_grad: bool = False) -> None:
        self._cpu = cpu

    __torch_function__ = torch._C._disabled_torch_function_impl

    # ``param.data = new`` (nn.Module.to(dtype), user code) replaces the tensor's metadata in C++;
    # the CPU data behind it must follow, or the wrapper would describe one dtype and hold another
    @property  # type: ignore[override]
    def data(self) -> torch.Tensor:
        return torch._C.TensorBase.data.__get__(self)  # type: ignore[attr-defined]

    @data.setter
    def data(self, value: torch.Tensor) -> None:
        if not isinstance(value, SimulatedNPUTensor):
            raise SimulatedNPUError(
                "cannot set .data of an NPU tensor to a tensor on another device; move it first (.to('npu'))")
        torch._C.TensorBase.data.__set__(self, value)  # type: ignore[attr-defined]
        self._cpu = value._cpu

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        _count_host_transfer()
        text = repr(self._cpu)
        extra = f", device='{self.device}'"
        if self.requires_grad and self.grad_fn is None:
            extra += ", requires_grad=True"
        if self.grad_fn is not None:
            extra += f", grad_fn=<{type(self.grad_fn).__name__}>"
        return text[:-1] + extra + ")"

    def tolist(self) -> Any:  # type: ignore[override]
        _count_host_transfer()
        return self._cpu.tolist()

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        wrappers: Dict[int, SimulatedNPUTensor] = {}

        def unwrap(x: Any) -> Any:
            if isinstance(x, SimulatedNPUTensor):
                wrappers[id(x._cpu)] = x
                return x._cpu
            if isinstance(x, torch.device) and x.type == DEVICE_TYPE:
                return torch.device("cpu")
            return x

        to_host = False
        if func.overloadpacket in _MOVES and _is_cpu_device(_target_device(args, kwargs)):
            to_host = True
        elif func is torch.ops.aten._local_scalar_dense.default:
            to_host = True
        elif func is torch.ops.aten.copy_.default and not isinstance(args[0], SimulatedNPUTensor):
            to_host = True
        if to_host:
            _count_host_transfer()
        else:
            _check_dtype(kwargs.get("dtype"))

        cpu_args = tree_map(unwrap, args)
        cpu_kwargs = tree_map(unwrap, kwargs)
        fused = _fused_impls.get(func._schema.name) if getattr(func, "namespace", "") == "npu" else None
        out = fused(*cpu_args, **cpu_kwargs) if fused is not None else func(*cpu_args, **cpu_kwargs)
        if to_host:
            # aten.to returns its argument when nothing changes: a move to the host is a copy
            return _aten.clone.default(out) if id(out) in wrappers else out

        def wrap(x: Any) -> Any:
            if isinstance(x, torch.Tensor) and not isinstance(x, SimulatedNPUTensor):
                if id(x) in wrappers:  # in-place / out= ops return their (wrapped) argument
                    return wrappers[id(x)]
                return SimulatedNPUTensor(x)
            return x

        return tree_map(wrap, out)


# ----------------------------------------------------------------------------------------- torch.npu


class _NPUModule(types.ModuleType):
    """The ``torch.npu`` stand-in registered with ``torch._register_device_module``."""

    def __init__(self) -> None:
        super().__init__("torch.npu")
        self._current = 0
        self._enabled = False  # True inside a simulated_npu() block

    def is_available(self) -> bool:
        return self._enabled

    def is_initialized(self) -> bool:
        return self._enabled

    def device_count(self) -> int:
        return 1 if self._enabled else 0

    def current_device(self) -> int:
        return self._current

    def set_device(self, device: Any) -> None:
        index = device if isinstance(device, int) else torch.device(device).index or 0
        if index != 0:
            raise SimulatedNPUError(f"simulated NPU has a single device (npu:0); got set_device({device!r})")
        self._current = index

    def synchronize(self, device: Any = None) -> None:
        """No-op: the simulated device is synchronous."""

    def _is_in_bad_fork(self) -> bool:
        return False

    def manual_seed(self, seed: int) -> None:
        # Device random ops run on the CPU generator. Not torch.manual_seed: that calls back into
        # this module's manual_seed_all (unbounded recursion).
        torch.default_generator.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.default_generator.manual_seed(seed)

    def get_device_name(self, device: Any = None) -> str:
        return "Simulated NPU (CPU-backed)"

    def get_rng_state(self, device: Any = None) -> torch.Tensor:
        return torch.default_generator.get_state()

    def set_rng_state(self, state: torch.Tensor, device: Any = None) -> None:
        torch.default_generator.set_state(state)


# -------------------------------------------------------------------------------------- fused ops


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


_MATH: Dict[str, Callable[..., Any]] = {"npu_fusion_attention": _fusion_attention,
                                        "npu_rms_norm": _rms_norm, "npu_swiglu": _swiglu,
                                        "npu_rotary_mul": _rotary_mul, "npu_quant_matmul": _quant_matmul}
# tensor inputs of the ops with a backward (torch_npu's npu_quant_matmul has none)
_TENSOR_ARGS = {"npu_rms_norm": 2, "npu_swiglu": 1, "npu_rotary_mul": 3, "npu_fusion_attention": 3}

# "npu::<name>" -> implementation (with this block's defects) while a simulation is active
_fused_impls: Dict[str, Callable[..., Any]] = {}


def _make_op_impls(defects: Mapping[str, str]) -> Dict[str, Callable[..., Any]]:
    def bind(name: str) -> Callable[..., Any]:
        reduced = defects.get(name) == "reduced_precision"

        def impl(*args: Any, **kwargs: Any) -> Any:
            return _MATH[name](*args, reduced=reduced, **kwargs)

        return impl

    return {name: bind(name) for name in _MATH}


def _register_autograd(lib: Any, name: str, defect: str | None) -> None:
    """Backward of a fused op: the clean math's own gradient, recomputed on the device tensors;
    negated with the seeded "wrong_backward" defect (a backward kernel with a sign error)."""
    count = _TENSOR_ARGS[name]
    sign = -1.0 if defect == "wrong_backward" else 1.0

    def setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Any) -> None:
        ctx.save_for_backward(*inputs[:count])
        ctx.extra = inputs[count:]

    def backward(ctx: Any, *grads: Any) -> Any:
        saved = ctx.saved_tensors
        with torch.enable_grad():
            # TensorBase's methods, not Tensor's: a tool may have wrapped those
            xs = [torch._C.TensorBase.requires_grad_(_aten.detach.default(t), t.dtype.is_floating_point)
                  for t in saved]
            outs = _MATH[name](*xs, *ctx.extra)
            outs = outs if isinstance(outs, tuple) else (outs,)
            used = [(o, g) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
            wanted = [x for x in xs if x.requires_grad]
            found = torch.autograd.grad([o for o, _ in used], wanted, [g for _, g in used], allow_unused=True)
        by_input = iter(found)
        grads_in = tuple(next(by_input) if x.requires_grad else None for x in xs)
        if sign != 1.0:
            grads_in = tuple(None if g is None else _aten.mul.Scalar(g, sign) for g in grads_in)
        return grads_in + (None,) * len(ctx.extra)

    torch.library.register_autograd(f"npu::{name}", backward, setup_context=setup_context, lib=lib)


def _make_torch_npu_module(device_module: _NPUModule) -> types.ModuleType:
    mod = types.ModuleType(
        "torch_npu", "Stand-in for torch_npu installed by pytest_msprobe.testing.simulated_npu."
    )
    mod.__dict__["__simulated__"] = True
    # importlib.util.find_spec("torch_npu") (transformers, accelerate) needs a spec
    mod.__spec__ = importlib.machinery.ModuleSpec("torch_npu", None)
    mod.__version__ = "0.0.0+simulated"  # type: ignore[attr-defined]
    mod.npu = device_module  # type: ignore[attr-defined]

    def npu_rms_norm(x: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6) -> Tuple[torch.Tensor, ...]:
        return torch.ops.npu.npu_rms_norm(x, gamma, epsilon)

    def npu_swiglu(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        return torch.ops.npu.npu_swiglu(x, dim)

    def npu_rotary_mul(x: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor) -> torch.Tensor:
        return torch.ops.npu.npu_rotary_mul(x, r1, r2)

    def npu_fusion_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, head_num: int,
                             input_layout: str, **kwargs: Any) -> Tuple[Any, ...]:
        return tuple(torch.ops.npu.npu_fusion_attention(query, key, value, head_num, input_layout, **kwargs)) + (0, 0, 0)

    def npu_quant_matmul(x1: torch.Tensor, x2: torch.Tensor, scale: torch.Tensor, *, offset: Any = None,
                         pertoken_scale: Any = None, bias: Any = None, output_dtype: Any = None) -> torch.Tensor:
        return torch.ops.npu.npu_quant_matmul(x1, x2, scale, offset=offset, pertoken_scale=pertoken_scale,
                                              bias=bias, output_dtype=output_dtype)

    for fn in (npu_rms_norm, npu_swiglu, npu_rotary_mul, npu_fusion_attention, npu_quant_matmul):
        fn.__module__ = "torch_npu"
        setattr(mod, fn.__name__, fn)
    return mod


# ------------------------------------------------------------------------------------------ setup


def _refuse_if_real_backend() -> None:
    existing = sys.modules.get("torch_npu")
    if existing is not None and not getattr(existing, "__simulated__", False):
        raise SimulatedNPUError(
            "a real torch_npu is imported in this process; simulated_npu() refuses to replace it "
            "(run simulated-NPU tests in a process without torch_npu)"
        )
    name = torch._C._get_privateuse1_backend_name()
    if not _process_setup_done and name != "privateuseone":
        raise SimulatedNPUError(
            f"PyTorch's PrivateUse1 backend is already claimed as {name!r} by another backend in this "
            "process; simulated_npu() needs it (the rename cannot be undone)"
        )


def prepare() -> None:
    """Do the process-global part of the simulation now (rename PrivateUse1 to "npu", register
    its device guard). Autograd sizes its per-device queues at a process's first backward pass, so
    a block that runs backward on device tensors needs this before that first backward: call it at
    the top of conftest.py (``simulated_npu()`` calls it too, which is enough when nothing ran
    backward before). Idempotent; refuses, as ``simulated_npu()`` does, when a real torch_npu is
    imported or PrivateUse1 belongs to another backend."""
    with _lock:
        _refuse_if_real_backend()
        _setup_process_once()


def _setup_process_once() -> None:
    """Process-global, irreversible part: rename PrivateUse1 and register Python device guard/hooks."""
    global _process_setup_done
    if _process_setup_done:
        return
    from torch.utils.backend_registration import _DummyDeviceGuard, _DummyPrivateUse1Hook

    global _device_module
    torch.utils.rename_privateuse1_backend(DEVICE_TYPE)
    torch.utils.generate_methods_for_privateuse1_backend(for_storage=False)
    torch._C._acc.register_python_privateuseone_hook(_DummyPrivateUse1Hook())
    torch._C._acc.register_python_privateuseone_device_guard(_DummyDeviceGuard())
    # torch.npu stays registered (PyTorch's accelerator API looks it up once PrivateUse1 has hooks,
    # and caches it): outside a simulated_npu() block it reports no device
    _device_module = _NPUModule()
    torch._register_device_module(DEVICE_TYPE, _device_module)
    _process_setup_done = True


def _empty_memory_format(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):  # type: ignore[no-untyped-def]
    dtype = dtype if dtype is not None else torch.get_default_dtype()
    _check_dtype(dtype)
    return SimulatedNPUTensor(
        torch.empty(size, dtype=dtype, memory_format=memory_format or torch.contiguous_format)
    )


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):  # type: ignore[no-untyped-def]
    dtype = dtype if dtype is not None else torch.get_default_dtype()
    _check_dtype(dtype)
    return SimulatedNPUTensor(torch.empty_strided(size, stride, dtype=dtype))


def _as_cpu(t: torch.Tensor) -> torch.Tensor:
    return t._cpu if isinstance(t, SimulatedNPUTensor) else t


def _copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    # Reached when the Python dispatch key is excluded (e.g. ``torch.tensor(data, device="npu")``).
    if not isinstance(src, SimulatedNPUTensor) and isinstance(dst, SimulatedNPUTensor):
        pass  # host -> device
    elif isinstance(src, SimulatedNPUTensor) and not isinstance(dst, SimulatedNPUTensor):
        _count_host_transfer()
    _as_cpu(dst).copy_(_as_cpu(src))
    return dst


def _copy_from_and_resize(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    _as_cpu(dst).resize_(src.shape)
    return _copy_from(src, dst)


class SimulatedNPU:
    """Handle returned by :func:`simulated_npu`; counts device->host transfers."""

    def __init__(self, defects: Mapping[str, str]) -> None:
        self.defects: Dict[str, str] = dict(defects)
        self.host_transfers: int = 0
        self.device = torch.device(DEVICE_TYPE, 0) if _process_setup_done else None

    def reset_host_transfers(self) -> None:
        self.host_transfers = 0


def active() -> SimulatedNPU | None:
    """The simulation active in this process, if any."""
    return _active


def _validate_defects(defects: Mapping[str, str] | None) -> Dict[str, str]:
    result = dict(defects or {})
    for op, kind in result.items():
        if op not in SUPPORTED_DEFECTS:
            raise ValueError(f"unknown operator {op!r} in defects; supported: {sorted(SUPPORTED_DEFECTS)}")
        if kind not in SUPPORTED_DEFECTS[op]:
            raise ValueError(f"unknown defect {kind!r} for {op}; supported: {SUPPORTED_DEFECTS[op]}")
    return result


@contextlib.contextmanager
def simulated_npu(defects: Mapping[str, str] | None = None) -> Iterator[SimulatedNPU]:
    """Make ``torch.device("npu:0")``, ``torch.npu`` and ``import torch_npu`` work on a CPU-only machine.

    Args:
        defects: optional ``{operator: defect}`` to seed into the fused ops, e.g.
            ``{"npu_rms_norm": "reduced_precision"}`` (see :data:`SUPPORTED_DEFECTS`).

    Yields:
        A :class:`SimulatedNPU` whose ``host_transfers`` counts device->host transfers.

    Raises:
        SimulatedNPUError: when nested, when a real torch_npu is imported, or when PrivateUse1 is
            already used by another backend.
        ValueError: for unknown defects.
    """
    global _active
    checked = _validate_defects(defects)
    with _lock:
        if _active is not None:
            raise SimulatedNPUError("simulated_npu() is already active; nesting is not supported")
        _refuse_if_real_backend()
        if getattr(torch, DEVICE_TYPE, _device_module) is not _device_module:
            raise SimulatedNPUError(
                "torch.npu is already registered by something else; refusing to replace it"
            )
        _setup_process_once()
        state = SimulatedNPU(checked)
        _active = state

    undo: list = []
    try:
        device_module = _device_module
        assert device_module is not None
        device_module._enabled = True
        undo.append(lambda: setattr(device_module, "_enabled", False))

        aten_lib = torch.library.Library("aten", "IMPL")  # noqa: TOR901
        undo.append(aten_lib._destroy)
        aten_lib.impl("empty.memory_format", _empty_memory_format, "PrivateUse1")
        aten_lib.impl("empty_strided", _empty_strided, "PrivateUse1")
        aten_lib.impl("_copy_from", _copy_from, "PrivateUse1")
        aten_lib.impl("_copy_from_and_resize", _copy_from_and_resize, "PrivateUse1")

        npu_lib = torch.library.Library("npu", "DEF")  # noqa: TOR901
        undo.append(npu_lib._destroy)
        # no CPU kernel, as with the real torch_npu: the ops run only on device tensors, whose
        # __torch_dispatch__ calls these implementations
        for name, impl in _make_op_impls(checked).items():
            npu_lib.define(_OP_SCHEMAS[name])
            if name in _TENSOR_ARGS:
                _register_autograd(npu_lib, name, checked.get(name))
            _fused_impls[f"npu::{name}"] = impl
        undo.append(_fused_impls.clear)

        sys.modules["torch_npu"] = _make_torch_npu_module(device_module)
        undo.append(lambda: sys.modules.pop("torch_npu", None))
        yield state
    finally:
        errors = []
        for step in reversed(undo):
            try:
                step()
            except Exception as exc:  # pragma: no cover - best effort cleanup
                errors.append(exc)
        with _lock:
            _active = None
        if errors:  # pragma: no cover
            raise SimulatedNPUError(f"cleanup of simulated_npu() failed: {errors!r}")
