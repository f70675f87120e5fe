"""grad_probe on compiled MindSpore steps (GRAPH_MODE, mindspore.jit; probes/grad_probe/mindspore_graph.py):
the same files as PyNative, training unchanged, filters, stop(), steps that cannot be read, a seeded
sign bug flagged at its step, and free_benchmark listing the compiled calls it does not check."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
from mindspore import nn, ops  # noqa: E402

from probes import GradComparator  # noqa: E402
from probes.grad_probe import mindspore_graph  # noqa: E402
from probes.mindspore import PrecisionDebugger  # noqa: E402

SETUPS = ("pynative", "pynative+jit", "graph+jit", "graph+cell")


class MLP(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Dense(8, 16)
        self.fc2 = nn.Dense(16, 4)

    def construct(self, x):
        return self.fc2(ops.relu(self.fc1(x)))


@pytest.fixture
def restore_mode():
    yield
    ms.set_context(mode=ms.PYNATIVE_MODE)


def train(setup: str, dump: Path | None, level: str = "L1", steps: int = 3, flip_from: int | None = None,
          twice: bool = False, **config) -> tuple[list[float], dict]:
    """A seeded MLP trained `steps` Adam steps in one of SETUPS, monitored when `dump` is given.
    `flip_from`: from that step on, the first layer's weight gradient reaches the optimizer negated
    (a seeded sign bug); `twice`: the optimizer is called twice inside one compiled step."""
    ms.set_context(mode=ms.GRAPH_MODE if setup.startswith("graph") else ms.PYNATIVE_MODE)
    np.random.seed(0)
    ms.set_seed(0)
    net, loss_fn = MLP(), nn.MSELoss()
    opt = nn.Adam(net.trainable_params(), learning_rate=1e-2)
    debugger = None
    if dump is not None:
        debugger = PrecisionDebugger(config={"task": "grad_probe", "dump_path": str(dump),
                                             "grad_probe": {"grad_level": level}, **config})
        debugger.monitor(opt)
    x = ms.Tensor(np.random.randn(16, 8).astype(np.float32))
    y = ms.Tensor(np.random.randn(16, 4).astype(np.float32))
    if setup == "graph+cell":
        cell = nn.TrainOneStepCell(nn.WithLossCell(net, loss_fn), opt)

        def step(x, y, sign):
            return cell(x, y)
    else:
        def forward(x, y):
            return loss_fn(net(x), y)

        grad_fn = ms.value_and_grad(forward, None, opt.parameters)

        def step(x, y, sign):
            loss, grads = grad_fn(x, y)
            grads = (grads[0] * sign,) + grads[1:]
            opt(grads)
            if twice:
                opt(grads)
            return loss

        if setup != "pynative":
            step = ms.jit(step)
    losses = []
    for s in range(steps):
        sign = ms.Tensor(-1.0 if flip_from is not None and s >= flip_from else 1.0, ms.float32)
        losses.append(float(step(x, y, sign)))
    summary = {}
    if debugger is not None:
        debugger.stop()
        written = dump / "rank0" / "summary.json"
        summary = json.loads(written.read_text()) if written.is_file() else {}
        assert not isinstance(opt, mindspore_graph.GraphBuffers) and not type(opt).__name__.startswith("GradProbe")
    return losses, summary


def _rows(path: Path) -> list[list[str]]:
    with open(path, encoding="utf-8-sig", newline="") as fh:
        return list(csv.reader(fh))


@pytest.mark.parametrize("setup", SETUPS[1:])
def test_compiled_steps_train_unchanged_and_write_what_pynative_writes(setup, tmp_path, restore_mode):
    plain, _ = train(setup, None)
    reference, ref_summary = train("pynative", tmp_path / "pynative")
    losses, summary = train(setup, tmp_path / setup)
    assert losses == plain  # bit-identical training with the monitor on
    assert losses == reference
    assert summary["steps_written"] == ref_summary["steps_written"] == [0, 1, 2]
    assert summary["paths"] == {"host": 0, "graph": 3} and summary["mode"] == "graph"
    assert ref_summary["paths"] == {"host": 3, "graph": 0}
    assert summary["steps_not_recorded"]["count"] == 0 and not summary["errors"]
    for step in range(3):
        a = _rows(tmp_path / "pynative" / "rank0" / f"grad_summary_{step}.csv")
        b = _rows(tmp_path / setup / "rank0" / f"grad_summary_{step}.csv")
        assert [r[0] for r in a] == [r[0] for r in b] and [r[-1] for r in a] == [r[-1] for r in b]
        for ra, rb in zip(a[1:], b[1:]):
            assert np.allclose([float(v) for v in ra[1:-1]], [float(v) for v in rb[1:-1]], rtol=1e-12, atol=0)
    first = {p.name: np.load(p) for p in (tmp_path / "pynative" / "rank0" / "step0").iterdir()}
    assert all(np.array_equal(first[p.name], np.load(p)) for p in (tmp_path / setup / "rank0" / "step0").iterdir())
    result = GradComparator.compare_distributed(tmp_path / "pynative", tmp_path / setup, tmp_path / "cmp")
    assert result.ok and not result.flags


@pytest.mark.parametrize("level", ["L0", "L2"])
def test_levels_l0_checksums_and_l2_histograms_match_pynative(level, tmp_path, restore_mode):
    train("pynative", tmp_path / "a", level=level)
    train("graph+jit", tmp_path / "b", level=level)
    for step in range(3):
        a = _rows(tmp_path / "a" / "rank0" / f"grad_summary_{step}.csv")
        b = _rows(tmp_path / "b" / "rank0" / f"grad_summary_{step}.csv")
        assert a[0] == b[0]
        if level == "L0":  # the checksum column: exactly the same bytes
            assert [r[1] for r in a] == [r[1] for r in b]
        else:  # the interval fractions and "=0": counts, exact
            assert [r[1:7] for r in a] == [r[1:7] for r in b]


def test_step_and_rank_filters_apply_to_compiled_steps(tmp_path, restore_mode):
    _, summary = train("graph+jit", tmp_path / "step", step=[1])
    assert summary["steps_written"] == [1] and summary["optimizer_steps"] == 3
    assert sorted(p.name for p in (tmp_path / "step" / "rank0").glob("grad_summary_*.csv")) == ["grad_summary_1.csv"]
    train("graph+jit", tmp_path / "rank", rank=[1])
    assert not (tmp_path / "rank").exists()


def test_an_optimizer_called_twice_in_one_compiled_step_reports_the_step_it_could_not_read(tmp_path, restore_mode):
    _, summary = train("graph+jit", tmp_path / "twice", twice=True)
    assert summary["optimizer_steps"] == 6 and summary["steps_written"] == [1, 3, 5]
    assert summary["steps_not_recorded"]["count"] == 3 and "latest step" in summary["steps_not_recorded"]["reason"]


def test_a_sign_bug_in_a_graph_mode_model_is_flagged_at_its_step(tmp_path, restore_mode):
    train("graph+jit", tmp_path / "clean")
    train("graph+jit", tmp_path / "bug", flip_from=2, steps=4)
    train("graph+jit", tmp_path / "clean4", steps=4)
    result = GradComparator.compare_distributed(tmp_path / "clean4", tmp_path / "bug", tmp_path / "cmp")
    assert result.first_flagged_step() == 2
    flagged = {flag.param for _rank, flag in result.flags if flag.step == 2}
    assert "fc1.weight" in flagged and "fc2.weight" not in flagged


def test_stop_reads_the_last_step_and_gives_the_optimizer_its_class_back(tmp_path, restore_mode):
    ms.set_context(mode=ms.GRAPH_MODE)
    np.random.seed(0)
    net = MLP()
    opt = nn.Adam(net.trainable_params(), learning_rate=1e-2)
    base = type(opt)
    debugger = PrecisionDebugger(config={"task": "grad_probe", "dump_path": str(tmp_path / "d")})
    monitor = debugger.monitor(opt)
    assert type(opt).__name__ == "GradProbeAdam" and isinstance(opt, base)
    cell = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), opt)
    cell(ms.Tensor(np.ones((2, 8), np.float32)), ms.Tensor(np.zeros((2, 4), np.float32)))
    debugger.stop()
    assert type(opt) is base and not hasattr(opt, "_msprobe_buffers") and not monitor.running
    assert (tmp_path / "d" / "rank0" / "grad_summary_0.csv").is_file()


def test_free_benchmark_lists_the_compiled_calls_it_does_not_check(tmp_path, restore_mode):
    ms.set_context(mode=ms.PYNATIVE_MODE)
    debugger = PrecisionDebugger(config={"task": "free_benchmark", "dump_path": str(tmp_path),
                                         "free_benchmark": {"pert_mode": "improve_precision"}})

    @ms.jit
    def compiled(x):
        return ops.exp(x) * 2

    x = ms.Tensor(np.ones((4,), np.float32))
    with debugger:
        compiled(x)
        compiled(x)
        ops.exp(x)  # a PyNative call: checked
    summary = debugger.summary()
    not_checked = {reason: apis for reason, apis in summary["not_checked"].items() if "compiled" in reason}
    assert not_checked and list(not_checked.values())[0] == {"Graph.compiled": 2}
    assert summary["apis"]


def test_an_optimizer_whose_construct_takes_more_than_the_gradients_is_recorded_from_python_only(
        tmp_path, restore_mode):
    class Scaled(nn.Optimizer):
        def __init__(self, params):
            super().__init__(0.1, params)

        def construct(self, gradients, scale):  # not the nn.Optimizer signature: the graph path steps aside
            for i in range(len(gradients)):
                ops.assign_sub(self._parameters[i], gradients[i] * scale)
            return True

    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = MLP()
    opt = Scaled(net.trainable_params())
    debugger = PrecisionDebugger(config={"task": "grad_probe", "dump_path": str(tmp_path / "d")})
    monitor = debugger.monitor(opt)
    grads = tuple(ms.Tensor(np.ones(p.shape, np.float32)) for p in opt.parameters)
    opt(grads, ms.Tensor(0.5, ms.float32))  # from Python: recorded
    debugger.stop()
    summary = monitor.summary()
    assert summary["steps_written"] == [0] and "takes 2 arguments" in summary["compiled_steps"]
    assert type(opt) is Scaled


PLUGIN_SUITE = """
import mindspore as ms
import numpy as np
from mindspore import nn, ops

def test_graph_mode_training():
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        np.random.seed(0)
        ms.set_seed(0)
        net = nn.SequentialCell(nn.Dense(8, 16), nn.ReLU(), nn.Dense(16, 4))
        opt = nn.Adam(net.trainable_params(), learning_rate=1e-2)
        train = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), opt)
        x = ms.Tensor(np.random.randn(16, 8).astype(np.float32))
        y = ms.Tensor(np.random.randn(16, 4).astype(np.float32))
        for _ in range(3):
            train(x, y)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
"""


def test_the_plugin_records_a_graph_mode_test_under_grad_probe(pytester):
    pytester.makepyfile(test_graph_suite=PLUGIN_SUITE)
    dump = pytester.path / "out"
    result = pytester.runpytest_subprocess("--msprobe-task=grad_probe", f"--msprobe-dump-path={dump}", "-p",
                                           "no:cacheprovider")
    result.assert_outcomes(passed=1)
    summary, = list(dump.rglob("rank0/summary.json"))
    data = json.loads(summary.read_text())
    assert data["steps_written"] == [0, 1, 2] and data["paths"]["graph"] == 3
    assert (summary.parent / "step2" / "0.weight.npy").is_file() or any((summary.parent / "step2").iterdir())
