"""The objects the `free_benchmark` and `grad_probe` fixtures hand to a test: a probe run around
a block of the test's code, and its results with an assertion that reads like a test failure.

Each use of a fixture in a test is a run of its own, with its own dump folder
(`{test dump}/{tool}{k}`), so two runs in one test (fp32 vs bf16, before vs after a change) can be
compared with each other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pytest_msprobe.reports.tables import as_number, failing_ops
from pytest_msprobe.reports.text import failure_message


class ToolRun:
    """A context manager around test code; results are read after the block."""

    tool = ""

    def __init__(self, framework: str, config: Any, label: str) -> None:
        self.framework = framework
        self.config = config
        self.label = label
        self.dump_path = Path(config.dump_path)
        self._handle: Any = None
        self._closed = False
        self.summary: dict[str, Any] = {}

    def __enter__(self) -> ToolRun:
        self._start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Finish the run (idempotent): hooks removed, results read."""
        if self._handle is not None and not self._closed:
            self._closed = True
            self._finish()

    def _start(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _finish(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


class FreeBenchmarkRun(ToolRun):
    """`with free_benchmark(pert_mode="bit_noise", list=["softmax"]) as fb: ...`, then `fb.rows`,
    `fb.flagged_apis`, `fb.assert_clean()`. `fb.step()` marks a training step inside the block."""

    tool = "free_benchmark"

    def _start(self) -> None:
        if self.framework == "mindspore":
            from probes.mindspore import PrecisionDebugger
        else:
            from probes.pytorch import PrecisionDebugger
        self._handle = PrecisionDebugger(config=self.config)
        self._handle.start()

    def step(self) -> None:
        self._handle.step()

    def _finish(self) -> None:
        self._handle.stop()
        self.summary = self._handle.summary()

    @property
    def rows(self) -> list[Any]:
        """The inconsistent outputs (records of free_benchmark.csv rows)."""
        return self._handle.rows if self._handle is not None else []

    @property
    def flagged_apis(self) -> list[str]:
        return sorted(api for api, s in self.summary.get("apis", {}).items() if s["flagged"])

    def assert_clean(self) -> None:
        """Fail, with each flagged API's figure, threshold and evidence file, unless every
        checked output stayed within its dtype's threshold."""
        if self._handle is None or not self.summary:
            raise RuntimeError("assert_clean() reads the results of a finished run: call it after the `with` block")
        if self.flagged_apis:
            raise AssertionError(failure_message(self.label, self.summary))


class GradProbeRun(ToolRun):
    """`with grad_probe() as run: train(...)` monitors every optimizer stepped in the block; then
    `run.assert_finite()` and `run.assert_directions_close(other_run_or_dump_path)`."""

    tool = "grad_probe"

    def _start(self) -> None:
        if self.framework == "mindspore":
            from probes.grad_probe.mindspore_watch import MindSporeOptimizerWatch as Watch
        else:
            from probes.grad_probe.torch_watch import TorchOptimizerWatch as Watch
        self._handle = Watch(self.config).start()

    def _finish(self) -> None:
        self._handle.stop()
        self.summary = self._handle.summary()

    @property
    def nonfinite(self) -> list[Any]:
        from probes.grad_probe.health import nonfinite_gradients

        return nonfinite_gradients(self.dump_path)

    @property
    def steps(self) -> int:
        """Optimizer steps recorded by the first optimizer of the block."""
        first = self.summary.get("optimizers") or [{}]
        return len(first[0].get("steps_written", []))

    def assert_finite(self) -> None:
        bad = self.nonfinite
        if bad:
            shown = "\n".join(f"  {f.describe()}" for f in bad[:10])
            raise AssertionError(f"{self.label}: {len(bad)} non-finite gradient statistic(s):\n{shown}\n"
                                 f"evidence: {bad[0].csv}")

    def assert_directions_close(self, other: GradProbeRun | str | Path, first_step_min: float = 0.97,
                                max_drop: float = 0.03) -> None:
        """The direction rule between this run and `other` (a run or a grad_probe dump path):
        similarity ≥ first_step_min at the first step, no drop > max_drop after it."""
        from probes.grad_probe import assert_grad_directions_close

        if not self.summary.get("optimizers"):
            raise AssertionError(f"{self.label}: no optimizer stepped inside the grad_probe block; nothing to compare")
        other_path = other.dump_path if isinstance(other, GradProbeRun) else Path(other)
        assert_grad_directions_close(self.dump_path, other_path, first_step_min, max_drop,
                                     out=self.dump_path.parent / f"{self.dump_path.name}_vs_{other_path.name}")


def dispatch_arguments(config: Any, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """PtdbgDispatch's arguments from the config's "online_dispatch" section (dump_mode, api_list,
    process_num, debug, tag, background, rule, compiled_first, compiled_every) and overrides;
    dump_mode defaults to "auto" (failing ops dumped)."""
    section = dict(config.extra_sections.get("online_dispatch", {}))
    section.update(overrides or {})
    allowed = ("dump_mode", "api_list", "process_num", "debug", "tag", "background", "rule", "compiled_first",
               "compiled_every")
    unknown = sorted(set(section) - set(allowed))
    if unknown:
        from probes.core.errors import ConfigError

        raise ConfigError(f"online_dispatch.{unknown[0]}", section[unknown[0]], f"one of {', '.join(allowed)}")
    section.setdefault("dump_mode", "auto")
    return dict(section, dump_path=str(config.dump_path))


class OnlineDispatchRun(ToolRun):
    """`with online_dispatch(dump_mode="auto") as od: model(x)`; then `od.failing_ops` and
    `od.assert_clean()`. Every aten op in the block is compared with the CPU (float64 on a CPU run)."""

    tool = "online_dispatch"

    def __init__(self, framework: str, config: Any, label: str, overrides: dict[str, Any] | None = None) -> None:
        super().__init__(framework, config, label)
        if framework != "pytorch":
            raise ValueError("online_dispatch checks PyTorch aten ops; this test uses MindSpore")
        from probes.pytorch.online_dispatch import PtdbgDispatch

        self._handle = PtdbgDispatch(**dispatch_arguments(config, overrides))
        self._entered = False

    def _start(self) -> None:
        self._handle.__enter__()
        self._entered = True

    def __exit__(self, *exc: Any) -> None:
        self._exit(*exc)

    def close(self) -> None:
        """Leave the dispatch mode if the test left the block open, then read the results."""
        self._exit(None, None, None)

    def _exit(self, *exc: Any) -> None:
        if not self._closed:
            self._closed = True
            if self._entered:
                self._entered = False
                self._handle.__exit__(*exc)
            self._finish()

    def _finish(self) -> None:
        if self._handle.results is None:  # never entered
            return
        self._handle.close()
        self.summary = self._handle.results.summary()
        self.summary["csv_path"] = str(self._handle.results.csv_path)

    @property
    def failing_ops(self) -> list[dict[str, Any]]:
        """One entry per failing op call: {"op", "name", "cosine", "max_abs_err"} (worst leaf)."""
        return failing_ops(self.summary)

    def assert_clean(self) -> None:
        if not self.summary:
            raise RuntimeError("assert_clean() reads the results of a finished run: call it after the `with` block")
        if self.failing_ops:
            raise AssertionError(dispatch_failure_message(self.label, self.summary))


def dispatch_failure_message(label: str, summary: dict[str, Any], limit: int = 10) -> str:
    from probes.core.dispatch_metrics import (
        COS_MAX_THRESHOLD,
        COS_THRESHOLD,
        MAX_ABS_ERR_MAX_THRESHOLD,
        MAX_ABS_ERR_THRESHOLD,
    )

    ops = failing_ops(summary)
    lines = [f"online_dispatch found {len(ops)} failing op call(s) in {label} "
             f"(of {summary.get('ops_compared', '?')} compared against the CPU reference):"]
    leaves = {f["name"]: f.get("leaves") or [] for f in summary.get("failed_ops", [])}
    for f in ops[:limit]:
        rules = sorted({leaf.get("failed_rule") for leaf in leaves.get(f["name"], []) if leaf.get("failed_rule")})
        ulps = [as_number(leaf["scaled_ulps"], 0.0) for leaf in leaves.get(f["name"], [])
                if leaf.get("scaled_ulps") not in (None, "")]
        extra = (f", scaled error {max(ulps):.4g} ulp" if ulps else "") + (f" [{'/'.join(rules)}]" if rules else "")
        lines.append(f"  {f['name']} ({f['op']}): Cosine {f['cosine']:.6g}, MaxAbsErr {f['max_abs_err']:.6g}{extra}")
    if len(ops) > limit:
        lines.append(f"  ... and {len(ops) - limit} more")
    graphs = [g for g in summary.get("graphs", []) if g.get("flagged")]
    if graphs:  # compiled graphs: where they lose it, and how to reproduce it (probes.compiled)
        from probes.compiled.check import graph_lines

        lines += graph_lines(graphs)
    config = summary.get("config")
    rule = config.get("rule", "reference") if config else "both"  # runs before the rule option: msprobe's
    reference = (f"Cosine < {COS_THRESHOLD} and MaxAbsErr > {MAX_ABS_ERR_THRESHOLD}, or Cosine < "
                 f"{COS_MAX_THRESHOLD}, or MaxAbsErr > {MAX_ABS_ERR_MAX_THRESHOLD}")
    scaled = "the error at the output's scale is above the dtype's DISPATCH_SCALED_THRESHOLD"
    text = {"reference": reference, "scaled": scaled}.get(rule, f"{reference} (reference), or {scaled} (scaled)")
    lines.append(f"rule ({rule}): fail when {text} (noise-level differences pass)")
    if summary.get("csv_path"):
        lines.append(f"evidence: {summary['csv_path']} (inputs and outputs of failing ops dumped beside it)")
    lines.append("next: rerun the op alone with PtdbgDispatch(dump_mode='list', api_list=[...]) and compare the "
                 "dumped .npy files; use --msprobe-fail-on=never to report without failing.")
    return "\n".join(lines)


RUNS: dict[str, type[ToolRun]] = {"free_benchmark": FreeBenchmarkRun, "grad_probe": GradProbeRun,
                                  "online_dispatch": OnlineDispatchRun}
