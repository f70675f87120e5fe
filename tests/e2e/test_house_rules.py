"""Rules of the code base a newcomer relies on, checked on the source: no import cycle between
modules (function-level imports included: hiding a cycle in a function does not untangle it), the
packages layered as docs/architecture.md draws them (no package imports a higher layer, and none
is in a cycle with another), no private member used outside its module, each shared fact defined
once, no module that only re-exports another, and no citation of a document the repo does not
have."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from repo_paths import REPO

ROOT = REPO
PACKAGES = ("probes", "pytest_msprobe")


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _import_lines(name: str, path: Path, modules: dict[str, Path], *,
                  lazy_exports: bool = True) -> dict[str, int]:
    """The package's modules that `name` imports anywhere in its body (a package's __init__
    included), each with the first line that does. `lazy_exports=False` leaves out what a package's
    __init__ imports in its module `__getattr__` (the comment above LAYERS)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    skipped: set[int] = set()
    if not lazy_exports and path.name == "__init__.py":
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
                skipped.update(id(n) for n in ast.walk(node))
    found: dict[str, int] = {}
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, package)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.setdefault(target, node.lineno)
    return found


def _absolute(node: ast.ImportFrom, package: str) -> str:
    base = node.module or ""
    if not node.level:
        return base
    parts = package.split(".")
    return ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that `name` imports anywhere in its body."""
    # a package's __init__ is not an edge: importing a.b runs a/__init__, which must stay a leaf anyway
    return {t for t in _import_lines(name, path, modules) if modules[t].name != "__init__.py"}


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


# The packages' layers, lowest first (docs/architecture.md draws them): a package may import the
# packages of its own layer (never in a cycle) and of lower ones, never those of a higher layer, so
# each layer stands, and is tested, on what is below it. A package is a folder of probes/ or
# pytest_msprobe/ (its subfolders included: reports.sections is reports); the top-level modules
# of either are the package "probes" or "pytest_msprobe", except a top-level module named here,
# which is a leaf every part of its package reads (the plugin's options and its stash key, so the
# catalogue, the golden checks and the reports reach the session without the plugin's hooks).
# A package's __init__ may name, in a module __getattr__, what a higher layer builds on the
# package (probes.compiled.check_compiled is free_benchmark run on the package's graphs): it is
# loaded only when asked for, so the package's modules still stand without it, and it is the one
# import the layering does not count.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("probes.core",),  # framework-free: config, thresholds, metrics, the rules, records, writers
    ("probes.backends",),  # torch and MindSpore adapters, API catalogs, the wrapping machinery
    ("probes.compiled", "probes.free_benchmark", "probes.grad_probe", "probes.online_dispatch"),  # the probes
    ("probes", "probes.mindspore", "probes.pytorch"),  # the facades, results, the debugger, the CLI
    ("pytest_msprobe.options", "pytest_msprobe.stash"),  # the plugin's leaves
    ("pytest_msprobe.tools",),  # one descriptor per tool
    ("pytest_msprobe.api", "pytest_msprobe.catalogue", "pytest_msprobe.golden", "pytest_msprobe.reports",
     "pytest_msprobe.testing"),  # what the plugin serves, by purpose
    ("pytest_msprobe",),  # the plugin's hooks, its session, distributed runs
)
LAYER = {package: i for i, layer in enumerate(LAYERS) for package in layer}


def _package(module: str) -> str:
    """The package of LAYERS a module belongs to."""
    parts = module.split(".")
    if len(parts) > 1 and (ROOT / parts[0] / parts[1]).is_dir():
        return ".".join(parts[:2])
    return module if module in LAYER else parts[0]


def _package_graph() -> dict[str, dict[str, list[str]]]:
    """package -> each package it imports -> the imports that make the edge ("module:line -> module")."""
    modules = _modules()
    graph: dict[str, dict[str, list[str]]] = {}
    for name, path in modules.items():
        source = _package(name)
        graph.setdefault(source, {})
        for target, line in _import_lines(name, path, modules, lazy_exports=False).items():
            if _package(target) != source:
                graph[source].setdefault(_package(target), []).append(f"{name}:{line} -> {target}")
    return graph


def test_every_package_has_a_layer():
    packages = {_package(name) for name in _modules()}
    assert not packages - set(LAYER), "place these in LAYERS (and docs/architecture.md)"
    assert not set(LAYER) - packages, "LAYERS names packages the repo does not have"


def _upward(graph: dict[str, dict[str, list[str]]]) -> list[str]:
    return [f"{source} (layer {LAYER.get(source)}) imports {target} (layer {LAYER.get(target)}): " + "; ".join(how)
            for source, targets in sorted(graph.items()) for target, how in sorted(targets.items())
            if LAYER.get(target, -1) > LAYER.get(source, -1)]


def test_no_package_imports_a_higher_layer():
    upward = _upward(_package_graph())
    assert not upward, ("move the shared piece down, or let the higher layer hand it in:\n"
                        + "\n".join(upward))


def test_no_import_cycle_between_packages():
    graph = _package_graph()
    lines = []
    for cycle in _cycles({p: set(targets) for p, targets in graph.items()}):
        lines.append(" <-> ".join(cycle))
        lines += [f"    {source} -> {target}: " + "; ".join(graph[source][target][:3])
                  for source in cycle for target in sorted(graph[source]) if target in cycle]
    assert not lines, "import cycles between packages:\n" + "\n".join(lines)


def test_the_layer_checks_find_what_they_look_for():
    graph = {"probes.core": {"probes.backends": ["probes.core.x:3 -> probes.backends.y"]},
             "probes.backends": {"probes.core": ["probes.backends.y:5 -> probes.core.x"]},
             "probes.pytorch": {"probes.core": ["probes.pytorch.z:1 -> probes.core.x"]}}
    assert _upward(graph) == ["probes.core (layer 0) imports probes.backends (layer 1): "
                              "probes.core.x:3 -> probes.backends.y"]
    assert _cycles({p: set(t) for p, t in graph.items()}) == [["probes.backends", "probes.core"]]
    assert _package("pytest_msprobe.reports.sections.apis") == "pytest_msprobe.reports"
    assert _package("pytest_msprobe.stash") == "pytest_msprobe.stash"
    assert _package("probes.results") == "probes"


def test_only_a_package_lazy_export_is_left_out_of_the_layers(tmp_path):
    init = tmp_path / "__init__.py"
    init.write_text("from probes.core import errors\n\ndef __getattr__(name):\n"
                    "    from probes.pytorch import debugger\n    return debugger\n", encoding="utf-8")
    modules = _modules()
    assert _import_lines("probes.compiled", init, modules, lazy_exports=False) == {"probes.core.errors": 1}
    assert _import_lines("probes.compiled", init, modules) == {"probes.core.errors": 1, "probes.pytorch.debugger": 4}


def _private_uses(sources: dict[str, Path], modules: dict[str, Path]) -> list[str]:
    """`from m import _x` and `m._x` (dunders aside) where m is another module of the packages."""
    hits = []
    for name, path in sources.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        aliases: dict[str, str] = {}  # a local name bound to one of the packages' modules
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = _absolute(node, package)
                if base.split(".")[0] not in PACKAGES:
                    continue
                for a in node.names:
                    if f"{base}.{a.name}" in modules:
                        aliases[a.asname or a.name] = f"{base}.{a.name}"
                    if _private(a.name):
                        hits.append(f"{_shown(path)}:{node.lineno}: from {base} import {a.name}")
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] in PACKAGES:
                        aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _private(node.attr)):
                continue
            chain, value = [], node.value
            while isinstance(value, ast.Attribute):
                chain.insert(0, value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in aliases:
                owner = ".".join([aliases[value.id], *chain])
                if owner in modules and owner != name:
                    hits.append(f"{_shown(path)}:{node.lineno}: {owner}.{node.attr}")
    return hits


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_no_private_member_is_used_outside_its_module():
    modules = _modules()
    hits = _private_uses(modules, modules)
    assert not hits, "a member other modules use is public (drop the underscore where it is defined):\n" \
        + "\n".join(hits)


def test_the_private_use_finder_finds_both_forms(tmp_path):
    user = tmp_path / "user.py"
    user.write_text("from probes.core import errors\nfrom probes.core.errors import _hidden, __doc__\n"
                    "from . import writers\nerrors._secret\nwriters.__name__\nwriters.public\n", encoding="utf-8")
    hits = _private_uses({"probes.core.user": user}, _modules())
    assert [h.split(": ", 1)[1] for h in hits] == ["from probes.core.errors import _hidden", "probes.core.errors._secret"]


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
FOLDERS = ("probes", "pytest_msprobe", "tests", "benchmarks", "examples", "docs")


def _texts() -> list[Path]:
    """The code and the documents the rules below read (this file names what they look for)."""
    paths = [p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*")) if p.suffix in (".py", ".md")]
    return [p for p in [ROOT / "README.md", *paths] if p != Path(__file__)]


def test_code_cites_no_document_outside_the_repo():
    hits = []
    for path in _texts():
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if CITATION.search(line.split("# noqa")[0]):
                hits.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()[:120]}")
    assert not hits, "say the reason in the code (and user-visible differences in docs/migrating-from-msprobe.md):\n" \
        + "\n".join(hits[:30])


# a file of the repo's own code or documents, named as a path ("probes/core/scaled.py"): tests/ and
# golden/ paths in the texts are mostly the made-up ones of test data, and other files are outputs
REPO_PATH = re.compile(r"(?<![\w/.-])((?:probes|pytest_msprobe|docs|benchmarks|examples)/[\w./-]*\w\.(?:py|md))")
MARKDOWN_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _missing_references(path: Path) -> list[str]:
    hits = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        named = [m.group(1) for m in REPO_PATH.finditer(line) if not (ROOT / m.group(1)).exists()]
        if path.suffix == ".md":
            named += [t for t in MARKDOWN_LINK.findall(line)
                      if "://" not in t and not t.startswith("mailto:") and not (path.parent / t).exists()]
        hits += [f"{_shown(path)}:{i}: {target}" for target in named]
    return hits


def test_no_text_names_a_file_the_repo_does_not_have():
    hits = [hit for path in _texts() for hit in _missing_references(path)]
    assert not hits, "a moved or removed file is still named (say where it is now):\n" + "\n".join(hits)


def test_the_reference_check_finds_a_missing_file(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("see probes/core/scaled.py, probes/core/gone.py and [x](nowhere.md), [y](doc.md), "
                   "[z](https://example.org/a.md)\n", encoding="utf-8")
    assert _missing_references(doc) == ["doc.md:1: probes/core/gone.py", "doc.md:1: nowhere.md"]


# a test named after an entry of a bug list the repo does not have: test_b27_..., test_b_g1_... (not bf16)
BUG_ID_NAME = re.compile(r"(^|_)b(_[a-z]{1,3})?\d{1,3}(_|$)", re.I)


def _bug_id_test_names() -> list[str]:
    hits = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                    and node.name.lower().startswith("test") and BUG_ID_NAME.search(node.name):
                hits.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.name}")
    return hits


def test_the_bug_id_pattern_tells_an_id_from_a_dtype():
    assert [bool(BUG_ID_NAME.search(n)) for n in ("test_b27_x", "test_b_g1_x", "test_x_b5", "test_bf16_x",
                                                   "test_l0_x", "test_fp8_b")] == [True, True, True, False,
                                                                                   False, False]


def test_no_test_is_named_after_a_bug_id():
    hits = _bug_id_test_names()
    assert not hits, "name a test after what it checks:\n" + "\n".join(hits)


# msprobe's PrecisionDebugger is per task by its own API (start/stop run free_benchmark, monitor()
# runs grad_probe): the compatibility facades keep that shape for users, so they may name a tool;
# so may the config parser (msprobe's config file has one section per task) and each tool's own
# file names (probes/core/file_names.py)
TOOL_BRANCHES_ALLOWED = ("pytest_msprobe/tools/", "probes/debugger.py", "probes/pytorch/debugger.py",
                         "probes/mindspore/debugger.py", "probes/core/config.py", "probes/core/file_names.py")
_NAMES_OF_A_TOOL = re.compile(r"(tool|task|name|owner)$")


def _tool_branches(sources: dict[str, Path], tools: tuple[str, ...]) -> list[str]:
    """Comparisons with a tool's name (``x == "grad_probe"``, ``x in ("free_benchmark", ...)``):
    what a tool means belongs in its descriptor (pytest_msprobe.tools)."""
    hits = []
    for path in sources.values():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            names = {c.value for side in sides for c in ast.walk(side)
                     if isinstance(c, ast.Constant) and isinstance(c.value, str)}
            # what is compared: a variable that holds a tool's name (not a column or key named like one)
            holders = [side.id if isinstance(side, ast.Name) else side.attr for side in sides
                       if isinstance(side, (ast.Name, ast.Attribute))]
            if names & set(tools) and any(_NAMES_OF_A_TOOL.search(h) for h in holders):
                hits.append(f"{_shown(path)}:{node.lineno}: {ast.unparse(node)}")
    return hits


def test_no_module_branches_on_a_tool_name_outside_the_descriptors():
    from probes.core.config import TASKS

    sources = {n: p for n, p in _modules().items()
               if not str(p.relative_to(ROOT)).startswith(TOOL_BRANCHES_ALLOWED)}
    hits = _tool_branches(sources, TASKS)
    assert not hits, ("say it in the tool's descriptor (pytest_msprobe/tools/) or its keys "
                      "(probes/core/tool_keys.py), and read it from there:\n" + "\n".join(hits))


def test_the_tool_branch_finder_finds_both_forms(tmp_path):
    user = tmp_path / "user.py"
    user.write_text('if tool == "grad_probe":\n    pass\nok = task in ("online_dispatch", "x")\n'
                    'fine = name == "grad"\nkey = k != "free_benchmark"\n', encoding="utf-8")
    hits = _tool_branches({"user": user}, ("free_benchmark", "grad_probe", "online_dispatch"))
    assert [h.split(": ", 1)[1] for h in hits] == ["tool == 'grad_probe'", "task in ('online_dispatch', 'x')"]


MODULE_LINES = 400  # one job per module: past this, a module is doing several


def test_no_module_is_longer_than_one_job_needs():
    long = {str(p.relative_to(ROOT)): n for p in _modules().values()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MODULE_LINES}
    assert not long, (f"split these by job (at most {MODULE_LINES} lines each):\n"
                      + "\n".join(f"{p}: {n} lines" for p, n in sorted(long.items())))
