"""Where each tool's results sit in summary.json, and what the session's lines call them.

The plugin's tool descriptors write these keys, and report.html and ``python -m probes summary``
read them back: one entry per tool, stated here once, so that a key renamed for the writer is
renamed for every reader (the command line reads summary.json without the plugin, so this lives in
the framework-free core).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from probes.core import file_names
from probes.core.rules import SCALED
from probes.core.session_tables import ApiRow, OpRow, ParamRow, Row

__all__ = ["CHECKED_LABELS", "TOOL_KEYS", "ToolKeys"]


@dataclass(frozen=True)
class ToolKeys:
    """One tool's keys and labels in a session's summary.json."""

    row: type[Row]  # the row of the session table (its TABLE is the table's key)
    findings_key: str  # a test entry's key listing what the probe flagged in it
    findings_label: str  # what those are, in a sentence ("2 tests with failing ops")
    checked_label: str  # what the probe's account counts as "checked", in a sentence
    # an entry of a dump root -> (rank, that rank's summary.json), or None: how readers find each rank
    rank_summary: Callable[[Path], tuple[int, Path] | None]
    # the rule it gates on under pytest unless the user names one (--msprobe-rule, a test's override,
    # the config file's "rule"); None: the config's own rule
    pytest_rule: str | None = None
    # config keys that, set true, keep the config's own rule (free_benchmark's preheat tunes
    # msprobe's ratio rule, so a run that asks for it keeps that rule)
    rule_kept_by: tuple[str, ...] = ()

    @property
    def table_key(self) -> str:
        return self.row.TABLE


TOOL_KEYS: dict[str, ToolKeys] = {
    "free_benchmark": ToolKeys(ApiRow, "flagged_apis", "inconsistent APIs", "API calls checked",
                               file_names.free_benchmark_rank_summary,
                               pytest_rule=SCALED, rule_kept_by=("if_preheat",)),
    "grad_probe": ToolKeys(ParamRow, "nonfinite_params", "non-finite gradients", "parameter-steps checked",
                           file_names.grad_rank_summary),
    "online_dispatch": ToolKeys(OpRow, "failing_ops", "failing ops", "op calls compared",
                                file_names.dispatch_rank_summary),
}
#: what a session account's "checked" counts, per tool
CHECKED_LABELS: dict[str, str] = {tool: keys.checked_label for tool, keys in TOOL_KEYS.items()}
