"""The direction files of CPU gradients are taken by NumPy reading the gradients in place (bfloat16
by its bits): their bytes must be those of the straightforward ``np.save((g > 0).numpy())`` on
every awkward value of every float dtype, and a sign flipped between two runs must still be caught."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from grad_runs import step_with_grads  # noqa: E402

from probes.grad_probe import GradComparator, torch_figures, torch_signs  # noqa: E402
from probes.grad_probe.torch_signs import host_signs, signs  # noqa: E402
from probes.pytorch import PrecisionDebugger  # noqa: E402

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def awkward(dtype: torch.dtype) -> torch.Tensor:
    """±0, ±NaN, ±inf, ±1, the smallest normals and subnormals, ±max, eps; for a 16-bit dtype also
    every one of its 65536 bit patterns (every NaN payload, every subnormal)."""
    fi = torch.finfo(dtype)
    values = [0.0, -0.0, float("nan"), -float("nan"), float("inf"), -float("inf"), 1.0, -1.0,
              fi.tiny, -fi.tiny, fi.tiny / 4, -fi.tiny / 4, fi.smallest_normal / 2 ** 3, fi.max, -fi.max, fi.eps]
    t = torch.tensor(values, dtype=dtype)
    if dtype.itemsize == 2:
        every = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(dtype)
        t = torch.cat([t, every])
    elif dtype == torch.float32:  # NaNs with payloads and both signs, the subnormal edges
        bits = torch.tensor([0x7FC00001, 0x7F800001, 0x7FFFFFFF, 0x00000001, 0x007FFFFF, 0x00800000,
                             0x7F7FFFFF, 0x7F800000], dtype=torch.int64)
        more = torch.cat([bits, bits | (1 << 31)]).to(torch.int64)
        more = torch.where(more >= 1 << 31, more - (1 << 32), more).to(torch.int32).view(torch.float32)
        t = torch.cat([t, more])
    return t


def npy_bytes(positive: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, positive)
    return buf.getvalue()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_host_signs_are_torchs_comparison_byte_for_byte(dtype: torch.dtype) -> None:
    t = awkward(dtype)
    strided = torch.stack([t, t]).T[0]  # a non-contiguous view: reshape copies it
    parts = [t, t[:0], strided.reshape(-1), t.flip(0)]
    got = host_signs(parts)
    assert got is not None and got.dtype == np.bool_
    want = np.concatenate([(p > 0).numpy() for p in parts])
    assert got.tobytes() == want.tobytes()
    # the device path (not taken on the CPU) gives the same bytes as well
    assert (torch.cat(parts) > 0).numpy().tobytes() == want.tobytes()


def test_what_numpy_cannot_view_is_compared_by_torch() -> None:
    neg = torch._neg_view(torch.tensor([1.0, -2.0, 0.0]).repeat(2000))
    needs_grad = torch.tensor([1.0, -2.0, 0.0]).repeat(2000).requires_grad_()
    for t, want in ((neg, [False, True, False]), (needs_grad, [True, False, False])):
        assert host_signs([t]) is None
        assert signs([t]).tolist() == want * 2000


@pytest.mark.parametrize("host", [True, False], ids=["host figures", "device figures"])
@pytest.mark.parametrize("large", [True, False], ids=["large", "small"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_direction_files_are_np_save_of_g_gt_0(tmp_path: Path, monkeypatch, dtype: torch.dtype, large: bool,
                                                host: bool) -> None:
    """The files of a step whose gradients hold the awkward values, batched: small gradients of a
    dtype NumPy has are taken on the host (host_figures), large float32 / float64 ones in one pass
    with their signs (one_pass_figures), the others by torch, the signs of large float16 /
    bfloat16 gradients by NumPy (host_signs) and of small ones by torch (cheaper there)."""
    taken: list[bool] = []
    one_pass: list[bool] = []
    real, real_one_pass = torch_signs.host_signs, torch_figures.one_pass_figures
    monkeypatch.setattr(torch_signs, "host_signs", lambda flats: taken.append(True) or real(flats))
    monkeypatch.setattr(torch_figures, "one_pass_figures", lambda views: one_pass.append(True) or real_one_pass(views))
    if not host:
        monkeypatch.setattr(torch_figures, "HOST_FIGURES_AVERAGE", 0)
    t = awkward(dtype)
    t = t.repeat(20000 // t.numel() + 1) if large else t[:16]
    grads = {"a": t, "b": t.flip(0).reshape(1, -1), "c": t[: 5].clone(), "d": torch.randn(3, 4).to(dtype)}
    step_with_grads(tmp_path, grads)
    for name, g in grads.items():
        got = (tmp_path / "rank0" / "step0" / f"{name}.npy").read_bytes()
        assert got == npy_bytes((g > 0).numpy()), name
        assert (tmp_path / "rank0" / "step0" / f"{name}.npy").stat().st_mode & 0o777 == 0o640
    assert (tmp_path / "rank0" / "step0").stat().st_mode & 0o777 == 0o750  # whatever the umask
    wide = dtype in (torch.float32, torch.float64)
    assert bool(one_pass) == (wide and (large or not host))  # what host_figures does not take
    assert bool(taken) == (large and not wide)  # the others' figures are the device path's, their signs NumPy's


def _run(root: Path, flip_from: int | None = None) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    dbg = PrecisionDebugger(config={"task": "grad_probe", "dump_path": str(root), "grad_probe": {"grad_level": "L1"}})
    dbg.monitor(model)
    gen = torch.Generator().manual_seed(1)
    for step in range(3):
        opt.zero_grad()
        x = torch.randn(6, 8, generator=gen)
        model(x).pow(2).sum().backward()
        if flip_from is not None and step >= flip_from:  # the seeded defect
            model[0].weight.grad.neg_()
        opt.step()
    dbg.stop()


def test_a_flipped_gradient_sign_is_still_caught(tmp_path: Path) -> None:
    _run(tmp_path / "a")
    _run(tmp_path / "b", flip_from=1)
    res = GradComparator.compare(tmp_path / "a" / "rank0", tmp_path / "b" / "rank0", tmp_path / "out", plots=False)
    assert res.similarity["0.weight"][0] >= 0.99
    assert res.similarity["0.weight"][1] < 0.5
    assert res.first_flagged_step() == 1
    assert ("0.weight", 1) in {(f.param, f.step) for f in res.flags}
