"""torch.compile under the probes (probes/compiled): the compiled program is the same with a probe
on (graphs, graph breaks, bit-identical outputs and gradients), its graphs are judged against
float64 at the backend, a seeded reduced-precision operator in a vendor backend is caught and
localised by node through free_benchmark (forward and backward) and online_dispatch, and clean
compiled models stay quiet."""

from __future__ import annotations

import glob
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from compiled_programs import PATTERNS, compiled_run, mlp, rope, rope_inputs, vendor_backend, with_graph_break
from torch._dynamo.utils import counters

from probes.compiled import capture
from probes.pytorch import PrecisionDebugger
from probes.pytorch.online_dispatch import PtdbgDispatch


def _free_benchmark(tmp_path: Path, **section) -> PrecisionDebugger:
    section.setdefault("pert_mode", "improve_precision")
    section.setdefault("rule", "scaled")
    return PrecisionDebugger(config={"task": "free_benchmark", "dump_path": str(tmp_path / "fb"),
                                     "free_benchmark": section})


def _mlp_inputs(dtype: torch.dtype = torch.float32, sizes=(16, 16)) -> list[tuple[torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(n, 32, generator=g).to(dtype),) for n in sizes]


def _same(plain, probed) -> None:
    assert probed.graphs == plain.graphs and probed.breaks == plain.breaks
    assert all(torch.equal(a, b) for a, b in zip(plain.outputs, probed.outputs))
    assert len(plain.grads) == len(probed.grads) and all(torch.equal(a, b) for a, b in zip(plain.grads, probed.grads))


def _graphs(summary: dict) -> dict[str, dict]:
    return {g["graph"]: g for g in summary.get("graphs", [])}


# the compiled program is unchanged ------------------------------------------------------------
TOOLS = ["free_benchmark", "online_dispatch", "grad_probe"]
SETTINGS = {"default": {}, "fullgraph": {"fullgraph": True}, "dynamic": {"dynamic": True}}


def _around(tool: str, tmp_path: Path, model: torch.nn.Module):
    if tool == "free_benchmark":
        return lambda: _free_benchmark(tmp_path)
    if tool == "online_dispatch":
        return lambda: PtdbgDispatch(dump_mode="OFF", dump_path=str(tmp_path / "od"))
    from probes.grad_probe.torch_watch import TorchOptimizerWatch  # noqa: F401 - the tool's import
    from probes.pytorch import PrecisionDebugger as Debugger

    debugger = Debugger(config={"task": "grad_probe", "dump_path": str(tmp_path / "gp")})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    debugger.monitor(optimizer)
    return lambda: debugger


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("tool", TOOLS)
def test_a_probe_leaves_the_compiled_program_as_it_is(tool, setting, tmp_path):
    kwargs = dict(SETTINGS[setting], backend="aot_eager")
    inputs = _mlp_inputs(sizes=(16, 24) if setting == "dynamic" else (16, 16))
    model = mlp()
    plain = compiled_run(model, inputs, list(model.parameters()), **kwargs)
    model = mlp()
    probed = compiled_run(model, inputs, list(model.parameters()), around=_around(tool, tmp_path, model), **kwargs)
    _same(plain, probed)
    assert not capture._ACTIVE  # the graph hook is gone with the probe
    assert plain.graphs >= 1


@pytest.mark.parametrize("tool", ["free_benchmark", "online_dispatch"])
def test_graph_breaks_stay_where_they_were(tool, tmp_path):
    x = torch.randn(8, 8, generator=torch.Generator().manual_seed(2))
    plain = compiled_run(with_graph_break, [(x,)], backward=False, backend="aot_eager")
    probed = compiled_run(with_graph_break, [(x,)], backward=False, backend="aot_eager",
                          around=_around(tool, tmp_path, torch.nn.Linear(1, 1)))
    assert plain.breaks >= 1
    _same(plain, probed)


def test_inductor_and_its_modes_compile_the_same_graphs_and_results_under_free_benchmark(tmp_path):
    for mode in (None, "reduce-overhead"):
        for dtype in (torch.float32, torch.bfloat16):
            kwargs = {"backend": "inductor", **({"mode": mode} if mode else {})}
            model = mlp(dtype)
            plain = compiled_run(model, _mlp_inputs(dtype), list(model.parameters()), **kwargs)
            model = mlp(dtype)
            debugger = _free_benchmark(tmp_path / f"{mode}{dtype}")
            probed = compiled_run(model, _mlp_inputs(dtype), list(model.parameters()), around=lambda d=debugger: d,
                                  **kwargs)
            _same(plain, probed)
            graphs = _graphs(debugger.summary())
            assert graphs and all(g["checked"] >= 1 and g["flagged"] == 0 for g in graphs.values()), graphs


# judged at the backend, against float64 -------------------------------------------------------
def test_a_reduced_precision_operator_of_a_vendor_backend_is_caught_and_localised(tmp_path):
    model = mlp()
    debugger = _free_benchmark(tmp_path)
    run = compiled_run(model, _mlp_inputs(), list(model.parameters()), around=lambda d=debugger: d,
                       backend=vendor_backend("linear", occurrence=1))
    summary = debugger.summary()
    (name, graph), = _graphs(summary).items()
    assert graph["flagged"] >= 1 and graph["backend"] == "vendor_linear"
    assert graph["forward"]["compiled_ulps"] > graph["forward"]["threshold_ulps"] > graph["forward"]["eager_ulps"]
    found = graph["localisation"]
    assert found["target"].endswith("linear") and found["where"] == "compiler" and "3 (Linear)" in found["source"]
    assert found["compiled_ulps"] > found["threshold_ulps"] > found["eager_ulps"]
    rows = [r for r in summary["flagged"] if r["api"] == f"Graph.{name}"]
    assert rows and "node" in rows[0]["detail"]
    assert f"Graph.{name}" in summary["apis"] and not any(k.startswith("Functional.") for k in summary["apis"])
    # the reproduction runs with plain PyTorch and shows the loss of the node with the vendor's
    # rewrite undone (eager, Inductor): it is the vendor backend that loses it
    repro = Path(found["repro"])
    assert {p.name for p in repro.iterdir()} == {"inputs.pt", "repro.py"}  # code and tensors, no pickled module
    done = subprocess.run([sys.executable, "repro.py", "--backend", "eager"], cwd=repro, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "eager" in done.stdout and "ulps against float64" in done.stdout
    assert run.outputs  # the user's program ran to the end


def test_an_exp_like_operator_through_float16_is_caught_with_the_noise_modes_too(tmp_path):
    for mode in ("improve_precision", "bit_noise"):
        model = mlp()
        debugger = _free_benchmark(tmp_path / mode, pert_mode=mode)
        compiled_run(model, _mlp_inputs(), list(model.parameters()), around=lambda d=debugger: d,
                     backend=vendor_backend("gelu"))
        graph, = _graphs(debugger.summary()).values()
        assert graph["checked"] >= 1
        if mode == "improve_precision":
            assert graph["flagged"] >= 1 and "gelu" in graph["localisation"]["target"]


def test_the_backward_stage_judges_the_compiled_gradients_against_float64(tmp_path):
    results = {}
    for defect in (None, "linear"):
        model = mlp()
        debugger = _free_benchmark(tmp_path / str(defect), fuzz_stage="backward", list=["Graph"])
        compiled_run(model, _mlp_inputs(), list(model.parameters()), around=lambda d=debugger: d,
                     backend=vendor_backend(defect))
        results[defect] = next(iter(_graphs(debugger.summary()).values()))
    clean, bad = results[None]["backward"], results["linear"]["backward"]
    assert results[None]["flagged"] == 0 and clean["compiled_ulps"] <= clean["threshold_ulps"]
    assert results["linear"]["flagged"] >= 1 and bad["compiled_ulps"] > bad["threshold_ulps"] > bad["eager_ulps"]


def test_a_defect_only_the_gradients_show_is_localised_to_its_node_in_the_backward(tmp_path):
    """The second GELU's backward computes its derivative in float16, its forward is exact: the
    forward stays clean, the backward stage flags the graph and names that GELU, and the
    reproduction compares the gradients."""
    found = {}
    for stage in ("forward", "backward"):
        model = mlp()
        debugger = _free_benchmark(tmp_path / stage, fuzz_stage=stage, list=["Graph"])
        compiled_run(model, _mlp_inputs(), list(model.parameters()), around=lambda d=debugger: d,
                     backend=vendor_backend("gelu_backward", occurrence=1))
        found[stage] = next(iter(_graphs(debugger.summary()).values()))
    assert found["forward"]["flagged"] == 0
    graph = found["backward"]
    assert graph["flagged"] >= 1 and graph["backward"]["compiled_ulps"] > graph["backward"]["threshold_ulps"]
    where = graph["localisation"]
    assert where["stage"] == "backward" and where["target"].endswith("gelu") and "4 (GELU)" in where["source"]
    assert where["compiled_ulps"] > where["threshold_ulps"] >= where["eager_ulps"]
    repro = Path(where["repro"])
    done = subprocess.run([sys.executable, "repro.py", "--backend", "eager"], cwd=repro, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "gradient of input" in done.stdout and "ulps against float64" in done.stdout


def test_a_clean_backward_is_not_localised(tmp_path):
    """Bisecting a clean graph's gradients finds nothing: no prefix fails against float64."""
    from probes.compiled.localize import localise_and_reproduce

    model = mlp()
    graphs = []

    class Keep:
        def graph_call(self, graph, args, kwargs):
            graphs.append((graph, args))
            return graph.compiled(*args, **kwargs)

    keeper = Keep()
    capture.install(keeper)
    try:
        compiled_run(model, _mlp_inputs(sizes=(16,)), list(model.parameters()), backend=vendor_backend(None))
    finally:
        capture.uninstall(keeper)
    (graph, args), = graphs
    assert localise_and_reproduce(graph, args, tmp_path, stage="backward") is None
    bad = vendor_backend("gelu_backward")
    graph.backend = bad
    found = localise_and_reproduce(graph, args, tmp_path, stage="backward")
    assert found is not None and found.target.endswith("gelu") and found.stage == "backward"
    assert "its backward" in found.describe()


@pytest.mark.parametrize("runner", [False, True], ids=["inline", "reference_runner"])
def test_online_dispatch_compares_each_graph_with_float64_on_the_cpu_and_localises(tmp_path, monkeypatch, runner):
    """(With the reference runner in use, a graph's call is judged on the user's thread, in its
    turn: a compiled program may write into its inputs.)"""
    if runner:
        from probes.backends import torch_reference_runner
        from probes.online_dispatch import mode

        if torch_reference_runner.runner_module(wait=True) is None:
            pytest.skip(f"no reference runner here: {torch_reference_runner.why_not()}")
        monkeypatch.setattr(mode, "use_reference_thread", lambda background: True)
    for defect in (None, "linear"):
        model = mlp()
        dump = tmp_path / str(defect)
        run = compiled_run(model, _mlp_inputs(), list(model.parameters()), backend=vendor_backend(defect),
                           around=lambda d=dump: PtdbgDispatch(dump_mode="auto", dump_path=str(d)))
        assert run.graphs == 1
        summary = json.loads(Path(glob.glob(str(dump / "*" / "summary.json"))[0]).read_text())
        graph, = summary["graphs"]
        assert graph["sampled"] == 1
        failing = [f["name"] for f in summary["failed_ops"]]
        if defect is None:
            assert not [f for f in failing if f.startswith("Graph.")]
        else:
            assert failing and failing[0].startswith(f"Graph.{graph['graph']}_1")
            assert graph["localisation"]["target"].endswith("linear")


@pytest.mark.parametrize("runner", [False, True], ids=["inline", "reference_runner"])
def test_online_dispatch_compares_each_graph_backward_as_one_op(tmp_path, monkeypatch, runner):
    """The compiled backward runs fused kernels the dispatch mode never sees one by one: it is
    compared as one op, Graph.<name>.backward, on the call's real cotangents; a defect only the
    gradients show fails it (and only it) and is localised to its node; a clean one passes."""
    if runner:
        from probes.backends import torch_reference_runner
        from probes.online_dispatch import mode

        if torch_reference_runner.runner_module(wait=True) is None:
            pytest.skip(f"no reference runner here: {torch_reference_runner.why_not()}")
        monkeypatch.setattr(mode, "use_reference_thread", lambda background: True)
    for defect in (None, "gelu_backward"):
        model = mlp()
        dump = tmp_path / str(defect)
        plain = compiled_run(mlp(), _mlp_inputs(), list(model.parameters()), backend=vendor_backend(defect))
        run = compiled_run(model, _mlp_inputs(), list(model.parameters()), backend=vendor_backend(defect, occurrence=1),
                           around=lambda d=dump: PtdbgDispatch(dump_mode="auto", dump_path=str(d)))
        assert run.graphs == plain.graphs == 1
        summary = json.loads(Path(glob.glob(str(dump / "*" / "summary.json"))[0]).read_text())
        graph, = summary["graphs"]
        failing = [f["name"] for f in summary["failed_ops"] if f["name"].startswith("Graph.")]
        rows = (Path(glob.glob(str(dump / "*" / "compare_result_*.csv"))[0])).read_text()
        assert f"Graph.{graph['graph']}.backward_1_output.0" in rows  # the gradient of the first input
        if defect is None:
            assert not failing
        else:
            assert failing and all(f.startswith(f"Graph.{graph['graph']}.backward_") for f in failing)
            where = graph["localisation"]
            assert where["stage"] == "backward" and where["target"].endswith("gelu") and "4 (GELU)" in where["source"]


def test_the_compiled_rope_in_bfloat16_passes_and_reads_closer_to_float64_than_eager(tmp_path):
    """pytorch/pytorch#182225's pattern: Inductor's fused bf16 RoPE is the more accurate one."""
    debugger = _free_benchmark(tmp_path)
    inputs = rope_inputs()
    plain = torch.compile(rope, backend="inductor")(*inputs)
    torch._dynamo.reset()
    compiled = torch.compile(rope, backend="inductor")
    with debugger:
        out = compiled(*inputs)
    assert torch.equal(plain, out)
    graph, = _graphs(debugger.summary()).values()
    assert graph["flagged"] == 0
    assert graph["forward"]["eager_ulps"] > 2 * graph["forward"]["compiled_ulps"]


def test_sampling_checks_the_first_calls_and_every_nth(tmp_path):
    model = mlp()
    debugger = _free_benchmark(tmp_path, compiled_first=2, compiled_every=3)
    compiled_run(model, _mlp_inputs(sizes=(16,) * 9), list(model.parameters()), around=lambda d=debugger: d,
                 backend="aot_eager")
    graph, = _graphs(debugger.summary()).values()
    assert (graph["calls"], graph["sampled"], graph["checked"]) == (9, 4, 4)  # calls 1, 2, 5, 8


def test_random_graphs_are_not_checked_and_say_why(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Dropout(0.5))
    torch.manual_seed(5)
    plain = compiled_run(model, _mlp_inputs(), list(model.parameters()), backend="aot_eager")
    for p in model.parameters():
        p.grad = None
    torch.manual_seed(5)
    debugger = _free_benchmark(tmp_path)
    probed = compiled_run(model, _mlp_inputs(), list(model.parameters()), backend="aot_eager",
                          around=lambda: debugger)
    _same(plain, probed)
    graph, = _graphs(debugger.summary()).values()
    assert graph["checked"] == 0 and "random" in graph["not_checked"] and "dropout" in graph["not_checked"]


def test_a_graph_that_updates_its_inputs_is_checked_on_copies(tmp_path):
    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.BatchNorm1d(16))

    model = make()
    compiled_run(model, _mlp_inputs(), list(model.parameters()), backend="aot_eager")
    plain_stats = model[1].running_mean.clone(), model[1].num_batches_tracked.clone()
    model = make()
    debugger = _free_benchmark(tmp_path)
    compiled_run(model, _mlp_inputs(), list(model.parameters()), backend="aot_eager", around=lambda: debugger)
    assert torch.equal(model[1].running_mean, plain_stats[0]) and torch.equal(model[1].num_batches_tracked,
                                                                              plain_stats[1])
    graph, = _graphs(debugger.summary()).values()
    assert graph["checked"] >= 1


def test_a_model_compiled_before_the_probe_recompiles_once_the_same_graph_and_is_checked(tmp_path):
    """Dynamo guards on the identity of the torch functions the probe hooks: a model compiled
    before the probe started is compiled again, once, when it first runs under it (the same graph),
    and runs its first compilation again once the probe stopped."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(mlp(), backend="aot_eager")
    x, = _mlp_inputs()[0]
    before = compiled(x)
    debugger = _free_benchmark(tmp_path)
    for _ in range(2):
        with debugger:
            during = compiled(x)
    after = compiled(x)
    assert counters["stats"]["unique_graphs"] == 2 and not counters["graph_break"]
    assert torch.equal(before, during) and torch.equal(before, after)
    graph, = _graphs(debugger.summary()).values()
    assert graph["calls"] == 2 and graph["checked"] == 1
    from torch._dynamo.output_graph import OutputGraph

    assert not hasattr(OutputGraph.call_user_compiler, "__wrapped__")  # the hook left with the probe


# PyTorch's compile test patterns ----------------------------------------------------------------
@pytest.mark.parametrize("tool", ["free_benchmark", "online_dispatch"])
@pytest.mark.parametrize("pattern", sorted(PATTERNS))
def test_no_tool_breaks_or_changes_pytorchs_compile_patterns(pattern, tool, tmp_path):
    fn = PATTERNS[pattern]
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(8, 16, generator=g), torch.randn(16, 16, generator=g, requires_grad=True)

    def run(around):
        torch._dynamo.reset()
        counters.clear()
        w.grad = None
        compiled = torch.compile(fn, backend="aot_eager")
        with around():
            out = compiled(x.clone(), w)
            leaves = [t for t in (out if isinstance(out, tuple) else (out,))
                      if isinstance(t, torch.Tensor) and t.requires_grad]
            if leaves:
                sum(t.float().sum() for t in leaves).backward()
        outs = [t.detach().clone() if isinstance(t, torch.Tensor) else t
                for t in (out if isinstance(out, tuple) else (out,))]
        return outs, None if w.grad is None else w.grad.clone(), dict(counters["stats"]), dict(counters["graph_break"])

    import contextlib

    plain = run(contextlib.nullcontext)
    probed = run(_around(tool, tmp_path, torch.nn.Linear(1, 1)))
    assert plain[2] == probed[2] and plain[3] == probed[3]
    assert all((torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b) for a, b in zip(plain[0], probed[0]))
    assert (plain[1] is None and probed[1] is None) or torch.equal(plain[1], probed[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_an_inductor_compiled_llama_gives_no_finding_forward_and_backward(dtype, tmp_path):
    """A real model nobody here wrote (Hugging Face Llama, random init), compiled with Inductor:
    its graph is checked forward and backward against float64, and nothing is flagged."""
    pytest.importorskip("transformers")
    from llama_model import tiny_llama, token_batch

    from probes.compiled import check_compiled

    model = tiny_llama(dtype, layers=2, hidden=64)
    ids = token_batch(2, 32)

    def loss(ids):
        return model(input_ids=ids, labels=ids).loss

    check = check_compiled(loss, ids, backend="inductor", backward=True, dump_path=tmp_path)
    check.assert_clean()
    graph, = check.graphs
    assert graph["checked"] == 2 and graph["forward"] and graph["backward"]
    assert graph["forward"]["eager_ulps"] is not None and graph["backward"]["eager_ulps"] is not None
