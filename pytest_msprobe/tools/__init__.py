"""The tools as the plugin, the reports and the golden checks see them: one descriptor each
(`pytest_msprobe.tools.base.Tool`), registered here by name. Adding a tool is a module beside
these and one entry below (docs/architecture.md shows one)."""

from __future__ import annotations

from pytest_msprobe.tools.base import Tool


def _registry() -> dict[str, Tool]:
    from pytest_msprobe.tools.free_benchmark import FreeBenchmarkTool
    from pytest_msprobe.tools.grad_probe import GradProbeTool
    from pytest_msprobe.tools.online_dispatch import OnlineDispatchTool

    return {t.name: t for t in (FreeBenchmarkTool(), GradProbeTool(), OnlineDispatchTool())}


TOOLS: dict[str, Tool] = _registry()


def tool(name: str) -> Tool:
    """The descriptor of tool `name` (one of probes.core.config.TASKS)."""
    try:
        return TOOLS[name]
    except KeyError:
        raise ValueError(f"tool {name!r}; allowed: {', '.join(TOOLS)}") from None
