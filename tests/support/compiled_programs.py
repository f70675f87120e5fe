"""Compiled programs for the torch.compile tests: small models, a function with a graph break, the
RoPE pattern, seeded vendor backends that run one operator in reduced precision, and a runner
that counts what Dynamo compiled."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch._dynamo.utils import counters


def mlp(dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64),
                               torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding as Llama applies it (pytorch/pytorch#182225's pattern)."""
    return (q * cos) + (rotate_half(q) * sin)


def rope_inputs(dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, 64, 64, generator=g).to(dtype)
    inv = 1.0 / (10000 ** (torch.arange(0, 64, 2, dtype=torch.float32) / 64))
    angles = torch.arange(64, dtype=torch.float32)[:, None] * inv[None]
    emb = torch.cat((angles, angles), dim=-1)
    return q, emb.cos().to(dtype), emb.sin().to(dtype)


def with_graph_break(x: torch.Tensor) -> torch.Tensor:
    y = torch.nn.functional.gelu(x @ x.T)
    if float(y.sum()) > 0:  # a data-dependent branch: Dynamo breaks the graph here
        y = y * 2
    return torch.softmax(y, dim=-1)


# seeded defects: backends that run one operator of the graph in reduced precision --------------
def _linear_through_bf16(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """A float32 linear layer on bfloat16-rounded inputs (as a TF32 / bf16 tensor core would)."""
    return torch.nn.functional.linear(x.bfloat16().to(x.dtype), w.bfloat16().to(w.dtype), b)


def _gelu_through_fp16(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """A float32 GELU computed in float16."""
    return torch.nn.functional.gelu(x.half(), approximate=approximate).to(x.dtype)


class _GeluFp16Backward(torch.autograd.Function):
    """GELU whose forward is exact and whose backward computes its derivative in float16: a
    defect only the gradients show."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return torch.nn.functional.gelu(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        h = x.half()
        derivative = 0.5 * (1 + torch.erf(h * 0.7071067811865476)) + h * torch.exp(-0.5 * h * h) * 0.3989422804014327
        return grad * derivative.to(grad.dtype)


def _gelu_backward_through_fp16(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    return _GeluFp16Backward.apply(x)


REWRITES: dict[str, tuple[tuple[Any, ...], Callable[..., Any]]] = {
    "linear": ((torch._C._nn.linear, torch.nn.functional.linear), _linear_through_bf16),
    "gelu": ((torch._C._nn.gelu, torch.nn.functional.gelu), _gelu_through_fp16),
    "gelu_backward": ((torch._C._nn.gelu, torch.nn.functional.gelu), _gelu_backward_through_fp16),
}


def vendor_backend(defect: str | None = None, inner: str | Callable[..., Any] = "aot_eager",
                   occurrence: int = 0) -> Callable[..., Any]:
    """A backend the way vendors plug one in: it takes Dynamo's FX graph, rewrites the
    `occurrence`-th node of the defect's operator to run in reduced precision, and compiles the
    result with `inner`. No defect: a clean vendor backend."""
    from torch._dynamo import lookup_backend

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        if defect is not None:
            targets, lossy = REWRITES[defect]
            found = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in targets]
            if len(found) > occurrence:
                found[occurrence].target = lossy
                gm.recompile()
        compile_fn = lookup_backend(inner) if isinstance(inner, str) else inner
        return compile_fn(gm, example_inputs)

    backend.__name__ = f"vendor_{defect or 'clean'}"
    return backend


@dataclass
class CompiledRun:
    outputs: list[torch.Tensor]
    grads: list[torch.Tensor]
    graphs: int
    breaks: int


def compiled_run(fn: Callable[..., Any], inputs: list[tuple[Any, ...]], params: list[torch.Tensor] | None = None,
                 backward: bool = True, around: Any = None, **compile_kwargs: Any) -> CompiledRun:
    """torch.compile(fn) called on each input tuple (inside `around`, a context manager factory,
    when given), outputs and parameter gradients kept; with Dynamo's graph and graph-break counts."""
    import contextlib

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(fn, **compile_kwargs)
    outputs = []
    context = around() if around is not None else contextlib.nullcontext()
    with context:
        for args in inputs:
            out = compiled(*args)
            outputs.append(out.detach().clone())
            if backward:
                out.float().square().mean().backward()
    grads = [p.grad.detach().clone() for p in params or [] if p.grad is not None]
    return CompiledRun(outputs, grads, counters["stats"]["unique_graphs"], sum(counters["graph_break"].values()))


# PyTorch's own compile test patterns (test/dynamo): each a function of (x, w), x of shape (8, 16)
class _Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return 2 * x * grad


def _custom_function(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return _Square.apply(x @ w).sum(-1)


def _checkpointed(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    from torch.utils.checkpoint import checkpoint

    return checkpoint(lambda a: torch.tanh(a @ w), x, use_reentrant=False).mean(0)


def _mutates_input(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    buffer = x.detach().clone()
    buffer.mul_(2.0)
    return (buffer @ w).relu()


def _cond(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.cond(x.sum() > 0, lambda a: (a @ w).sin(), lambda a: (a @ w).cos(), (x,))


def _loop_and_closure(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    scale = 0.5

    def layer(a: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.silu(a @ w) * scale

    for _ in range(3):
        x = layer(x)
    return x


def _view_of_input(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    return x[:, :4], (x @ w).softmax(-1), x.shape[0]


def _no_grad_inside(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        scale = (x @ w).abs().max()
    return (x @ w) / scale


def _attention(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    q = (x @ w).reshape(2, 4, 4, 4).transpose(1, 2)
    return torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).sum()


def _complex(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    z = torch.view_as_complex((x @ w).reshape(8, 8, 2).contiguous())
    return torch.view_as_real(z * z.conj()).sum(-1)


PATTERNS: dict[str, Callable[..., Any]] = {
    "custom_function": _custom_function, "checkpoint": _checkpointed, "mutation": _mutates_input, "cond": _cond,
    "loop_and_closure": _loop_and_closure, "view_of_input": _view_of_input, "no_grad_inside": _no_grad_inside,
    "attention": _attention, "complex": _complex, "graph_break": lambda x, w: with_graph_break(x @ w),
}
