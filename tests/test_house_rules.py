"""Rules of the code base a newcomer relies on, checked on the source: no import cycle between
modules (function-level imports included: hiding a cycle in a function does not untangle it), each
shared fact defined once, no module that only re-exports another, and no citation of a document
the repo does not have."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("probes", "pytest_msprobe")


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that `name` imports anywhere in its body."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            # a package's __init__ is not an edge: importing a.b runs a/__init__, which must stay a leaf anyway
            if target and target != name and modules[target].name != "__init__.py":
                found.add(target)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    cycles = _cycles(graph)
    assert not cycles, "import cycles (make the shared piece a leaf module):\n" + "\n".join(
        " <-> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def _definitions(pattern: str) -> list[str]:
    regex = re.compile(pattern, re.M)
    hits = []
    for path in _modules().values():
        for m in regex.finditer(path.read_text(encoding="utf-8")):
            hits.append(f"{path.relative_to(ROOT)}: {m.group(0).strip()}")
    return hits


@pytest.mark.parametrize("what, pattern", [
    ("the task names", r'^\s*\w*TASKS\w*\s*(:[^=]*)?=\s*\(\s*"free_benchmark"'),
    ("the device list", r'^\s*\w*DEVICES\s*(:[^=]*)?=\s*\(\s*"auto"'),
    ("the rule name scaled", r'^\s*\w+\s*=\s*"scaled"\s*$'),
    ("the rule name reference", r'^\s*\w+\s*=\s*"reference"\s*$'),
    ("free_benchmark's rules", r'^\s*\w*RULES\w*\s*(:[^=]*)?=\s*\((REFERENCE|"reference"), (SCALED|"scaled")\)'),
    ("online_dispatch's rules", r'^\s*\w*RULES\w*\s*(:[^=]*)?=\s*\((BOTH|"both"),'),
])
def test_each_fact_is_defined_once(what, pattern):
    hits = _definitions(pattern)
    assert len(hits) == 1, f"{what} defined in {len(hits)} places (one is enough: import it):\n" + "\n".join(hits)


def test_the_plugin_runs_every_task_of_the_config():
    from probes.core.config import TASKS
    from pytest_msprobe.tools import TOOLS

    assert tuple(TOOLS) == TASKS


def test_no_module_only_re_exports_another():
    shims = [str(p.relative_to(ROOT)) for p in _modules().values()
             if "sys.modules[__name__]" in p.read_text(encoding="utf-8")]
    assert not shims


# "spec §4.2", "spec/free_benchmark.md", bug ids such as B12 or B-G1: documents this repo does not have
CITATION = re.compile(r"spec\b[^\n]{0,40}(§|\.md)|§\s*\d|\bB(-[A-Z]{1,3})?\d{1,3}\b")


def test_code_cites_no_document_outside_the_repo():
    hits = []
    for folder in ("probes", "pytest_msprobe", "tests", "benchmarks", "examples", "docs"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in (".py", ".md") or path == Path(__file__):
                continue
            for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if CITATION.search(line.split("# noqa")[0]):
                    hits.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()[:120]}")
    assert not hits, "say the reason in the code (and user-visible differences in docs/migrating-from-msprobe.md):\n" \
        + "\n".join(hits[:30])
