"""One catalogue test as the plugin runs it, and the session's catalogue files.

A test measures its case on the device under test (--msprobe-device), judges it against the
device golden under ``<rootdir>/golden`` and records the row; the controller (the only writer,
also under pytest-xdist) writes ``catalogue.csv``, the report section and, with
--msprobe-regen-golden, the golden, at the end of the session.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_msprobe.catalogue import gate
from pytest_msprobe.catalogue.records import CatalogueCase, NothingToMeasure
from pytest_msprobe.stash import session_of


def run_case(case: CatalogueCase, item: pytest.Item) -> None:
    from pytest_msprobe.catalogue.measure import measure
    from pytest_msprobe.golden.checks import golden_root, machine

    session = session_of(item.config)
    options = session.options
    device = options.device if case.framework == "torch" else "cpu"
    row: dict[str, Any] = {"api": case.api, "dtype": case.dtype, "device": device, "source": case.source,
                           "samples": 0, "elements": 0, "max_ulp": None, "p99_ulp": None, "verdict": "",
                           "status": gate.SKIPPED, "message": ""}
    skip = case.skip if device == "cpu" else None
    if case.source == "npu" and device != "npu":
        skip = f"{case.api} runs on an NPU: --msprobe-device=npu (or --msprobe-simulated-npu)"
    if skip:
        row["message"] = skip
        session.catalogue_results.append(row)
        pytest.skip(skip)
    dump = session.test_dump_path(item.nodeid)
    probe_config = None
    if case.framework == "torch":
        probe_config = session.probe_config("free_benchmark", dump, {"pert_mode": "improve_precision",
                                                                     "list": [case.key]})
    try:
        result = measure(case, device, probe_config).to_dict()
    except NothingToMeasure as exc:
        row["message"] = str(exc)
        session.catalogue_results.append(row)
        pytest.skip(str(exc))
    gate.judge(result, gate.goldens(golden_root(options), device, machine(device).key), options.regen_golden)
    session.catalogue_results.append(result)
    if result["status"] == gate.SKIPPED:
        pytest.skip(result["message"])
    if gate.failing(result) and options.fail_on == "risk":
        pytest.fail(result["message"], pytrace=False)


def finish_session(session: Any) -> dict[str, Any]:
    """catalogue.csv (and the golden when regenerating) of a PluginSession; what the terminal
    summary prints."""
    from pytest_msprobe.golden.checks import golden_root, machine, store_for

    options, results = session.options, session.catalogue_results
    info: dict[str, Any] = {"csv": gate.write_csv(Path(session.root) / gate.CSV_FILE, results)}
    devices = sorted({r["device"] for r in results})
    root = golden_root(options)
    info["machines"] = {d: (machine(d), gate.identities(root, d), root) for d in devices}
    if options.regen_golden:
        info["golden"] = {}
        for device in devices:
            store = store_for(options, device)
            rows = [r for r in results if r["device"] == device]
            changed = gate.write_golden(store, device, machine(device).key, rows)
            info["golden"][device] = (store.folder(gate.golden_name(device, machine(device).key)), changed)
    return info
