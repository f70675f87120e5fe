"""online_dispatch compares scaled_dot_product_attention's fused kernels, forward and backward.

On the CPU (torch 2.13) ``F.scaled_dot_product_attention`` without dropout runs
``_scaled_dot_product_flash_attention_for_cpu`` and, in the backward,
``_scaled_dot_product_flash_attention_for_cpu_backward``; with dropout it is decomposed (matmul,
``_safe_softmax``, ``bernoulli_``...). Accelerators run other kernels (``_scaled_dot_product_flash_attention``,
``_scaled_dot_product_efficient_attention``, ``_scaled_dot_product_cudnn_attention``,
``_scaled_dot_product_fused_attention_overrideable``), simulated here by CPU kernels registered for
them with the accelerators' output layouts.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from dispatch_files import read_rows, summary
from torch.utils._python_dispatch import TorchDispatchMode

from probes.online_dispatch import reference, skip_list
from probes.pytorch.online_dispatch import PtdbgDispatch
from pytest_msprobe.testing import simulated_npu

A = torch.ops.aten
FLASH_CPU = "_scaled_dot_product_flash_attention_for_cpu"
FLASH_CPU_BACKWARD = "_scaled_dot_product_flash_attention_for_cpu_backward"


# helpers ------------------------------------------------------------------------------------------
def output_rows(run_dir: Path, op: str) -> dict[str, dict[str, str]]:
    """The output rows of the op's calls, by name (``<op>_<n>_output.<i>``)."""
    return {r["NPU Name"]: r for r in read_rows(run_dir)
            if r["NPU Name"].startswith(op + "_") and "_output" in r["NPU Name"]
            and r["NPU Name"][len(op) + 1:].split("_")[0].isdigit()}


def qkv(dtype: torch.dtype, b: int = 2, h: int = 4, seq_q: int = 8, seq_k: int = 8, e: int = 16,
        heads_kv: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    q = torch.randn(b, h, seq_q, e, dtype=dtype, requires_grad=True)
    k = torch.randn(b, heads_kv or h, seq_k, e, dtype=dtype, requires_grad=True)
    v = torch.randn(b, heads_kv or h, seq_k, e, dtype=dtype, requires_grad=True)
    return q, k, v


def attention_pass(dispatch: PtdbgDispatch | None, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   **kwargs: Any) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """F.sdpa forward in one context, its backward in another; the output and the gradients."""
    for t in (q, k, v):
        t.grad = None
    torch.manual_seed(1)
    with dispatch if dispatch is not None else contextlib.nullcontext():
        out = F.scaled_dot_product_attention(q, k, v, **kwargs)
    grad = torch.randn_like(out)
    with dispatch if dispatch is not None else contextlib.nullcontext():
        out.backward(grad)
    return out.detach().clone(), tuple(t.grad.clone() for t in (q, k, v))


class OpRecorder(TorchDispatchMode):
    """The aten ops a pass dispatches."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.ops.append(func._opname)
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def cpu_kernels(**kernels: Any) -> Iterator[None]:
    """Registers Python CPU kernels for aten ops for the block (an existing CPU kernel is
    overridden and restored on exit)."""
    lib = torch.library.Library("aten", "IMPL")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "overriding a previously registered kernel"
            for name, fn in kernels.items():
                lib.impl(name, fn, "CPU")
        yield
    finally:
        lib._destroy()


# the seeded device: attention kernels computing with bf16-rounded operands behind a float32 API
def _bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).to(t.dtype) if t.dtype == torch.float32 else t


def _scores(q: torch.Tensor, k: torch.Tensor, attn_mask: torch.Tensor | None, is_causal: bool,
            scale: float | None) -> torch.Tensor:
    s = q @ k.transpose(-2, -1) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if attn_mask is not None:
        s = s + attn_mask
    if is_causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).tril().logical_not(), float("-inf"))
    return s


def bf16_flash_forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout_p: float = 0.0,
                       is_causal: bool = False, *, attn_mask: torch.Tensor | None = None,
                       scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    s = _scores(_bf16(query), _bf16(key), attn_mask, is_causal, scale)
    lse = torch.logsumexp(s, -1)
    return torch.exp(s - lse.unsqueeze(-1)) @ _bf16(value), lse


def bf16_flash_backward(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        out: torch.Tensor, logsumexp: torch.Tensor, dropout_p: float, is_causal: bool, *,
                        attn_mask: torch.Tensor | None = None,
                        scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g, q, k, v = (_bf16(t) for t in (grad_out, query, key, value))
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    p = torch.exp(_scores(q, k, attn_mask, is_causal, scale) - logsumexp.unsqueeze(-1))
    ds = p * (g @ v.transpose(-2, -1) - (g * out).sum(-1, keepdim=True))
    return ds @ k * scale, ds.transpose(-2, -1) @ q * scale, p.transpose(-2, -1) @ g


# 1. what PyTorch dispatches on the CPU ------------------------------------------------------------
def test_sdpa_kernels_the_cpu_dispatches():
    """Which fused kernels reach a dispatch mode: they are the ones the mode must compare."""
    q, k, v = qkv(torch.float32)

    def ops(fn: Any) -> list[str]:
        rec = OpRecorder()
        with rec:
            fn()
        return [o for o in rec.ops if "attention" in o]

    assert ops(lambda: F.scaled_dot_product_attention(q, k, v).sum().backward()) == [FLASH_CPU, FLASH_CPU_BACKWARD]
    assert ops(lambda: F.scaled_dot_product_attention(q, k, v, dropout_p=0.3).sum().backward()) == []  # decomposed
    x = torch.randn(2, 8, 16, requires_grad=True)
    mha = nn.MultiheadAttention(16, 4, dropout=0.1, batch_first=True)
    assert ops(lambda: mha(x, x, x, need_weights=False)[0].sum().backward()) == []  # train: dropout 0.1
    mha.eval()
    assert ops(lambda: mha(x, x, x, need_weights=False)[0].sum().backward()) == [FLASH_CPU, FLASH_CPU_BACKWARD]
    assert ops(lambda: mha(x, x, x)[0].sum()) == []  # need_weights: the weights written out (bmm, softmax)
    with torch.no_grad():
        assert ops(lambda: mha(x, x, x, need_weights=False)) == ["_native_multi_head_attention"]  # fast path
    layer = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True).eval()
    assert ops(lambda: layer(x).sum().backward()) == [FLASH_CPU, FLASH_CPU_BACKWARD]


# 2. the skip decision, per call --------------------------------------------------------------------
def _overloads() -> list[Any]:
    found = []
    for name in sorted(skip_list.ATTENTION_BY_CALL):
        packet = getattr(A, name)
        found += [getattr(packet, o) for o in packet.overloads()]
    return found


@pytest.mark.parametrize("op", _overloads(), ids=str)
def test_attention_is_decided_per_call_by_dropout(op):
    assert skip_list.skip_reason(op) is None  # its tags say random: not decided per overload
    rule = skip_list.call_rule(op)
    assert rule is not None
    position = [a.name for a in op._schema.arguments].index("dropout_p")
    args = [None] * position
    assert rule((*args, 0.0), {}) is None
    assert rule((*args, 0.1), {}) == skip_list.RNG
    assert rule(tuple(args), {"dropout_p": 0.5}) == skip_list.RNG
    if op._schema.arguments[position].has_default_value():
        assert rule(tuple(args), {}) is None  # the default, 0


def test_other_ops_have_no_per_call_rule():
    assert set(reference.ATTENTION) <= skip_list.ATTENTION_BY_CALL
    for op in (A.mm.default, A.native_dropout.default, A.bernoulli_.float, A._efficient_attention_forward.default):
        assert skip_list.call_rule(op) is None
    assert skip_list.skip_reason(A._efficient_attention_forward.default) == skip_list.RNG  # not an SDPA entry point
    assert reference.host_reference(A._scaled_dot_product_flash_attention.default) is not None
    assert reference.host_reference(A._scaled_dot_product_flash_attention.quantized) is None  # descaled fp8
    assert reference.host_reference(A.mm.default) is None


# 3. the reference ----------------------------------------------------------------------------------
@pytest.mark.parametrize("case", ["plain", "causal", "float mask", "broadcast bias", "bool mask", "gqa", "scale"])
def test_reference_attention_equals_autograd_of_the_math(case):
    """The written-out reference (in blocks of queries) against PyTorch's float64 math kernel and
    its autograd, seq_q != seq_k."""
    q, k, v = (t.detach().double().requires_grad_() for t in qkv(torch.float64, seq_q=9, seq_k=13,
                                                                    heads_kv=2 if case == "gqa" else None))
    mask: torch.Tensor | None = None
    kwargs: dict[str, Any] = {}
    if case == "float mask":
        mask = torch.randn(9, 13, dtype=torch.float64, requires_grad=True)
    elif case == "broadcast bias":
        mask = torch.randn(2, 1, 1, 13, dtype=torch.float64, requires_grad=True)
    elif case == "bool mask":
        mask = torch.rand(9, 13) > 0.3
    kwargs["is_causal"] = case == "causal"
    kwargs["enable_gqa"] = case == "gqa"
    kwargs["scale"] = 0.3 if case == "scale" else None
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kwargs)
    grad = torch.randn_like(expected)
    leaves = [q, k, v] + ([mask] if mask is not None and mask.is_floating_point() else [])
    expected_grads = torch.autograd.grad(expected, leaves, grad)
    blocks = reference._BLOCK_ELEMENTS
    try:
        reference._BLOCK_ELEMENTS = 2 * 4 * 13 * 2  # blocks of two queries
        out, lse, grads = reference.attention(q.detach(), k.detach(), v.detach(),
                                              None if mask is None else mask.detach(), kwargs["is_causal"],
                                              kwargs["scale"], grad=grad)
    finally:
        reference._BLOCK_ELEMENTS = blocks
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    scores = q @ k.repeat_interleave(q.shape[1] // k.shape[1], 1).transpose(-2, -1) * (kwargs["scale"] or 0.25)
    if mask is not None:
        scores = scores + (mask if mask.is_floating_point() else torch.zeros(mask.shape).masked_fill(~mask, -torch.inf))
    if kwargs["is_causal"]:
        scores = scores.masked_fill(torch.ones(9, 13, dtype=torch.bool).tril().logical_not(), -torch.inf)
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1).detach(), rtol=1e-12, atol=1e-12)
    assert grads is not None
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    if len(expected_grads) == 3:
        assert grads[3] is None


def test_reference_of_fully_masked_queries_and_lower_right_causal():
    q, k, v = (t.detach() for t in qkv(torch.float64, seq_q=3, seq_k=5))
    keep = torch.ones(3, 5, dtype=torch.bool)
    keep[1] = False
    out, lse, _ = reference.attention(q, k, v, keep, False, None)
    assert torch.equal(out[:, :, 1], torch.zeros_like(out[:, :, 1])) and bool((lse[:, :, 1] == -torch.inf).all())
    assert bool(torch.isfinite(lse[:, :, [0, 2]]).all())
    got, _, _ = reference.attention(q, k, v, None, True, None, lower_right=True)
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, attn_mask=_lower_right(3, 5).double()))


# 4. clean attention passes, forward and backward -----------------------------------------------------
MASKS = ["none", "float", "bool with a fully masked query", "causal"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("mask", MASKS)
def test_clean_sdpa_is_compared_and_passes(tmp_path, dtype, mask):
    q, k, v = qkv(dtype)
    kwargs: dict[str, Any] = {}
    if mask == "float":
        kwargs["attn_mask"] = torch.randn(8, 8, dtype=dtype)
    elif mask == "causal":
        kwargs["is_causal"] = True
    elif mask != "none":
        keep = torch.rand(8, 8) > 0.3
        keep[3] = False  # query 3 attends to nothing: no logsumexp, output 0
        kwargs["attn_mask"] = keep
    plain = attention_pass(None, q, k, v, **kwargs)
    d = PtdbgDispatch(dump_mode="auto", dump_path=str(tmp_path))
    probed = attention_pass(d, q, k, v, **kwargs)
    assert torch.equal(plain[0], probed[0]) and all(torch.equal(a, b) for a, b in zip(plain[1], probed[1]))
    s = summary(d.run_dir)
    assert s["failed_op_count"] == 0, s["failed_ops"]
    assert s["probe_errors"] == {}
    assert FLASH_CPU not in json.dumps(s["skipped"])
    forward, backward = output_rows(d.run_dir, FLASH_CPU), output_rows(d.run_dir, FLASH_CPU_BACKWARD)
    assert sorted(forward) == [f"{FLASH_CPU}_1_output.0", f"{FLASH_CPU}_1_output.1"]  # attention, logsumexp
    assert sorted(backward) == [f"{FLASH_CPU_BACKWARD}_1_output.{i}" for i in range(3)]  # dq, dk, dv
    for row in (*forward.values(), *backward.values()):
        assert row["Accuracy Reached or Not"] == "Yes", row
        assert row["Bench Tensor Dtype"] == "torch.float64"
        assert row["Scaled Error (ulp)"] != ""
    lse = forward[f"{FLASH_CPU}_1_output.1"]
    assert lse["NPU Tensor Dtype"] == "torch.float32" and lse["NPU Tensor Shape"] == "[2, 4, 8]"


def test_clean_bf16_backward_is_judged_on_the_output_it_received(tmp_path):
    """The backward's softmax correction rowsum(grad · out) cancels: from the exact output instead
    of the bf16 one the kernel received, dq of this clean kernel measured 6 bf16 ulps (threshold 4)."""
    q, k, v = qkv(torch.bfloat16, b=1, h=8, seq_q=512, seq_k=512, e=64)
    d = PtdbgDispatch(dump_path=str(tmp_path))
    attention_pass(d, q, k, v, is_causal=True)
    s = summary(d.run_dir)
    assert s["failed_op_count"] == 0, s["failed_ops"]
    assert len(output_rows(d.run_dir, FLASH_CPU_BACKWARD)) == 3


def test_clean_bf16_backward_of_a_long_sequence_passes(tmp_path):
    """A fused attention backward rounds P, dP and dS to bf16 on the way: at 4,096 keys its clean
    dk / dv reach 4.6 ulps, judged by the chained limit (16 ulps) as free_benchmark's backward
    stage; the forward keeps the 4-ulp limit."""
    q, k, v = qkv(torch.bfloat16, b=1, h=2, seq_q=64, seq_k=4096, e=64)
    d = PtdbgDispatch(dump_path=str(tmp_path))
    attention_pass(d, q, k, v)
    s = summary(d.run_dir)
    assert s["failed_op_count"] == 0, s["failed_ops"]
    assert len(output_rows(d.run_dir, FLASH_CPU_BACKWARD)) == 3
    assert skip_list.chains_roundings(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
    assert not skip_list.chains_roundings(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default)


def test_clean_sdpa_in_the_reference_thread(tmp_path):
    q, k, v = qkv(torch.float32, seq_q=16, seq_k=24, heads_kv=2)
    d = PtdbgDispatch(dump_path=str(tmp_path), background=True)
    attention_pass(d, q, k, v, enable_gqa=True)
    s = summary(d.run_dir)
    assert s["failed_op_count"] == 0 and s["probe_errors"] == {}
    assert len(output_rows(d.run_dir, FLASH_CPU)) == 2 and len(output_rows(d.run_dir, FLASH_CPU_BACKWARD)) == 3


def test_bf16_on_an_accelerator_is_compared_in_float32(tmp_path):
    """Off the CPU the reference of bf16 is float32 (the simulated NPU runs the CPU's kernels)."""
    with simulated_npu():
        q = torch.randn(2, 4, 8, 16, dtype=torch.bfloat16, device="npu")
        d = PtdbgDispatch(dump_path=str(tmp_path))
        with d:
            A._scaled_dot_product_flash_attention_for_cpu(q, q, q)
    s = summary(d.run_dir)
    assert s["devices"] == {"npu": 1} and s["failed_op_count"] == 0 and s["probe_errors"] == {}
    out = output_rows(d.run_dir, FLASH_CPU)[f"{FLASH_CPU}_1_output.0"]
    assert (out["NPU Tensor Dtype"], out["Bench Tensor Dtype"], out["Accuracy Reached or Not"]) == (
        "torch.bfloat16", "torch.float32", "Yes")


# 5. seeded defects -----------------------------------------------------------------------------------
def test_seeded_bf16_attention_kernel_is_flagged(tmp_path):
    q, k, v = qkv(torch.float32)
    with cpu_kernels(**{FLASH_CPU: bf16_flash_forward}):
        d = PtdbgDispatch(dump_mode="auto", dump_path=str(tmp_path))
        with d:
            F.scaled_dot_product_attention(q, k, v)
    s = summary(d.run_dir)
    assert [f["name"] for f in s["failed_ops"]] == [f"{FLASH_CPU}_1"]
    rows = output_rows(d.run_dir, FLASH_CPU)
    out = rows[f"{FLASH_CPU}_1_output.0"]
    assert out["Accuracy Reached or Not"] == "No" and out["FailedRule"] == "scaled"  # Cosine 1.0: msprobe's rule is blind
    assert float(out["Scaled Error (ulp)"]) > 10 * 1678
    assert (d.run_dir / "npu" / f"{FLASH_CPU}_1_output.0.npy").exists()


def test_seeded_bf16_attention_backward_is_flagged(tmp_path):
    q, k, v = qkv(torch.float32)
    with cpu_kernels(**{FLASH_CPU_BACKWARD: bf16_flash_backward}):
        d = PtdbgDispatch(dump_path=str(tmp_path))
        attention_pass(d, q, k, v)
    s = summary(d.run_dir)
    assert [f["name"] for f in s["failed_ops"]] == [f"{FLASH_CPU_BACKWARD}_1"]  # the forward is clean
    rows = output_rows(d.run_dir, FLASH_CPU_BACKWARD)
    assert [rows[f"{FLASH_CPU_BACKWARD}_1_output.{i}"]["FailedRule"] for i in range(3)] == ["scaled"] * 3


# 6. dropout: random, skipped -------------------------------------------------------------------------
def test_dropout_calls_are_skipped_as_random(tmp_path):
    q, k, v = qkv(torch.float32)
    d = PtdbgDispatch(dump_path=str(tmp_path))
    with d:
        torch.manual_seed(0)
        F.scaled_dot_product_attention(q, k, v, dropout_p=0.3)  # decomposed: bernoulli_ draws the mask
        with contextlib.suppress(RuntimeError):  # torch 2.13's CPU kernel refuses dropout; a device's draws
            A._scaled_dot_product_flash_attention_for_cpu(q.detach(), k.detach(), v.detach(), 0.3)
        A._scaled_dot_product_flash_attention_for_cpu(q.detach(), k.detach(), v.detach(), 0.0)
    s = summary(d.run_dir)
    assert s["skipped"][skip_list.RNG][f"aten.{FLASH_CPU}.default"] == 1
    assert "aten.bernoulli_.float" in s["skipped"][skip_list.RNG]
    assert sorted(output_rows(d.run_dir, FLASH_CPU)) == [f"{FLASH_CPU}_1_output.0", f"{FLASH_CPU}_1_output.1"]
    assert s["failed_op_count"] == 0


# 7. modules ------------------------------------------------------------------------------------------
def test_multihead_attention_in_eval_shows_the_sdpa_rows(tmp_path):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 4, dropout=0.1, batch_first=True).eval()  # eval: dropout_p 0
    x = torch.randn(2, 8, 16, requires_grad=True)
    d = PtdbgDispatch(dump_path=str(tmp_path))
    with d:
        out, _ = mha(x, x, x, need_weights=False)
    with d:
        out.sum().backward()
    s = summary(d.run_dir)
    assert s["failed_op_count"] == 0 and s["probe_errors"] == {}
    rows = {**output_rows(d.run_dir, FLASH_CPU), **output_rows(d.run_dir, FLASH_CPU_BACKWARD)}
    assert sorted(rows) == [f"{FLASH_CPU}_1_output.0", f"{FLASH_CPU}_1_output.1",
                            *(f"{FLASH_CPU_BACKWARD}_1_output.{i}" for i in range(3))]
    assert all(r["Accuracy Reached or Not"] == "Yes" for r in rows.values())
    assert rows[f"{FLASH_CPU}_1_output.0"]["NPU Tensor Shape"] == "[2, 4, 8, 4]"


# 8. accelerator kernels' layouts, simulated by CPU kernels ------------------------------------------
def _lower_right(seq_q: int, seq_k: int) -> torch.Tensor:
    """is_causal aligned to the last key, as an additive mask (the CPU kernel takes no bool mask)."""
    keep = torch.ones(seq_q, seq_k, dtype=torch.bool).tril(diagonal=seq_k - seq_q)
    return torch.zeros(seq_q, seq_k).masked_fill(~keep, -torch.inf)


def cuda_like_efficient(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_bias: torch.Tensor | None,
                        compute_log_sumexp: bool, dropout_p: float = 0.0, is_causal: bool = False, *,
                        scale: float | None = None) -> tuple[torch.Tensor, ...]:
    """CUDA's memory-efficient layout: logsumexp padded to blocks of 32 queries (inf there), philox
    seed and offset."""
    out, lse = A._scaled_dot_product_flash_attention_for_cpu(query, key, value, 0.0, is_causal, attn_mask=attn_bias,
                                                             scale=scale)
    seq_q = query.shape[-2]
    padded = torch.full((*lse.shape[:-1], -(-seq_q // 32) * 32), torch.inf)
    padded[..., :seq_q] = lse
    return out, padded if compute_log_sumexp else lse.new_empty(0), torch.tensor(123), torch.tensor(7)


def cuda_like_flash(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout_p: float = 0.0,
                    is_causal: bool = False, return_debug_mask: bool = False, *,
                    scale: float | None = None) -> tuple[Any, ...]:
    """CUDA's flash layout: nine outputs, is_causal aligned to the last key."""
    seq_q, seq_k = query.shape[-2], key.shape[-2]
    mask = _lower_right(seq_q, seq_k) if is_causal else None
    out, lse = A._scaled_dot_product_flash_attention_for_cpu(query, key, value, attn_mask=mask, scale=scale)
    empty = query.new_empty(0)
    return out, lse, empty, empty, seq_q, seq_k, torch.tensor([5, 9]), empty, empty


def cuda_like_flash_backward(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             out: torch.Tensor, logsumexp: torch.Tensor, cum_seq_q: torch.Tensor,
                             cum_seq_k: torch.Tensor, max_q: int, max_k: int, dropout_p: float, is_causal: bool,
                             philox_seed: torch.Tensor, philox_offset: torch.Tensor, *,
                             scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    mask = _lower_right(query.shape[-2], key.shape[-2]) if is_causal else None
    return A._scaled_dot_product_flash_attention_for_cpu_backward(grad_out, query, key, value, out, logsumexp, 0.0,
                                                                  False, attn_mask=mask, scale=scale)


@pytest.mark.parametrize("compute_log_sumexp", [True, False])
def test_efficient_kernel_layout(tmp_path, compute_log_sumexp):
    q, k, v = (t.detach() for t in qkv(torch.float32, seq_q=40, seq_k=24))
    bias = torch.randn(40, 24)
    op = "_scaled_dot_product_efficient_attention"
    with cpu_kernels(**{op: cuda_like_efficient}):
        d = PtdbgDispatch(dump_path=str(tmp_path))
        with d:
            A._scaled_dot_product_efficient_attention(q, k, v, bias, compute_log_sumexp, 0.0, True)
            A._scaled_dot_product_efficient_attention(q, k, v, bias, compute_log_sumexp, 0.2)
    s = summary(d.run_dir)
    assert s["failed_op_count"] == 0, s["failed_ops"]
    assert s["skipped"][skip_list.RNG] == {f"aten.{op}.default": 1}  # the dropout call
    rows = output_rows(d.run_dir, op)
    assert rows[f"{op}_1_output.0"]["Accuracy Reached or Not"] == "Yes"
    lse = rows[f"{op}_1_output.1"]
    if compute_log_sumexp:  # the padding is not compared
        assert lse["Accuracy Reached or Not"] == "Yes" and lse["NPU Tensor Shape"] == "[2, 4, 40]"
    else:
        assert lse["Accuracy Reached or Not"] == "Nan" and "not computed" in lse["Err_message"]
    for i in (2, 3):
        assert rows[f"{op}_1_output.{i}"]["Accuracy Reached or Not"] == "Nan"
        assert "random-number state" in rows[f"{op}_1_output.{i}"]["Err_message"]


def test_flash_kernel_layout_and_lower_right_causal(tmp_path):
    q, k, v = (t.detach() for t in qkv(torch.float32, seq_q=6, seq_k=10))
    op, back = "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward"
    with cpu_kernels(**{op: cuda_like_flash, back: cuda_like_flash_backward}):
        d = PtdbgDispatch(dump_path=str(tmp_path))
        with d:
            res = A._scaled_dot_product_flash_attention(q, k, v, 0.0, True)
        with d:
            grads = A._scaled_dot_product_flash_attention_backward(torch.ones_like(res[0]), q, k, v, res[0], res[1],
                                                                   res[2], res[3], 6, 10, 0.0, True, res[6], res[7])
    assert len(grads) == 3
    s = summary(d.run_dir)
    assert s["failed_op_count"] == 0, s["failed_ops"]
    rows = output_rows(d.run_dir, op)
    verdicts = [rows[f"{op}_1_output.{i}"]["Accuracy Reached or Not"] for i in range(9)]
    assert verdicts == ["Yes", "Yes"] + ["Nan"] * 7  # attention, logsumexp; bookkeeping, RNG state, debug mask
    assert "bookkeeping" in rows[f"{op}_1_output.4"]["Err_message"]
    back_rows = output_rows(d.run_dir, back)
    assert [back_rows[f"{back}_1_output.{i}"]["Accuracy Reached or Not"] for i in range(3)] == ["Yes"] * 3


def test_flash_kernel_with_the_wrong_causal_alignment_is_flagged(tmp_path):
    """A kernel aligning is_causal to the first key where its API says the last is a defect."""
    q, k, v = (t.detach() for t in qkv(torch.float32, seq_q=6, seq_k=10))
    op = "_scaled_dot_product_flash_attention"

    def upper_left(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout_p: float = 0.0,
                   is_causal: bool = False, return_debug_mask: bool = False, *,
                   scale: float | None = None) -> tuple[Any, ...]:
        out, lse = A._scaled_dot_product_flash_attention_for_cpu(query, key, value, 0.0, is_causal, scale=scale)
        empty = query.new_empty(0)
        return out, lse, empty, empty, 6, 10, empty, empty, empty

    with cpu_kernels(**{op: upper_left}):
        d = PtdbgDispatch(dump_path=str(tmp_path))
        with d:
            A._scaled_dot_product_flash_attention(q, k, v, 0.0, True)
    assert [f["name"] for f in summary(d.run_dir)["failed_ops"]] == [f"{op}_1"]
    assert output_rows(d.run_dir, op)[f"{op}_1_output.0"]["Accuracy Reached or Not"] == "No"
