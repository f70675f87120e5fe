"""Where each tool's results sit in summary.json, and what the session's lines call them.

The plugin's tool descriptors write these keys, and report.html and ``python -m probes summary``
read them back: one entry per tool, stated here once, so that a key renamed for the writer is
renamed for every reader (the command line reads summary.json without the plugin, so this lives in
the framework-free core).
"""

from __future__ import annotations

from dataclasses import dataclass

from probes.core.session_tables import ApiRow, OpRow, ParamRow, Row

__all__ = ["CHECKED_LABELS", "TOOL_KEYS", "ToolKeys"]


@dataclass(frozen=True)
class ToolKeys:
    """One tool's keys and labels in a session's summary.json."""

    row: type[Row]  # the row of the session table (its TABLE is the table's key)
    findings_key: str  # a test entry's key listing what the probe flagged in it
    findings_label: str  # what those are, in a sentence ("2 tests with failing ops")
    checked_label: str  # what the probe's account counts as "checked", in a sentence

    @property
    def table_key(self) -> str:
        return self.row.TABLE


TOOL_KEYS: dict[str, ToolKeys] = {
    "free_benchmark": ToolKeys(ApiRow, "flagged_apis", "inconsistent APIs", "API calls checked"),
    "grad_probe": ToolKeys(ParamRow, "nonfinite_params", "non-finite gradients", "parameter-steps checked"),
    "online_dispatch": ToolKeys(OpRow, "failing_ops", "failing ops", "op calls compared"),
}
#: what a session account's "checked" counts, per tool
CHECKED_LABELS: dict[str, str] = {tool: keys.checked_label for tool, keys in TOOL_KEYS.items()}
