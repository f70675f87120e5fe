"""grad_probe end to end: two real PyTorch runs dumped by the monitor, compared by the rule."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from probes import GradComparator
from probes.pytorch import PrecisionDebugger
from pytest_msprobe import assert_grad_directions_close


def _run(dump, *, flip_from_step=None, steps=4, level="L1"):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 8), torch.randn(32, 2)
    dbg = PrecisionDebugger(config={"task": "grad_probe", "dump_path": str(dump),
                                    "grad_probe": {"grad_level": level}})
    dbg.monitor(model)
    for step in range(steps):
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        if flip_from_step is not None and step >= flip_from_step:
            model[2].weight.grad.neg_()  # the seeded defect: a backward kernel with the wrong sign
        opt.step()
    dbg.stop()


def test_identical_runs_agree_and_a_sign_bug_is_flagged_at_its_step(tmp_path):
    _run(tmp_path / "a")
    _run(tmp_path / "b")
    _run(tmp_path / "bug", flip_from_step=2)
    clean = GradComparator.compare_distributed(tmp_path / "a", tmp_path / "b", tmp_path / "cmp_clean")
    assert clean.ok and not clean.flags
    assert all(v == 1.0 for v in clean[0].summary.values())
    assert_grad_directions_close(tmp_path / "a", tmp_path / "b")

    bad = GradComparator.compare_distributed(tmp_path / "a", tmp_path / "bug", tmp_path / "cmp_bug")
    assert bad.first_flagged_step() == 2
    flagged = {flag.param for _rank, flag in bad.flags if flag.step == 2}
    assert "2.weight" in flagged and "0.weight" not in flagged
    with pytest.raises(AssertionError, match=r"step 2[\s\S]*2\.weight"):
        assert_grad_directions_close(tmp_path / "a", tmp_path / "bug")
    assert (tmp_path / "cmp_bug" / "rank0" / "similarities.csv").exists()
    assert (tmp_path / "cmp_bug" / "rank0" / "similarities_picture" / "summary_similarities.png").exists()


def test_l0_dumps_compare_by_hash(tmp_path):
    _run(tmp_path / "a", level="L0")
    _run(tmp_path / "bug", level="L0", flip_from_step=1)
    result = GradComparator.compare_distributed(tmp_path / "a", tmp_path / "bug", tmp_path / "cmp")
    assert result.first_flagged_step() == 1
