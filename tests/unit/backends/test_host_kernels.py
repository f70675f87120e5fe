"""The host arrays' one-pass C kernels give NumPy's passes' results bit for bit (the ratio figures
and the band edits of add_noise / bit_noise), on every layout they accept; they load once per
build key, and a machine that cannot build them keeps NumPy's passes with the reason said."""

from __future__ import annotations

import ctypes
import logging
import math
import os
import platform

import numpy as np
import pytest

from probes.backends import host_arrays, host_kernels
from probes.backends.host_arrays import HOST_ARRAYS, bound_figures, in_memory_order, ratio_figures
from probes.core import metrics

SPECIAL = [0.0, -0.0, math.inf, -math.inf, math.nan, 1e-45, -1e-45, 1e-300, 3e38, -3e38, 1e-7, 1.0, -2.5]


def _numpy_path(fn, *args):
    """fn(*args) with the kernels switched off."""
    old = os.environ.get(host_kernels.SWITCH)
    os.environ[host_kernels.SWITCH] = "0"
    host_kernels.reset()
    try:
        return fn(*args)
    finally:
        if old is None:
            del os.environ[host_kernels.SWITCH]
        else:
            os.environ[host_kernels.SWITCH] = old
        host_kernels.reset()


def _arrays(dtype, n, seed, special_share=0.0):
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal(n) * 10.0 ** rng.integers(-8, 4, n)).astype(dtype)
    b = (a * (1 + 1e-3 * rng.standard_normal(n))).astype(dtype)
    b[rng.random(n) < 0.05] *= -1
    for arr in (a, b):
        where = np.flatnonzero(rng.random(n) < special_share)
        arr[where] = rng.choice(np.array(SPECIAL, dtype), where.size)
    return a, b


def _same(x, y):
    """Figures equal as the rule reads them: NaN where NaN, a zero of either sign for min(a*b)."""
    return [repr(v) if not (isinstance(v, float) and v == 0) else "0" for v in x] == \
        [repr(v) if not (isinstance(v, float) and v == 0) else "0" for v in y]


def _need_kernels():
    host_kernels.reset()
    if host_kernels.kernels() is None:
        pytest.skip(f"no C kernels on this machine: {host_kernels.why_not()}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 3, 15, 16, 17, 31, 33, 1000, 4099])
@pytest.mark.parametrize("special_share", [0.0, 0.002, 0.3])
def test_ratio_figures_equal_numpys_passes(dtype, n, special_share):
    _need_kernels()
    for seed in range(3):
        a, b = _arrays(dtype, n, seed + n, special_share)
        for tol in (1e-6, 1e-3, 1e-45 if dtype == np.float32 else 1e-300, 0.5):
            native = ratio_figures(a, b, tol)
            plain = _numpy_path(ratio_figures, a, b, tol)
            assert _same(native, plain), (native, plain, tol)
            assert repr(metrics.finish_ratio(native, tol)) == repr(metrics.finish_ratio(plain, tol))
            assert metrics.needs_nonfinite_pass(native) == metrics.needs_nonfinite_pass(plain)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 7, 8, 9, 33, 1000])
@pytest.mark.parametrize("special_share", [0.0, 0.01, 0.3])
def test_scaled_bound_equals_numpys_passes(dtype, n, special_share):
    _need_kernels()
    for seed in range(3):
        a, b = _arrays(dtype, n, seed + 7 * n, special_share)
        for x, y in ((a, b), (a.reshape(-1, 1).T, b.reshape(-1, 1).T), (a, a), (-a, a)):
            native = bound_figures(x, y)
            plain = _numpy_path(bound_figures, x, y)
            assert [repr(v) for v in native] == [repr(v) for v in plain], (native, plain)
    a, b = _arrays(dtype, 64, 3)
    for at in range(64):  # a NaN difference in every lane: NaN, as NumPy's max
        x = a.copy()
        x[at] = math.nan
        assert math.isnan(bound_figures(x, b)[0]) and math.isnan(_numpy_path(bound_figures, x, b)[0])


def test_a_nan_anywhere_in_any_lane_makes_the_figures_nan():
    _need_kernels()
    for n in (1, 16, 17, 40):
        for at in range(n):
            a = np.ones(n, np.float32)
            b = np.full(n, 2.0, np.float32)
            a[at] = math.nan
            assert [math.isnan(x) for x in ratio_figures(a, b, 1e-6)] == [True, True, True]
            a[at], b[at] = math.inf, 0.0  # inf * 0: only the product is NaN
            figures = ratio_figures(a, b, 1e-6)
            assert figures[0] == math.inf and not math.isnan(figures[1]) and math.isnan(figures[2])


def test_layouts_the_kernels_walk_and_those_they_leave_to_numpy():
    _need_kernels()
    a, b = _arrays(np.float32, 6 * 5 * 4, 7)
    a, b = a.reshape(6, 5, 4), b.reshape(6, 5, 4)
    for perm in ((0, 1, 2), (2, 1, 0), (1, 0, 2), (0, 2, 1)):
        ta, tb = a.transpose(perm), b.transpose(perm)
        assert in_memory_order(ta, tb) is not None
        assert _same(ratio_figures(ta, tb, 1e-6), _numpy_path(ratio_figures, ta, tb, 1e-6))
    # not one memory order, or not dense: NumPy's passes, the same figures
    assert in_memory_order(a.transpose(2, 1, 0), np.ascontiguousarray(b.transpose(2, 1, 0))) is None
    assert in_memory_order(a[:, ::2], b[:, ::2]) is None
    assert in_memory_order(a[::-1], b[::-1]) is None
    assert _same(ratio_figures(a[:, ::2], b[:, ::2], 1e-6), _numpy_path(ratio_figures, a[:, ::2], b[:, ::2], 1e-6))
    assert ratio_figures(a.astype(">f4"), b.astype(">f4"), 1e-6) == _numpy_path(
        ratio_figures, a.astype(">f4"), b.astype(">f4"), 1e-6)  # another byte order: NumPy's passes


@pytest.mark.parametrize("width", [16, 32, 64])
@pytest.mark.parametrize("op", ["add", "bitwise_xor"])
def test_band_edits_equal_numpys_passes_bit_for_bit(width, op):
    _need_kernels()
    rng = np.random.default_rng(width)
    dtype = np.dtype(f"int{width}")
    info = np.iinfo(dtype)
    bits = rng.integers(info.min, info.max, 5003, dtype=dtype, endpoint=True)
    top = (1 << (width - 1)) - 1
    bits[:8] = [0, -1, top, -top - 1, 1, top - 1, -2, 2]
    for above, below in ((0, top), (5, 7), (1 << (width - 3), top - (1 << (width - 4))), (top - 1, top), (0, 1)):
        bits[8:12] = [above, above + 1, below - 1, below]
        edited = HOST_ARRAYS.edited_in_band(op, bits, width, above, below)
        expected = HOST_ARRAYS.combined(op, HOST_ARRAYS.in_band(bits, width, above, below), bits)
        assert edited is not None and edited.dtype == bits.dtype
        assert np.array_equal(edited, expected), (above, below)
    # a transposed workspace keeps its layout, as NumPy's empty_like and torch do
    square = bits[: 70 * 70].reshape(70, 70).T
    edited = HOST_ARRAYS.edited_in_band(op, square, width, 3, top)
    assert edited.strides == square.strides
    assert np.array_equal(edited, HOST_ARRAYS.combined(op, HOST_ARRAYS.in_band(square, width, 3, top), square))
    assert HOST_ARRAYS.edited_in_band(op, bits[::2], width, 3, top) is None  # not dense: the caller's passes
    assert HOST_ARRAYS.edited_in_band(op, bits[:0], width, 3, top) is None


def test_the_switch_a_missing_compiler_and_a_failing_build_keep_numpys_passes(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    a, b = _arrays(np.float32, 100, 1)
    expected = _numpy_path(ratio_figures, a, b, 1e-6)
    for env, reason in (({host_kernels.SWITCH: "off"}, host_kernels.SWITCH),
                        ({"CC": str(tmp_path / "no-such-cc")}, "could not be built"),
                        ({"CC": "false"}, "failed")):
        with monkeypatch.context() as m:
            for key, value in env.items():
                m.setenv(key, value)
            host_kernels.reset()
            with caplog.at_level(logging.INFO, logger="probes.backends"):
                assert host_kernels.kernels() is None
            assert reason in host_kernels.why_not()
            assert reason in caplog.text and "same results" in caplog.text  # said once, at INFO
            caplog.clear()
            assert _same(ratio_figures(a, b, 1e-6), expected)
            assert HOST_ARRAYS.edited_in_band("add", a.view(np.int32), 32, 1, 5) is None
    host_kernels.reset()
    assert not any(p.suffix == ".so" for p in (tmp_path / "cache").rglob("*")), "a failed build leaves nothing"


def test_one_build_per_key_shared_through_the_cache(monkeypatch, tmp_path):
    _need_kernels()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    host_kernels.reset()
    assert host_kernels.kernels() is not None
    built = list((tmp_path / "cache" / "pytest-msprobe").glob("host_kernels-*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    host_kernels.reset()
    assert host_kernels.kernels() is not None  # loaded again, not rebuilt
    assert built[0].stat().st_mtime_ns == stamp
    assert list((tmp_path / "cache" / "pytest-msprobe").iterdir()) == built  # no temporary left
    # a cached build this machine cannot load: built again in a private folder of the process
    garbage = built[0].with_suffix(".tmp")
    garbage.write_bytes(b"not a library")
    os.replace(garbage, built[0])  # (never written in place: this process has the library mapped)
    host_kernels.reset()
    assert host_kernels.kernels() is not None and host_kernels.why_not() is None
    # a cache folder that cannot be made (a file in its way): a private folder of the process
    (tmp_path / "blocked").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "blocked"))
    host_kernels.reset()
    assert host_kernels.kernels() is not None
    host_kernels.reset()


def test_ratio_figures_keep_their_documented_shape_with_either_path(kernel_path):
    figures = ratio_figures(np.array([1e-9, 2.0], np.float32), np.array([2e-9, -4.0], np.float32), 1e-6)
    assert figures == [1.0, 0.5, pytest.approx(-8.0)]
    assert host_arrays.COMPUTE_DTYPES  # (the module's other users unchanged)


def _parts_in_order(dev: np.ndarray, ref: np.ndarray) -> list[float]:
    """online_dispatch's one-pass parts element by element in the documented order: element i
    into partial sum i % 4, the partials combined as (p0 + p1) + (p2 + p3)."""
    sums = [[0.0] * 4 for _ in range(3)]
    top, low, nan = -math.inf, math.inf, False
    for i, (x, r) in enumerate(zip(dev.tolist(), ref.tolist())):
        d = x - r
        for s, v in zip(sums, (r * r, r * d, d * d)):
            s[i % 4] += v
        nan |= d != d
        top, low = (top, low) if d != d else (max(top, d), min(low, d))
    return [(s[0] + s[1]) + (s[2] + s[3]) for s in sums] + ([math.nan] * 2 if nan else [top, low])


def _kernel_parts(kind: str, dev: np.ndarray, ref: np.ndarray) -> list[float]:
    return host_kernels.dispatch_parts(kind, dev.ctypes.data, ref.ctypes.data, ref.size)


@pytest.mark.parametrize("kind", ["f32", "f64", "bf16"])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8, 9, 33, 1001])
@pytest.mark.parametrize("special_share", [0.0, 0.01, 0.3])
def test_dispatch_parts_keep_one_documented_order_with_either_path(kind, n, special_share):
    """The kernel's sums, NumPy's (a machine without a compiler) and an element-by-element loop
    in the documented order agree bit for bit, NaN and inf included; the extrema are exact."""
    _need_kernels()
    for seed in range(3):
        a, b = _arrays(np.float64, n, seed + 11 * n, special_share)
        if kind == "bf16":
            dev = (a.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
            wide = host_arrays.bfloat16_as_float32(dev.view(np.int16)).astype(np.float64)
        else:
            dev = a.astype(np.float32 if kind == "f32" else np.float64)
            wide = dev.astype(np.float64)
        want = _parts_in_order(wide, b)
        assert _same(_kernel_parts(kind, dev, b), want)
        assert _same(host_arrays.dispatch_parts(wide, b), want)


def test_dispatch_parts_see_a_nan_in_every_lane_and_the_tail():
    _need_kernels()
    b = np.linspace(-3.0, 5.0, 11)
    for at in range(11):
        a = b.astype(np.float32) + np.float32(0.5)
        a[at] = math.nan
        got = _kernel_parts("f32", a, b)
        assert math.isnan(got[3]) and math.isnan(got[4]) and math.isnan(got[1]) and math.isfinite(got[0])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 33, 1001])
@pytest.mark.parametrize("special_share", [0.0, 0.01, 0.3])
def test_grad_figures_keep_one_documented_order_with_either_path(dtype, n, special_share):
    """grad_probe's one pass: max, min and the sum of squares (eight partial sums, element i into
    i % 8, combined pairwise) by the kernel, by NumPy and element by element agree bit for bit, and
    the signs are NumPy's g > 0."""
    from probes.grad_probe.host_figures import _figures_in_order

    _need_kernels()
    for seed in range(3):
        g, _ = _arrays(dtype, n, seed + 13 * n, special_share)
        signs = np.ones(n + 2, dtype=bool)  # a byte either side must stay as it was
        got = host_kernels.grad_figures(g.itemsize, g.ctypes.data, n, signs.ctypes.data + 1)
        assert signs[0] and signs[-1]
        assert signs[1:-1].tobytes() == np.greater(g, 0).tobytes()
        p = [0.0] * 8
        for i, x in enumerate(g.tolist()):
            p[i % 8] += x * x
        values = [x for x in g.tolist() if x == x]
        nan = len(values) < n
        want = [math.nan if nan else max(values), math.nan if nan else min(values),
                ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]))]
        assert _same(got, want), (got, want)
        # NumPy's order, a batch of views each laid out from a row of its own
        batch = [g[:3], g, g[:2]]
        numpy_signs = np.empty(sum(v.size for v in batch), dtype=bool)
        rows = _figures_in_order(batch, numpy_signs)
        assert numpy_signs.tobytes() == np.greater(np.concatenate(batch), 0).tobytes()
        assert _same(rows[1], [*want[:2], math.sqrt(want[2])]), (rows[1], want)


def test_the_portable_branch_gives_the_x86_branchs_bytes(monkeypatch, tmp_path):
    """A compiler that does not define __SSE2__ (another CPU) builds the kernels' portable branch:
    built here with __SSE2__ undefined, every kernel gives the SSE2 branch's bytes and flags."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("the SSE2 branch is x86's")
    _need_kernels()
    libs = [host_kernels.kernels()]
    monkeypatch.setattr(host_kernels, "_FLAGS", (*host_kernels._FLAGS, "-U__SSE2__"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    host_kernels.reset()
    libs.append(host_kernels.kernels())
    host_kernels.reset()
    assert libs[1] is not None and libs[1]._name != libs[0]._name
    for n in (1, 7, 8, 9, 31, 1000):
        for dtype, sfx in ((np.float32, "f32"), (np.float64, "f64")):
            a, b = _arrays(dtype, n, n, 0.05)
            ref = b.astype(np.float64)
            results = []
            for lib in libs:
                out = np.zeros(12)  # ratio figures [0:3], max |a - b| [3], dispatch parts [4:9], grad figures [9:12]
                signs = np.zeros(n, dtype=bool)
                bits = a.view(np.int32 if dtype == np.float32 else np.int64)
                edited = np.empty_like(bits)
                width = 8 * a.itemsize
                mask = (1 << (width - 1)) - 1
                flags = [
                    getattr(lib, f"ratio_figures_{sfx}")(a.ctypes.data, b.ctypes.data, n, 1e-6, _at(out, 0)),
                    getattr(lib, f"max_abs_diff_{sfx}")(a.ctypes.data, b.ctypes.data, n, _at(out, 3)),
                    getattr(lib, f"all_equal_{sfx}")(a.ctypes.data, a.ctypes.data, n),
                    getattr(lib, f"dispatch_parts_{sfx}")(a.ctypes.data, ref.ctypes.data, n, _at(out, 4)),
                    getattr(lib, f"grad_figures_{sfx}")(a.ctypes.data, n, signs.ctypes.data, _at(out, 9)),
                ]
                getattr(lib, f"band_add_{width}")(bits.ctypes.data, edited.ctypes.data, n, mask, 1 << (width - 9), mask >> 1)
                results.append((flags, out.tobytes(), signs.tobytes(), edited.tobytes()))
            assert results[0] == results[1], (n, dtype)
        h = np.random.default_rng(n).integers(0, 1 << 16, n, dtype=np.uint16)
        ref = np.random.default_rng(n).standard_normal(n)
        got = []
        for lib in libs:
            out = np.zeros(5)
            got.append((lib.dispatch_parts_bf16(h.ctypes.data, ref.ctypes.data, n, _at(out, 0)), out.tobytes(),
                        lib.all_equal_h16(h.ctypes.data, h.ctypes.data, n, 0x7F80)))
        assert got[0] == got[1], n


def _at(out: np.ndarray, i: int):
    """A double* to out[i], for the kernels' ctypes signatures."""
    return ctypes.cast(out.ctypes.data + 8 * i, ctypes.POINTER(ctypes.c_double))
