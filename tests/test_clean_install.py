"""README's main job prints nothing a newcomer must decode (issue 18): no traceback (MindSpore's
NumPy-2 warm-up failure used to print one before the first test), no framework warning, no
pytest warnings summary."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_main_job_output_has_no_traceback_and_no_warning(tmp_path):
    pytest.importorskip("mindspore")
    cmd = [sys.executable, "-m", "pytest", "examples", "--msprobe-task=free_benchmark", "--msprobe-fail-on=never",
           "-q", "-p", "no:cacheprovider", f"--msprobe-dump-path={tmp_path / 'out'}"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert "passed" in text
    for marker in ("Traceback", "[WARNING]", "warnings summary", "compiled using NumPy 1.x"):
        assert marker not in text, f"{marker!r} in the main job's output:\n{text[-3000:]}"
    assert (tmp_path / "out" / "report.html").is_file()
