"""Reproductions of failing compiled graphs (probes/compiled/repro.py): written as code and plain
tensors (no pickled module, nothing loaded with weights_only=False), run in a fresh interpreter
they print the report's own figures for the seeded defect, forward and backward; sub-modules,
constants, custom operators with an import path and sub-graphs of higher-order operators are
written as code, and what cannot be written gets a script that says why instead of failing."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from compiled_programs import PATTERNS, compiled_run, mlp, vendor_backend
from repo_paths import SUPPORT

from probes.compiled import capture
from probes.compiled.repro import measure, write_repro
from probes.pytorch import PrecisionDebugger

TESTS = SUPPORT
PICKLED = ("torch.save(gm", "weights_only=False", "module.pt")


def _inputs(sizes=(16, 16)) -> list[tuple[torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(n, 32, generator=g),) for n in sizes]


def _localised(tmp_path: Path, defect: str, stage: str) -> dict:
    """The localisation free_benchmark reports for mlp compiled with a vendor backend whose second
    `defect` operator loses precision."""
    debugger = PrecisionDebugger(config={"task": "free_benchmark", "dump_path": str(tmp_path / "fb"),
                                         "free_benchmark": {"pert_mode": "improve_precision", "rule": "scaled",
                                                            "fuzz_stage": stage, "list": ["Graph"]}})
    model = mlp()
    compiled_run(model, _inputs(), list(model.parameters()), around=lambda: debugger,
                 backend=vendor_backend(defect, occurrence=1))
    graph, = debugger.summary()["graphs"]
    assert graph["localisation"] is not None, graph
    return graph["localisation"]


def _run(folder: Path, *options: str, tmp_path: Path, code: str | None = None) -> subprocess.CompletedProcess:
    """python repro.py in a fresh interpreter, in its folder, with the seeded vendor backends
    importable as `vendors:<defect>` (a backend the script cannot know by name)."""
    (tmp_path / "vendors.py").write_text(
        "from compiled_programs import vendor_backend\n"
        "linear = vendor_backend('linear', occurrence=1)\n"
        "gelu_backward = vendor_backend('gelu_backward', occurrence=1)\n", encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(TESTS), os.environ.get("PYTHONPATH", "")]))
    command = [sys.executable, "-c", code] if code else [sys.executable, "repro.py", *options]
    return subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=600, env=env)


def _figures(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _written_as_code(folder: Path) -> None:
    """No pickled module anywhere; every saved file loads with weights_only=True into plain tensors."""
    for path in folder.iterdir():
        if path.suffix == ".py":
            text = path.read_text(encoding="utf-8")
            assert not [p for p in PICKLED if p in text], path
        elif path.suffix == ".pt":
            loaded = torch.load(path, weights_only=True)
            values = loaded.values() if isinstance(loaded, dict) else loaded
            assert all(type(v) is torch.Tensor or isinstance(v, (int, float, bool, type(None))) for v in values)
    assert not (folder / "module.pt").exists()


@pytest.mark.parametrize("stage, defect", [("forward", "linear"), ("backward", "gelu_backward")])
def test_a_seeded_defect_s_repro_prints_the_report_s_figures(stage, defect, tmp_path):
    found = _localised(tmp_path, defect, stage)
    assert found["compiled_ulps"] > found["threshold_ulps"] >= found["eager_ulps"]
    repro = Path(found["repro"])
    _written_as_code(repro)
    script = (repro / "repro.py").read_text(encoding="utf-8")
    assert "class Repro(torch.nn.Module)" in script and "torch._C._nn.linear(" in script
    loads = re.findall(r"torch\.load\(([^)]*)\)", script)
    assert len(loads) >= 2 and all("weights_only=True" in call for call in loads), loads
    # with the graph's own backend the script measures what the report measured, to the last bit
    figures = _figures(_run(repro, "--backend", f"vendors:{defect}", "--json", tmp_path=tmp_path))
    assert figures["stage"] == stage
    reported = {k: found[k] for k in ("compiled_ulps", "eager_ulps", "threshold_ulps")}
    assert {k: figures[k] for k in reported} == reported
    # with the vendor's rewrite undone (eager kernels behind Dynamo) the loss is gone: it is the backend's
    undone = _figures(_run(repro, "--backend", "aot_eager", "--json", tmp_path=tmp_path))
    assert undone["eager_ulps"] == found["eager_ulps"] and undone["compiled_ulps"] <= found["threshold_ulps"]


def test_without_pytest_msprobe_the_repro_says_so_and_prints_plain_differences(tmp_path):
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
    gm = torch.fx.symbolic_trace(lambda a: torch.nn.functional.gelu(a @ a.T))
    repro = write_repro(tmp_path / "r", gm, (x,), "gelu", "eager")
    hide = ("import runpy, sys; sys.modules['probes.compiled.repro'] = None; sys.argv = ['repro.py'];"
            "runpy.run_path('repro.py', run_name='__main__')")
    done = _run(repro, tmp_path=tmp_path, code=hide)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "pytest-msprobe is not installed" in done.stdout and "ulps" not in done.stdout.split("\n", 1)[1]
    assert "output 0 (torch.float32): eager " in done.stdout


class _Holder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.full((8,), 0.5))


class _WithState(torch.nn.Module):
    """A graph with a leaf submodule (call_module), a buffer and a nested parameter (get_attr), and
    tensor constants traced from the code."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(16, 8)
        self.register_buffer("shift", torch.linspace(-1.0, 1.0, 8))
        self.inner = _Holder()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.proj(x) * self.inner.scale + self.shift + torch.tensor(0.25)) * torch.tensor(3.0)


def test_submodules_buffers_parameters_and_constants_are_written_as_code_and_tensors(tmp_path):
    torch.manual_seed(0)
    gm = torch.fx.symbolic_trace(_WithState())
    targets = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
    assert any(n.op == "call_module" for n in gm.graph.nodes) and {"inner.scale", "shift"} <= targets
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(3))
    repro = write_repro(tmp_path / "state", gm, (x,), "state", "eager")
    _written_as_code(repro)
    state = torch.load(repro / "state.pt", weights_only=True)
    assert {"proj.weight", "proj.bias", "shift", "inner.scale", "_tensor_constant0"} <= set(state)
    assert torch.equal(state["proj.weight"], gm.proj.weight.detach())
    with torch.no_grad():  # eager against float64, the graph's tensors widened too
        expected = measure(gm(x), copy.deepcopy(gm).double()(x.double()))[0]
    figures = _figures(_run(repro, "--backend", "eager", "--json", tmp_path=tmp_path))
    assert figures["eager_ulps"] == figures["compiled_ulps"] == expected > 0
    assert figures["leaves"][0]["dtype"] == "torch.float32" and figures["threshold_ulps"] > expected


def test_higher_order_operators_and_a_custom_op_with_an_import_path_run_in_a_fresh_interpreter(tmp_path):
    """torch.cond's branches and a checkpoint's body are sub-graphs written as classes (traced back
    to GraphModules for the operator); a custom_op defined in an importable module is imported."""
    (tmp_path / "my_ops.py").write_text(
        "import torch\n\n"
        "@torch.library.custom_op('msprobe_repro_test::scale', mutates_args=())\n"
        "def scale(x: torch.Tensor) -> torch.Tensor:\n"
        "    return x * 2\n\n"
        "@scale.register_fake\n"
        "def _(x):\n"
        "    return torch.empty_like(x)\n", encoding="utf-8")
    sys.path.insert(0, str(tmp_path))
    try:
        import my_ops

        graphs = _captured({"cond": PATTERNS["cond"], "checkpoint": PATTERNS["checkpoint"],
                            "custom_op": lambda x, w: my_ops.scale(x @ w).sin()})
    finally:
        sys.path.remove(str(tmp_path))
    runs = []
    debugger = PrecisionDebugger(config={"task": "free_benchmark", "dump_path": str(tmp_path / "fb")})
    for name, (gm, args) in graphs.items():
        with debugger:  # written as localize writes them: while the probe's API hooks are on
            repro = write_repro(tmp_path / name, gm, args, name, "eager")
        script = (repro / "repro.py").read_text(encoding="utf-8")
        assert "NOT RUNNABLE" not in script, script[:2000]
        _written_as_code(repro)
        runs.append(str(repro))
    assert "import my_ops" in (tmp_path / "custom_op" / "repro.py").read_text(encoding="utf-8")
    # one interpreter for the three scripts (each run as __main__ from its folder): torch imports once
    code = ("import os, runpy, sys\n"
            f"for folder in {runs!r}:\n"
            "    os.chdir(folder); sys.argv = ['repro.py', '--backend', 'aot_eager']\n"
            "    runpy.run_path('repro.py', run_name='__main__')\n")
    done = _run(tmp_path, tmp_path=tmp_path, code=code)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("worst: eager") == 3, done.stdout


def _captured(functions: dict) -> dict[str, tuple[torch.fx.GraphModule, tuple]]:
    """The first graph Dynamo hands the backend for each function, with its example inputs."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(8, 16, generator=g), torch.randn(16, 16, generator=g)
    graphs = {}
    for name, fn in functions.items():
        def keep(gm, example, name=name):
            graphs.setdefault(name, (gm, tuple(example)))
            return gm.forward

        torch._dynamo.reset()
        torch.compile(fn, backend=keep)(x, w)
    return graphs


def _unrunnable(tmp_path: Path, gm: torch.fx.GraphModule, args: tuple, *why: str) -> None:
    repro = write_repro(tmp_path, gm, args, "g", "eager")
    script = (repro / "repro.py").read_text(encoding="utf-8")
    assert script.startswith('"""Reproduction of g, written by pytest-msprobe: NOT RUNNABLE.')
    assert all(w in script for w in why), script
    assert (repro / "graph.py").exists() and not (repro / "state.pt").exists()
    done = subprocess.run([sys.executable, "repro.py"], cwd=repro, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "no runnable reproduction of g" in done.stderr and why[0] in done.stderr


def test_what_cannot_be_written_as_code_gets_a_script_that_says_why(tmp_path):
    def local_double(t: torch.Tensor) -> torch.Tensor:
        return t * 2

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output((graph.call_function(local_double, (x,)),))
    args = (torch.ones(3),)
    _unrunnable(tmp_path / "closure", torch.fx.GraphModule(torch.nn.Module(), graph), args,
                "the graph calls", "local_double", "no import path")
    # an operator registered with torch.library, with no Python module to import
    library = torch.library.Library("msprobe_repro_cpp", "DEF")
    library.define("twice(Tensor x) -> Tensor")
    library.impl("twice", lambda t: t * 2, "CompositeExplicitAutograd")
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output((graph.call_function(torch.ops.msprobe_repro_cpp.twice.default, (x,)),))
    _unrunnable(tmp_path / "op", torch.fx.GraphModule(torch.nn.Module(), graph), args,
                "torch.ops.msprobe_repro_cpp.twice", "registered outside PyTorch")
    # an input that weights_only loading refuses
    gm = torch.fx.symbolic_trace(lambda a, b: a + 1)
    _unrunnable(tmp_path / "input", gm, (torch.ones(2), object()), "input 1 is a object")


def test_a_graph_from_the_capture_hook_gets_a_runnable_repro_of_its_prefix(tmp_path):
    """What localize hands the writer: a prefix of the pristine graph the hook kept."""
    from probes.compiled.localize import prefix

    graphs = []

    class Keep:
        def graph_call(self, graph, args, kwargs):
            graphs.append((graph, args))
            return graph.compiled(*args, **kwargs)

    keeper = Keep()
    capture.install(keeper)
    try:
        compiled_run(mlp(), _inputs(sizes=(16,)), backward=False, backend="aot_eager")
    finally:
        capture.uninstall(keeper)
    (graph, args), = graphs
    node = [n for n in graph.gm.graph.nodes if n.op == "call_function"][2].name
    repro = write_repro(tmp_path / "prefix", prefix(graph.gm, node), args, "prefix", graph.backend_name)
    script = (repro / "repro.py").read_text(encoding="utf-8")
    assert "NOT RUNNABLE" not in script and "DEFAULT_BACKEND = 'aot_eager'" in script
    assert "layer_norm" in script and "torch._C._nn.linear(" in script and script.count("torch._C._nn.linear(") == 1
