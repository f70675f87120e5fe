"""grad_probe on MindSpore (PyNative): the optimizer-Cell forward pre-hook writes the same files as the
PyTorch monitor, with msprobe's MindSpore defects fixed (float64 statistics, NaN rows for empty
gradients, CSVs replaced not appended, odd parameter names percent-encoded)."""

from __future__ import annotations

import csv
import io
import json
import math
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")

from mindspore import Tensor, nn  # noqa: E402

from probes.backends import mindspore_xp  # noqa: E402
from probes.core.config import load_config  # noqa: E402
from probes.core.errors import ConfigError, ProbeError  # noqa: E402
from probes.grad_probe import csv_format  # noqa: E402
from probes.grad_probe.mindspore_monitor import MindSporeGradMonitor  # noqa: E402

mindspore_xp.warm_up()
ms.set_context(mode=ms.PYNATIVE_MODE)

BOUNDS = (-1, 0, 1)
NAMES = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]


def config(tmp_path: Path, level: str = "L1", **top: Any) -> Any:
    gp = top.pop("gp", {})
    return load_config({"task": "grad_probe", "dump_path": str(tmp_path / "dump"), "grad_probe": {"grad_level": level, **gp}, **top})


class MLP(nn.Cell):
    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        rng = np.random.default_rng(seed)
        w = [rng.uniform(-0.5, 0.5, s).astype(np.float32) for s in ((3, 4), (3,), (2, 3), (2,))]
        self.fc1 = nn.Dense(4, 3, weight_init=Tensor(w[0]), bias_init=Tensor(w[1]))
        self.relu = nn.ReLU()
        self.fc2 = nn.Dense(3, 2, weight_init=Tensor(w[2]), bias_init=Tensor(w[3]))

    def construct(self, x: Any) -> Any:
        return self.fc2(self.relu(self.fc1(x)))


def train(net: nn.Cell, opt: nn.Cell, steps: int = 3, seed: int = 1) -> list[list[np.ndarray]]:
    """Train; return the gradients each optimizer call received (captured by the test itself)."""

    def loss_fn(x: Any) -> Any:
        return (net(x) ** 2).mean() * 10

    grad_fn = ms.value_and_grad(loss_fn, None, opt.parameters)
    rng = np.random.default_rng(seed)
    seen = []
    for _ in range(steps):
        _, grads = grad_fn(Tensor(rng.standard_normal((5, 4)).astype(np.float32)))
        seen.append([g.asnumpy().copy() for g in grads])
        opt(grads)
    return seen


def read_csv_bytes(path: Path) -> tuple[bytes, list[list[str]]]:
    """Check BOM and CRLF; return the header line's bytes and the rows."""
    raw = path.read_bytes()
    assert raw.startswith(b"\xef\xbb\xbf")
    assert raw.endswith(b"\r\n")
    assert raw.count(b"\n") == raw.count(b"\r\n")
    rows = list(csv.reader(io.StringIO(raw[3:].decode("utf-8"))))
    return raw.split(b"\r\n")[0], rows


def expected_row(level: str, name: str, g: np.ndarray, bounds: tuple = BOUNDS) -> list[Any]:
    d = g.astype(np.float64).reshape(-1)
    tail = [float(d.max()), float(d.min()), math.sqrt(float((d * d).sum())), str(list(g.shape))]
    if level == "L0":
        return [name, f"{zlib.crc32(np.ascontiguousarray(g, dtype='<f4').tobytes()):08x}", *tail]
    if level == "L1":
        return [name, *tail]
    edges = [-math.inf, *bounds, math.inf]
    fr = [float(np.count_nonzero((d > lo) & (d <= hi))) / d.size for lo, hi in zip(edges[:-2], edges[1:-1])]
    fr.append(float(np.count_nonzero(d > bounds[-1])) / d.size)
    return [name, *fr, float(np.count_nonzero(d == 0)) / d.size, *tail]


def assert_row(cells: list[str], want: list[Any]) -> None:
    assert len(cells) == len(want)
    norm_at = len(want) - 2
    for i, (got, exp) in enumerate(zip(cells, want)):
        if isinstance(exp, float):
            if math.isnan(exp):
                assert got == "nan"
            elif i == norm_at:  # sqrt of a float64 sum whose order differs from numpy's
                assert float(got) == pytest.approx(exp, rel=1e-12, abs=0), (cells, want)
            else:  # max, min and fractions are exact
                assert float(got) == exp, (cells, want)
        else:
            assert got == exp


def torch_header(tmp_path: Path, level: str, bounds: Any = None) -> bytes:
    """The header bytes the PyTorch monitor writes for ``level`` / ``bounds``."""
    torch = pytest.importorskip("torch")
    from probes.grad_probe.torch_monitor import GradMonitor

    gp = {"bounds": list(bounds)} if bounds is not None else {}
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    opt = torch.optim.SGD([p], lr=0.1)
    with GradMonitor(config(tmp_path / "torch", level, gp=gp), {"p": p}):
        p.grad = torch.tensor([0.5, -0.5])
        opt.step()
    return read_csv_bytes(tmp_path / "torch" / "dump" / "rank0" / "grad_summary_0.csv")[0]


def hooks(opt: nn.Cell) -> int:
    """1 while a monitor watches `opt` (its monitored class, probes/grad_probe/mindspore_graph.py), else 0."""
    return int(hasattr(type(opt), "_msprobe_base"))


@pytest.mark.parametrize(("level", "optimizer"), [("L0", "SGD"), ("L1", "Momentum"), ("L2", "SGD")])
def test_levels_write_reference_files(tmp_path: Path, level: str, optimizer: str) -> None:
    net = MLP()
    if optimizer == "SGD":
        opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    else:
        opt = nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9)
    mon = MindSporeGradMonitor(config(tmp_path, level), opt)
    assert hooks(opt) == 1
    seen = train(net, opt)
    mon.stop()
    rank0 = tmp_path / "dump" / "rank0"
    want_header = torch_header(tmp_path, level)
    assert want_header == b"\xef\xbb\xbf" + csv_format.render_csv([csv_format.header(level, BOUNDS)]).encode().rstrip(b"\r\n")
    assert len(seen) == 3
    for step, grads in enumerate(seen):
        header, rows = read_csv_bytes(rank0 / f"grad_summary_{step}.csv")
        assert header == want_header  # byte for byte the PyTorch monitor's header
        assert len(rows) - 1 == len(grads) == 4
        for cells, name, g in zip(rows[1:], NAMES, grads):
            assert_row(cells, expected_row(level, name, g))
            npy = rank0 / f"step{step}" / f"{name}.npy"
            if level == "L0":
                assert not npy.exists()
            else:
                arr = np.load(npy)
                assert arr.dtype == np.bool_ and arr.shape == g.shape
                assert np.array_equal(arr, g > 0)
    assert (level == "L0") == (not (rank0 / "step0").exists())
    summary = json.loads((rank0 / "summary.json").read_text())
    assert summary["framework"] == "mindspore" and summary["mode"] == "pynative"
    assert summary["steps_written"] == [0, 1, 2] and summary["optimizer_steps"] == 3
    assert summary["level"] == level and summary["bounds"] == [-1, 0, 1]
    assert summary["params"] == NAMES
    assert summary["errors"] == [] and summary["upcasts"] == {}
    assert not mon.running


def test_custom_bounds_header_matches_torch(tmp_path: Path) -> None:
    bounds = [-0.1, 0, 1e-05]
    net = MLP()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    with MindSporeGradMonitor(config(tmp_path, "L2", gp={"bounds": bounds}), opt):
        seen = train(net, opt, steps=1)
    header, rows = read_csv_bytes(tmp_path / "dump" / "rank0" / "grad_summary_0.csv")
    assert header == torch_header(tmp_path, "L2", bounds)
    assert header.decode("utf-8-sig").startswith('param_name,"(-inf, -0.1]","(-0.1, 0]","(0, 1e-05]","(1e-05, inf)",=0')
    for cells, name, g in zip(rows[1:], NAMES, seen[0]):
        assert_row(cells, expected_row("L2", name, g, tuple(bounds)))


def test_monitor_does_not_change_training(tmp_path: Path) -> None:
    base_net = MLP()
    base = train(base_net, nn.SGD(base_net.trainable_params(), learning_rate=0.1))
    net = MLP()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    with MindSporeGradMonitor(config(tmp_path, "L2"), opt):
        got = train(net, opt)
    for a, b in zip(base, got):
        for x, y in zip(a, b):
            assert np.array_equal(x, y)


def test_step_filter(tmp_path: Path) -> None:
    net = MLP()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    with MindSporeGradMonitor(config(tmp_path, "L1", step=[1]), opt) as mon:
        train(net, opt)
    rank0 = tmp_path / "dump" / "rank0"
    assert sorted(p.name for p in rank0.iterdir()) == ["grad_summary_1.csv", "step1", "summary.json"]
    assert mon.steps_written == [1] and mon.current_step == 2


def test_rank_filter_and_rank_zero_without_communication(tmp_path: Path) -> None:
    net = MLP()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    with MindSporeGradMonitor(config(tmp_path, rank=[1]), opt) as mon:
        train(net, opt, steps=1)
    assert mon.rank == 0 and mon.steps_written == [] and not (tmp_path / "dump").exists()


def test_hook_removed_after_stop(tmp_path: Path) -> None:
    net = MLP()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    mon = MindSporeGradMonitor(config(tmp_path), opt)
    mon.monitor(opt)  # the same optimizer again: no second hook
    assert hooks(opt) == 1 and mon.running
    train(net, opt, steps=1)
    mon.stop()
    mon.stop()  # idempotent
    assert hooks(opt) == 0 and not mon.running
    train(net, opt, steps=2)
    assert mon.steps_written == [0] and mon.current_step == 0
    assert not (tmp_path / "dump" / "rank0" / "grad_summary_1.csv").exists()
    with pytest.raises(ProbeError):
        mon.monitor(opt)
    with pytest.raises(ProbeError, match="one optimizer"):
        MindSporeGradMonitor(config(tmp_path / "x"), opt).monitor(nn.SGD(MLP().trainable_params(), learning_rate=0.1))


def test_param_list_selects_and_typo_suggests(tmp_path: Path) -> None:
    net = MLP()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    with pytest.raises(ConfigError) as info:
        MindSporeGradMonitor(config(tmp_path, gp={"param_list": ["fc1.weight", "fc2.wieght"]}), opt)
    assert info.value.key == "grad_probe.param_list[1]"
    assert 'did you mean "fc2.weight"' in str(info.value)
    assert hooks(opt) == 0  # raised before the hook was installed
    with MindSporeGradMonitor(config(tmp_path, gp={"param_list": ["fc2.bias", "fc1.weight"]}), opt):
        train(net, opt, steps=1)
    _, rows = read_csv_bytes(tmp_path / "dump" / "rank0" / "grad_summary_0.csv")
    assert [r[0] for r in rows[1:]] == ["fc1.weight", "fc2.bias"]  # optimizer order
    assert sorted(p.name for p in (tmp_path / "dump" / "rank0" / "step0").iterdir()) == ["fc1.weight.npy", "fc2.bias.npy"]


def test_csv_replaced_not_appended(tmp_path: Path) -> None:
    for _ in range(2):  # the reference appends a second header + rows block
        net = MLP()
        opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
        with MindSporeGradMonitor(config(tmp_path, "L2"), opt):
            train(net, opt, steps=1)
    header, rows = read_csv_bytes(tmp_path / "dump" / "rank0" / "grad_summary_0.csv")
    assert len(rows) == 5 and header.count(b"\xef\xbb\xbf") == 1


def test_odd_param_names_are_percent_encoded(tmp_path: Path) -> None:
    net = MLP()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    with MindSporeGradMonitor(config(tmp_path), opt, names={"fc1.weight": "blocks/0-w x"}) as mon:
        seen = train(net, opt, steps=1)
    rank0 = tmp_path / "dump" / "rank0"
    assert np.array_equal(np.load(rank0 / "step0" / "blocks%2F0-w%20x.npy"), seen[0][0] > 0)
    _, rows = read_csv_bytes(rank0 / "grad_summary_0.csv")
    assert rows[1][0] == "blocks/0-w x"
    assert mon.summary()["file_names"] == {"blocks/0-w x": "blocks%2F0-w%20x"}


def test_empty_bf16_and_bad_gradients(tmp_path: Path) -> None:
    """Gradients handed to the hook directly: CPU MindSpore has no empty parameters and no bf16 SGD."""
    w = ms.Parameter(Tensor(np.ones((2, 3), np.float32)), name="w")
    b = ms.Parameter(Tensor(np.ones((3,), np.float32)), name="b")
    i = ms.Parameter(Tensor(np.ones((1,), np.float32)), name="i")
    opt = nn.SGD([w, b, i], learning_rate=0.1)
    g = np.array([[1.0, -2.0, 0.0], [3.0, 0.5, -1.0]], np.float32)
    mon = MindSporeGradMonitor(config(tmp_path, "L2"), opt)
    bf = Tensor(g).astype(ms.bfloat16)
    mon.on_call(opt, ((bf, Tensor(np.ones((0, 3), np.float32)), Tensor(np.array([1], np.int32))),))
    mon.stop()
    rank0 = tmp_path / "dump" / "rank0"
    _, rows = read_csv_bytes(rank0 / "grad_summary_0.csv")
    assert_row(rows[1], expected_row("L2", "w", bf.astype(ms.float32).asnumpy()))
    assert rows[2] == ["b", "0.0", "0.0", "0.0", "0.0", "0.0", "nan", "nan", "nan", "[0, 3]"]  # empty: NaN, no exception
    assert len(rows) == 3  # the int32 gradient is an error, not a row
    assert np.array_equal(np.load(rank0 / "step0" / "w.npy"), g > 0)
    assert np.load(rank0 / "step0" / "b.npy").shape == (0, 3)
    summary = json.loads((rank0 / "summary.json").read_text())
    assert summary["upcasts"] == {"bfloat16": {"to": "float32", "ops": ["direction"]}}
    assert [e["param"] for e in summary["errors"]] == ["i"] and "Int32" in summary["errors"][0]["error"]

    strict = MindSporeGradMonitor(config(tmp_path / "s", strict=True), opt)
    try:
        with pytest.raises(ProbeError, match="step 0"):
            strict.on_call(opt, ((Tensor(g), Tensor(np.ones((3,), np.float32))),))  # 2 gradients for 3 params
    finally:
        strict.stop()


def test_graph_mode_is_monitored_and_a_second_monitor_is_refused(tmp_path: Path) -> None:
    """GRAPH_MODE is supported (tests/unit/grad_probe/test_grad_probe_mindspore_graph.py); one monitor per optimizer."""
    opt = nn.SGD(MLP().trainable_params(), learning_rate=0.1)
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        mon = MindSporeGradMonitor(config(tmp_path), opt)
        assert hooks(opt) == 1
        with pytest.raises(ProbeError, match="already monitored"):
            MindSporeGradMonitor(config(tmp_path / "second"), opt)
        mon.stop()
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    assert hooks(opt) == 0
