"""The dtypes and frameworks the tensor strategies take, and how each dtype is held in numpy.

Why one place: every entry point (tensors, arrays, api_inputs, the marker) accepts what users write
("bf16", torch.half, a MindSpore dtype, a numpy type) and then compares canonical names only, so
the spelling rules and the per-dtype facts (numpy storage, Hypothesis float width, largest finite
value) must not drift apart between the modules that use them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict

import numpy as np

from probes.core.errors import ConfigError
from probes.core.hints import did_you_mean
from probes.core.thresholds import FLOAT_DTYPES

__all__ = ["FLOAT_DTYPES", "INT_DTYPES", "DTYPES", "DTYPE_ALIASES", "FRAMEWORKS", "Format", "FORMATS", "dtype_name",
           "resolve_dtype", "resolve_framework"]

INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8")
DTYPES = FLOAT_DTYPES + INT_DTYPES + ("bool",)
# the short names people write for the float dtypes (torch.half, torch.float, torch.double, "bf16")
DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32",
                 "fp64": "float64", "double": "float64"}
FRAMEWORKS = ("torch", "mindspore")
_FRAMEWORK_ALIASES = {"torch": "torch", "pytorch": "torch", "mindspore": "mindspore", "ms": "mindspore"}


@dataclass(frozen=True)
class Format:
    """How values of one neutral dtype are held: numpy has no bfloat16, so it lives in float32
    with zero low 16 bits, drawn by Hypothesis as 32-bit floats. `width` and `top` (the largest
    finite value) matter for the float dtypes only."""

    storage: type
    width: int = 0
    top: float = 0.0


FORMATS: Dict[str, Format] = {
    "float16": Format(np.float16, 16, float(np.finfo(np.float16).max)),
    "bfloat16": Format(np.float32, 32, 3.3895313892515355e38),
    "float32": Format(np.float32, 32, float(np.finfo(np.float32).max)),
    "float64": Format(np.float64, 64, float(np.finfo(np.float64).max)),
    "int8": Format(np.int8), "int16": Format(np.int16), "int32": Format(np.int32), "int64": Format(np.int64),
    "uint8": Format(np.uint8), "bool": Format(np.bool_),
}


def dtype_name(dtype: Any) -> str:
    """The neutral name ("float16", ...) of a neutral name or an alias of one ("bf16", "half", in
    any case), a torch dtype, a MindSpore dtype or a numpy dtype: every entry point takes what
    users write and compares canonical names only."""
    return resolve_dtype(dtype)[0]


def resolve_dtype(dtype: Any) -> tuple[str, str | None]:
    """(neutral name, framework the dtype object belongs to or None for a plain name): the
    framework of a dtype object decides where `tensors` builds when no framework is given."""
    if isinstance(dtype, str):
        folded = dtype.strip().lower()
        name = DTYPE_ALIASES.get(folded, folded)
        if name in DTYPES:
            return name, None
        raise ConfigError("dtype", dtype, f"one of {', '.join(DTYPES)} (or an alias: {', '.join(DTYPE_ALIASES)}), "
                          "a torch dtype or a MindSpore dtype", hint=did_you_mean(dtype, (*DTYPES, *DTYPE_ALIASES)))
    root = type(dtype).__module__.partition(".")[0]
    if root == "torch":
        name, framework = str(dtype).replace("torch.", ""), "torch"
    elif root == "mindspore":
        name, framework = str(dtype).lower(), "mindspore"
    elif root == "numpy" or isinstance(dtype, type) and issubclass(dtype, np.generic):
        name, framework = np.dtype(dtype).name, None
    else:
        name, framework = repr(dtype), None
    if name == "bool_":
        name = "bool"
    if name not in DTYPES:
        raise ConfigError("dtype", dtype, f"a dtype these strategies build: {', '.join(DTYPES)}")
    return name, framework


def resolve_framework(framework: str | None, from_dtype: str | None, dtype: Any) -> str:
    """The framework to build in: the one asked for, else the dtype object's, else torch. Asking
    for one framework with another's dtype is an error, not a silent conversion."""
    if framework is None:
        return from_dtype or "torch"
    chosen = _FRAMEWORK_ALIASES.get(framework) if isinstance(framework, str) else None
    if chosen is None:
        raise ConfigError("framework", framework, f"one of {', '.join(FRAMEWORKS)}")
    if from_dtype is not None and from_dtype != chosen:
        raise ConfigError("framework", framework, f"{from_dtype} (the framework of dtype={dtype!r}) or None")
    return chosen
