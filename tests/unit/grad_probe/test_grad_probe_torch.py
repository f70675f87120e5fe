"""grad_probe on PyTorch: statistics, msprobe's file formats and the monitor's hook life cycle
(only the model's optimizers hooked, rank resolved lazily, empty gradients as NaN rows, a missing
gradient logged once)."""

from __future__ import annotations

import csv
import json
import logging
import math
import zlib
from pathlib import Path
from typing import Any

import array_api_compat.numpy as xp_np
import array_api_compat.torch as xp_torch
import numpy as np
import pytest
import torch
import torch.optim.optimizer as topt
from grad_runs import step_with_grads

from probes.core.config import load_config
from probes.core.errors import ConfigError, ProbeError
from probes.grad_probe import csv_format, stats
from probes.grad_probe.stats import GradStats
from probes.grad_probe.torch_monitor import GradMonitor
from probes.pytorch import PrecisionDebugger

HEADERS = {
    "L0": "param_name,MD5,max,min,norm,shape",
    "L1": "param_name,max,min,norm,shape",
    "L2": 'param_name,"(-inf, -1]","(-1, 0]","(0, 1]","(1, inf)",=0,max,min,norm,shape',
}
BOUNDS = (-1, 0, 1)


def config(tmp_path: Path, level: str = "L1", **top: Any) -> Any:
    gp = top.pop("gp", {})
    return load_config({"task": "grad_probe", "dump_path": str(tmp_path / "dump"), "grad_probe": {"grad_level": level, **gp}, **top})


def mlp(seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))


def train(model: torch.nn.Module, optimizers: list[torch.optim.Optimizer], steps: int = 3, seed: int = 1) -> list[float]:
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        for opt in optimizers:
            opt.zero_grad()
        x = torch.randn(5, 4, generator=gen)
        loss = (model(x) ** 2).mean() * 10
        loss.backward()
        for opt in optimizers:
            opt.step()
        losses.append(loss.item())
    return losses


def capture(model: torch.nn.Module, opt: torch.optim.Optimizer) -> list[dict[str, torch.Tensor]]:
    """The test's own pre-hook: the gradients as they are just before each step."""
    seen: list[dict[str, torch.Tensor]] = []

    def hook(o: Any, args: Any, kwargs: Any) -> None:
        seen.append({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})

    opt.register_step_pre_hook(hook)
    return seen


def read_csv_bytes(path: Path) -> tuple[list[str], list[list[str]]]:
    """Check BOM and CRLF, return the header line and the split rows."""
    import csv
    import io

    raw = path.read_bytes()
    assert raw.startswith(b"\xef\xbb\xbf")
    assert raw.endswith(b"\r\n")
    assert raw.count(b"\n") == raw.count(b"\r\n")
    text = raw[3:].decode("utf-8")
    lines = text.split("\r\n")[:-1]
    rows = list(csv.reader(io.StringIO(text)))
    return lines, rows


def expected_row(level: str, name: str, g: torch.Tensor, bounds: tuple = BOUNDS) -> list[Any]:
    d = g.detach().to(torch.float64).reshape(-1)
    mx, mn, norm = d.max().item(), d.min().item(), math.sqrt((d * d).sum().item())
    tail = [mx, mn, norm, str(list(g.shape))]
    if level == "L0":
        return [name, f"{zlib.crc32(g.float().numpy().tobytes()):08x}", *tail]
    if level == "L1":
        return [name, *tail]
    a = d.numpy()
    edges = [-math.inf, *bounds, math.inf]
    fr = [float(np.count_nonzero((a > lo) & (a <= hi))) / a.size for lo, hi in zip(edges[:-2], edges[1:-1])]
    fr.append(float(np.count_nonzero(a > bounds[-1])) / a.size)
    return [name, *fr, float(np.count_nonzero(a == 0)) / a.size, *tail]


def assert_row(cells: list[str], want: list[Any]) -> None:
    assert len(cells) == len(want)
    for got, exp in zip(cells, want):
        if isinstance(exp, float):
            assert float(got) == pytest.approx(exp, rel=1e-15, abs=0), (cells, want)
        else:
            assert got == exp


# -------------------------------------------------------------------------------- statistics


@pytest.mark.parametrize(
    ("values", "crc"),
    [([1.0, 2.0, 3.0], "b20e96b1"), ([9.3, 5.4, -1.0, -12.3], "a973efad"), ([[0.5, -0.25], [0.0, 2.0]], "dccd20d1"), ([], "00000000")],
)
def test_crc32_test_vectors(values: list[Any], crc: str) -> None:
    assert stats.crc32_hex(values) == crc
    assert stats.crc32_hex(torch.tensor(values, dtype=torch.float64).numpy()) == crc  # float64 rounds to float32 first


def test_stat_vector_doc_example_numpy_and_torch() -> None:
    for xp, g in ((xp_np, np.array([9.3, 5.4, -1.0, -12.3])), (xp_torch, torch.tensor([9.3, 5.4, -1.0, -12.3], dtype=torch.float64))):
        v = [float(x) for x in stats.stat_vector(xp, g, (-10, 0, 10), True)]
        assert v[:2] == [9.3, -12.3]  # float64 grads keep their precision (no float32 rounding)
        assert v[2] == math.sqrt(9.3**2 + 5.4**2 + 1.0 + 12.3**2)
        assert v[3:] == [0.25, 0.25, 0.5, 0.0, 0.0]


def test_stat_vector_nonfinite_buckets() -> None:
    g = torch.tensor([-math.inf, math.inf, math.nan, 0.0, -0.0, -1.0, 1.0, 1.5])
    v = stats.stat_vector(xp_torch, g, BOUNDS, True).tolist()
    assert all(math.isnan(x) for x in v[:3])
    # -inf and -1 in the first interval; +-0 in (-1, 0]; 1 in (0, 1]; inf, nan, 1.5 in the last
    assert v[3:] == [2 / 8, 2 / 8, 1 / 8, 3 / 8, 2 / 8]


def test_stat_vector_bucketing_in_float64() -> None:
    # a float64 gradient equal to 0.1 lies in (0, 0.1]; just above 0.1 lies beyond (reference: float32 bounds)
    g = torch.tensor([0.1, math.nextafter(0.1, 1.0)], dtype=torch.float64)
    assert stats.stat_vector(xp_torch, g, (0, 0.1), True).tolist()[3:] == [0.0, 0.5, 0.5, 0.0]


def test_stat_vector_empty_and_scalar() -> None:
    v = stats.stat_vector(xp_torch, torch.zeros(0, 3), BOUNDS, True).tolist()
    assert all(math.isnan(x) for x in v[:3]) and v[3:] == [0.0] * 5
    assert stats.stat_vector(xp_torch, torch.tensor(-2.0), BOUNDS, False).tolist() == [-2.0, -2.0, 2.0]
    assert stats.vector_length(BOUNDS, True) == 8 and stats.vector_length(BOUNDS, False) == 3


def test_stat_vector_chunks_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.randn(1001, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    g[::7] = 0
    whole = stats.stat_vector(xp_torch, g, (-0.5, 0, 0.5), True)
    monkeypatch.setattr(stats, "CHUNK_ELEMENTS", 64)
    chunked = stats.stat_vector(xp_torch, g, (-0.5, 0, 0.5), True)
    assert whole[[0, 1, 3, 4, 5, 6, 7]].tolist() == chunked[[0, 1, 3, 4, 5, 6, 7]].tolist()
    assert chunked[2].item() == pytest.approx(whole[2].item(), rel=1e-14)


def test_stat_vector_low_precision_exact_max_min() -> None:
    g = torch.tensor([1.0, -3.5, 2.25], dtype=torch.bfloat16)
    v = stats.stat_vector(xp_torch, g, BOUNDS, False)
    assert v.dtype == torch.float64
    assert v.tolist()[:2] == [2.25, -3.5]


# -------------------------------------------------------------------------------- file format


def test_interval_headers() -> None:
    assert csv_format.interval_headers((-1, 0, 1)) == ["(-inf, -1]", "(-1, 0]", "(0, 1]", "(1, inf)"]
    assert csv_format.interval_headers((-0.01, 0.0, 1e-5, 2.5)) == ["(-inf, -0.01]", "(-0.01, 0.0]", "(0.0, 1e-05]", "(1e-05, 2.5]", "(2.5, inf)"]
    with pytest.raises(ValueError):
        csv_format.interval_headers(())
    for level, head in HEADERS.items():
        assert ",".join(f'"{h}"' if "," in h else h for h in csv_format.header(level, BOUNDS)) == head


def test_spec_example_row_layer_weight(tmp_path: Path) -> None:
    """msprobe's L2 row for [[0.5, -0.25], [0.0, 2.0]]. The reference's norm 2.076655864715576 is
    float32-rounded; ours is the float64 value sqrt(4.3125) = 2.0766559657295187. Every other cell is
    byte-identical."""
    g = torch.tensor([[0.5, -0.25], [0.0, 2.0]])
    row = stats.split_stats("layer.weight", g.shape, stats.stat_vector(xp_torch, g, BOUNDS, True).tolist(), BOUNDS, True)
    path = csv_format.write_summary_csv(tmp_path / "s.csv", "L2", BOUNDS, [row])
    assert math.sqrt(4.3125) == 2.0766559657295187
    assert path.read_bytes() == (
        "\ufeff" + HEADERS["L2"] + "\r\n" + 'layer.weight,0.0,0.5,0.25,0.25,0.25,2.0,-0.25,2.0766559657295187,"[2, 2]"\r\n'
    ).encode("utf-8")


def test_spec_full_example_bytes(tmp_path: Path) -> None:
    """Header, quoting, BOM and CRLF of the reference, from a file msprobe wrote (L2, two-layer MLP)."""
    bounds = (-0.1, 0, 0.1)
    rows = [
        GradStats("0.weight", (3, 4), 0.0, -0.22386321425437927, 0.239546537399292,
                  (0.08333333333333333, 0.9166666666666666, 0.0, 0.0), 0.6666666666666666),
        GradStats("0.bias", (3,), 0.14159651100635529, 0.0, 0.14159651100635529,
                  (0.0, 0.6666666666666666, 0.0, 0.3333333333333333), 0.6666666666666666),
    ]
    path = csv_format.write_summary_csv(tmp_path / "grad_summary_0.csv", "L2", bounds, rows)
    assert path.read_bytes() == (
        b'\xef\xbb\xbfparam_name,"(-inf, -0.1]","(-0.1, 0]","(0, 0.1]","(0.1, inf)",=0,max,min,norm,shape\r\n'
        b'0.weight,0.08333333333333333,0.9166666666666666,0.0,0.0,0.6666666666666666,0.0,-0.22386321425437927,0.239546537399292,"[3, 4]"\r\n'
        b"0.bias,0.0,0.6666666666666666,0.0,0.3333333333333333,0.6666666666666666,0.14159651100635529,0.0,0.14159651100635529,[3]\r\n"
    )
    # rewriting replaces the file (as msprobe's PyTorch side does), header-only when no parameter has a gradient
    csv_format.write_summary_csv(path, "L2", bounds, [])
    assert path.read_bytes() == b'\xef\xbb\xbfparam_name,"(-inf, -0.1]","(-0.1, 0]","(0, 0.1]","(0.1, inf)",=0,max,min,norm,shape\r\n'


def test_row_cells_render_nan_inf_and_scalar_shape() -> None:
    r = GradStats("p", (), math.nan, -math.inf, math.inf, md5="00000000")
    assert csv_format.render_csv([csv_format.row_cells("L0", r)]) == "p,00000000,nan,-inf,inf,[]\r\n"


@pytest.mark.parametrize(("name", "file"), [("0.weight", "0.weight"), ("a/b c", "a%2Fb%20c"), ("x%y", "x%25y"), ("ü-1_2", "%C3%BC-1_2")])
def test_file_names_percent_encoded(name: str, file: str) -> None:
    assert csv_format.file_name_for_param(name) == file
    assert csv_format.param_from_file_name(file) == name


# -------------------------------------------------------------------------------- the monitor


@pytest.mark.parametrize("level", ["L0", "L1", "L2"])
def test_levels_write_reference_files(tmp_path: Path, level: str) -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = capture(model, opt)
    with GradMonitor(config(tmp_path, level), model) as mon:
        train(model, [opt])
    rank0 = tmp_path / "dump" / "rank0"
    assert len(seen) == 3
    for step, grads in enumerate(seen):
        lines, rows = read_csv_bytes(rank0 / f"grad_summary_{step}.csv")
        assert lines[0] == HEADERS[level]
        assert len(rows) - 1 == len(grads) == 4
        for cells, (name, g) in zip(rows[1:], grads.items()):
            assert_row(cells, expected_row(level, name, g))
            npy = rank0 / f"step{step}" / f"{name}.npy"
            if level == "L0":
                assert not npy.exists()
            else:
                arr = np.load(npy)
                assert arr.dtype == np.bool_ and arr.shape == tuple(g.shape)
                assert np.array_equal(arr, (g > 0).numpy())
    assert (level == "L0") == (not (rank0 / "step0").exists())
    summary = json.loads((rank0 / "summary.json").read_text())
    assert summary["steps_written"] == [0, 1, 2]
    assert summary["level"] == level and summary["bounds"] == [-1, 0, 1]
    assert summary["params"] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert summary["errors"] == [] and summary["params_without_grad"] == {}
    assert not mon.running


def test_monitor_does_not_change_training(tmp_path: Path) -> None:
    base_model = mlp()
    base = train(base_model, [torch.optim.Adam(base_model.parameters(), lr=0.01)], steps=4)
    for level in ("L0", "L2"):
        model = mlp()
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        with GradMonitor(config(tmp_path / level, level), model):
            losses = train(model, [opt], steps=4)
        assert losses == base
        for p, q in zip(model.parameters(), base_model.parameters()):
            assert torch.equal(p, q)


def test_two_optimizers_one_step_per_iteration(tmp_path: Path) -> None:
    model = mlp()
    opts = [torch.optim.SGD(model[0].parameters(), lr=0.1), torch.optim.SGD(model[2].parameters(), lr=0.1)]
    with GradMonitor(config(tmp_path), model) as mon:
        train(model, opts)
    rank0 = tmp_path / "dump" / "rank0"
    assert sorted(p.name for p in rank0.glob("grad_summary_*.csv")) == [f"grad_summary_{i}.csv" for i in range(3)]
    _, rows = read_csv_bytes(rank0 / "grad_summary_2.csv")
    assert [r[0] for r in rows[1:]] == ["0.weight", "0.bias", "2.weight", "2.bias"]  # every parameter, once
    assert mon.summary()["optimizer_steps"] == 3


def test_explicit_optimizers(tmp_path: Path) -> None:
    model = mlp()
    opts = [torch.optim.SGD(model[0].parameters(), lr=0.1), torch.optim.SGD(model[2].parameters(), lr=0.1)]
    n_global = len(topt._global_optimizer_pre_hooks)
    mon = GradMonitor(config(tmp_path), model, optimizers=opts)
    assert len(topt._global_optimizer_pre_hooks) == n_global  # no global hook when optimizers are given
    train(model, opts)
    mon.stop()
    assert mon.steps_written == [0, 1, 2]
    assert all(len(o._optimizer_step_pre_hooks) == 0 for o in opts)


def test_monitor_twice_does_not_double_count(tmp_path: Path) -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    n_global = len(topt._global_optimizer_pre_hooks)
    mon = GradMonitor(config(tmp_path), model)
    mon.monitor(model)
    mon.monitor(model[0])
    assert len(topt._global_optimizer_pre_hooks) == n_global + 1
    train(model, [opt])
    mon.stop()
    assert mon.steps_written == [0, 1, 2]
    assert mon.summary()["params"] == ["0.weight", "0.bias", "2.weight", "2.bias"]


def test_hooks_removed_after_stop(tmp_path: Path) -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    n_global = len(topt._global_optimizer_pre_hooks)
    mon = GradMonitor(config(tmp_path), model)
    mon2 = GradMonitor(config(tmp_path / "b"), opt)  # an optimizer: its own pre-hook
    assert len(topt._global_optimizer_pre_hooks) == n_global + 1
    assert len(opt._optimizer_step_pre_hooks) == 1
    train(model, [opt], steps=1)
    mon.stop()
    mon2.stop()
    mon.stop()  # idempotent
    assert len(topt._global_optimizer_pre_hooks) == n_global
    assert len(opt._optimizer_step_pre_hooks) == 0
    train(model, [opt], steps=2)
    assert mon.steps_written == [0] and mon2.steps_written == [0]
    assert not (tmp_path / "dump" / "rank0" / "grad_summary_1.csv").exists()


def test_unrelated_optimizer_is_ignored(tmp_path: Path) -> None:
    model, other = mlp(), mlp(5)
    with GradMonitor(config(tmp_path), model) as mon:
        train(other, [torch.optim.SGD(other.parameters(), lr=0.1)], steps=2)  # not the monitored model's
        assert mon.steps_written == [] and mon.current_step is None
        train(model, [torch.optim.SGD(model.parameters(), lr=0.1)], steps=1)
    assert mon.steps_written == [0]


def test_main_grad_preferred(tmp_path: Path) -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = model[0].weight
    w.main_grad = torch.full_like(w, 7.0)  # type: ignore[attr-defined]
    model[0].bias.main_grad = None  # type: ignore[attr-defined]  # None main_grad: falls back to grad
    with GradMonitor(config(tmp_path), model):
        train(model, [opt], steps=1)
    _, rows = read_csv_bytes(tmp_path / "dump" / "rank0" / "grad_summary_0.csv")
    assert rows[1][:4] == ["0.weight", "7.0", "7.0", str(math.sqrt(49.0 * 12))]
    assert rows[2][0] == "0.bias" and float(rows[2][1]) == model[0].bias.grad.max().item()


def test_frozen_param_no_row_recorded_and_logged_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model = mlp()
    model[0].bias.requires_grad_(False)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    caplog.set_level(logging.INFO, logger="probes.grad_probe")
    with GradMonitor(config(tmp_path), model) as mon:
        train(model, [opt])
    for step in range(3):
        _, rows = read_csv_bytes(tmp_path / "dump" / "rank0" / f"grad_summary_{step}.csv")
        assert [r[0] for r in rows[1:]] == ["0.weight", "2.weight", "2.bias"]
    summary = json.loads((tmp_path / "dump" / "rank0" / "summary.json").read_text())
    assert summary["params_without_grad"] == {"0": ["0.bias"], "1": ["0.bias"], "2": ["0.bias"]}
    assert len([r for r in caplog.records if "0.bias" in r.getMessage()]) == 1
    assert mon.errors == []


def test_empty_param_gives_nan_row(tmp_path: Path) -> None:
    model = mlp()
    model.empty = torch.nn.Parameter(torch.zeros(0, 3))  # type: ignore[assignment]

    def forward(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.Sequential.forward(model, x) + model.empty.sum()

    model.forward = forward  # type: ignore[method-assign]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with GradMonitor(config(tmp_path, "L2"), model) as mon:
        train(model, [opt], steps=1)
    _, rows = read_csv_bytes(tmp_path / "dump" / "rank0" / "grad_summary_0.csv")
    # named_parameters(): the module's own parameters come before its children's
    assert rows[1] == ["empty", "0.0", "0.0", "0.0", "0.0", "0.0", "nan", "nan", "nan", "[0, 3]"]
    assert len(rows) == 6
    assert np.load(tmp_path / "dump" / "rank0" / "step0" / "empty.npy").shape == (0, 3)
    assert mon.errors == []


def test_param_list_selects_and_typo_suggests(tmp_path: Path) -> None:
    model = mlp()
    n_global = len(topt._global_optimizer_pre_hooks)
    with pytest.raises(ConfigError) as info:
        GradMonitor(config(tmp_path, gp={"param_list": ["0.weight", "2.wieght"]}), model)
    assert info.value.key == "grad_probe.param_list[1]"
    assert 'did you mean "2.weight"' in str(info.value)
    assert len(topt._global_optimizer_pre_hooks) == n_global  # raised before any hook was installed
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with GradMonitor(config(tmp_path, gp={"param_list": ["2.bias", "0.weight"]}), model):
        train(model, [opt], steps=1)
    _, rows = read_csv_bytes(tmp_path / "dump" / "rank0" / "grad_summary_0.csv")
    assert [r[0] for r in rows[1:]] == ["0.weight", "2.bias"]  # named_parameters() order


def test_step_filter(tmp_path: Path) -> None:
    model = mlp()
    with GradMonitor(config(tmp_path, "L1", step=[1]), model) as mon:
        train(model, [torch.optim.SGD(model.parameters(), lr=0.1)])
    rank0 = tmp_path / "dump" / "rank0"
    assert sorted(p.name for p in rank0.iterdir()) == ["grad_summary_1.csv", "step1", "summary.json"]
    assert mon.steps_written == [1] and mon.current_step == 2


class _Rank:
    def __init__(self) -> None:
        self.value = 0
        from probes.backends.torch_backend import BACKEND

        self._b = BACKEND

    def rank(self) -> int:
        return self.value

    def namespace(self, t: Any) -> Any:
        return self._b.namespace(t)


def test_rank_resolved_lazily_and_filtered(tmp_path: Path) -> None:
    model = mlp()
    backend = _Rank()
    mon = GradMonitor(config(tmp_path), model, backend=backend)
    backend.value = 3  # e.g. init_process_group after monitor()
    train(model, [torch.optim.SGD(model.parameters(), lr=0.1)], steps=1)
    mon.stop()
    assert (tmp_path / "dump" / "rank3" / "grad_summary_0.csv").exists()
    assert (tmp_path / "dump" / "rank3" / "summary.json").exists()
    assert not (tmp_path / "dump" / "rank0").exists()

    backend2 = _Rank()
    backend2.value = 1
    with GradMonitor(config(tmp_path / "f", rank=[0]), model, backend=backend2) as mon2:
        train(model, [torch.optim.SGD(model.parameters(), lr=0.1)], steps=1)
    assert mon2.steps_written == [] and not (tmp_path / "f" / "dump").exists()


def test_odd_param_names_are_percent_encoded(tmp_path: Path) -> None:
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    opt = torch.optim.SGD([p], lr=0.1)
    with GradMonitor(config(tmp_path), {"blocks/0 w": p}) as mon:
        p.grad = torch.tensor([0.5, -0.5])
        opt.step()
    rank0 = tmp_path / "dump" / "rank0"
    assert np.load(rank0 / "step0" / "blocks%2F0%20w.npy").tolist() == [True, False]
    _, rows = read_csv_bytes(rank0 / "grad_summary_0.csv")
    assert rows[1][0] == "blocks/0 w"
    assert mon.summary()["file_names"] == {"blocks/0 w": "blocks%2F0%20w"}


def test_errors_recorded_not_raised_unless_strict(tmp_path: Path) -> None:
    good = torch.nn.Parameter(torch.tensor([1.0]))
    bad = torch.nn.Parameter(torch.tensor([1.0 + 1.0j]))  # complex: no max/min
    opt = torch.optim.SGD([good, bad], lr=0.1)
    with GradMonitor(config(tmp_path), {"good": good, "bad": bad}) as mon:
        good.grad, bad.grad = torch.tensor([2.0]), torch.tensor([1.0j])
        opt.step()
    assert [e["param"] for e in mon.errors] == ["bad"] and mon.errors[0]["step"] == 0
    assert "complex64" in mon.errors[0]["error"]
    _, rows = read_csv_bytes(tmp_path / "dump" / "rank0" / "grad_summary_0.csv")
    assert [r[0] for r in rows[1:]] == ["good"]
    assert json.loads((tmp_path / "dump" / "rank0" / "summary.json").read_text())["errors"][0]["param"] == "bad"

    mon = GradMonitor(config(tmp_path / "s", strict=True), {"good": good, "bad": bad})
    try:
        with pytest.raises(ProbeError, match="step 0"):
            opt.step()
    finally:
        mon.stop()
    assert len(mon.errors) == 1


# -------------------------------------------------------------------------------- PrecisionDebugger


def test_debugger_monitor_model(tmp_path: Path) -> None:
    cfg_path = tmp_path / "config.json"
    cfg_path.write_text(json.dumps({"task": "grad_probe", "dump_path": "ignored", "grad_probe": {"grad_level": "L2"}}))
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    n_global = len(topt._global_optimizer_pre_hooks)
    debugger = PrecisionDebugger(str(cfg_path), dump_path=tmp_path / "out")  # the override is honoured (msprobe ignored it)
    debugger.start()
    mon = debugger.monitor(model)
    assert debugger.monitor(model) is mon  # a second call adds nothing
    for _ in range(3):
        train(model, [opt], steps=1)
        debugger.step()
    debugger.stop()
    assert len(topt._global_optimizer_pre_hooks) == n_global
    assert mon.steps_written == [0, 1, 2]
    lines, _ = read_csv_bytes(tmp_path / "out" / "rank0" / "grad_summary_2.csv")
    assert lines[0] == HEADERS["L2"]
    assert debugger.summary()["steps_written"] == [0, 1, 2] and debugger.rows == []


def test_debugger_monitor_optimizer_hooks_only_that_optimizer(tmp_path: Path) -> None:
    model = mlp()
    opt0 = torch.optim.SGD(model[0].parameters(), lr=0.1)
    opt2 = torch.optim.SGD(model[2].parameters(), lr=0.1)
    debugger = PrecisionDebugger(task="grad_probe", dump_path=str(tmp_path / "out"), model=model)
    debugger.monitor(opt2)
    train(model, [opt0, opt2], steps=2)
    debugger.stop()
    assert len(opt2._optimizer_step_pre_hooks) == 0
    _, rows = read_csv_bytes(tmp_path / "out" / "rank0" / "grad_summary_1.csv")
    assert [r[0] for r in rows[1:]] == ["2.weight", "2.bias"]  # names from the debugger's model
    assert not (tmp_path / "out" / "rank0" / "grad_summary_2.csv").exists()


def test_debugger_monitor_is_a_no_op_for_free_benchmark(tmp_path: Path) -> None:
    debugger = PrecisionDebugger(task="free_benchmark", dump_path=str(tmp_path))
    assert debugger.monitor(mlp()) is None


def test_bfloat16_model_stats_in_float64(tmp_path: Path) -> None:
    model = mlp().to(torch.bfloat16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = capture(model, opt)
    with GradMonitor(config(tmp_path, "L2"), model):
        x = torch.randn(5, 4, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
        model(x).float().pow(2).sum().backward()
        opt.step()
    _, rows = read_csv_bytes(tmp_path / "dump" / "rank0" / "grad_summary_0.csv")
    for cells, (name, g) in zip(rows[1:], seen[0].items()):
        assert g.dtype == torch.bfloat16
        assert_row(cells, expected_row("L2", name, g))


def test_batched_statistics_match_one_by_one_and_stay_exact_where_they_must(tmp_path, monkeypatch):
    """A step's small gradients are reduced together (NumPy on the host, _foreach kernels for
    bfloat16): max and min exactly as one by one, the norm to the last digit or so; inf, NaN, -0.0,
    empty, bf16 and a gradient larger than a chunk all keep their own row, in the parameters' order."""

    from probes.backends import torch_xp
    from probes.grad_probe import torch_figures, torch_monitor

    calls, host = [], []
    real, real_host = torch_xp.extrema, torch_figures.host_figures
    monkeypatch.setattr(torch_xp, "extrema", lambda xs, dtype: calls.append(len(xs)) or real(xs, dtype))
    monkeypatch.setattr(torch_figures, "host_figures", lambda views, *a: host.append(len(views)) or real_host(views, *a))
    monkeypatch.setattr(stats, "CHUNK_ELEMENTS", 1000)  # "large": more than 1000 elements
    grads = {
        "a": torch.randn(7, 5),
        "inf": torch.tensor([1.0, float("inf"), -2.0]),
        "nan": torch.tensor([float("nan"), 1.0]),
        "zero": torch.tensor([-0.0, 0.0]),
        "empty": torch.zeros(0),
        "half": torch.randn(9, dtype=torch.bfloat16),
        "large": torch.randn(40, 40),
        "b": torch.randn(3),
    }
    step_with_grads(tmp_path, grads)
    assert host == [5] and calls == [1]  # float32 small ones together, the bf16 one in its own batch
    rows = list(csv.reader((tmp_path / "rank0" / "grad_summary_0.csv").read_text(encoding="utf-8-sig").splitlines()))
    assert [r[0] for r in rows[1:]] == list(grads)
    for row in rows[1:]:
        g = grads[row[0]].double()
        want = stats.stat_vector(xp_torch, g, BOUNDS, False).tolist()
        got = [float(v) for v in row[1:4]]
        for w, v in zip(want, got):
            if np.isnan(w):
                assert np.isnan(v)
            else:
                assert v == pytest.approx(w, rel=1e-14, abs=0.0), (row[0], want, got)
        assert got[:2] == want[:2] or any(np.isnan(got[:2]))
        signs = np.load(tmp_path / "rank0" / "step0" / f"{row[0]}.npy")
        np.testing.assert_array_equal(signs, (grads[row[0]] > 0).numpy())
    assert torch_monitor.BATCH_ELEMENTS >= stats.CHUNK_ELEMENTS


def test_a_batch_that_fails_is_taken_again_parameter_by_parameter(tmp_path, monkeypatch):
    from probes.backends import torch_xp
    from probes.grad_probe import torch_figures

    def broken(xs, *args):
        raise RuntimeError("no _foreach kernel for this device")

    monkeypatch.setattr(torch_xp, "extrema", broken)
    monkeypatch.setattr(torch_figures, "host_figures", broken)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dbg = PrecisionDebugger(config={"task": "grad_probe", "dump_path": str(tmp_path), "grad_probe": {"grad_level": "L1"}})
    dbg.monitor(model)
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    dbg.stop()
    rows = (tmp_path / "rank0" / "grad_summary_0.csv").read_text(encoding="utf-8-sig").splitlines()
    assert len(rows) == 1 + 4 and not dbg.summary()["errors"]
