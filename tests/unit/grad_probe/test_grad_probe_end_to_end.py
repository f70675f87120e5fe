"""grad_probe end to end: two real PyTorch runs dumped by the monitor, compared by the rule."""

from __future__ import annotations

import pytest
from grad_runs import grad_run

from probes import GradComparator
from pytest_msprobe import assert_grad_directions_close


def test_identical_runs_agree_and_a_sign_bug_is_flagged_at_its_step(tmp_path):
    grad_run(tmp_path / "a")
    grad_run(tmp_path / "b")
    grad_run(tmp_path / "bug", flip_from_step=2)
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
    grad_run(tmp_path / "a", level="L0")
    grad_run(tmp_path / "bug", level="L0", flip_from_step=1)
    result = GradComparator.compare_distributed(tmp_path / "a", tmp_path / "bug", tmp_path / "cmp")
    assert result.first_flagged_step() == 1
