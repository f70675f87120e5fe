"""Hypothesis strategies for precision tests: tensors whose values the dtype holds exactly.

Why exactness matters: a float32 value cast to float16/bfloat16 is rounded by the cast, so the
value Hypothesis reports (and shrinks) is not the value the API saw, and the bounds asked for can
be crossed by the rounding. Here every value is made in the target format: Hypothesis draws float16
values as 16-bit floats and bfloat16 values as float32 bit patterns with the low 16 bits cleared
(truncation towards zero: it keeps bf16-representable bounds and never turns a finite value
infinite); bounds are first rounded inwards to the dtype; numpy's random values are clipped to
those bounds and then rounded to the dtype (rounding is monotonic and the bounds are dtype values,
so they stay inside). So `x == x.to(float32).to(x.dtype)` always holds.

Why numpy: drawing every cell through Hypothesis costs about 0.1 ms a cell. An array here is a
handful of Hypothesis draws (a fill value, a seed, a share, a profile, up to 4 chosen cells) and
numpy does the rest (see `_ArraySpec.draw`), then one call turns it into a framework tensor. The
draws are arranged so that shrinking still works: to small shapes, a constant fill of simple
values, and the few cells a failure needs.

Frameworks are imported lazily, when a tensor is built: this module imports without torch and
without MindSpore. It imports no other module of this package, so the API input table
(`pytest_msprobe.api.inputs`) and the public `pytest_msprobe.api.strategies` both build on it.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Tuple, Union

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from probes.core.errors import ConfigError
from probes.core.hints import did_you_mean
from probes.core.thresholds import FLOAT_DTYPES, SMALLEST_NORMAL

__all__ = [
    "FLOAT_DTYPES",
    "INT_DTYPES",
    "DTYPES",
    "DTYPE_ALIASES",
    "FRAMEWORKS",
    "tensors",
    "arrays",
    "shapes",
    "broadcastable_shapes",
    "matmul_shapes",
    "draw_broadcastable",
    "draw_matmul_rhs",
    "integers",
    "dtype_name",
    "array_spec",
    "to_tensor",
    "round_inward",
    "round_to_bf16",
]

Shape = Tuple[int, ...]
ShapeArg = Union[int, Shape, st.SearchStrategy, None]

INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8")
DTYPES = FLOAT_DTYPES + INT_DTYPES + ("bool",)
# the short names people write for the float dtypes (torch.half, torch.float, torch.double, "bf16")
DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32",
                 "fp64": "float64", "double": "float64"}
FRAMEWORKS = ("torch", "mindspore")
_FRAMEWORK_ALIASES = {"torch": "torch", "pytorch": "torch", "mindspore": "mindspore", "ms": "mindspore"}

# numpy storage of each neutral dtype; bfloat16 is held as float32 with zero low 16 bits.
_NUMPY_STORAGE = {
    "float16": np.float16, "bfloat16": np.float32, "float32": np.float32, "float64": np.float64,
    "int8": np.int8, "int16": np.int16, "int32": np.int32, "int64": np.int64, "uint8": np.uint8,
    "bool": np.bool_,
}
_FLOAT_WIDTH = {"float16": 16, "bfloat16": 32, "float32": 32, "float64": 64}
_BF16_KEEP = np.uint32(0xFFFF0000)
_BF16_QNAN = np.uint32(0x7FC00000)


@functools.lru_cache(maxsize=256)
def shapes(min_dims: int = 1, max_dims: int = 3, min_side: int = 1, max_side: int = 16) -> st.SearchStrategy[Shape]:
    """Small array shapes; they shrink towards fewer dimensions and sides of `min_side`."""
    if min_dims < 0 or max_dims < min_dims:
        raise ConfigError("max_dims", max_dims, f"an integer >= min_dims={min_dims} >= 0")
    if min_side < 0 or max_side < min_side:
        raise ConfigError("max_side", max_side, f"an integer >= min_side={min_side} >= 0")
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side)


_BOOLEANS = st.booleans()


@functools.lru_cache(maxsize=256)
def integers(lo: int, hi: int) -> st.SearchStrategy[int]:
    """st.integers(lo, hi), cached: strategies drawn inside composites every example are built
    and validated once."""
    return st.integers(lo, hi)


def draw_broadcastable(draw: Callable[[st.SearchStrategy], Any], shape: Shape) -> Shape:
    """Inside a composite: a shape that broadcasts to `shape` (leading dims dropped, some sides
    set to 1). Shrinks to `shape` itself."""
    dropped = draw(integers(0, len(shape)))
    return tuple(1 if draw(_BOOLEANS) else s for s in shape[dropped:])


def broadcastable_shapes(shape: Shape) -> st.SearchStrategy[Shape]:
    """Shapes that broadcast against `shape` without changing it (the result shape is `shape`):
    the second operand of a binary API, a bias, a mask."""
    base = tuple(shape)
    return st.composite(lambda draw: draw_broadcastable(draw, base))()


def draw_matmul_rhs(draw: Callable[[st.SearchStrategy], Any], a_shape: Shape, max_side: int = 6) -> Shape:
    """Inside a composite: the shape of a `b` with `a @ b` defined (torch.matmul's rules): a
    vector, a matrix, or (when `a` is batched) a batch of matrices with a's batch dims."""
    k = a_shape[-1]
    forms = 3 if len(a_shape) > 2 else 2
    form = draw(integers(0, forms - 1))
    if form == 0:
        return (k,)
    m = draw(integers(1, max_side))
    return (k, m) if form == 1 else a_shape[:-2] + (k, m)


def matmul_shapes(min_dims: int = 1, max_dims: int = 4, max_side: int = 6) -> st.SearchStrategy[tuple[Shape, Shape]]:
    """Pairs of shapes `(a, b)` with `torch.matmul(a, b)` defined."""
    a_shapes = shapes(min_dims, max_dims, 1, max_side)

    @st.composite
    def pairs(draw: Callable[[st.SearchStrategy], Any]) -> tuple[Shape, Shape]:
        a = draw(a_shapes)
        return a, draw_matmul_rhs(draw, a, max_side)

    return pairs()


def dtype_name(dtype: Any) -> str:
    """The neutral name ("float16", ...) of a neutral name or an alias of one ("bf16", "half", in
    any case), a torch dtype, a MindSpore dtype or a numpy dtype: every entry point takes what
    users write and compares canonical names only."""
    return _resolve_dtype(dtype)[0]


def _resolve_dtype(dtype: Any) -> tuple[str, str | None]:
    """(neutral name, framework the dtype object belongs to or None for a plain name)."""
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


def _resolve_framework(framework: str | None, from_dtype: str | None, dtype: Any) -> str:
    if framework is None:
        return from_dtype or "torch"
    chosen = _FRAMEWORK_ALIASES.get(framework) if isinstance(framework, str) else None
    if chosen is None:
        raise ConfigError("framework", framework, f"one of {', '.join(FRAMEWORKS)}")
    if from_dtype is not None and from_dtype != chosen:
        raise ConfigError("framework", framework, f"{from_dtype} (the framework of dtype={dtype!r}) or None")
    return chosen


def round_inward(name: str, value: float | None, up: bool) -> float | None:
    """The bound `value` moved to the nearest value of the dtype inside the range, so that the
    rounded range holds only values the caller allowed."""
    if value is None:
        return None
    if name == "bfloat16":
        x = np.float32(round_inward("float32", value, up))
        bits = np.array([x], dtype=np.float32).view(np.uint32)[0]
        low = bits & np.uint32(0xFFFF)
        if low == 0:
            return float(x)
        trunc = np.array([bits & _BF16_KEEP], dtype=np.uint32).view(np.float32)[0]  # towards zero
        # truncation moves towards zero; away from zero is one bf16 step further out
        away = np.array([(bits & _BF16_KEEP) + np.uint32(0x10000)], dtype=np.uint32).view(np.float32)[0]
        lower, upper = (trunc, away) if x > 0 else (away, trunc)
        return float(upper if up else lower)
    storage = np.dtype(_NUMPY_STORAGE[name]).type
    x = storage(value)
    if float(x) < value and up:
        x = np.nextafter(x, storage(np.inf))
    elif float(x) > value and not up:
        x = np.nextafter(x, storage(-np.inf))
    return float(x)


def _element_strategy(name: str, min_value: Any, max_value: Any, allow_nan: bool, allow_infinity: bool,
                      allow_subnormal: bool) -> st.SearchStrategy:
    if name == "bool":
        return st.booleans()
    if name in INT_DTYPES:
        info = np.iinfo(_NUMPY_STORAGE[name])
        lo = info.min if min_value is None else max(info.min, int(np.ceil(min_value)))
        hi = info.max if max_value is None else min(info.max, int(np.floor(max_value)))
        if lo > hi:
            raise ConfigError("min_value", min_value, f"<= max_value={max_value} with an {name} value between them")
        return st.integers(lo, hi)
    lo = round_inward(name, min_value, up=True)
    hi = round_inward(name, max_value, up=False)
    if lo is not None and hi is not None and lo > hi:
        raise ConfigError("min_value", min_value,
                          f"a range [min_value, max_value] that holds a {name} value (max_value={max_value})")
    return st.floats(min_value=lo, max_value=hi, allow_nan=allow_nan, allow_infinity=allow_infinity,
                     allow_subnormal=allow_subnormal, width=_FLOAT_WIDTH[name])


def _to_bf16_pattern(a: np.ndarray) -> np.ndarray:
    """float32 -> the bf16 values truncated towards zero, held in float32 (NaN stays NaN)."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    kept = bits & _BF16_KEEP
    nan = np.isnan(a)
    if nan.any():
        kept = np.where(nan, _BF16_QNAN, kept)  # the NaN torch casts produce
    return kept.view(np.float32)


def round_to_bf16(a: np.ndarray) -> np.ndarray:
    """Finite float32 -> the nearest bf16 values (ties to even, as a torch cast rounds), held in
    float32: numpy has no bfloat16 type."""
    bits = a.view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return (rounded & _BF16_KEEP).view(np.float32)


def _check_bf16_exact(a: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    bad = (bits & np.uint32(0xFFFF)) != 0
    if bad.any():
        value = a[bad].flat[0]
        raise ConfigError("elements", float(value), "values exactly representable in bfloat16 "
                          "(a float32 whose low 16 bits are zero)",
                          hint="round them, e.g. torch.tensor(v).bfloat16().item(), or leave elements=None")
    return a


_MAX_OVERRIDES = 4
_SEEDS = st.integers(0, 2**32 - 1)
_SHARE_MAX = 2**16
_SHARES = st.integers(0, _SHARE_MAX)  # of the cells that get random background values


class _ArraySpec:
    """How the cells of one array are made: a Hypothesis element strategy for the few drawn
    cells, and the dtype-rounded range numpy's background values are drawn from."""

    def __init__(self, name: str, min_value: Any, max_value: Any, allow_nan: bool, allow_infinity: bool,
                 allow_subnormal: bool) -> None:
        self.name = name
        self.storage = _NUMPY_STORAGE[name]
        elem = _element_strategy(name, min_value, max_value, allow_nan, allow_infinity, allow_subnormal)
        if name == "bfloat16":
            elem = elem.map(lambda v: float(_to_bf16_pattern(np.array([v], dtype=np.float32))[0]))
        self.elements = elem
        # flat index (taken modulo the size) and value of each drawn cell; shrinks to no cells
        self.overrides = st.lists(st.tuples(st.integers(0, 2**31 - 1), elem), max_size=_MAX_OVERRIDES)
        self.allow_subnormal = allow_subnormal
        self.allow_nan = allow_nan and name in FLOAT_DTYPES
        self.lo_given, self.hi_given = min_value is not None, max_value is not None
        self.profiles = _profiles(name, allow_subnormal, self.lo_given and self.hi_given) \
            if name in FLOAT_DTYPES else None
        if name in FLOAT_DTYPES:
            top = float(_FLOAT_MAX[name])
            self.lo = round_inward(name, min_value, up=True) if self.lo_given else -top
            self.hi = round_inward(name, max_value, up=False) if self.hi_given else top
            self.lo, self.hi = max(self.lo, -top), min(self.hi, top)
        elif name in INT_DTYPES:
            info = np.iinfo(self.storage)
            self.lo = info.min if min_value is None else max(info.min, int(np.ceil(min_value)))
            self.hi = info.max if max_value is None else min(info.max, int(np.floor(max_value)))

    def draw(self, draw: Callable[[st.SearchStrategy], Any], shape: Shape) -> np.ndarray:
        """A few Hypothesis draws, the rest numpy: a fill value; a seed, a share and a profile for
        numpy's random background, which replaces the fill in that share of the cells; then up to
        4 cells drawn by Hypothesis, where NaN, infinities, subnormals and extremes come from.

        Shrinking: the same draws happen whatever their values, and the background cells are a
        prefix of one seeded permutation with values fixed by the seed, so lowering the share
        removes background cells one by one without changing the others: failures shrink to a
        constant fill plus the few cells that matter."""
        size = int(np.prod(shape, dtype=np.int64))
        fill = draw(self.elements)
        seed = draw(_SEEDS)
        share = draw(_SHARES)
        profile = draw(self.profiles) if self.profiles is not None else ("plain", 1.0)
        flat = np.full(size, fill, dtype=self.storage)
        count = -(-size * share // _SHARE_MAX)  # ceil
        if count:
            rng = np.random.default_rng(seed)
            values = self._background(rng, size, profile)
            if count >= size:
                flat = values
            else:
                where = rng.permutation(size)[:count]
                flat[where] = values[where]
        cells = draw(self.overrides)
        if size:
            for index, value in cells:
                flat[index % size] = value
            if self.allow_nan:  # one NaN, the quiet one casts produce: round trips stay bit-exact
                nan = np.isnan(flat)
                if nan.any():
                    flat[nan] = np.nan
        return flat.reshape(shape)

    def _background(self, rng: np.random.Generator, size: int, profile: tuple[str, float]) -> np.ndarray:
        if self.name == "bool":
            return rng.random(size) < 0.5
        if self.name in INT_DTYPES:
            return rng.integers(self.lo, self.hi, size, endpoint=True, dtype=self.storage)
        lo, hi = self.lo, self.hi
        kind, scale = profile
        bounded = self.lo_given and self.hi_given and np.isfinite(hi - lo)
        if kind == "log":  # magnitudes spread evenly over the decades: cancellation lives at small ones
            values = self._log_uniform(rng, size, lo, hi)
        elif bounded:
            values = rng.uniform(lo, hi, size)
        else:
            values = rng.standard_normal(size) * scale
            if self.lo_given:
                values = lo + np.abs(values)
            elif self.hi_given:
                values = hi - np.abs(values)
        values = np.clip(values, lo, hi)  # bounds are dtype values, and rounding is monotonic
        if self.name == "bfloat16":
            out = round_to_bf16(values.astype(np.float32))
        else:
            out = values.astype(self.storage)
        if not self.allow_subnormal:
            tiny = SMALLEST_NORMAL[self.name]
            sub = (out != 0) & (np.abs(out) < tiny)
            if sub.any():
                out[sub] = np.clip(0.0, lo, hi)
        return out

    def _log_uniform(self, rng: np.random.Generator, size: int, lo: float, hi: float) -> np.ndarray:
        """Values in [lo, hi] whose magnitudes are log-uniform from the dtype's smallest normal
        (or the range's own smallest magnitude) up, with both signs where the range has them."""
        floor = SMALLEST_NORMAL[self.name]
        negative = rng.random(size) < (0.5 if lo < 0 < hi else float(hi <= 0))

        def magnitudes(a: float, b: float) -> np.ndarray:  # log-uniform in [a, b], 0 < a <= b
            a, b = max(a, floor), max(b, floor)
            return np.exp(rng.uniform(np.log(a), np.log(b), size))

        pos = magnitudes(max(lo, floor), hi) if hi > 0 else np.zeros(size)
        neg = -magnitudes(max(-hi, floor), -lo) if lo < 0 else np.zeros(size)
        return np.where(negative, neg, pos)


def _profiles(name: str, allow_subnormal: bool, bounded: bool) -> st.SearchStrategy[tuple[str, float]]:
    """Shapes of the random background: "plain" (uniform in a bounded range, normal times the
    scale otherwise) or "log" (log-uniform magnitudes). The first is what failures shrink to."""
    options = [("plain", 1.0), ("log", 1.0)]
    if not bounded:
        options += [("plain", 1e-3), ("plain", 1e3), ("plain", float(_FLOAT_MAX[name]) / 4)]
    if allow_subnormal:
        options.append(("plain", 4 * SMALLEST_NORMAL[name]))  # mostly subnormal values
    return st.sampled_from(options)


_FLOAT_MAX = {"float16": np.finfo(np.float16).max, "bfloat16": 3.3895313892515355e38,
              "float32": np.finfo(np.float32).max, "float64": np.finfo(np.float64).max}


@functools.lru_cache(maxsize=512)
def _array_spec(name: str, min_value: Any, max_value: Any, allow_nan: bool, allow_infinity: bool,
                allow_subnormal: bool) -> _ArraySpec:
    """Cached: strategies built once are validated once, which is most of Hypothesis's cost for
    a strategy drawn in every example."""
    return _ArraySpec(name, min_value, max_value, allow_nan, allow_infinity, allow_subnormal)


def array_spec(dtype: Any, *, min_value: Any = None, max_value: Any = None, allow_nan: bool = False,
               allow_infinity: bool = False, allow_subnormal: bool = False) -> _ArraySpec:
    """The cached array maker for these values; `.draw(draw, shape)` inside a composite strategy
    builds one array without creating strategies per example (what api_inputs uses)."""
    return _array_spec(dtype_name(dtype), min_value, max_value, allow_nan, allow_infinity, allow_subnormal)


def arrays(dtype: Any, shape: ShapeArg = None, *, elements: st.SearchStrategy | None = None,
           allow_nan: bool = False, allow_infinity: bool = False, allow_subnormal: bool = False,
           min_value: Any = None, max_value: Any = None) -> st.SearchStrategy[np.ndarray]:
    """numpy arrays holding values of `dtype` exactly (bfloat16 as float32 with zero low bits):
    what `tensors` converts, usable on its own for framework-free code."""
    name, _ = _resolve_dtype(dtype)
    return _arrays(name, shape, elements, allow_nan, allow_infinity, allow_subnormal, min_value, max_value)


def _shape_strategy(shape: ShapeArg) -> st.SearchStrategy[Shape]:
    if shape is None:
        return shapes()
    if isinstance(shape, st.SearchStrategy):
        return shape
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (int(shape),)
    if isinstance(shape, (tuple, list)) and all(isinstance(s, (int, np.integer)) and s >= 0 for s in shape):
        return st.just(tuple(int(s) for s in shape))
    raise ConfigError("shape", shape, "a tuple of non-negative ints, an int, a Hypothesis strategy of shapes or None")


def _arrays(name: str, shape: ShapeArg, elements: st.SearchStrategy | None, allow_nan: bool,
            allow_infinity: bool, allow_subnormal: bool, min_value: Any, max_value: Any) -> st.SearchStrategy:
    shape_strategy = _shape_strategy(shape)
    if elements is not None:
        given = {"min_value": min_value, "max_value": max_value, "allow_nan": allow_nan or None,
                 "allow_infinity": allow_infinity or None, "allow_subnormal": allow_subnormal or None}
        for key, value in given.items():
            if value is not None:
                raise ConfigError(key, value, "left at its default when elements= is given "
                                  "(the elements strategy decides the values)")
        base = hnp.arrays(_NUMPY_STORAGE[name], shape_strategy, elements=elements)
        return base.map(_check_bf16_exact) if name == "bfloat16" else base
    spec = _array_spec(name, min_value, max_value, allow_nan, allow_infinity, allow_subnormal)

    @st.composite
    def draw_array(draw: Callable[[st.SearchStrategy], Any]) -> np.ndarray:
        return spec.draw(draw, draw(shape_strategy))

    return draw_array()


def tensors(dtype: Any, shape: ShapeArg = None, *, elements: st.SearchStrategy | None = None,
            device: str = "cpu", allow_nan: bool = False, allow_infinity: bool = False,
            allow_subnormal: bool = False, min_value: Any = None, max_value: Any = None,
            framework: str | None = None) -> st.SearchStrategy[Any]:
    """Tensors of `dtype` whose every value the dtype holds exactly.

    dtype: a neutral name (see DTYPES), a torch dtype or a MindSpore dtype. framework: "torch" or
    "mindspore"; None takes the dtype object's framework, else torch. shape: a tuple, an int, a
    strategy of shapes, or None for small shapes (`shapes()`). Bounds are rounded inwards to the
    dtype, so every value lies in [min_value, max_value]; NaN, infinities and subnormals appear
    only when allowed. elements: a strategy of Python scalars the dtype holds exactly (then the
    bounds and allow_* flags stay at their defaults). device: where torch tensors are placed;
    MindSpore places tensors by its context and ignores it.
    """
    name, from_dtype = _resolve_dtype(dtype)
    chosen = _resolve_framework(framework, from_dtype, dtype)
    if not isinstance(device, str) or not device:
        raise ConfigError("device", device, 'a device string such as "cpu", "cuda", "cuda:0" or "npu"')
    source = _arrays(name, shape, elements, allow_nan, allow_infinity, allow_subnormal, min_value, max_value)
    return source.map(_converter(chosen, name, device))


def to_tensor(a: np.ndarray, dtype: Any, device: str = "cpu", framework: str | None = None) -> Any:
    """A framework tensor of `dtype` holding the values of `a` (from `arrays`/`array_spec`) exactly."""
    name, from_dtype = _resolve_dtype(dtype)
    return _converter(_resolve_framework(framework, from_dtype, dtype), name, device)(a)


def _converter(framework: str, name: str, device: str) -> Callable[[np.ndarray], Any]:
    if framework == "torch":
        return lambda a: _to_torch(a, name, device)
    return lambda a: _to_mindspore(a, name)


def _to_torch(a: np.ndarray, name: str, device: str) -> Any:
    import torch

    if name == "bfloat16":  # the top half of each float32 is the bf16 bit pattern
        halves = (np.ascontiguousarray(a).view(np.uint32) >> np.uint32(16)).astype(np.uint16).view(np.int16)
        t = torch.from_numpy(halves).view(torch.bfloat16)
    else:
        t = torch.from_numpy(np.array(a, copy=True))
    return t if device == "cpu" else t.to(device)


_MS_READY = False


def _to_mindspore(a: np.ndarray, name: str) -> Any:
    global _MS_READY
    import mindspore as ms

    if not _MS_READY:
        from probes.backends.mindspore_xp import warm_up

        warm_up()
        _MS_READY = True
    t = ms.Tensor(np.array(a, copy=True))
    if name == "bfloat16":  # exact: the float32 values are bf16 values
        t = t.astype(ms.bfloat16)
    return t

