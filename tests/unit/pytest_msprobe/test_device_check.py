"""benchmarks/device_check.py, the script for a lent accelerator, run on the simulated NPU so it
cannot rot: every tool runs, the seeded fused-op defect is named, and a crash is an exit code."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from repo_paths import REPO

pytest.importorskip("torch")

ROOT = REPO
SCRIPT = ROOT / "benchmarks" / "device_check.py"


def _run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout)


def test_device_check_on_the_simulated_npu_names_the_seeded_defect(tmp_path):
    out = tmp_path / "check.json"
    done = _run("--simulate", "--seed-defect", "--steps", "2", "--json", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["device"] == "simulated NPU"
    rows = {(r["tool"], r["dtype"]): r for r in report["results"]}
    tools = {tool for tool, _dtype in rows}
    assert tools == {"plain", "free_benchmark:improve_precision", "free_benchmark:add_noise",
                     "free_benchmark:backward", "online_dispatch", "grad_probe"}
    assert not [r for r in report["results"] if "crash" in r]
    assert rows[("free_benchmark:improve_precision", "float32")]["findings"] == ["NPU.npu_rms_norm"]
    assert "NPU.npu_rms_norm" in rows[("online_dispatch", "float32")]["findings"]
    for r in report["results"]:  # counted exactly on the simulated device; the plain step makes none
        assert isinstance(r["transfers_per_step"], int) and r["checked"] >= 0
    assert rows[("plain", "float32")]["transfers_per_step"] == 0
    assert rows[("grad_probe", "float32")]["transfers_per_step"] <= 1
    assert rows[("free_benchmark:add_noise", "float32")]["transfers_per_step"] <= 2
    assert "findings" in done.stdout and "transfers/step" in done.stdout


def test_device_check_clean_run_finds_nothing_and_bad_arguments_are_refused(tmp_path):
    out = tmp_path / "clean.json"
    done = _run("--simulate", "--steps", "1", "--dtypes", "float32", "--json", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
    assert all(r["findings"] == [] for r in results), results
    refused = _run("--seed-defect")
    assert refused.returncode == 2 and "--seed-defect needs --simulate" in refused.stderr


def test_a_crashing_tool_makes_the_exit_status_non_zero(monkeypatch, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("device_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    real = module._run_tool

    def crash_grad_probe(name, *args, **kwargs):
        if name == "grad_probe":
            raise RuntimeError("seeded crash inside a probe")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(module, "_run_tool", crash_grad_probe)
    monkeypatch.setattr(module, "TOOLS", ("free_benchmark:add_noise", "grad_probe"))
    assert module.main(["--simulate", "--steps", "1", "--dtypes", "float32"]) == 1
    captured = capsys.readouterr()
    assert "grad_probe" in captured.out and "CRASHED: RuntimeError: seeded crash" in captured.out
    assert "seeded crash inside a probe" in captured.err


def test_device_check_runs_on_a_plain_device_without_torch_npu(tmp_path):
    """--device cpu (as cuda would): the model's fused ops are plain PyTorch and transfers are
    not countable there; every tool still runs."""
    out = tmp_path / "cpu.json"
    done = _run("--device", "cpu", "--steps", "1", "--dtypes", "float32", "--json", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
    assert not [r for r in results if "crash" in r] and len(results) == 6
    assert all(r["transfers_per_step"] is None for r in results)
    backward = [r for r in results if r["tool"] == "free_benchmark:backward"][0]
    assert backward["checked"] > 0
