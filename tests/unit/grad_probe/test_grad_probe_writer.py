"""grad_probe's files off the training thread: written by a background writer with
one step in flight, on disk after stop(), at exit when the training loop raised, and at most the
step in flight lost on a hard kill; statistics and signs cross in one transfer per step."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from repo_paths import REPO

torch = pytest.importorskip("torch")

import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from probes.core.writers import BackgroundWriter  # noqa: E402
from probes.grad_probe import csv_format, monitor_common  # noqa: E402
from probes.pytorch import PrecisionDebugger  # noqa: E402
from pytest_msprobe.testing import simulated_npu  # noqa: E402

ROOT = REPO


def _train(dump: Path, steps: int = 3, level: str = "L1", device: str = "cpu") -> PrecisionDebugger:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 8, device=device), torch.randn(32, 2, device=device)
    dbg = PrecisionDebugger(config={"task": "grad_probe", "dump_path": str(dump), "grad_probe": {"grad_level": level}})
    dbg.monitor(model)
    for _ in range(steps):
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    return dbg


def _writer_threads(monkeypatch) -> list[str]:
    threads: list[str] = []
    real = csv_format.write_summary_csv

    def spy(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(csv_format, "write_summary_csv", spy)
    return threads


def test_a_tiny_models_steps_are_written_inline_and_on_disk_after_stop(tmp_path, monkeypatch):
    # a few KiB per step: a hand-off to a thread would cost more than the write (however busy the
    # disk of the test machine: the write's measured cost is taken as small)
    monkeypatch.setattr(monitor_common, "WRITE_HANDOFF_S", 60.0)
    threads = _writer_threads(monkeypatch)
    dbg = _train(tmp_path, steps=4)
    assert threads == [threading.current_thread().name] * 4
    dbg.stop()
    rank = tmp_path / "rank0"
    assert sorted(p.name for p in rank.glob("grad_summary_*.csv")) == [f"grad_summary_{i}.csv" for i in range(4)]
    assert len(list((rank / "step3").glob("*.npy"))) == 4


def test_large_steps_are_written_off_the_training_thread_and_on_disk_after_stop(tmp_path, monkeypatch):
    monkeypatch.setattr(BackgroundWriter, "INLINE_BYTES", 0)  # every step counts as large
    threads = _writer_threads(monkeypatch)
    dbg = _train(tmp_path, steps=4)
    dbg.stop()
    assert len(threads) == 4 and all(name.startswith("msprobe-grad_probe-writer") for name in threads)
    rank = tmp_path / "rank0"
    assert sorted(p.name for p in rank.glob("grad_summary_*.csv")) == [f"grad_summary_{i}.csv" for i in range(4)]
    assert len(list((rank / "step3").glob("*.npy"))) == 4
    # stop() ends the writer thread: no thread of the probes outlives its run
    assert not [t for t in threading.enumerate() if t.name.startswith("msprobe-grad_probe-writer")]


def test_a_writer_never_waits_for_an_earlier_step_unless_memory_needs_it():
    release = threading.Event()
    writer = BackgroundWriter("test", inline_bytes=0, max_pending=100)
    done: list[int] = []
    writer.submit(release.wait, size=10)  # a slow disk
    for i in range(5):
        writer.submit(done.append, i, size=10)  # queued without waiting: 60 bytes < 100
    assert done == []
    blocked = threading.Thread(target=writer.submit, args=(done.append, 5), kwargs={"size": 50})
    blocked.start()
    blocked.join(0.3)
    assert blocked.is_alive()  # 110 bytes would be queued: it waits for the writer
    release.set()
    blocked.join(10)
    writer.close()
    assert done == [0, 1, 2, 3, 4, 5]


def test_small_tasks_go_to_the_thread_while_they_are_slow_inline_and_come_back_when_fast():
    writer = BackgroundWriter("adaptive", handoff_s=0.05, max_tasks=1)
    where: list[str] = []
    delay = [0.06]

    def write() -> None:
        time.sleep(delay[0])
        where.append(threading.current_thread().name)

    for _ in range(4):  # one slow write is a spike, two in a row a slow disk
        writer.submit(write, size=1)
        writer.flush()
    main = threading.current_thread().name
    assert where[:2] == [main, main] and all(w.startswith("msprobe-adaptive-writer") for w in where[2:])
    delay[0] = 0.0
    for _ in range(2 * BackgroundWriter.REMEASURE_EVERY):
        writer.submit(write, size=1)
        writer.flush()
    assert where[-3:] == [main] * 3  # measured again, fast: inline from then on
    writer.close()


def test_one_task_in_flight_the_caller_waits_for_the_one_before():
    release = threading.Event()
    writer = BackgroundWriter("one", inline_bytes=0, max_tasks=1)
    done: list[int] = []
    writer.submit(lambda: (release.wait(), done.append(0)), size=1)
    second = threading.Thread(target=writer.submit, args=(done.append, 1), kwargs={"size": 1})
    second.start()
    second.join(0.3)
    assert second.is_alive() and done == []  # a hard kill now loses one task, not two
    release.set()
    second.join(10)
    writer.close()
    assert done == [0, 1]


def test_a_small_task_waits_behind_the_tasks_queued_before_it_and_close_ends_the_thread():
    release = threading.Event()
    writer = BackgroundWriter("order", inline_bytes=100)
    done: list[str] = []
    writer.submit(lambda: (release.wait(), done.append("large")), size=1000)
    writer.submit(done.append, "small", size=1)
    assert done == []  # not run inline: it would overtake the large step
    release.set()
    assert writer.close() == []
    assert done == ["large", "small"]
    assert not [t for t in threading.enumerate() if t.name.startswith("msprobe-order-writer")]
    writer.submit(done.append, "later", size=1000)  # a later task starts a new thread
    writer.close()
    assert done[-1] == "later"


@pytest.mark.parametrize("level", ["L0", "L1", "L2"])
def test_one_host_transfer_per_step_on_the_simulated_npu(tmp_path, level):
    with simulated_npu() as npu:
        torch.manual_seed(0)
        model = nn.Sequential(*[nn.Linear(16, 16) for _ in range(6)]).to("npu")  # 12 parameters
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(8, 16, device="npu")
        dbg = PrecisionDebugger(config={"task": "grad_probe", "dump_path": str(tmp_path), "strict": True,
                                        "grad_probe": {"grad_level": level}})
        dbg.monitor(model)
        per_step = []
        for _ in range(3):
            opt.zero_grad()
            model(x).square().mean().backward()
            npu.reset_host_transfers()
            opt.step()  # the monitor's statistics run in the optimizer's step pre-hook
            per_step.append(npu.host_transfers)
        dbg.stop()
    assert per_step == [1, 1, 1]
    rows = (tmp_path / "rank0" / "grad_summary_2.csv").read_text().splitlines()
    assert len(rows) == 1 + 12


_RAISING_LOOP = """
import sys, torch, torch.nn as nn
from probes.pytorch import PrecisionDebugger
from probes.grad_probe import csv_format
import time

real = csv_format.write_summary_csv
def slow(*args, **kwargs):  # a slow disk: each step's write outlasts the next step
    time.sleep(0.3)
    return real(*args, **kwargs)
csv_format.write_summary_csv = slow

torch.manual_seed(0)
model = nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
dbg = PrecisionDebugger(config={"task": "grad_probe", "dump_path": sys.argv[1]})
dbg.monitor(model)
for step in range(5):
    opt.zero_grad()
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
if sys.argv[2] == "raise":
    raise RuntimeError("the training loop failed")  # no stop(): the exit handler must flush
import os
os._exit(0)  # a hard kill: no exit handlers
"""


def _run_loop(tmp_path: Path, how: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _RAISING_LOOP, str(tmp_path), how], capture_output=True,
                          text=True, cwd=ROOT, timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))


def test_every_completed_step_is_on_disk_when_the_loop_raises(tmp_path):
    done = _run_loop(tmp_path, "raise")
    assert done.returncode != 0 and "the training loop failed" in done.stderr
    written = sorted(p.name for p in (tmp_path / "rank0").glob("grad_summary_*.csv"))
    assert written == [f"grad_summary_{i}.csv" for i in range(5)]
    assert (tmp_path / "rank0" / "summary.json").exists()


def test_a_hard_kill_loses_at_most_the_step_in_flight(tmp_path):
    done = _run_loop(tmp_path, "kill")
    assert done.returncode == 0, done.stderr
    written = sorted(int(p.stem.rsplit("_", 1)[1]) for p in (tmp_path / "rank0").glob("grad_summary_*.csv"))
    assert written[:4] == [0, 1, 2, 3], written  # step 4 may be the one in flight


def test_writer_errors_come_back_to_the_training_thread():
    def fail():
        raise OSError("disk full")

    queued = BackgroundWriter("test", inline_bytes=0)
    assert queued.submit(fail) == []
    errors = queued.flush()
    assert len(errors) == 1 and isinstance(errors[0], OSError)
    assert queued.flush() == []
    queued.close()
    inline = BackgroundWriter("test")  # small and nothing queued: written at once, error at once
    errors = inline.submit(fail)
    assert len(errors) == 1 and isinstance(errors[0], OSError)
    assert inline.flush() == []


def test_a_failing_write_is_recorded_and_raised_in_strict_mode(tmp_path, monkeypatch):
    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(csv_format, "write_summary_csv", fail)
    dbg = _train(tmp_path, steps=2)
    dbg.stop()
    errors = dbg.summary()["errors"]
    assert errors and "disk full" in errors[0]["error"]
    strict = PrecisionDebugger(config={"task": "grad_probe", "dump_path": str(tmp_path / "s"), "strict": True})
    model = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    strict.monitor(model)
    model(torch.ones(1, 2)).sum().backward()
    with pytest.raises(Exception, match="could not write its files"):
        opt.step()  # a small step is written inline: its failure raises at the step
        strict.stop()
