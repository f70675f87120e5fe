"""A PyTorch run and a MindSpore run of the same small model, monitored at L1 with the same parameter
names, are compared by the same GradComparator: directions agree (fp32 both), and a seeded sign
defect on one MindSpore gradient from step 1 is flagged at step 1."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ms = pytest.importorskip("mindspore")

from mindspore import Tensor, nn  # noqa: E402

from probes.backends import mindspore_xp  # noqa: E402
from probes.core.config import load_config  # noqa: E402
from probes.grad_probe import GradComparator  # noqa: E402
from probes.grad_probe.mindspore_monitor import MindSporeGradMonitor  # noqa: E402
from probes.grad_probe.torch_monitor import GradMonitor  # noqa: E402

mindspore_xp.warm_up()
ms.set_context(mode=ms.PYNATIVE_MODE)

NAMES = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
STEPS = 3
LR = 0.05


def weights(seed: int = 0) -> list[np.ndarray]:
    # (out, in) in both frameworks: torch Linear.weight and MindSpore nn.Dense.weight
    rng = np.random.default_rng(seed)
    return [rng.uniform(-0.5, 0.5, s).astype(np.float32) for s in ((16, 8), (16,), (4, 16), (4,))]


def batches(seed: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((6, 8)).astype(np.float32) for _ in range(STEPS)]


class TorchMLP(torch.nn.Module):
    def __init__(self, w: list[np.ndarray]) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)
        with torch.no_grad():
            for p, a in zip(self.parameters(), w):
                p.copy_(torch.from_numpy(a))

    def forward(self, x: Any) -> Any:
        return self.fc2(torch.relu(self.fc1(x)))


class MsMLP(nn.Cell):
    def __init__(self, w: list[np.ndarray]) -> None:
        super().__init__()
        self.fc1 = nn.Dense(8, 16, weight_init=Tensor(w[0]), bias_init=Tensor(w[1]))
        self.relu = nn.ReLU()
        self.fc2 = nn.Dense(16, 4, weight_init=Tensor(w[2]), bias_init=Tensor(w[3]))

    def construct(self, x: Any) -> Any:
        return self.fc2(self.relu(self.fc1(x)))


def config(root: Path) -> Any:
    return load_config({"task": "grad_probe", "dump_path": str(root), "grad_probe": {"grad_level": "L1"}})


def run_torch(root: Path) -> list[list[np.ndarray]]:
    model = TorchMLP(weights())
    assert [n for n, _ in model.named_parameters()] == NAMES
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    seen = []
    with GradMonitor(config(root), model):
        for x in batches():
            opt.zero_grad()
            loss = (model(torch.from_numpy(x)) ** 2).mean()
            loss.backward()
            seen.append([p.grad.numpy().copy() for p in model.parameters()])
            opt.step()
    return seen


def run_mindspore(root: Path, flip: str | None = None, from_step: int = 1) -> list[list[np.ndarray]]:
    net = MsMLP(weights())
    opt = nn.SGD(net.trainable_params(), learning_rate=LR)
    assert [p.name for p in opt.parameters] == NAMES

    def loss_fn(x: Any) -> Any:
        return (net(x) ** 2).mean()

    grad_fn = ms.value_and_grad(loss_fn, None, opt.parameters)
    seen = []
    with MindSporeGradMonitor(config(root), opt):
        for step, x in enumerate(batches()):
            _, grads = grad_fn(Tensor(x))
            if flip is not None and step >= from_step:  # the seeded defect: one gradient's sign flipped
                grads = tuple(-g if name == flip else g for name, g in zip(NAMES, grads))
            seen.append([g.asnumpy().copy() for g in grads])
            opt(grads)
    return seen


def test_same_model_same_directions(tmp_path: Path) -> None:
    g_torch = run_torch(tmp_path / "torch")
    g_ms = run_mindspore(tmp_path / "ms")
    for a, b in zip(g_torch, g_ms):  # the two runs really are the same computation
        for x, y in zip(a, b):
            np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)
    res = GradComparator.compare(tmp_path / "torch" / "rank0", tmp_path / "ms" / "rank0", tmp_path / "out")
    assert res.steps == list(range(STEPS))
    assert res.params == NAMES
    assert res.problems() == []
    for name in NAMES:
        for step in res.steps:
            assert res.status[name][step] == "ok"
            assert res.similarity[name][step] >= 0.99, (name, step, res.similarity[name][step])
    assert all(res.summary[s] >= 0.99 for s in res.steps)
    assert res.flags == [] and res.ok and res.first_flagged_step() is None
    assert (tmp_path / "out" / "similarities.csv").exists()
    # the summary CSVs hold the same parameters with the same shapes, header byte for byte equal
    for step in range(STEPS):
        a = (tmp_path / "torch" / "rank0" / f"grad_summary_{step}.csv").read_bytes().split(b"\r\n")
        b = (tmp_path / "ms" / "rank0" / f"grad_summary_{step}.csv").read_bytes().split(b"\r\n")
        assert a[0] == b[0] and len(a) == len(b)
        assert [r.split(b",")[0] for r in a] == [r.split(b",")[0] for r in b]
    assert json.loads((tmp_path / "ms" / "rank0" / "summary.json").read_text())["framework"] == "mindspore"


def test_seeded_sign_defect_flagged_at_step_1(tmp_path: Path) -> None:
    run_torch(tmp_path / "torch")
    run_mindspore(tmp_path / "ms", flip="fc1.weight", from_step=1)
    res = GradComparator.compare(tmp_path / "torch" / "rank0", tmp_path / "ms" / "rank0", tmp_path / "out",
                                 plots=False)
    assert res.similarity["fc1.weight"][0] >= 0.99
    assert res.similarity["fc1.weight"][1] < 0.5
    assert res.first_flagged_step() == 1
    flagged = {(f.param, f.step) for f in res.flags}
    assert ("fc1.weight", 1) in flagged and ("summary", 1) in flagged
    assert not res.ok


def test_large_cpu_gradients_get_the_same_cells_from_both_frameworks(tmp_path: Path) -> None:
    """The same large float32 gradients (awkward values among them) through PyTorch's monitor and
    MindSpore's at L1: both take them in one pass (host_figures.one_pass_figures), so the CSV rows
    and direction files are byte for byte the same."""
    from grad_runs import step_with_grads

    rng = np.random.default_rng(5)
    values = {"fc1.weight": rng.standard_normal((64, 128)), "fc1.bias": rng.standard_normal(8191) * 1e-30,
              "fc2.weight": np.concatenate([[0.0, -0.0, np.inf], rng.standard_normal(9000)]),
              "fc2.bias": -np.abs(rng.standard_normal(5001))}
    grads = {name: v.astype(np.float32) for name, v in values.items()}
    step_with_grads(tmp_path / "torch", {name: torch.from_numpy(g.copy()) for name, g in grads.items()})
    params = [ms.Parameter(Tensor(np.zeros_like(g)), name=name) for name, g in grads.items()]
    opt = nn.SGD(params, learning_rate=0.0)
    with MindSporeGradMonitor(config(tmp_path / "ms"), opt):
        opt(tuple(Tensor(g) for g in grads.values()))
    a = (tmp_path / "torch" / "rank0" / "grad_summary_0.csv").read_bytes()
    b = (tmp_path / "ms" / "rank0" / "grad_summary_0.csv").read_bytes()
    assert a == b and a.count(b"\r\n") == 1 + len(grads)
    for name in grads:
        assert (tmp_path / "torch" / "rank0" / "step0" / f"{name}.npy").read_bytes() == \
            (tmp_path / "ms" / "rank0" / "step0" / f"{name}.npy").read_bytes()
