import logging

import pytest

try:  # the simulated NPU's process-global setup must come before this process's first backward
    from pytest_msprobe.testing import prepare as _prepare_simulated_npu
except ImportError:  # PyTorch not installed: the MindSpore-only tests still run
    pass
else:
    _prepare_simulated_npu()


@pytest.fixture
def fb_config(tmp_path):
    """A free_benchmark config dict; tests add their section keys."""

    def make(**section):
        return {"task": "free_benchmark", "dump_path": str(tmp_path / "dump"), "free_benchmark": section}

    return make


@pytest.fixture(autouse=True)
def _quiet_probes(caplog):
    caplog.set_level(logging.WARNING, logger="probes")
