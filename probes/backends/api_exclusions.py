"""Which APIs are never re-run, and why, by their names and by how they are called (msprobe re-ran
all of them).

The API catalogs (torch_apis.py, mindspore_apis.py) record each API's reason and the wrappers
(patching.py) add the reasons of a call's arguments, so the knowledge lives with the catalogs
that name the APIs; free_benchmark, which re-runs calls, reads them. Re-running these would change
the user's model (in-place updates applied twice, optimizer steps, collectives issued again) or
compare noise with noise (random ops, uninitialised memory). Framework-free: rules on API names.
"""

from __future__ import annotations

import re

from probes.core.random_ops import RANDOM_FUNCTIONS, is_random

IN_PLACE = "in-place: re-running it would apply the update to the model twice"
OUT_ARG = "writes into an out= argument: the re-run would overwrite the real result"
RANDOM = "random: its output differs between runs by design"
UNINITIALISED = "returns uninitialised memory"
COLLECTIVE = "collective communication: re-running it would issue it again on every rank"
OPTIMIZER = "fused optimizer kernel: mutates parameters and optimizer state"
ACCESSOR = "returns metadata or a Python value, not a tensor computation"
SIDE_EFFECT = "has side effects on autograd, storage or streams"
DATA_MOVEMENT = ("moves, copies or casts data without arithmetic: a perturbation would only pass through "
                 "(and a one-ulp bf16 perturbation alone exceeds the bf16 threshold)")

_UNINITIALISED_NAMES = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
                        "empty_with_format", "empty_permuted", "new"}
_COLLECTIVE_NAMES = {
    "send", "recv", "isend", "irecv", "broadcast", "all_reduce", "reduce", "all_gather", "gather_object",
    "reduce_scatter", "_reduce_scatter_base", "_all_gather_base", "all_to_all_single", "all_to_all",
    "all_gather_into_tensor", "reduce_scatter_tensor", "batch_isend_irecv", "barrier",
}
_OPTIMIZER_RE = re.compile(r"(apply_adam|fused_adam|fused_sgd|_foreach_|apply_rms_prop|npu_bert_apply_adam)")
_ACCESSOR_NAMES = {
    "size", "dim", "ndimension", "numel", "nelement", "stride", "storage_offset", "data_ptr", "element_size",
    "get_device", "has_names", "tolist", "item", "numpy", "type", "equal", "allclose", "dim_order",
    "result_type", "can_cast", "promote_types", "__len__", "__bool__", "__nonzero__", "__int__", "__float__",
    "__index__", "__complex__", "__long__", "__hash__", "__repr__", "__format__", "__str__", "__array__",
    "__array_wrap__", "__contains__", "__iter__", "__reversed__", "__dlpack__", "__dlpack_device__",
    "dense_dim", "sparse_dim", "nbytes", "itemsize", "untyped_storage", "storage", "storage_type",
    "__deepcopy__", "__reduce_ex__", "__getstate__", "__sizeof__", "__setstate__", "const_data_ptr",
    "qscheme", "q_scale", "q_zero_point", "q_per_channel_axis", "q_per_channel_scales", "q_per_channel_zero_points",
    "hash_tensor",
}
_SIDE_EFFECT_NAMES = {
    "backward", "register_hook", "register_post_accumulate_grad_hook", "retain_grad", "record_stream",
    "module_load", "set_", "resize_", "resize_as_", "share_memory_", "apply_", "map_", "map2_",
    "__setitem__", "__delitem__", "copy_", "save", "load", "manual_seed", "seed", "set_rng_state",
}
# Views, copies, concatenations, index selections and dtype/device casts: exact by construction.
_DATA_MOVEMENT_NAMES = {
    "view", "view_as", "reshape", "reshape_as", "flatten", "unflatten", "ravel", "squeeze", "unsqueeze",
    "transpose", "swapaxes", "swapdims", "t", "permute", "movedim", "moveaxis", "contiguous", "expand",
    "expand_as", "broadcast_to", "broadcast_tensors", "repeat", "tile", "repeat_interleave", "clone", "detach",
    "to", "type_as", "float", "double", "half", "bfloat16", "cpu", "cuda", "xpu", "ipu", "mtia", "npu",
    "narrow", "narrow_copy", "select", "split", "split_with_sizes", "chunk", "unbind", "tensor_split", "hsplit",
    "vsplit", "dsplit", "unsafe_chunk", "unsafe_split", "unsafe_split_with_sizes", "__getitem__",
    "index_select", "gather", "take", "take_along_dim", "masked_select", "flip", "fliplr", "flipud", "roll",
    "rot90", "diagonal", "cat", "concat", "concatenate", "stack", "hstack", "vstack", "dstack", "column_stack",
    "row_stack", "atleast_1d", "atleast_2d", "atleast_3d", "as_strided", "alias_copy", "view_copy",
    "pin_memory", "resolve_conj", "resolve_neg", "positive", "__pos__", "conj", "align_as", "align_to",
    "refine_names", "rename", "new_tensor", "as_subclass", "int", "long", "short", "char", "byte", "bool",
    "cdouble", "cfloat", "chalf", "requires_grad", "dequantize", "to_dense", "coalesce",
    "masked_tensor", "as_masked_tensor",  # torch.masked's MaskedTensor constructors
    "scatter",  # torch.scatter / Tensor.scatter places values (a collective only in torch.distributed, never hooked)
    "to_sparse", "to_sparse_csr", "to_sparse_csc", "to_sparse_bsr", "to_sparse_bsc", "to_mkldnn",  # layouts
}
_INPLACE_DUNDER_RE = re.compile(r"^__i[a-z]+__$")
_PREFIXED_ACCESSOR_RE = re.compile(r"^(is_|has_|get_|set_|use_)")


def exclusion_reason(qualname: str) -> str | None:
    """Why the API named `qualname` (e.g. "add_", "linalg.norm", "__iadd__") is never re-run,
    or None when it may be. Only the last dotted segment matters."""
    name = qualname.rsplit(".", 1)[-1]
    if name in _SIDE_EFFECT_NAMES:
        return SIDE_EFFECT
    if name in _ACCESSOR_NAMES or _PREFIXED_ACCESSOR_RE.match(name):
        return ACCESSOR
    if name in _COLLECTIVE_NAMES:
        return COLLECTIVE
    if _OPTIMIZER_RE.search(qualname):
        return OPTIMIZER
    if is_random(name, RANDOM_FUNCTIONS):
        return RANDOM
    if name in _UNINITIALISED_NAMES:
        return UNINITIALISED
    if name in _DATA_MOVEMENT_NAMES:
        return DATA_MOVEMENT
    if _INPLACE_DUNDER_RE.match(name) and name not in ("__init__", "__invert__", "__index__", "__iter__"):
        return IN_PLACE
    if name.endswith("_") and not name.endswith("__"):
        return IN_PLACE
    return None
