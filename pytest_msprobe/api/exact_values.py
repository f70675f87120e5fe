"""How the values of one array are made so that the dtype holds each exactly, cheaply, and so that
failures still shrink.

Why numpy: drawing every cell through Hypothesis costs about 0.1 ms a cell. An array here is a
handful of Hypothesis draws (a fill value, a seed, a share, a profile, up to 4 chosen cells) and
numpy does the rest (see `ArraySpec.draw`). The draws are arranged so that shrinking still works:
to small shapes, a constant fill of simple values, and the few cells a failure needs.

Why bounds are rounded inwards first: numpy's random values are clipped to the bounds and then
rounded to the dtype; rounding is monotonic and the bounds are dtype values, so the values stay
inside what the caller allowed.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np
from hypothesis import strategies as st

from probes.core.errors import ConfigError
from probes.core.thresholds import SMALLEST_NORMAL
from pytest_msprobe.api import bfloat16_bits as bf16
from pytest_msprobe.api.tensor_dtypes import FLOAT_DTYPES, FORMATS, INT_DTYPES, dtype_name
from pytest_msprobe.api.tensor_shapes import Shape

__all__ = ["ArraySpec", "array_spec", "round_inward"]


def round_inward(name: str, value: float | None, up: bool) -> float | None:
    """The bound `value` moved to the nearest value of the dtype inside the range, so that the
    rounded range holds only values the caller allowed."""
    if value is None:
        return None
    if name == "bfloat16":
        return bf16.inward(np.float32(round_inward("float32", value, up)), up)
    storage = np.dtype(FORMATS[name].storage).type
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
        info = np.iinfo(FORMATS[name].storage)
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
                     allow_subnormal=allow_subnormal, width=FORMATS[name].width)


_MAX_OVERRIDES = 4
_SEEDS = st.integers(0, 2**32 - 1)
_SHARE_MAX = 2**16
_SHARES = st.integers(0, _SHARE_MAX)  # of the cells that get random background values


class ArraySpec:
    """How the cells of one array are made: a Hypothesis element strategy for the few drawn
    cells, and the dtype-rounded range numpy's background values are drawn from."""

    def __init__(self, name: str, min_value: Any, max_value: Any, allow_nan: bool, allow_infinity: bool,
                 allow_subnormal: bool) -> None:
        self.name = name
        self.storage = FORMATS[name].storage
        elem = _element_strategy(name, min_value, max_value, allow_nan, allow_infinity, allow_subnormal)
        if name == "bfloat16":
            elem = elem.map(lambda v: float(bf16.truncate(np.array([v], dtype=np.float32))[0]))
        self.elements = elem
        # flat index (taken modulo the size) and value of each drawn cell; shrinks to no cells
        self.overrides = st.lists(st.tuples(st.integers(0, 2**31 - 1), elem), max_size=_MAX_OVERRIDES)
        self.allow_subnormal = allow_subnormal
        self.allow_nan = allow_nan and name in FLOAT_DTYPES
        self.lo_given, self.hi_given = min_value is not None, max_value is not None
        self.profiles = _profiles(name, allow_subnormal, self.lo_given and self.hi_given) \
            if name in FLOAT_DTYPES else None
        if name in FLOAT_DTYPES:
            top = FORMATS[name].top
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
            out = bf16.round_to_bf16(values.astype(np.float32))
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
        options += [("plain", 1e-3), ("plain", 1e3), ("plain", FORMATS[name].top / 4)]
    if allow_subnormal:
        options.append(("plain", 4 * SMALLEST_NORMAL[name]))  # mostly subnormal values
    return st.sampled_from(options)


@functools.lru_cache(maxsize=512)
def _array_spec(name: str, min_value: Any, max_value: Any, allow_nan: bool, allow_infinity: bool,
                allow_subnormal: bool) -> ArraySpec:
    """Cached: strategies built once are validated once, which is most of Hypothesis's cost for
    a strategy drawn in every example."""
    return ArraySpec(name, min_value, max_value, allow_nan, allow_infinity, allow_subnormal)


def array_spec(dtype: Any, *, min_value: Any = None, max_value: Any = None, allow_nan: bool = False,
               allow_infinity: bool = False, allow_subnormal: bool = False) -> ArraySpec:
    """The cached array maker for these values; `.draw(draw, shape)` inside a composite strategy
    builds one array without creating strategies per example (what api_inputs uses)."""
    return _array_spec(dtype_name(dtype), min_value, max_value, allow_nan, allow_infinity, allow_subnormal)
