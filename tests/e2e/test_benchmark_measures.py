"""The instrument behind issue 7's memory target: benchmarks/free_benchmark_backward_overhead.py
reads a step's tensor high-water mark from the CPU allocator's events. If it summed allocations,
or missed frees, the benchmark's `mem x` would be meaningless, so it is checked against known
allocation patterns here."""

from __future__ import annotations

import sys

import pytest
from repo_paths import REPO

torch = pytest.importorskip("torch")

sys.path.insert(0, str(REPO / "benchmarks"))
import free_benchmark_backward_overhead as bench  # noqa: E402

MIB = 2**20


def _floats(mib: int) -> torch.Tensor:
    return torch.ones(mib * MIB // 4, dtype=torch.float32)


def _together() -> None:
    a = _floats(1)
    b = _floats(2)
    del a, b


def _one_after_another() -> None:
    for _ in range(5):
        t = _floats(2)
        del t


_OLD: list = []


def _free_older_then_allocate() -> None:
    _OLD.clear()  # 4 MiB allocated before the measure started
    t = _floats(3)
    del t


@pytest.mark.parametrize(
    "fn, mib",
    [
        (_together, 3),  # tensors alive together add up
        (_one_after_another, 2),  # a high-water mark, not a total
        # the profiler cannot size a block allocated before it started, so frees of older
        # tensors are not subtracted: an upper bound, the same bias for plain and probed steps
        (_free_older_then_allocate, 3),
    ],
)
def test_tensor_peak_of_known_allocation_patterns(fn, mib):
    _OLD[:] = [_floats(4)]
    peak = bench.tensor_peak_bytes(fn)
    assert peak is not None
    assert mib * MIB <= peak < mib * MIB + 64 * 1024


def test_persistent_bytes_counts_weights_gradients_and_optimizer_state():
    model = torch.nn.Linear(16, 8)
    opt = torch.optim.Adam(model.parameters())
    x, y = torch.randn(4, 16), torch.randn(4, 8)
    holder = type("B", (), {"model": model, "opt": opt, "x": x, "y": y})()
    n_params = sum(p.numel() for p in model.parameters())
    before = bench.persistent_bytes(holder)
    assert before == 4 * (n_params + x.numel() + y.numel())
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    after = bench.persistent_bytes(holder)
    # + gradients + exp_avg + exp_avg_sq (+ the step counters)
    assert after >= before + 3 * 4 * n_params


@pytest.mark.parametrize("level", ["L0", "L1"])
def test_grad_probe_floor_writes_the_files_the_monitor_writes(tmp_path, level):
    """grad_probe_overhead's floor stands for the dump's cost: for each step it must create the
    folders and files the monitor creates, the direction files with the same names and sizes."""
    import grad_probe_overhead as gpo

    spec = gpo.SPECS["toy"]
    probed, floor_bench = gpo.Bench(spec), gpo.Bench(spec)
    dump = str(tmp_path / "probed")
    dbg = gpo.make_debugger(level, dump)
    gpo._OPEN.remove((dbg, dump))  # stopped here, the dump kept (close_debuggers would delete it)
    try:
        for _ in range(2):
            gpo.probed_step(dbg, probed)
    finally:
        dbg.stop()
    files = gpo.FloorFiles(str(tmp_path / "floor"), floor_bench.model, level)
    for _ in range(2):
        floor_bench.step()
        files.write()

    def layout(root):
        return sorted((str(p.relative_to(root)), p.stat().st_size if p.suffix == ".npy" else p.is_dir())
                      for p in root.rglob("*") if p.name != "summary.json")  # (written once, at stop)

    monitor = layout(tmp_path / "probed" / "rank0")
    assert layout(tmp_path / "floor") == monitor
    assert len(monitor) == (2 if level == "L0" else 2 * (1 + 1 + 6))  # CSVs, folders, a file per parameter


def test_a_ratio_over_its_target_is_the_machines_only_when_its_floor_is_too():
    assert bench.fbo.verdict(1.9, 2.0, 2.5) == "PASS"
    assert bench.fbo.verdict(2.3, 2.0, 1.5) == "FAIL"  # the tool's own cost: a failure
    assert bench.fbo.verdict(2.3, 2.0, 2.5) == "FLOOR"  # the least work is over the target already
    assert bench.fbo.verdict(2.3, 2.0) == "FAIL"
    assert bench.fbo.verdict(None, 2.0, 1.0) == "ERR"
