"""grad_probe's FP8 health columns: absent unless asked for (msprobe's CSV unchanged), the exact
fractions of a gradient that underflow / saturate at its tensorwise amax scale, the same cells
from MindSpore's monitor (PyNative on NumPy, on MindSpore tensors, and compiled) as from
PyTorch's, and bad values of the key refused by name. Sharded engines' figures are compared with
the single process's in tests/unit/grad_probe/test_sharded_grad_probe.py and tests/unit/grad_probe/test_zero_grad_probe.py."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch

from probes.core.config import load_config
from probes.core.errors import ConfigError
from probes.core.thresholds import LARGEST_FINITE, MIN_EXPONENT
from probes.grad_probe import csv_format
from probes.grad_probe.torch_monitor import GradMonitor

FORMATS = ["float8_e5m2", "float8_e4m3fn"]
COLUMNS = ["float8_e5m2 underflow", "float8_e5m2 saturated", "float8_e4m3fn underflow", "float8_e4m3fn saturated"]


def _config(tmp_path: Path, level: str = "L1", **gp):
    return load_config({"task": "grad_probe", "dump_path": str(tmp_path), "grad_probe": {"grad_level": level, **gp}})


def _dump(tmp_path: Path, grads: dict[str, torch.Tensor], level: str = "L1", **gp) -> list[dict[str, str]]:
    """One step of a monitor over parameters whose gradients are ``grads``: the CSV's rows."""
    params = {name: torch.nn.Parameter(torch.zeros_like(g)) for name, g in grads.items()}
    opt = torch.optim.SGD(list(params.values()), lr=0.0)
    with GradMonitor(_config(tmp_path, level, **gp), params, opt):
        for name, p in params.items():
            p.grad = grads[name].clone()
        opt.step()
    return _read(csv_format.summary_csv_path(tmp_path, 0, 0))


def _read(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8-sig", newline="") as f:
        return list(csv.DictReader(f))


def _expected(g: np.ndarray, fmt: str) -> tuple[float, float]:
    """(underflow, saturated) by hand: scale = largest / amax, counted on the float64 products."""
    a = np.abs(g.astype(np.float64))
    scaled = a * (LARGEST_FINITE[fmt] / a[np.isfinite(a)].max())
    under = np.count_nonzero((scaled > 0) & (scaled < 2.0 ** MIN_EXPONENT[fmt]))
    return under / g.size, np.count_nonzero(np.isinf(scaled)) / g.size


def _outliers() -> torch.Tensor:
    """Small gradient values with three huge outliers: at the outliers' scale the rest underflows."""
    g = torch.randn(1000, generator=torch.Generator().manual_seed(0)) * 1e-3
    g[[7, 400, 999]] = torch.tensor([1e4, -2e4, 3e4])
    return g


def _gaussian() -> torch.Tensor:
    """A clean gradient: at its amax (about 3.3 sigma) almost nothing falls below either range."""
    return torch.randn(1000, generator=torch.Generator().manual_seed(2))


def _non_finite() -> torch.Tensor:
    g = _spread()
    g[[3, 5]] = torch.tensor([float("inf"), float("nan")])
    return g


def _spread() -> torch.Tensor:
    """Magnitudes within a factor 4 of each other: nothing comes near the bottom of the range."""
    gen = torch.Generator().manual_seed(1)
    return (torch.rand(1000, generator=gen) * 3 + 1) * torch.sign(torch.randn(1000, generator=gen))


def test_off_by_default_the_csv_is_msprobes(tmp_path):
    grads = {"w": _outliers(), "b": _spread()}
    for level in ("L0", "L1", "L2"):
        plain = _dump(tmp_path / level / "plain", grads, level)
        empty = _dump(tmp_path / level / "empty", grads, level, fp8_health=[])
        assert list(plain[0]) == csv_format.header(level, (-1, 0, 1))  # msprobe's header, nothing after shape
        a = csv_format.summary_csv_path(tmp_path / level / "plain", 0, 0).read_bytes()
        b = csv_format.summary_csv_path(tmp_path / level / "empty", 0, 0).read_bytes()
        assert a == b and plain == empty


@pytest.mark.parametrize("level", ["L0", "L1", "L2"])
def test_the_columns_end_each_row_when_asked_for(tmp_path, level):
    grads = {"w": _outliers(), "b": _spread()}
    rows = _dump(tmp_path, grads, level, fp8_health=FORMATS)
    assert list(rows[0]) == csv_format.header(level, (-1, 0, 1)) + COLUMNS
    plain = _dump(tmp_path / "plain", grads, level)
    for row, before in zip(rows, plain):
        assert {k: v for k, v in row.items() if k not in COLUMNS} == before  # msprobe's cells unchanged


def test_exact_fractions_of_an_outlier_gradient_and_a_well_spread_one(tmp_path):
    grads = {"outliers": _outliers(), "spread": _spread()}
    rows = {r["param_name"]: r for r in _dump(tmp_path, grads, fp8_health=FORMATS)}
    for name, g in grads.items():
        for fmt in FORMATS:
            under, sat = _expected(g.numpy(), fmt)
            assert float(rows[name][f"{fmt} underflow"]) == under
            assert float(rows[name][f"{fmt} saturated"]) == sat == 0.0  # the amax lands on the largest value
    # e4m3fn: scale 448 / 3e4, so every value but the outliers (|g| ~ 1e-3) falls below 2^-6
    assert float(rows["outliers"]["float8_e4m3fn underflow"]) == 997 / 1000
    # e5m2's four more exponent bits keep most of them normal
    assert float(rows["outliers"]["float8_e5m2 underflow"]) < 0.1
    assert float(rows["spread"]["float8_e4m3fn underflow"]) == float(rows["spread"]["float8_e5m2 underflow"]) == 0.0


def test_non_finite_and_empty_gradients(tmp_path):
    rows = {r["param_name"]: r for r in _dump(tmp_path, {"bad": _non_finite(), "empty": torch.zeros(0),
                                                         "zero": torch.zeros(8)},
                                             fp8_health=["float8_e4m3fn"])}
    # the amax is the finite elements': the infinity saturates, the NaN counts in neither
    assert float(rows["bad"]["float8_e4m3fn saturated"]) == 1 / 1000
    assert float(rows["bad"]["float8_e4m3fn underflow"]) == 0.0
    for name in ("empty", "zero"):
        assert float(rows[name]["float8_e4m3fn underflow"]) == float(rows[name]["float8_e4m3fn saturated"]) == 0.0


@pytest.mark.parametrize(("value", "message"), [
    (True, "a list of FP8 formats"),
    ("float8_e5m2", "a list of FP8 formats"),
    (["e5m2"], 'write "float8_e5m2"'),
    (["float8_e8m0fnu"], "float8_e4m3fn"),
    (["float8_e5m2", "float8_e5m2"], "listed twice"),
    ([3], "a list of FP8 formats"),
])
def test_bad_values_are_refused_by_name(tmp_path, value, message):
    with pytest.raises(ConfigError, match="grad_probe.fp8_health") as info:
        _config(tmp_path, fp8_health=value)
    assert message in str(info.value)


def test_the_key_round_trips_and_works_as_an_override(tmp_path):
    cfg = _config(tmp_path, fp8_health=FORMATS)
    assert cfg.grad_probe.fp8_health == tuple(FORMATS)
    assert load_config({"task": "grad_probe", "dump_path": str(tmp_path),
                        "grad_probe": cfg.grad_probe.to_dict()}).grad_probe == cfg.grad_probe
    assert "fp8_health" not in _config(tmp_path).grad_probe.to_dict()
    over = load_config({"task": "grad_probe", "dump_path": str(tmp_path)}, overrides={"grad_probe.fp8_health": FORMATS})
    assert over.grad_probe.fp8_health == tuple(FORMATS)


# ------------------------------------------------------------------ MindSpore

#: how MindSpore's monitor gets the gradients: called from Python with the figures on NumPy (the
#: CPU host view) or on MindSpore tensors (as on other targets), or compiled with mindspore.jit
MS_PATHS = ("numpy", "tensor", "jit")


def _seeded() -> dict[str, torch.Tensor]:
    return {"outliers": _outliers(), "gaussian": _gaussian(), "spread": _spread(), "non_finite": _non_finite()}


def _ms_dump(root: Path, grads: dict[str, np.ndarray], path: str, compute=None) -> list[dict[str, str]]:
    """One optimizer call of a MindSporeGradMonitor on gradients ``grads`` along ``path``."""
    import mindspore as ms
    from mindspore import Tensor, nn

    from probes.backends.mindspore_backend import BACKEND
    from probes.grad_probe import mindspore_monitor

    params = [ms.Parameter(Tensor(np.zeros(g.shape, np.float32)), name=n) for n, g in grads.items()]
    opt = nn.SGD(params, learning_rate=0.0)
    with pytest.MonkeyPatch.context() as mp:
        if path == "tensor":
            mp.setattr(BACKEND, "host_view", lambda t: None)
        if compute is not None:  # a target without float64, as Ascend
            mp.setattr(mindspore_monitor, "_graph_compute_dtype", lambda: compute)
        mon = mindspore_monitor.MindSporeGradMonitor(_config(root, fp8_health=FORMATS), opt)
        try:
            gradients = tuple(Tensor(g) for g in grads.values())
            if path == "jit":
                def step(gs):
                    return opt(gs)

                ms.jit(step)(gradients)
            else:
                opt(gradients)
        finally:
            mon.stop()
    summary = mon.summary()
    assert summary["errors"] == [] and summary["paths"]["graph" if path == "jit" else "host"] == 1
    return _read(csv_format.summary_csv_path(root, 0, 0))


@pytest.fixture(scope="module", params=MS_PATHS)
def ms_rows(request, tmp_path_factory):
    """(MindSpore's rows, PyTorch's rows) of the seeded gradients."""
    pytest.importorskip("mindspore")
    from probes.backends import mindspore_xp

    mindspore_xp.warm_up()
    root = tmp_path_factory.mktemp(f"fp8_ms_{request.param}")
    grads = _seeded()
    got = _ms_dump(root / "ms", {n: g.numpy() for n, g in grads.items()}, request.param)
    want = _dump(root / "torch", grads, fp8_health=FORMATS)
    return {r["param_name"]: r for r in got}, {r["param_name"]: r for r in want}


def test_mindspore_flags_the_outlier_gradient_and_passes_the_gaussian_one(ms_rows):
    rows, _ = ms_rows
    for name, g in _seeded().items():
        for fmt in FORMATS:
            under, sat = _expected(g.numpy(), fmt)
            assert float(rows[name][f"{fmt} underflow"]) == under, (name, fmt)
            assert float(rows[name][f"{fmt} saturated"]) == sat, (name, fmt)
    outliers, gaussian = rows["outliers"], rows["gaussian"]
    assert float(outliers["float8_e4m3fn underflow"]) == 997 / 1000  # all but the three outliers
    assert 0.0 < float(outliers["float8_e5m2 underflow"]) < 0.1
    for fmt in FORMATS:
        assert float(gaussian[f"{fmt} underflow"]) <= 1e-3
        # saturation at the amax scale: none for finite values; the infinity is the one element
        assert float(gaussian[f"{fmt} saturated"]) == float(outliers[f"{fmt} saturated"]) == 0.0
        assert float(rows["non_finite"][f"{fmt} saturated"]) == 1 / 1000


def test_mindspore_writes_the_cells_pytorch_writes_for_the_same_gradient(ms_rows):
    rows, torch_rows = ms_rows
    assert list(rows) == list(torch_rows)
    for name, row in torch_rows.items():
        assert list(rows[name]) == list(row)  # msprobe's header, then the FP8 columns
        assert [rows[name][c] for c in COLUMNS] == [row[c] for c in COLUMNS], name  # the same text


def test_a_compiled_step_without_float64_leaves_nan_as_pytorch_does(tmp_path):
    ms = pytest.importorskip("mindspore")
    rows = _ms_dump(tmp_path, {"w": _outliers().numpy()}, "jit", compute=ms.float32)
    assert [rows[0][c] for c in COLUMNS] == ["nan"] * len(COLUMNS)
    assert float(rows[0]["max"]) == 3e4  # the rest of the row is measured
