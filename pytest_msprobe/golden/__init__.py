"""Golden-file regression: compare a run's precision results with ones stored under ``golden/``.

store.py holds GoldenStore and the one check routine every kind goes through, kinds/ the kinds
of golden one module each (free_benchmark, grad_run, online_dispatch) with the registry that
finds a task's kind, and checks.py what the plugin compares with what; the API precision
catalogue adds its own kind (pytest_msprobe.catalogue.gate).
``from pytest_msprobe.golden import GoldenStore`` keeps working as before the package existed.
"""

from pytest_msprobe.golden.store import (
    FORMAT_VERSION,
    MAX_INFO_ITEMS,
    MAX_ITEM_LINES,
    META,
    REGEN_OPTION,
    GoldenOutcome,
    GoldenStore,
    base_versions,
    describe_made_with,
    validate_name,
)

__all__ = ["FORMAT_VERSION", "MAX_INFO_ITEMS", "MAX_ITEM_LINES", "META", "REGEN_OPTION", "GoldenOutcome", "GoldenStore",
           "base_versions", "describe_made_with", "validate_name"]
