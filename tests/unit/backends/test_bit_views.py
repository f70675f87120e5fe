"""The bit views the bit-level perturbations edit: one table (probes.backends.base.BIT_VIEW_DTYPES)
decides every framework's integer width, so a float is viewed at its own width, signed (FP8
unsigned), the same under torch, MindSpore and the NumPy host arrays."""

from __future__ import annotations

import numpy as np
import pytest

from probes.backends.base import BIT_VIEW_DTYPES, bit_view_table
from probes.core.thresholds import FLOAT8_DTYPES, FLOAT_DTYPES


def test_the_table_views_each_format_at_its_own_width():
    widths = {"float16": 16, "bfloat16": 16, "float32": 32, "float64": 64, **dict.fromkeys(FLOAT8_DTYPES, 8)}
    assert dict(BIT_VIEW_DTYPES) == {name: ("uint" if name in FLOAT8_DTYPES else "int") + str(bits)
                                     for name, bits in widths.items()}


def test_a_format_the_framework_lacks_is_left_out():
    table = bit_view_table(lambda name: None if name == "bfloat16" else f"<{name}>", FLOAT_DTYPES)
    assert table == {"<float16>": "<int16>", "<float32>": "<int32>", "<float64>": "<int64>"}


def test_torch_views_every_float_and_fp8_format_and_back():
    torch = pytest.importorskip("torch")
    from probes.backends.torch_backend import BACKEND

    dtypes = [getattr(torch, n) for n in (*FLOAT_DTYPES, *FLOAT8_DTYPES) if hasattr(torch, n)]
    for dtype in dtypes:
        x = torch.linspace(-3, 3, 16).to(dtype)
        bits = BACKEND.bit_view(x)
        assert bits.dtype == getattr(torch, BIT_VIEW_DTYPES[BACKEND.dtype_name(x)])
        assert bits.element_size() == x.element_size()
        assert torch.equal(BACKEND.from_bit_view(bits, x).view(bits.dtype), bits)


def test_the_host_arrays_view_numpy_floats_and_back():
    pytest.importorskip("mindspore")
    from probes.backends.host_arrays import HOST_ARRAYS

    for dtype in (np.float16, np.float32, np.float64):
        a = np.linspace(-3, 3, 16, dtype=dtype)
        bits = HOST_ARRAYS.bit_view(a)
        assert bits.dtype == np.dtype(f"int{8 * a.itemsize}")
        assert HOST_ARRAYS.from_bit_view(bits, a).tobytes() == a.tobytes()


def test_mindspore_views_its_floats_and_back():
    ms = pytest.importorskip("mindspore")
    from probes.backends.mindspore_backend import BACKEND

    for name in FLOAT_DTYPES:
        t = ms.Tensor(np.linspace(-3, 3, 16, dtype=np.float32)).astype(getattr(ms, name))
        bits = BACKEND.bit_view(t)
        assert bits.dtype == getattr(ms, BIT_VIEW_DTYPES[name])
        assert (BACKEND.from_bit_view(bits, t).view(bits.dtype) == bits).all()
