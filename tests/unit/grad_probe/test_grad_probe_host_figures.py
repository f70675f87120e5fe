"""The figures of CPU gradients are taken by NumPy on their memory (host_figures): every cell but
the norm is the bytes the device path (torch's kernels) writes, on every awkward value of every
dtype NumPy has, at every level; the norm agrees to its last digits. The direction files, written
with a header made once per shape, are the bytes ``np.save`` writes."""

from __future__ import annotations

import io
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from grad_runs import step_with_grads  # noqa: E402

from probes.grad_probe import csv_format, torch_figures  # noqa: E402
from probes.grad_probe.host_figures import Squares, host_figures  # noqa: E402

DTYPES = [torch.float16, torch.float32, torch.float64]


def awkward(dtype: torch.dtype) -> torch.Tensor:
    fi = torch.finfo(dtype)
    return torch.tensor(
        [0.0, -0.0, 1.0, -1.0, fi.tiny, -fi.tiny, fi.tiny / 4, fi.max, -fi.max, fi.eps, 0.5, -0.25],
        dtype=dtype,
    )


def grads_of(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Gradients whose max or min is a signed zero, infinite or NaN, subnormal, and plain ones."""
    gen = torch.Generator().manual_seed(0)
    t = awkward(dtype)
    return {
        "awkward": t.reshape(3, 4),
        "zeros": torch.tensor([-0.0, 0.0, -0.0], dtype=dtype),  # the max: which zero
        "neg.zero": torch.tensor([-1.0, -0.0, 0.0], dtype=dtype),
        "pos.zero": torch.tensor([0.0, 2.0, -0.0], dtype=dtype),
        "inf": torch.tensor([1.0, float("inf"), -float("inf")], dtype=dtype),
        "nan": torch.tensor([float("nan"), 1.0, -3.0], dtype=dtype),
        "bounds": torch.tensor([-1.0, 0.1, 0.1000001, 1.0, 1.0000001, -0.1, -0.0999999], dtype=dtype),
        "randn": torch.randn(5, 7, generator=gen).to(dtype),
        "scalar": torch.tensor(0.75, dtype=dtype),
        "big": torch.randn(3000, generator=gen).to(dtype),
    }


def rows(dump: Path, step: int = 0) -> list[list[str]]:
    text = csv_format.summary_csv_path(dump, 0, step).read_text(encoding="utf-8-sig")
    return [line.split(",") for line in text.splitlines()[1:]]


@pytest.mark.parametrize("level", ["L0", "L1", "L2"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_host_figures_write_the_device_paths_cells(
    tmp_path: Path, monkeypatch, dtype: torch.dtype, level: str
):
    calls: list[int] = []
    real = torch_figures.host_figures
    monkeypatch.setattr(
        torch_figures, "host_figures", lambda views, *a: calls.append(len(views)) or real(views, *a)
    )
    grads = grads_of(dtype)
    step_with_grads(tmp_path / "host", grads, level)
    assert calls == [len(grads)]  # one batch for the step
    monkeypatch.setattr(torch_figures, "HOST_FIGURES_AVERAGE", 0)  # the device path, on the CPU
    monkeypatch.setattr(torch_figures, "_ONE_PASS", ())
    step_with_grads(tmp_path / "device", grads, level)
    assert calls == [len(grads)]
    host, device = rows(tmp_path / "host"), rows(tmp_path / "device")
    assert [r[0] for r in host] == list(grads)
    assert_device_cells(host, device, level)
    if level != "L0":
        for name, g in grads.items():
            got = (tmp_path / "host" / "rank0" / "step0" / f"{name}.npy").read_bytes()
            assert got == npy_bytes((g > 0).numpy()), name


def assert_device_cells(host: list[list[str]], device: list[list[str]], level: str) -> None:
    """Every cell the device path's, but the norm: to its last digits."""
    assert [r[0] for r in host] == [r[0] for r in device]
    norm = csv_format.header(level, ()).index("norm") if level != "L2" else None
    for a, b in zip(host, device):
        if norm is None:  # L2: the norm is the third figure from the end (before the shape's two cells)
            norm = len(a) - 3
        assert a[:norm] + a[norm + 1 :] == b[:norm] + b[norm + 1 :], a[0]
        x, y = float(a[norm]), float(b[norm])
        assert (math.isnan(x) and math.isnan(y)) or x == pytest.approx(y, rel=1e-14, abs=0.0), a[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_one_pass_figures_write_the_device_paths_cells_with_or_without_a_compiler(
    tmp_path: Path, monkeypatch, dtype: torch.dtype
):
    """L1 of large CPU gradients, each read once (host_figures.one_pass_figures): the device path's
    cells but the norm, the direction files np.save's bytes, and the same CSV bytes whether the C
    kernels or NumPy's passes took them."""
    from probes.backends import host_kernels

    calls: list[int] = []
    real = torch_figures.one_pass_figures
    monkeypatch.setattr(torch_figures, "one_pass_figures", lambda views: calls.append(len(views)) or real(views))
    monkeypatch.setattr(torch_figures, "HOST_FIGURES_AVERAGE", 0)  # large gradients, as far as the routing sees
    grads = grads_of(dtype)
    grads["big"] = torch.randn(40_001, generator=torch.Generator().manual_seed(1)).to(dtype)
    texts = []
    by_kernel: list[bool] = []
    real_kernel = host_kernels.grad_figures
    monkeypatch.setattr(host_kernels, "grad_figures", lambda *a: by_kernel.append(True) or real_kernel(*a))
    for way, switch in (("kernels", "1"), ("numpy", "0")):
        monkeypatch.setenv(host_kernels.SWITCH, switch)
        host_kernels.reset()
        if way == "kernels" and host_kernels.kernels() is None:
            if shutil.which("cc") or shutil.which("gcc") or shutil.which("clang"):
                pytest.fail(f"a C compiler is here but the kernels did not load: {host_kernels.why_not()}")
            pytest.skip(f"no C kernels on this machine: {host_kernels.why_not()}")
        step_with_grads(tmp_path / way, grads, "L1")
        texts.append(csv_format.summary_csv_path(tmp_path / way, 0, 0).read_bytes())
        for name, g in grads.items():
            got = (tmp_path / way / "rank0" / "step0" / f"{name}.npy").read_bytes()
            assert got == npy_bytes((g > 0).numpy()), (way, name)
    host_kernels.reset()
    assert calls == [len(grads)] * 2 and len(by_kernel) == len(grads)  # NumPy: the batch at once
    assert texts[0] == texts[1]
    monkeypatch.setattr(torch_figures, "_ONE_PASS", ())
    step_with_grads(tmp_path / "device", grads, "L1")
    assert calls == [len(grads)] * 2
    assert [r[0] for r in rows(tmp_path / "device")] == list(grads)
    assert_device_cells(rows(tmp_path / "kernels"), rows(tmp_path / "device"), "L1")


def test_host_figures_by_the_definitions():
    """max, min, norm of each view, the histogram as count differences over the elements (bounds
    compared in float64, not rounded to the view's float32), and the payloads."""
    views = [
        np.array([0.1, 0.2, -3.0], dtype=np.float32),
        np.array([np.nan, 2.0], dtype=np.float32),
        np.array([1.5, -0.5], dtype=np.float64),
    ]
    squares = Squares()
    got, signs = host_figures(views, squares, False, (0.1, 1))
    a, b = float(np.float32(0.1)), float(np.float32(0.2))  # a is above the float64 bound 0.1: in (0.1, 1]
    assert got[0][:2] + got[0][3:] == [b, -3.0, 1 / 3, 2 / 3, 0.0, 0.0]
    assert got[0][2] == pytest.approx(math.sqrt(a * a + b * b + 9.0), rel=1e-15)
    assert got[1][2] != got[1][2] and got[1][3:] == [0.0, 0.0, 1.0, 0.0]  # NaN: the last interval
    assert got[2] == [1.5, -0.5, math.sqrt(2.5), 0.5, 0.0, 0.5, 0.0]
    assert signs.tolist() == [True, True, False, False, True, True, False]
    rows_l0, payload = host_figures(views, squares, True)
    assert (
        payload.dtype == np.float32
        and payload.tobytes() == np.concatenate(views).astype(np.float32).tobytes()
    )
    assert [r[:3] for r in rows_l0][2] == got[2][:3]


def npy_bytes(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


SHAPES = [
    (),
    (0,),
    (1,),
    (7,),
    (10,),
    (64, 32),
    (3, 0, 2),
    (2, 3, 4),
    (1,) * 12,
    (128256, 1),
    (5, 1, 1, 1, 1, 3),
]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_direction_files_are_np_saves_bytes(tmp_path: Path, shape: tuple[int, ...]):
    """Every shape a direction file takes: a fresh file and one written over (a step written again)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal(shape) > 0
    path = tmp_path / "step0" / "p.npy"
    for _ in range(2):
        csv_format.write_direction(path, a)
        assert path.read_bytes() == npy_bytes(a)
        a = ~a


def test_which_batches_numpy_takes_and_in_what_parts(monkeypatch):
    """Small gradients on average: NumPy, in parts its squares buffer holds; large ones on
    average, or one NumPy cannot read in place: the device path."""
    small = [(f"p{i}", torch.ones(4)) for i in range(5)]
    assert torch_figures.host_parts(small) == [small]
    large = [("w", torch.ones(torch_figures.HOST_FIGURES_AVERAGE)), ("b", torch.ones(1))]
    assert torch_figures.host_parts(large[:1]) is None and torch_figures.host_parts(large) is not None
    assert torch_figures.host_parts(small + [("x", torch.ones(4, requires_grad=True))]) is None
    monkeypatch.setattr(torch_figures, "HOST_FIGURES_ELEMENTS", 9)
    parts = torch_figures.host_parts(small + [("big", torch.ones(12))] + small[:1])
    assert [[name for name, _ in part] for part in parts] == [
        ["p0", "p1"],
        ["p2", "p3"],
        ["p4"],
        ["big"],
        ["p0"],
    ]


def test_the_squares_buffer_is_kept_up_to_its_limit():
    squares = Squares()
    a = squares.take(10)
    assert np.shares_memory(a, squares.take(5))
    from probes.grad_probe.host_figures import HOST_FIGURES_ELEMENTS

    big = squares.take(HOST_FIGURES_ELEMENTS + 1)
    assert big.size == HOST_FIGURES_ELEMENTS + 1 and not np.shares_memory(big, squares.take(10))
    assert np.shares_memory(a, squares.take(10))


@pytest.mark.parametrize("level", ["L0", "L1", "L2"])
def test_training_under_the_monitor_is_bit_identical(tmp_path: Path, level: str):
    """NumPy only reads the gradients' memory: the weights after a few AdamW steps are the bytes
    an unmonitored run gives."""
    from probes.pytorch import PrecisionDebugger

    def run(monitored: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))
        dbg = None
        if monitored:
            config = {
                "task": "grad_probe",
                "dump_path": str(tmp_path / level),
                "grad_probe": {"grad_level": level},
            }
            dbg = PrecisionDebugger(config=config)
            dbg.monitor(model)
        for _ in range(4):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        if dbg is not None:
            dbg.stop()
            assert dbg.summary()["steps_written"] == [0, 1, 2, 3] and not dbg.summary()["errors"]
        return [p.detach().clone() for p in model.parameters()]

    for a, b in zip(run(True), run(False)):
        assert torch.equal(a, b)
