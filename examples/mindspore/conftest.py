"""The MindSpore example suite (PyNative, CPU): `pytest examples/mindspore`, and under a probe
`pytest examples/mindspore --msprobe-task=free_benchmark`."""

import mindspore as ms
import pytest

from probes.backends.mindspore_xp import warm_up

ms.set_context(mode=ms.PYNATIVE_MODE)
if hasattr(ms, "set_device"):  # MindSpore >= 2.5; set_context(device_target=...) is deprecated there
    try:
        ms.set_device("CPU")  # before any operator runs: MindSpore refuses it afterwards
    except RuntimeError:  # an earlier import already ran an operator: its device stands
        pass
else:
    ms.set_context(device_target="CPU")
warm_up()  # MindSpore with NumPy 2 fails the first operator of a process once (silently here)


@pytest.fixture(autouse=True)
def _seed():
    ms.set_seed(0)
