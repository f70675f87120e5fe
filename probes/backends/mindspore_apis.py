"""The MindSpore APIs free_benchmark can hook (PyNative), and their names.

The whitelist is the reference's (msprobe 8.3.3's free-benchmark yaml), intersected
with what the installed MindSpore has. Families and name prefixes (msprobe's):

    mindspore.ops                  → Functional      mindspore.ops.add            → Functional.add
    mindspore.Tensor methods       → Tensor          mindspore.Tensor.__add__     → Tensor.__add__
    mindspore.mint                 → Mint            mindspore.mint.matmul        → Mint.matmul
    mindspore.mint.nn.functional   → MintFunctional  mindspore.mint.nn.functional.relu → MintFunctional.relu

Calls are named like PyTorch's, per call and per step: `Functional.add.0.forward` (the reference
gave every call of an API one fixed id such as `Functional.add.0`, with no stage suffix).
Random and in-place APIs of the whitelist (bernoulli, normal, rrelu, `__iadd__`, ...) are wrapped
only so that their exclusion is counted; they are never re-run (the reference re-ran them).
Dropout is never replaced by an identity (the reference did so while its hooks were installed). Wrapping and restoring is the PyTorch probe's (probes.backends.patching).
"""

from __future__ import annotations

import inspect
from typing import Any

import mindspore
import mindspore.mint.nn.functional as mint_functional
from mindspore import Tensor, mint, ops

from probes.backends import api_exclusions
from probes.backends.patching import ApiMeta, call_exclusion, catalog_meta, inplace_position, is_op_callable

__all__ = ["FAMILIES", "WHITELIST", "build_catalog", "call_exclusion", "full_name"]

_OPS = """
adaptive_avg_pool1d adaptive_avg_pool2d adaptive_avg_pool3d adaptive_max_pool1d adaptive_max_pool2d avg_pool1d
avg_pool2d avg_pool3d batch_norm bias_add conv1d conv2d conv3d deformable_conv2d fractional_max_pool3d lp_pool1d
lp_pool2d lrn max_pool2d max_pool3d max_unpool1d max_unpool2d max_unpool3d binary_cross_entropy
binary_cross_entropy_with_logits cosine_embedding_loss cross_entropy ctc_loss gaussian_nll_loss hinge_embedding_loss
huber_loss kl_div l1_loss margin_ranking_loss mse_loss multi_margin_loss multilabel_margin_loss
multilabel_soft_margin_loss nll_loss smooth_l1_loss triplet_margin_loss elu fast_gelu gelu glu gumbel_softmax
hardshrink hardsigmoid hardswish hardtanh leaky_relu log_softmax logsigmoid mish prelu relu relu6 rrelu selu sigmoid
silu softmax softmin softshrink softsign tanh threshold cdist dist pdist choice_with_mask random_categorical
log_uniform_candidate_sampler uniform_candidate_sampler affine_grid bounding_box_decode bounding_box_encode col2im
check_valid crop_and_resize grid_sample interpolate iou pad padding pixel_shuffle pixel_unshuffle upsample
accumulate_n acos arccos acosh add addcdiv addcmul addmv addn angle arccosh arcsin arcsinh arctan arctanh arctan2
asin asinh atan atan2 atanh atleast_1d atleast_2d atleast_3d bessel_i0 bessel_i0e bessel_i1 bessel_i1e bessel_j0
bessel_j1 bessel_k0 bessel_k0e bessel_k1 bessel_k1e bessel_y0 bessel_y1 ceil clamp clip cos cosh cosine_similarity
cov diag_embed diff deg2rad digamma div divide erf erfc erfinv exp exp2 expm1 floor floor_div floor_mod float_power
fmod frac gcd hypot igamma igammac imag i0 inv invert lcm ldexp lerp log log2 log10 log1p logaddexp logaddexp2
logical_and logical_not logical_or logical_xor logit mul multiply mvlgamma polar polygamma pow rad2deg ravel real
reciprocal remainder rot90 round rsqrt sgn sign signbit sin sinc sinh sqrt square sub subtract tan tanhshrink trapz
tril_indices triu_indices true_divide trunc truncate_div truncate_mod xdivy xlogy zeta amax amin aminmax argmax
argmin cummax cummin cumprod cumsum fmax histc logsumexp max mean median min norm prod std std_mean var var_mean
argsort approximate_equal intopk maximum minimum msort searchsorted topk bmm addbmm addmm baddbmm addr adjoint
cholesky cholesky_solve batch_dot dot eig inner inverse geqrf ger kron lu_solve lu_unpack matmul matrix_solve
matrix_band_part matrix_diag matrix_diag_part matrix_set_diag mm mv outer orgqr ormqr pinv svd tensor_dot logdet
slogdet qr trace bartlett_window blackman_window hamming_window hann_window kaiser_window heaviside bernoulli gamma
laplace multinomial multinomial_with_replacement standard_laplace standard_normal uniform argwhere
batch_to_space_nd bincount block_diag broadcast_to channel_shuffle column_stack conj count_nonzero diag diagflat
diagonal dyn_shape dsplit dstack einsum expand expand_dims flip fliplr flipud gather_d gather_elements gather_nd
hsplit hstack masked_fill masked_select meshgrid moveaxis movedim narrow nan_to_num nansum normal population_count
sequence_mask space_to_batch_nd sparse_segment_mean sum swapaxes swapdims tril triu unbind unsorted_segment_max
unsorted_segment_min unsorted_segment_prod unsorted_segment_sum vsplit vstack cross renorm tuple_to_array
clip_by_global_norm clip_by_value derivative jet
"""
_TENSOR = """
__add__ __and__ __iadd__ __ifloordiv__ __imatmul__ __imod__ __imul__ __isub__ __matmul__ __mod__ __mul__ __pow__
__radd__ __rmatmul__ __rmod__ __rmul__ __rpow__ __rsub__ __sub__ __truediv__ __xor__ acos acosh add addbmm addcdiv
addcmul addmm addmv addr all amax amin any arccos arccosh argmax angle arcsin arcsinh arctan arctanh argmin argsort
asin asinh atan atan2 atanh baddbmm bernoulli bincount bmm broadcast_to cholesky_solve cholesky conj cos cosh cross
cummax cummin cumprod cumsum deg2rad diag diagflat diff digamma div divide erf erfc erfinv exp expand_as expm1 flip
fliplr flipud float_power fmod frac gather_elements geqrf ger half hardshrink heaviside histc hypot i0 igamma igammac
imag index_add inner lcm ldexp lerp log log10 log1p log2 logaddexp logaddexp2 logdet logical_and logical_not
logical_or logical_xor logit logsumexp long masked_fill masked_scatter masked_select matmul mean median moveaxis
movedim multinomial multiply mvlgamma nansum narrow nelement norm ormqr permute pow prod qr ravel real reciprocal
remainder renorm rad2deg round rot90 rsqrt sum_to_size scatter sgn short sigmoid sign signbit sin sinc sinh slogdet
sort sqrt square std subtract svd swapaxes swapdims tan tanh trace topk tril true_divide trunc unbind
unique_consecutive var xlogy from_numpy diagonal sum
"""
_MINT = """
add add_ex any_ex argmax avg_pool2d baddbmm baddbmm_ex batch_norm binary_cross_entropy_with_logits bmm broadcast_to
conv2d conv_transpose2d cos cross cummax cummin cumsum div divide embedding erf erfinv exp gather gelu greater
grid_sample group_norm index_select interpolate layer_norm leaky_relu linear linspace log logical_and logical_not
logical_or masked_select matmul max_pool2d mean mean_ex mul normal permute permute_ex pow prod reciprocal relu
remainder repeat_interleave rsqrt searchsorted sigmoid silu sin softmax softplus sort sqrt sqrt_ex square stack sub
sub_ex sum tanh topk triu xlogy
"""
_MINT_FUNCTIONAL = """
absolute_import avg_pool2d batch_norm batch_norm_ex bce_with_logits binary_cross_entropy_with_logits
conv_transpose2d dense embedding fold gelu grid_sample group_norm interpolate layer_norm leaky_relu linear max_pool2d
max_pool2d_ex normal one_hot one_hot_ext pad relu sigmoid silu softmax softmax_ex softplus tanh unfold
"""

#: (dotted prefix users write in `list`, name prefix, owner) per family.
FAMILIES = (
    ("mindspore.ops.", "Functional", ops),
    ("mindspore.Tensor.", "Tensor", Tensor),
    ("mindspore.mint.", "Mint", mint),
    ("mindspore.mint.nn.functional.", "MintFunctional", mint_functional),
)
#: The reference's whitelist, per name prefix (before intersecting with the installed MindSpore).
WHITELIST = {
    "Functional": tuple(dict.fromkeys(_OPS.split())),
    "Tensor": tuple(dict.fromkeys(_TENSOR.split())),
    "Mint": tuple(dict.fromkeys(_MINT.split())),
    "MintFunctional": tuple(dict.fromkeys(_MINT_FUNCTIONAL.split())),
}
_DOTTED = {prefix: dotted for dotted, prefix, _owner in FAMILIES}
# APIs that update some of their inputs (running statistics, renormed embeddings) although their
# names do not say so: their re-run gets copies of every tensor argument.
_MUTATES_INPUTS = {"batch_norm", "batch_norm_ex", "embedding"}


def full_name(key: str) -> str:
    """`Functional.add` → `mindspore.ops.add` (the form `list` entries use)."""
    prefix, _, qual = key.partition(".")
    return _DOTTED[prefix] + qual


def _entry(prefix: str, owner: Any, name: str) -> ApiMeta | None:
    if owner is Tensor:
        static = inspect.getattr_static(owner, name, None)
        if static is None or isinstance(static, (property, staticmethod, classmethod)):
            return None  # from_numpy is a constructor, not a computation on a tensor
        value = getattr(owner, name)
        own = owner.__dict__.get(name)
        had_own = name in owner.__dict__
    else:
        value = owner.__dict__.get(name)
        own, had_own = value, True
    if value is None or not is_op_callable(value):
        return None  # absent from this MindSpore, or not a function (mint.nn.functional.absolute_import)
    return catalog_meta(prefix, name, owner, name, value, own, had_own, _classify)


def _classify(meta: ApiMeta) -> None:
    meta.exclusion = api_exclusions.exclusion_reason(meta.qualname)
    meta.mutates_inputs = meta.qualname in _MUTATES_INPUTS
    if meta.owner is not Tensor:
        meta.inplace_pos = inplace_position(meta.original)


def build_catalog() -> tuple[ApiMeta, ...]:
    """The whitelist ∩ the installed MindSpore, read afresh so attributes patched after import
    (by users or tests) are the ones wrapped and restored."""
    metas = []
    for _dotted, prefix, owner in FAMILIES:
        for name in WHITELIST[prefix]:
            meta = _entry(prefix, owner, name)
            if meta is not None:
                metas.append(meta)
    return tuple(metas)


_ = mindspore
