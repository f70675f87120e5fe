"""Running a captured graph outside the compiled program, and what a tool records of a graph.

A graph's eager program (the pristine FX graph Dynamo handed the backend) is the reference side of
every graph check: re-run in float64 (improve_precision), on the CPU (to_cpu, online_dispatch), or
in its own dtypes (the eager kernels' error, shown next to the compiled one). It always runs with
the probes' API hooks passing through and no dispatch mode on: its operators are the probe's own
work, not calls of the user's program. Its float64 run is judged by `scaled_judge`, here so that
the localisation (localize.py) and a written reproduction (repro.py) print the same figures.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

from probes.backends.patching import suspended

RANDOM = "its graph draws random numbers ({op}): a re-run would draw others"
# A graph computed in a low-precision dtype carries the rounding of each of its operators: its error
# against float64 grows with its depth, for the eager program as for the compiled one (a single API
# call rounds once, and its threshold is set for that). A compiled graph is therefore held to its
# dtype's threshold or to this many times the eager program's own error on the same call,
# whichever is larger: the compiled code may round in another order, not lose more.
EAGER_MARGIN = 4.0


def graph_limit(threshold_ulps: float, eager_ulps: float | None) -> float:
    """The most ulps a compiled graph output may be off, given its eager program's error."""
    if eager_ulps is None or not math.isfinite(eager_ulps):
        return threshold_ulps
    return max(threshold_ulps, EAGER_MARGIN * eager_ulps)


def quiet(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` run with every probe hook passing through and no dispatch mode."""

    def call(*args: Any, **kwargs: Any) -> Any:
        with suspended(), _disable_current_modes():
            return fn(*args, **kwargs)

    return call


def sampled(index: int, first: int, every: int) -> bool:
    """Whether the graph's call number `index` (0-based) is checked: the first `first` calls,
    then every `every`-th (0: none)."""
    if index < first:
        return True
    return every > 0 and (index - first + 1) % every == 0


@dataclass
class Localisation:
    """The first node of a failing graph whose compiled value loses the precision."""

    node: str  # the FX node's name
    target: str  # what it computes ("torch.matmul", "mul")
    source: str  # the user's line that made it (Dynamo's stack trace), "" when unknown
    compiled_ulps: float  # the compiled prefix ending at the node, against float64
    eager_ulps: float  # the same prefix run eagerly in its dtypes, against float64
    threshold_ulps: float
    compilations: int  # prefixes compiled to find it
    repro: str = ""  # the standalone reproduction's folder
    stage: str = "forward"  # "backward": the node's gradient is what loses the precision

    @property
    def where(self) -> str:
        """compiler: only the compiled code loses it (a fusion, a lowering); kernel: the eager
        kernel loses it too."""
        return "kernel" if self.eager_ulps > self.threshold_ulps else "compiler"

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "target": self.target, "source": self.source,
                "compiled_ulps": _finite(self.compiled_ulps), "eager_ulps": _finite(self.eager_ulps),
                "threshold_ulps": self.threshold_ulps, "where": self.where, "compilations": self.compilations,
                "repro": self.repro, "stage": self.stage}

    def describe(self) -> str:
        loses = ("only the compiled code loses it: a compiler problem" if self.where == "compiler"
                 else "the eager kernel loses it too: a kernel problem")
        at = f" at {self.source}" if self.source else ""
        what = "its backward: compiled gradients" if self.stage == "backward" else "compiled"
        return (f"node {self.node} ({self.target}){at}: {what} {_ulps(self.compiled_ulps)}, eager "
                f"{_ulps(self.eager_ulps)} ulps against float64; {loses}")


@dataclass
class Figure:
    """One output of a graph, the worst of its checked calls by its distance to the threshold: the
    compiled code's error and the eager kernels' on the same call, in ulps of the output's dtype."""

    output: str
    dtype: str
    compiled_ulps: float
    eager_ulps: float | None
    threshold_ulps: float

    @property
    def severity(self) -> float:
        return self.compiled_ulps / self.threshold_ulps if self.threshold_ulps > 0 else math.inf

    def to_dict(self) -> dict[str, Any]:
        return {"output": self.output, "dtype": self.dtype, "compiled_ulps": _finite(self.compiled_ulps),
                "eager_ulps": _finite(self.eager_ulps), "threshold_ulps": self.threshold_ulps}


@dataclass
class GraphReport:
    """One compiled graph over a run: how often it ran and was checked, its worst output forward
    and backward (compiled against float64, eager next to it), and where a failure sits."""

    name: str
    where: str
    backend: str
    nodes: int
    calls: int = 0
    sampled: int = 0
    checked: int = 0
    flagged: int = 0
    forward: Figure | None = None
    backward: Figure | None = None
    not_checked: str | None = None
    localisation: Localisation | None = None
    errors: list[str] = field(default_factory=list)

    def worse(self, stage: str, figure: Figure) -> None:
        """Keep `figure` as the stage's worst when it is further over (or closer to) its threshold."""
        current = self.forward if stage == "forward" else self.backward
        if current is None or figure.severity > current.severity:
            if stage == "forward":
                self.forward = figure
            else:
                self.backward = figure

    def to_dict(self) -> dict[str, Any]:
        return {"graph": self.name, "where": self.where, "backend": self.backend, "nodes": self.nodes,
                "calls": self.calls, "sampled": self.sampled, "checked": self.checked, "flagged": self.flagged,
                "forward": self.forward.to_dict() if self.forward is not None else None,
                "backward": self.backward.to_dict() if self.backward is not None else None,
                "not_checked": self.not_checked,
                "localisation": self.localisation.to_dict() if self.localisation is not None else None,
                "errors": list(self.errors)}


def _finite(v: float | None) -> float | str | None:
    if v is None or math.isfinite(v):
        return v
    return str(v)


def _ulps(v: float) -> str:
    return f"{v:.4g}" if math.isfinite(v) else str(v)


def upcast(x: Any, dtype: torch.dtype = torch.float64, device: Any = None) -> Any:
    """A floating tensor in `dtype` (on `device` when given), detached; anything else as it is."""
    if isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex()):
        target = dtype if x.is_floating_point() else torch.complex128
        return x.detach().to(device=device if device is not None else x.device, dtype=target)
    if isinstance(x, torch.Tensor) and device is not None:
        return x.detach().to(device)
    return x


def scaled_judge(out: Any, reference: Any, stage: str = "forward") -> tuple[float, float]:
    """(worst ulps, its threshold in ulps) of `out` against its float64 `reference`, by the scaled
    rule under improve_precision (exact figures), as free_benchmark judges that `stage`."""
    from probes.backends.torch_backend import BACKEND
    from probes.core import thresholds as th
    from probes.core.scaled_comparison import compare_scaled

    tolerance = th.BACKWARD_TOLERANCE if stage == "backward" else None
    verdicts = [v for v in compare_scaled(BACKEND, out, reference, pert_mode="improve_precision", exact=True,
                                          stage=stage, tolerance=tolerance) if "ulps" in v.detail]
    if not verdicts:
        return 0.0, math.inf

    def ulps(v: Any) -> float:
        return math.inf if v.detail.get("nan_mismatch") or v.detail.get("inf_mismatch") else float(v.detail["ulps"])

    def limit(v: Any) -> float:
        return v.threshold / th.machine_eps(BACKEND.dtype_name(v.leaf))

    worst = max(verdicts, key=lambda v: (not v.consistent, ulps(v) / max(limit(v), 1e-300)))
    return ulps(worst), limit(worst)
