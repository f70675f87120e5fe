"""PyTorch's OpInfo entries as catalogue and corpus ops: which public name each is called through.

`torch.testing._internal.common_methods_invocations.op_db` (installed with torch; importing it
needs `expecttest`) describes ~650 operators with sample inputs per dtype. An entry is used
through the public name free_benchmark hooks (torch, torch.linalg/fft/special/masked,
torch.nn.functional, Tensor methods), looked up at call time, so a probe started around the call
sees it. Shared by the API precision catalogue (pytest_msprobe.catalogue) and
benchmarks/opinfo_corpus.py.
"""

from __future__ import annotations

import copy
import re
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from probes.backends.torch_apis import build_catalog
from probes.core.random_ops import TORCH_RANDOM_FUNCTIONS, is_random

SEED = 1234

# hooked namespace (OpInfo's dotted prefix) -> (module, free_benchmark key prefix)
NAMESPACES: dict[str, tuple[Any, str]] = {
    "": (torch, "Torch."),
    "nn.functional": (F, "Functional."),
    "linalg": (torch.linalg, "Torch.linalg."),
    "fft": (torch.fft, "Torch.fft."),
    "special": (torch.special, "Torch.special."),
    "masked": (torch.masked, "Torch.masked."),
}
_UNINIT = re.compile(r"(^|\.)(new_)?empty")


# the corpus ---------------------------------------------------------------------------------
@dataclass
class Entry:
    """One OpInfo entry and how it is called through its public name."""

    name: str  # OpInfo name with its variant: "max.reduction_with_dim"
    opinfo: Any = field(repr=False)
    how: str  # function: namespace.attr(...); method: input.attr(...); wrapper: OpInfo's own callable
    owner: Any = field(repr=False)  # module, or torch.Tensor for methods
    attr: str
    key: str  # the free_benchmark key of the public name ("Functional.gelu", "Tensor.__radd__")
    random: bool
    uninitialised: bool
    exclusion: str | None  # why free_benchmark never re-runs the public name (None: it may)

    def call(self, inp: Any, args: tuple, kwargs: dict) -> Any:
        if self.how == "function":
            return getattr(self.owner, self.attr)(inp, *args, **kwargs)  # resolved now: hooked or not
        if self.how == "method":
            return getattr(inp, self.attr)(*args, **kwargs)
        return self.opinfo.op(inp, *args, **kwargs)


def is_random_name(name: str) -> bool:
    """Whether the OpInfo entry named `name` draws random numbers: OpInfo calls torch's public
    functions, so the torch-level list applies (fractional_max_pool2d is random as it is called)."""
    return is_random(name, TORCH_RANDOM_FUNCTIONS)


def build_corpus(ops: list[str] | None = None, limit: int | None = None) -> tuple[list[Entry], dict[str, str]]:
    """The OpInfo entries reachable through hooked namespaces, and the others with the reason."""
    from torch.testing._internal.common_methods_invocations import op_db

    catalog = {m.key: m for m in build_catalog()}
    entries: list[Entry] = []
    outside: dict[str, str] = {}
    wanted = set(ops) if ops else None
    for op in op_db:
        full = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
        if wanted is not None and op.name not in wanted and full not in wanted:
            continue
        ns, _, attr = op.name.rpartition(".")
        if ns not in NAMESPACES:
            outside[full] = f"namespace torch.{ns} is not hooked"
            continue
        module, prefix = NAMESPACES[ns]
        public = module.__dict__.get(attr)
        method = getattr(torch.Tensor, attr, None) if ns == "" else None
        if public is not None and public is op.op:
            how, owner, key = "function", module, prefix + attr
        elif method is not None and op.method_variant is not None and op.method_variant is method:
            how, owner, key = "method", torch.Tensor, "Tensor." + attr
        elif public is not None or method is not None:
            # OpInfo calls the public name through an adapter (argument order, a seed, a tuple input):
            # its callable is used; the hooks see the public names it calls.
            how = "wrapper"
            owner, key = (module, prefix + attr) if public is not None else (torch.Tensor, "Tensor." + attr)
        else:
            outside[full] = "no public torch name"
            continue
        meta = catalog.get(key)
        if meta is None:
            outside[full] = f"{key} is not in the free_benchmark catalog"
            continue
        entries.append(Entry(full, op, how, owner, attr, key, is_random_name(op.name),
                             bool(_UNINIT.search(op.name)), meta.exclusion))
        if limit is not None and len(entries) >= limit:
            break
    return entries, outside


# calls, copies, comparisons ------------------------------------------------------------------
def copy_tree(x: Any) -> Any:
    try:
        return copy.deepcopy(x)
    except Exception:
        return x


def upcast_tensor(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`x` in `dtype`, as the same view of an upcast copy of its whole storage when it is a view
    (as_strided and friends read the storage, not the view's elements)."""
    x = x.detach()
    if x.layout == torch.strided and not x.is_conj() and not x.is_neg() and (
        x.storage_offset() or not x.is_contiguous()
    ):
        try:
            n = x.untyped_storage().nbytes() // x.element_size()
            base = x.new_empty(0).set_(x.untyped_storage(), 0, (n,), (1,))
            return base.to(dtype).as_strided(x.shape, x.stride(), x.storage_offset())
        except Exception:
            pass
    return x.to(dtype)


def upcast(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        if x.is_floating_point():
            return upcast_tensor(x, torch.float64)
        if x.is_complex():
            return upcast_tensor(x, torch.complex128)
        return x
    if isinstance(x, torch.dtype):
        if x.is_floating_point:
            return torch.float64
        if x.is_complex:
            return torch.complex128
    return x


def call_sample(entry: Entry, inp: Any, args: tuple, kwargs: dict) -> tuple[Any, str | None]:
    torch.manual_seed(SEED)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return entry.call(inp, args, kwargs), None
    except Exception as exc:
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
