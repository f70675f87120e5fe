"""Packaging promises: lazy framework imports and the pytest11 entry point."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(' '.join(sys.modules))"],
                         capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_importing_probes_and_the_plugin_imports_no_framework():
    mods = _modules_after("import probes, probes.core.config, probes.core.metrics, pytest_msprobe.plugin")
    assert "torch" not in mods and "mindspore" not in mods


def test_plugin_is_registered_as_pytest11_entry_point():
    eps = [ep for ep in metadata.entry_points(group="pytest11") if ep.name == "msprobe"]
    assert eps and eps[0].value == "pytest_msprobe.plugin"


def test_msprobe_compatible_top_level_names_load_lazily():
    mods = _modules_after("import probes, pytest_msprobe")
    assert "numpy" not in mods and "matplotlib" not in mods
    mods = _modules_after(
        "from probes import GradComparator, assert_grad_directions_close\n"
        "from pytest_msprobe import assert_grad_directions_close as a2\n"
        "assert a2 is assert_grad_directions_close and hasattr(GradComparator, 'compare_distributed')"
    )
    assert "torch" not in mods


def test_the_golden_package_exports_its_store():
    from pytest_msprobe.golden import GoldenStore, validate_name
    from pytest_msprobe.golden.store import GoldenStore as Store

    assert GoldenStore is Store and callable(validate_name)
