"""The ``torch_npu`` stand-in: the fused operators as ``npu::`` custom ops (with, as on the hardware,
no CPU kernel, and autograd where torch_npu has a backward), the seeded ``"wrong_backward"`` defect,
and the module ``import torch_npu`` finds. The registration with PyTorch, apart from the math
(:mod:`pytest_msprobe.testing.simulated_npu_kernels`), so that a block's defects change which
implementations are bound, never the kernels themselves."""

from __future__ import annotations

import importlib.machinery
import types
from typing import Any, Callable, Dict, Mapping, MutableMapping, Tuple

import torch

from pytest_msprobe.testing.simulated_npu_kernels import KERNELS

_aten = torch.ops.aten

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

# tensor inputs of the ops with a backward (torch_npu's npu_quant_matmul has none)
_TENSOR_ARGS = {"npu_rms_norm": 2, "npu_swiglu": 1, "npu_rotary_mul": 3, "npu_fusion_attention": 3}


def _make_op_impls(defects: Mapping[str, str]) -> Dict[str, Callable[..., Any]]:
    def bind(name: str) -> Callable[..., Any]:
        reduced = defects.get(name) == "reduced_precision"

        def impl(*args: Any, **kwargs: Any) -> Any:
            return KERNELS[name](*args, reduced=reduced, **kwargs)

        return impl

    return {name: bind(name) for name in KERNELS}


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
            outs = KERNELS[name](*xs, *ctx.extra)
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


def make_torch_npu_module(device_module: types.ModuleType) -> types.ModuleType:
    """The module ``import torch_npu`` gets inside a block: what code written for Ascend calls
    (``torch_npu.npu_rms_norm``, ``torch_npu.npu``), each function reaching its ``npu::`` op."""
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


def define_fused_ops(npu_lib: Any, defects: Mapping[str, str],
                     registry: MutableMapping[str, Callable[..., Any]]) -> None:
    """Define the fused operators in `npu_lib` (a ``torch.library.Library("npu", "DEF")`` the caller
    destroys when its block ends) with `defects` seeded, and put their implementations in
    `registry`, where the device tensors' dispatch finds them: the ops have no CPU kernel, as with
    the real torch_npu, so they run only on device tensors."""
    for name, impl in _make_op_impls(defects).items():
        npu_lib.define(_OP_SCHEMAS[name])
        if name in _TENSOR_ARGS:
            _register_autograd(npu_lib, name, defects.get(name))
        registry[f"npu::{name}"] = impl
