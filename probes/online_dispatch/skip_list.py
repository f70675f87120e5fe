"""Which ops online_dispatch runs on the device only, and why.

An op is skipped when comparing it with a CPU re-run can say nothing about the device's
arithmetic (it moves, views or allocates data), or would report differences that are not
defects (random numbers, uninitialised memory, device-specific answers), or cannot be re-run
on the CPU at all (collectives). The decision depends on the op overload only, so the mode
computes it once per overload and caches it; the reasons are the keys of summary.json's
``skipped`` counts. The exception is attention (``ATTENTION_BY_CALL``): its kernels take a
``dropout_p`` and carry the ``nondeterministic_seeded`` tag, yet they draw random numbers only when
they drop out, so `call_rule` decides per call (eval mode and dropout-free training compare them).

The reference (msprobe 8.3.3) kept a fixed name list with gaps (``empty_like``, ``normal_``,
``native_dropout``, void ops such as ``_foreach_add_`` ... were re-run and compared); here the
categories come from the op's schema where possible (no tensor argument, a Generator argument,
the ``nondeterministic_seeded`` tag, view aliasing), and the name lists below and the random kernels
of probes.core.random_ops cover the rest.

Casts are copies, but a cast *to* an FP8 format is a rounding to 3 or 2 significand bits that
FP8 training relies on (and one *from* it must be exact): ``_to_copy``'s reason is a copy, but its
`call_rule` has the last word per call: compared when it changes the dtype to or from an FP8
format.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from probes.core.random_ops import RANDOM_KERNELS, is_random
from probes.core.thresholds import FLOAT8_DTYPES, SCALE_DTYPES

FACTORY = "factory: no tensor input, the output depends only on the arguments"
UNINITIALISED = "uninitialised memory or storage reassignment (empty*, resize_, set_)"
CONSTANT_FILL = "fills a constant (*_like, new_*, fill_, zero_): no arithmetic to check"
RNG = "random numbers: device and CPU generators differ"
VIEW = "view or layout-only op: no arithmetic"
COPY = "copy, cast or device transfer: no arithmetic"
COLLECTIVE = "collective communication (the program's own or a DTensor redistribution's): cannot be re-run on one CPU"
REDISTRIBUTION = ("DTensor redistribution (a collective between the ranks of a mesh, e.g. shard_dim_alltoall): "
                  "cannot be re-run on one CPU")
HOST_SYNC = "host sync or assertion (item, _local_scalar_dense, _assert_*)"
DEVICE_QUERY = "asks about the device or backend: the CPU's answer differs by design"
# Decided per call rather than per overload:
NO_TENSOR = "called without tensors"
TOO_LARGE = "too large for the host memory left: its float64 reference copies would not fit"
JIT_TRACE = ("torch.jit.trace: the dispatch modes step aside while it traces (a mode changes the graph it "
             "records), so its ops are not compared")
TORCHSCRIPT = ("run by a TorchScript module (traced or scripted): the dispatch modes step aside (its "
               "interpreter hands a mode arguments it cannot run from Python), so its ops are not compared")
THROUGH_SUBCLASS = "tensor subclass: compared through the operators its __torch_dispatch__ runs on plain tensors"
THROUGH_DTENSOR = ("DTensor op: compared through its local kernels (the aten ops it runs on this rank's shards, "
                   "each counted as compared under its own name); its redistributions are counted as collectives")
UNSUPPORTED_TENSOR = "tensor subclass, meta, sparse or other non-strided tensors"
NO_CPU_KERNEL = "the reference run failed on the CPU (first failure recorded in the CSV)"
NO_CPU_REFERENCE = "a torch_npu operator without a CPU reference in probes/backends/npu_references.py"
HIGHER_ORDER = "higher-order operator (cond, while_loop, ...): it runs with its sub-graphs unchecked"

_BY_NAME: dict[str, str] = {}
for _reason, _names in (
    (UNINITIALISED, "empty empty_like empty_strided empty_permuted new_empty new_empty_strided resize_ resize_as_ "
                    "set_ _resize_output_ _empty_affine_quantized _empty_per_channel_affine_quantized"),
    (CONSTANT_FILL, "zeros_like ones_like full_like new_zeros new_ones new_full fill fill_ zero_ scalar_tensor"),
    (COPY, "_to_copy to copy_ clone contiguous lift lift_fresh lift_fresh_copy _copy_from _copy_from_and_resize "
           "detach detach_ _pin_memory pin_memory _unsafe_view _reshape_alias _to_dense to_dense "
           "_nested_tensor_from_tensor_list"),
    (HOST_SYNC, "_local_scalar_dense item is_nonzero _assert_async _assert_scalar _assert_tensor_metadata "
                "sym_constrain_range sym_constrain_range_for_size _functional_sym_constrain_range"),
    (DEVICE_QUERY, "_fused_sdp_choice is_pinned _use_cudnn_ctc_loss _use_cudnn_rnn_flatten_weight "
                   "_has_compatible_shallow_copy_type is_coalesced is_same_size sym_size sym_stride sym_numel "
                   "sym_storage_offset _nested_tensor_size _nested_tensor_strides _has_same_storage_numel "
                   "record_stream _cudnn_rnn _cudnn_init_dropout_state"),
):
    for _name in _names.split():
        _BY_NAME[_name] = _reason

# Attention kernels, forward and backward: random only when the call's dropout_p is above 0.
# (``_scaled_dot_product_attention_math`` is composite and reaches a dispatch mode as its parts;
# it is listed for callers that see it whole.)
ATTENTION_BY_CALL = frozenset({
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward",
    "_scaled_dot_product_fused_attention_overrideable", "_scaled_dot_product_fused_attention_overrideable_backward",
    "_scaled_dot_product_attention_math",
})



def chains_roundings(func: Any) -> bool:
    """A fused attention backward: it rounds P, dP and dS to the dtype on the way, so it is judged
    by the wider limit of chained roundings (probes.core.thresholds.dispatch_scaled_threshold)."""
    name = func._opname
    return func.namespace == "aten" and name in ATTENTION_BY_CALL and name.endswith("_backward")


_COLLECTIVE_NAMESPACES = frozenset({"c10d", "_c10d_functional", "c10d_functional", "_c10d_functional_autograd"})
_SEEDED = getattr(torch.Tag, "nondeterministic_seeded", None)


def _has_tensor_argument(schema: Any) -> bool:
    return any("Tensor" in str(a.type) for a in schema.arguments)


def _has_generator_argument(schema: Any) -> bool:
    return any("Generator" in str(a.type) for a in schema.arguments)


def _is_view_copy(func: Any) -> bool:
    """``permute_copy``, ``view_copy``…: the functionalised copy of a view op."""
    base = func._opname
    if not base.endswith("_copy") or func.namespace != "aten":
        return False
    packet = getattr(torch.ops.aten, base[: -len("_copy")], None)
    if packet is None:
        return False
    return any(getattr(packet, o).is_view for o in packet.overloads())


def skip_reason(func: Any) -> str | None:
    """The reason this op overload is not compared, or None when it is compared."""
    if func.namespace in _COLLECTIVE_NAMESPACES:
        return COLLECTIVE
    if func.namespace == "_dtensor":
        return REDISTRIBUTION
    name = func._opname
    by_name = _BY_NAME.get(name)
    if by_name is not None:
        return by_name
    if is_random(name, RANDOM_KERNELS):  # kernels, not public names: fractional_max_pool2d's is deterministic
        return RNG
    if name in ATTENTION_BY_CALL and func.namespace == "aten":
        return None  # decided per call: call_rule
    if "all_reduce" in name or "allreduce" in name or "all_gather" in name or "reduce_scatter" in name:
        return COLLECTIVE
    schema = func._schema
    if _has_generator_argument(schema) or (_SEEDED is not None and _SEEDED in func.tags):
        return RNG
    if func.is_view or _is_view_copy(func):
        return VIEW
    if not _has_tensor_argument(schema):
        return FACTORY
    return None


# ops that are a copy unless they cast to or from an FP8 format
FLOAT8_CASTS = frozenset({"_to_copy"})
_FLOAT8 = frozenset(getattr(torch, name) for name in FLOAT8_DTYPES + SCALE_DTYPES if hasattr(torch, name))


def _float8_cast_rule(args: tuple, kwargs: dict) -> str | None:
    """Compared when the call changes the dtype to or from an FP8 format, else a copy."""
    src = args[0] if args else kwargs.get("self")
    dst = kwargs.get("dtype")
    if not isinstance(src, torch.Tensor) or dst is None or dst == src.dtype:
        return COPY
    return None if (src.dtype in _FLOAT8 or dst in _FLOAT8) else COPY


def call_rule(func: Any) -> Callable[[tuple, dict], str | None] | None:
    """For an op whose skip depends on its arguments (attention: dropout; ``_to_copy``: FP8), the
    per-call decision (the reason or None, from the call's args and kwargs), which replaces the
    overload's `skip_reason`; None for ops decided per overload."""
    if func.namespace == "aten" and func._opname in FLOAT8_CASTS:
        return _float8_cast_rule
    if func.namespace != "aten" or func._opname not in ATTENTION_BY_CALL:
        return None
    arguments = func._schema.arguments
    found = [(i, a) for i, a in enumerate(arguments) if a.name == "dropout_p"]
    if not found:
        return None
    position, argument = found[0]
    default = argument.default_value if argument.has_default_value() else 0.0

    def dropout_rule(args: tuple, kwargs: dict) -> str | None:
        p = args[position] if position < len(args) else kwargs.get("dropout_p", default)
        return RNG if p is not None and float(p) > 0.0 else None

    return dropout_rule
