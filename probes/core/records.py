"""Result records: tools emit these; writers turn them into files and the plugin into verdicts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from probes.core.number_format import short_number

FREE_BENCHMARK_COLUMNS = ("rank", "pert_mode", "stage", "step", "api_name", "max_rel", "dtype", "shape", "output_index")


@dataclass(frozen=True)
class FreeBenchmarkRow:
    """One inconsistent output leaf: a row of free_benchmark.csv plus what the CSV cannot hold."""

    rank: int
    pert_mode: str
    stage: str
    step: int
    api_name: str  # e.g. Torch.matmul.3.forward
    max_rel: float | str | None  # ratio - 1, "symbol_flipping", "nan_mismatch", ... or None (to_cpu)
    dtype: str  # str() of the framework dtype of the original output leaf
    shape: str  # str() of its shape object, e.g. torch.Size([4, 4])
    output_index: int | str | None
    api: str = ""  # the API without call counter and stage, e.g. Torch.matmul
    threshold: float = 0.0  # T - 1 of the rule that judged it (the documented relative error threshold)
    figure: float = 0.0  # a sortable magnitude of the error (inf for flips and NaN mismatches)
    detail: dict[str, Any] = field(default_factory=dict)

    def csv_values(self) -> list[Any]:
        values = []
        for name in FREE_BENCHMARK_COLUMNS:
            v = getattr(self, name)
            values.append("" if v is None else v)
        return values

    def to_dict(self) -> dict[str, Any]:
        d = {name: getattr(self, name) for name in FREE_BENCHMARK_COLUMNS}
        d.update(api=self.api, threshold=self.threshold, detail=dict(self.detail),
                 figure="inf" if self.figure == float("inf") else self.figure)
        return d


def rule_figures(detail: dict[str, Any]) -> str:
    """Both rules' view of a flagged leaf judged by the scaled rule, for failure messages:
    its error in ulps of the output dtype at the output's scale, and what msprobe's ratio rule
    says of the same call. Empty for the reference rule (its max_rel says it all)."""
    if detail.get("rule") != "scaled":
        return ""
    parts = []
    if "ulps" in detail:
        where = "of each element (a pointwise API)" if detail.get("scale") == "element" else "at the output's scale"
        parts.append(f"{short_number(float(detail['ulps']))} ulps {where}")
    if detail.get("input_move"):
        parts.append(f"input moved {short_number(float(detail['input_move']))} at its scale")
    ref = detail.get("reference_max_rel")
    if ref is not None:
        verdict = "flagged" if detail.get("reference_consistent") is False else "passed"
        limit = detail.get("reference_threshold")
        against = f" vs {short_number(limit)}" if limit is not None else ""
        parts.append(f"msprobe's ratio rule: max_rel {short_number(ref)}{against}, {verdict}")
    return "; ".join(parts)
