"""What the plugin adds to pytest's start-up when no --msprobe-task is given.

The plugin is loaded by every pytest run in an environment where it is installed, so it must be
cheap when unused: no torch, mindspore or matplotlib import at configure time. Measured as the
wall time of `pytest --collect-only` on a tiny framework-free suite, with the plugin
(`-p msprobe`, the default) and without it (`-p no:msprobe`), interleaved, median of N runs.

    python benchmarks/plugin_startup.py [--repeats 9]

Target (issue 6): under 0.3 s added.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUITE = "def test_a():\n    assert True\n"


def _time(args: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                   cwd=cwd, check=True, capture_output=True)
    return time.perf_counter() - start


def _imported(cwd: Path) -> list[str]:
    """Heavy modules in sys.modules after collection with the plugin on."""
    probe = ("import sys, pytest; pytest.main(['--collect-only', '-q', '-p', 'no:cacheprovider']); "
             "print('HEAVY=' + ','.join(m for m in ('torch', 'mindspore', 'matplotlib', 'hypothesis.extra.numpy', 'numpy') "
             "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=cwd, check=True, capture_output=True, text=True).stdout
    line = next(x for x in out.splitlines() if x.startswith("HEAVY="))
    return [m for m in line[len("HEAVY="):].split(",") if m]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        (cwd / "test_tiny.py").write_text(SUITE)
        (cwd / "pytest.ini").write_text("[pytest]\n")  # keep the repo's ini out of it
        _time([], cwd)  # warm the file cache
        on, off = [], []
        for _ in range(args.repeats):
            on.append(_time([], cwd))
            off.append(_time(["-p", "no:msprobe"], cwd))
        heavy = _imported(cwd)
    med_on, med_off = statistics.median(on), statistics.median(off)
    print(f"pytest --collect-only, median of {args.repeats}: with plugin {med_on:.3f} s, "
          f"without {med_off:.3f} s, added {med_on - med_off:+.3f} s (target < 0.3 s)")
    print(f"heavy modules imported with the plugin on and no task: {', '.join(heavy) or 'none'}")


if __name__ == "__main__":
    main()
