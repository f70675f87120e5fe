"""free_benchmark's usual path (probes/free_benchmark/usual_call.py) takes the usual checked calls
without the general path's questions: the same outputs, random stream, rows and summaries as the
general path, on a corpus of calls that mixes the usual ones with every kind it must hand over."""

from __future__ import annotations

from pathlib import Path

import pytest
from dump_files import dump_files

torch = pytest.importorskip("torch")

import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from probes.free_benchmark import lifecycle, usual_call  # noqa: E402
from probes.pytorch import PrecisionDebugger  # noqa: E402


def _corpus(model: nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    """One training step's calls: usual ones (plain tensors, scalars, keyword arguments, random
    draws) and the others (containers, out=, inplace=True, meta and empty tensors, integer-only
    inputs, a torch.func transform, an output beyond the host's limit, NaN outputs, the
    optimizer's calls)."""
    x = torch.randn(16, 32)
    ids = torch.randint(0, 10, (16,))
    y = model(x)
    outs = [
        y,
        torch.cat([y, y]),
        F.dropout(y, 0.3, training=True),
        torch.softmax(x * 0.5, dim=-1),
        torch.add(x, x, alpha=2),
        ids + 1,
        torch.empty(0) + 1,
        x.to(torch.bfloat16) @ torch.randn(32, 8, dtype=torch.bfloat16),
        torch.randn(200, 200) @ torch.randn(200, 200),
        torch.log(x),
        F.relu(x.clone(), inplace=True),
        torch.add(x, x, out=torch.empty_like(x)),
        torch.zeros((torch.ones(3, device="meta") + 1).shape),
        torch.vmap(torch.sin)(x),
        x.to(torch.float8_e4m3fn).float(),
    ]
    (y.sum() + outs[2].sum() + outs[3].sum()).backward()
    opt.step()
    opt.zero_grad()
    return outs


def _run(dump: Path, section: dict) -> tuple[list[torch.Tensor], dict]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dbg = PrecisionDebugger(config={"task": "free_benchmark", "dump_path": str(dump), "free_benchmark": section})
    outs = []
    for _ in range(2):
        dbg.start()
        outs += _corpus(model, opt)
        dbg.stop()
        dbg.step()
    outs += [p.detach().clone() for p in model.parameters()]
    outs.append(torch.randn(4))  # the random stream goes on as without the probe
    return outs, dbg.summary()


@pytest.mark.parametrize("mode,rule", [
    ("no_change", "reference"), ("no_change", "scaled"), ("add_noise", "reference"), ("add_noise", "scaled"),
    ("bit_noise", "reference"), ("change_value", "reference"), ("improve_precision", "reference"),
    ("improve_precision", "scaled"),
])
def test_the_usual_path_writes_what_the_general_path_writes(tmp_path, monkeypatch, mode, rule):
    section = {"pert_mode": mode, "rule": rule}
    taken = []
    check = usual_call._check
    monkeypatch.setattr(usual_call, "_check", lambda path, meta, *rest: (taken.append(meta.key), check(path, meta, *rest)))
    usual_outs, usual_summary = _run(tmp_path / "usual", section)
    monkeypatch.setattr(lifecycle, "usual_handler", lambda path: path.on_call)  # every call down the general path
    n_usual = len(taken)
    general_outs, general_summary = _run(tmp_path / "general", section)
    assert len(taken) == n_usual, "the general run took the usual path"
    # the usual calls took it (a linear layer's, softmax's), the others were handed over
    assert {"Functional.linear", "Torch.softmax", "Torch.add"} <= set(taken), sorted(set(taken))
    assert not {"Torch.cat", "Functional.relu", "Torch.sin"} & set(taken), sorted(set(taken))
    for u, g in zip(usual_outs, general_outs, strict=True):
        torch.testing.assert_close(u, g, rtol=0, atol=0, equal_nan=True)
    assert dump_files(tmp_path / "usual") == dump_files(tmp_path / "general")
    assert usual_summary["apis"] == general_summary["apis"]
    assert sum(api["checked"] for api in usual_summary["apis"].values()) >= 2  # (the bf16 matmul, for one mode)


def test_the_usual_path_is_off_where_the_config_needs_the_general_one(tmp_path):
    """Backward stage, fix, preheat and to_cpu keep the general handler for every call."""
    for section in ({"fuzz_stage": "backward", "list": ["matmul"]}, {"handler_type": "fix"}, {"pert_mode": "to_cpu", "fuzz_device": "cpu"},
                    {"if_preheat": True, "preheat_step": 2, "max_sample": 2}):
        section = {"pert_mode": "improve_precision", **section}
        dbg = PrecisionDebugger(config={"task": "free_benchmark", "dump_path": str(tmp_path),
                                        "free_benchmark": section})
        probe = dbg.probe
        assert usual_call.usual_handler(probe) == probe.on_call, section
    dbg = PrecisionDebugger(config={"task": "free_benchmark", "dump_path": str(tmp_path)})
    assert usual_call.usual_handler(dbg.probe) != dbg.probe.on_call
