"""The API precision catalogue: every operator, every dtype, its error in ulps, gated per device.

    pytest --pyargs pytest_msprobe.catalogue [--msprobe-device=npu|cuda|cpu] [-n auto]
    pytest --pyargs pytest_msprobe.catalogue --msprobe-regen-golden     # after an accepted upgrade

One test per API x dtype (float32, float16, bfloat16; cases.py): PyTorch's OpInfo sample inputs
when `expecttest` is installed, else the project's API table with Hypothesis; MindSpore's mint APIs
of the table. Each test scores the API's outputs on the device in ulps against a float64 CPU
reference (probes.core.ulps) and takes free_benchmark's improve_precision verdict (measurement.py,
with each framework's part in measure.py and mindspore_ops.py), then gates both against the
goldens under ``golden/catalogue/<device>/`` (golden_files.py): the ulp golden of this machine's
hardware identity, and limits that hold on any machine (an accumulation test ratio, a
cross-machine ulp limit; gate.py). The session writes
``catalogue.csv`` and a catalogue section in ``report.html`` under the dump root (.msprobe/) and
lists the worst APIs in the terminal summary (results_table.py, summary.py).
"""
