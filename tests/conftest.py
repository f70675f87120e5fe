import logging
import shutil
import sys
from pathlib import Path

import pytest

# the tests' helper modules (seeded defects, multi-rank jobs, models): importable by name from every
# test module, and from the ranks they spawn (which inherit sys.path)
sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))

try:  # the simulated NPU's process-global setup must come before this process's first backward
    from pytest_msprobe.testing import prepare as _prepare_simulated_npu
except ImportError:  # PyTorch not installed: the MindSpore-only tests still run
    pass
else:
    _prepare_simulated_npu()


@pytest.fixture(scope="session", autouse=True)
def _plugin_results_under_tmp(request, tmp_path_factory):
    """The plugin writes a session's results under ``.msprobe/`` of the rootdir unless told where:
    for this suite's own session (tests using the plugin's fixtures, such as msprobe_distributed)
    that is the repository. They go under pytest's temporary directory instead; an explicit
    --msprobe-dump-path (or msprobe_dump_path ini) and --msprobe-task sessions are left alone."""
    from pytest_msprobe.stash import SESSION_KEY

    session = request.config.stash.get(SESSION_KEY, None)
    if session is not None and not session.options.dump_given and session.probe is None:
        session.root = tmp_path_factory.mktemp("msprobe", numbered=False)


@pytest.fixture
def fb_config(tmp_path):
    """A free_benchmark config dict; tests add their section keys."""

    def make(**section):
        return {"task": "free_benchmark", "dump_path": str(tmp_path / "dump"), "free_benchmark": section}

    return make


@pytest.fixture(autouse=True)
def _quiet_probes(caplog):
    caplog.set_level(logging.WARNING, logger="probes")


@pytest.fixture
def noise_sum_input():
    """`values, reference = make(seed=0)`: a float32 (65, 16) tensor whose sum over rows (a bias
    gradient's shape) is rounding noise on the device and an unrelated tiny value in the float64
    reference, whatever order the CPU's kernels add in.

    Rows 0-31 hold magnitudes in [0.5, 1.5) with random signs, rows 32-63 the same values negated,
    each column in another order, row 64 is zero but for 3 * 2^-40 in column 0 (column 0 is zero
    elsewhere). Every value is a multiple of 2^-40 and every partial sum is below 2^6, so the
    float64 sum is exact in any order: (3 * 2^-40, 0, ..., 0). In float32 column 0 is exact too,
    and the other columns are multiples of 2^-24: each cancels exactly or is off by at least 2^-24,
    over 2e4 times the reference's whole norm. So the cosine of the two is below 1e-4 unless every
    column cancels exactly (the literal rule fails it), while MaxAbsErr stays below the noise
    floor, 8 * 2^-23 * 1.5 * sqrt(65) = 1.2e-5: 2,000 random sequential orders of these float32
    additions give at most 4.8e-6, PyTorch's sum kernels about 2e-6. `reference` is that exact
    float64 sum, written out."""

    def make(seed: int = 0):
        import torch

        gen = torch.Generator().manual_seed(seed)
        rows, width = 32, 16
        values = (torch.rand(rows, width, generator=gen) + 0.5) * (torch.randint(0, 2, (rows, width), generator=gen) * 2 - 1)
        values[:, 0] = 0.0
        shuffled = torch.gather(values, 0, torch.argsort(torch.rand(rows, width, generator=gen), dim=0))
        reference = torch.zeros(width, dtype=torch.float64)
        reference[0] = 3 * 2.0**-40
        return torch.cat([values, -shuffled, reference.float()[None]]), reference

    return make


@pytest.fixture(params=["kernels", "numpy"])
def kernel_path(request, monkeypatch):
    """Run a test with the host arrays' C kernels loaded ('kernels') and again with NumPy's passes
    alone ('numpy', the path of a machine without a C compiler): both must give the same results."""
    from probes.backends import host_kernels

    if request.param == "kernels":
        monkeypatch.delenv(host_kernels.SWITCH, raising=False)
    else:
        monkeypatch.setenv(host_kernels.SWITCH, "0")
    host_kernels.reset()
    if request.param == "kernels" and host_kernels.kernels() is None:
        if shutil.which("cc") or shutil.which("gcc") or shutil.which("clang"):
            pytest.fail(f"a C compiler is here but the kernels did not load: {host_kernels.why_not()}")
        pytest.skip(f"no C kernels on this machine: {host_kernels.why_not()}")
    yield request.param
    host_kernels.reset()
