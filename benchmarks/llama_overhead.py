"""Issue 16's table from one script: what each tool costs a training step of a small Llama-style
transformer (Hugging Face LlamaForCausalLM, random init, 2 layers, hidden 128, batch 4 x 64),
in time (probed / plain, one process, interleaved repeats) and in device-to-host transfers
added per step, plus the probes' fixed costs. Beside each ratio it measures the path's floor: plain
torch code doing the least work the tool must do (FLOORS), timed in the same interleaved rounds,
so `x floor` = ratio / floor says how far the tool is from what its job costs at least.

    python benchmarks/llama_overhead.py                 # ~1-2 min on 2 cores
    python benchmarks/llama_overhead.py --threads 1 --repeats 7 --json results/llama.json
    python benchmarks/llama_overhead.py --repeats 1 --no-transfers    # a quick check that it runs

Times run on the CPU. Transfers are counted exactly on the simulated NPU
(pytest_msprobe.testing.simulated_npu): one plain and one probed step there, the difference is
what the tool adds. Needs torch and transformers (a dev extra, never a runtime dependency).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
for extra in (ROOT, ROOT / "tests" / "support"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

import free_benchmark_overhead as fbo  # noqa: E402
import torch  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402

# path -> (tool, dtype, config section); the targets of issue 16: (time ratio, transfers per step)
PATHS: dict[str, tuple[str, torch.dtype, dict[str, Any]]] = {
    "free_benchmark fp32 no_change": ("free_benchmark", torch.float32, {"pert_mode": "no_change"}),
    "free_benchmark fp32 add_noise": ("free_benchmark", torch.float32, {"pert_mode": "add_noise"}),
    "free_benchmark bf16 improve_precision": ("free_benchmark", torch.bfloat16, {"pert_mode": "improve_precision"}),
    "free_benchmark bf16 bit_noise": ("free_benchmark", torch.bfloat16, {"pert_mode": "bit_noise"}),
    "grad_probe L1": ("grad_probe", torch.float32, {"grad_level": "L1"}),
    "online_dispatch": ("online_dispatch", torch.float32, {}),
}
TARGETS = {  # issue 36's time targets; issue 16's transfer targets
    "free_benchmark fp32 no_change": (1.6, 2), "free_benchmark fp32 add_noise": (1.8, 2),
    "free_benchmark bf16 improve_precision": (1.4, 2), "free_benchmark bf16 bit_noise": (1.5, 2),
    "grad_probe L1": (1.10, 2), "online_dispatch": (3.5, None),
}
LABELS = {"online_dispatch": "online_dispatch fwd+bwd"}  # the key stays: tests and --paths use it
# path -> what its floor measures (the work the tool cannot avoid, in plain torch), see floor_extra
FLOORS = {
    "free_benchmark fp32 no_change": "plain step + one no_grad forward (one re-run of each checked call)",
    "free_benchmark fp32 add_noise": "the same + one perturbation (x * (1 + eps)) of the first float input of each call",
    "free_benchmark bf16 improve_precision": "bf16 step + a no_grad forward of a float32 copy of the model",
    "free_benchmark bf16 bit_noise": "bf16 step + one bf16 no_grad forward + one perturbation per call, as add_noise",
    "grad_probe L1": "plain step + the norms (one call), extrema and g > 0 of every gradient, one host copy, "
                     "+ the step's files (the monitor's names and sizes) written with bare system calls",
    "online_dispatch": "float32 step + zero_grad/forward/backward of a float64 copy of the model",
}


class Runner:
    """One model, optimizer and batch; `step()` is a training step, under `tool` when given (the
    plain and the probed runner start from the same weights)."""

    def __init__(self, tool: str | None, dtype: torch.dtype, section: dict[str, Any], device: str, dump: str) -> None:
        from llama_model import tiny_llama, token_batch

        from probes.pytorch import PrecisionDebugger
        from probes.pytorch.online_dispatch import PtdbgDispatch

        self.model = tiny_llama(dtype).to(device)
        self.ids = token_batch().to(device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.tool = tool
        self.dbg: Any = None
        self.disp: Any = None
        if tool == "free_benchmark":
            self.dbg = PrecisionDebugger(config={"task": "free_benchmark", "dump_path": dump, "free_benchmark": section})
        elif tool == "grad_probe":
            self.dbg = PrecisionDebugger(config={"task": "grad_probe", "dump_path": dump, "grad_probe": section})
            self.dbg.monitor(self.model)
        elif tool == "online_dispatch":
            self.disp = PtdbgDispatch(dump_path=dump)

    def _forward_backward(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        self.model(input_ids=self.ids, labels=self.ids).loss.backward()

    def _train(self) -> None:
        self._forward_backward()
        self.opt.step()

    def step(self) -> None:
        if self.tool == "free_benchmark":
            self.dbg.start()
            try:
                self._train()
            finally:
                self.dbg.stop()
            self.dbg.step()
        elif self.tool == "online_dispatch":  # forward and backward compared, the optimizer step outside
            with self.disp:
                self._forward_backward()
            self.opt.step()
        else:  # plain, or grad_probe (its hooks are on the optimizer)
            self._train()
            if self.tool == "grad_probe":  # the step's files on disk: a write its thread does counts here
                self.dbg.probe.flush()

    def close(self) -> None:
        if self.dbg is not None:
            self.dbg.stop()
        if self.disp is not None:
            self.disp.close()


def _timed(fn: Callable[[], None]) -> float:
    """Seconds of one call, no gc.collect() first (fbo.time_arms collects before each timed step)."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _first_float(args: tuple, kwargs: dict) -> torch.Tensor | None:
    for a in (*args, *kwargs.values()):
        for t in (a if isinstance(a, (list, tuple)) else (a,)):
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel():
                return t
    return None


class _FirstInputs(TorchFunctionMode):
    """Records the first floating-point input of every call that returns a floating-point tensor:
    what free_benchmark perturbs, one input per checked call."""

    def __init__(self) -> None:
        super().__init__()
        self.inputs: list[torch.Tensor] = []

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        first = _first_float(args, kwargs)
        if isinstance(out, torch.Tensor) and out.is_floating_point() and first is not None:
            self.inputs.append(first.detach())
        return out


def _no_grad_forward(model: Any, ids: torch.Tensor) -> Callable[[], None]:
    def forward() -> None:
        with torch.no_grad():
            model(input_ids=ids, labels=ids)
    return forward


def _grad_stats(model: Any) -> None:
    """A step's L1 figures in the fewest calls: the norms in one, the extrema one call a gradient,
    the signs of all gradients in one comparison; one host copy of each."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    norms = torch.stack(torch._foreach_norm(grads))
    extrema = torch.stack([torch.stack(torch.aminmax(g)) for g in grads])
    torch.cat([norms[:, None], extrema], 1).cpu().tolist()
    (torch.cat([g.flatten() for g in grads]) > 0).cpu().numpy()


def floor_extra(path: str, base: Runner, dump: str) -> Callable[[], None]:
    """What the floor adds to `base`'s plain step for `path` (FLOORS says it in words); files go
    under `dump`."""
    tool, dtype, section = PATHS[path]
    if tool == "grad_probe":
        from grad_probe_overhead import FloorFiles

        files = FloorFiles(os.path.join(dump, "floor"), base.model, section["grad_level"])

        def stats_and_files() -> None:
            _grad_stats(base.model)
            files.write()
        return stats_and_files
    if tool == "online_dispatch":
        f64 = copy.deepcopy(base.model).double()

        def reference() -> None:
            f64.zero_grad(set_to_none=True)
            f64(input_ids=base.ids, labels=base.ids).loss.backward()
        return reference
    if section["pert_mode"] == "improve_precision":
        return _no_grad_forward(copy.deepcopy(base.model).float(), base.ids)
    forward = _no_grad_forward(base.model, base.ids)
    if section["pert_mode"] == "no_change":
        return forward
    recorder = _FirstInputs()
    with torch.no_grad(), recorder:
        base.model(input_ids=base.ids, labels=base.ids)
    inputs, factor = recorder.inputs, 1.0 + torch.finfo(dtype).eps

    def perturbed() -> None:
        forward()
        with torch.no_grad():
            for t in inputs:
                torch.mul(t, factor)
    return perturbed


def time_ratio(path: str, repeats: int) -> dict[str, Any]:
    """Plain step, probed step and the floor (plain step + floor_extra), interleaved: ratios of medians."""
    tool, dtype, section = PATHS[path]
    with tempfile.TemporaryDirectory() as dump:
        base, runner = Runner(None, dtype, section, "cpu", dump), Runner(tool, dtype, section, "cpu", dump)
        extra = floor_extra(path, base, dump)

        def floor() -> None:
            base.step()
            extra()
        for fn in (base.step, runner.step, floor):  # warm-up of each
            fn()
        arms = {"plain": base.step, "probed": runner.step, "floor": floor}
        cpu: dict[str, list[float]] = {name: [] for name in arms}
        t = fbo.time_arms({name: _with_thread_cpu(fn, cpu[name]) for name, fn in arms.items()}, repeats)
        runner.close()
    plain, probed, fl = (statistics.median(t[k]) for k in ("plain", "probed", "floor"))
    cpu_plain, cpu_probed, cpu_floor = (statistics.median(cpu[k]) for k in ("plain", "probed", "floor"))
    return {"ratio": probed / plain, "floor": fl / plain, "ratio_over_floor": probed / fl,
            "ratio_min": min(t["probed"]) / min(t["plain"]), "plain_ms": plain * 1e3, "probed_ms": probed * 1e3,
            "floor_ms": fl * 1e3, "cpu_ratio": cpu_probed / cpu_plain, "cpu_floor": cpu_floor / cpu_plain,
            "seconds": t, "thread_cpu_seconds": cpu}


def _with_thread_cpu(fn: Callable[[], None], into: list[float]) -> Callable[[], None]:
    """`fn`, also recording the CPU time the calling thread spent in it (time.thread_time): other
    processes on the machine do not move it, so its ratio stays readable on a loaded machine; it
    leaves out what the probes' own threads do (a large step's files, a reference thread's ops)."""
    def run() -> None:
        start = time.thread_time()
        fn()
        into.append(time.thread_time() - start)
    return run


def transfers(path: str) -> int:
    """Device->host transfers a probed step adds, counted on the simulated NPU."""
    from pytest_msprobe.testing import simulated_npu

    tool, dtype, section = PATHS[path]
    with tempfile.TemporaryDirectory() as dump, simulated_npu() as npu:
        base, runner = Runner(None, dtype, section, "npu", dump), Runner(tool, dtype, section, "npu", dump)
        base.step()
        runner.step()  # warm-up
        npu.reset_host_transfers()
        base.step()
        plain = npu.host_transfers
        npu.reset_host_transfers()
        runner.step()
        added = npu.host_transfers - plain
        runner.close()
    return added


def fixed_costs() -> dict[str, float]:
    """start()+stop()+step() of a listed run that calls nothing selected, and what an unselected
    call costs over a plain one (a C API, not wrapped; a Python-level one, pass-through)."""
    from probes.pytorch import PrecisionDebugger

    x = torch.ones(4)
    with tempfile.TemporaryDirectory() as dump:
        dbg = PrecisionDebugger(config={"task": "free_benchmark", "dump_path": dump,
                                        "free_benchmark": {"list": ["softmax"]}})
        for _ in range(20):
            dbg.start()
            dbg.stop()
            dbg.step()
        cycle = statistics.median(_timed(lambda: (dbg.start(), dbg.stop(), dbg.step())) for _ in range(300))

        def per_call(fn: Callable[[], Any], n: int = 20000) -> float:
            return min(_timed(lambda: [fn() for _ in range(n)]) for _ in range(3)) / n

        c_api, py_api = (lambda: torch.add(x, x)), (lambda: torch.nn.functional.relu6(x))
        plain_c, plain_py = per_call(c_api), per_call(py_api)
        dbg.start()
        hooked_c, hooked_py = per_call(c_api), per_call(py_api)
        dbg.stop()
    return {"start_stop_step_ms": cycle * 1e3, "unselected_c_call_us": (hooked_c - plain_c) * 1e6,
            "unselected_python_call_us": (hooked_py - plain_py) * 1e6}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--paths", default=",".join(PATHS), help="comma-separated subset of: " + ", ".join(PATHS))
    parser.add_argument("--no-transfers", action="store_true", help="skip the simulated-NPU transfer counts")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    import logging

    logging.getLogger("probes").setLevel(logging.ERROR)
    if not args.no_transfers:  # the simulated NPU's setup must precede the process's first backward
        from pytest_msprobe.testing import prepare

        prepare()
    rows = []
    cpu0, t0 = fbo.cpu_snapshot(), time.perf_counter()
    for path in [p.strip() for p in args.paths.split(",") if p.strip()]:
        if path not in PATHS:
            parser.error(f"--paths entry {path!r}; allowed: {', '.join(PATHS)}")
        timing = time_ratio(path, args.repeats)
        added = None if args.no_transfers else transfers(path)
        rows.append({"path": path, "label": LABELS.get(path, path), "ratio": timing.pop("ratio"),
                     "transfers_per_step": added, "target_ratio": TARGETS[path][0],
                     "target_transfers": TARGETS[path][1], "floor_measure": FLOORS[path], **timing})
    others = fbo.other_cpu_load(cpu0, fbo.cpu_snapshot(), time.perf_counter() - t0)
    costs = fixed_costs()
    print_table(rows, args.repeats)
    if others is not None:
        print(f"CPU used by other processes during the timings: {others:.2f} cores on average"
              + (" (disturbed: compare 'min x', or rerun on a quiet machine)" if others > 0.25 else ""))
    print(f"\nstart()+stop()+step(), nothing selected: {costs['start_stop_step_ms']:.3f} ms (target 0.3)")
    print(f"unselected call over plain: C API {costs['unselected_c_call_us']:.2f} us, "
          f"Python-level API {costs['unselected_python_call_us']:.2f} us (target 1)")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"threads": torch.get_num_threads(), "repeats": args.repeats,
                                         "other_cpu_load": others, "rows": rows, "fixed": costs}, indent=1))
    return 0


def print_table(rows: list[dict[str, Any]], repeats: int) -> None:
    """Issue 36's table: ratio, target, the floor measured beside it and ratio / floor, then the
    transfers added per step; a markdown copy below, then what each floor measures."""
    def cell(v: Any, spec: str = "") -> str:
        return "-" if v is None else (format(v, spec) if spec else str(v))

    cells = [(r["label"], cell(r["ratio"], ".2f"), cell(r["target_ratio"], ".2f"),
              fbo.verdict(r["ratio"], r["target_ratio"], r["floor"]), cell(r["floor"], ".2f"),
              cell(r["ratio_over_floor"], ".2f"), cell(r["ratio_min"], ".2f"), cell(r["plain_ms"], ".1f"),
              cell(r["transfers_per_step"]), cell(r["target_transfers"]), cell(r.get("cpu_ratio"), ".2f"),
              cell(r.get("cpu_floor"), ".2f")) for r in rows]
    print(f"\nprobed/plain = median of {repeats} interleaved repeats; floor = (plain step + the floor's work)"
          " / plain step, timed in the same rounds; cpu x / cpu floor: the same by the timing thread's CPU time")
    fbo.print_columns(("path", "ratio", "target", "", "floor", "x floor", "min x", "plain ms", "transfers/step",
                       "target", "cpu x", "cpu floor"), (40, 6, 6, 5, 6, 7, 6, 8, 14, 6, 6, 9), cells)
    print("\n| path | ratio | target | the floor | ratio / floor | transfers/step |\n|---|---|---|---|---|---|")
    for c in cells:
        print(f"| {c[0]} | {c[1]}x | {c[2]}x | {c[4]}x | {c[5]} | {c[8]} |")
    print()
    for r in rows:
        print(f"floor of {r['label']}: {r['floor_measure']}")
    if any(c[3] == "FLOOR" for c in cells):
        print("FLOOR: over the target, but so is the floor, timed beside it: the machine decides (for grad_probe, "
              "what a new file costs on the dump's disk); 'x floor' is the tool's own part")

if __name__ == "__main__":
    sys.exit(main())
