"""Issue 16's table from one script: what each tool costs a training step of a small Llama-style
transformer (Hugging Face LlamaForCausalLM, random init, 2 layers, hidden 128, batch 4 x 64),
in time (probed / plain, one process, interleaved repeats) and in device-to-host transfers
added per step, plus the probes' fixed costs.

    python benchmarks/llama_overhead.py                 # ~1-2 min on 2 cores
    python benchmarks/llama_overhead.py --threads 1 --repeats 7 --json results/llama.json

Times run on the CPU. Transfers are counted exactly on the simulated NPU
(pytest_msprobe.testing.simulated_npu): one plain and one probed step there, the difference is
what the tool adds. Needs torch and transformers (a dev extra, never a runtime dependency).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
for extra in (ROOT, ROOT / "tests"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

import torch  # noqa: E402

# path -> (tool, dtype, config section); the targets of issue 16: (time ratio, transfers per step)
PATHS: dict[str, tuple[str, torch.dtype, dict[str, Any]]] = {
    "free_benchmark fp32 no_change": ("free_benchmark", torch.float32, {"pert_mode": "no_change"}),
    "free_benchmark fp32 add_noise": ("free_benchmark", torch.float32, {"pert_mode": "add_noise"}),
    "free_benchmark bf16 improve_precision": ("free_benchmark", torch.bfloat16, {"pert_mode": "improve_precision"}),
    "free_benchmark bf16 bit_noise": ("free_benchmark", torch.bfloat16, {"pert_mode": "bit_noise"}),
    "grad_probe L1": ("grad_probe", torch.float32, {"grad_level": "L1"}),
    "online_dispatch": ("online_dispatch", torch.float32, {}),
}
TARGETS = {
    "free_benchmark fp32 no_change": (2.0, 2), "free_benchmark fp32 add_noise": (2.5, 2),
    "free_benchmark bf16 improve_precision": (1.8, 2), "free_benchmark bf16 bit_noise": (2.5, 2),
    "grad_probe L1": (1.15, 2), "online_dispatch": (5.0, None),
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

    def _train(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        self.model(input_ids=self.ids, labels=self.ids).loss.backward()
        self.opt.step()

    def step(self) -> None:
        if self.tool == "free_benchmark":
            self.dbg.start()
            try:
                self._train()
            finally:
                self.dbg.stop()
            self.dbg.step()
        elif self.tool == "online_dispatch":
            with self.disp:
                self._train()
        else:  # plain, or grad_probe (its hooks are on the optimizer)
            self._train()

    def close(self) -> None:
        if self.dbg is not None:
            self.dbg.stop()
        if self.disp is not None:
            self.disp.close()


def _timed(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def time_ratio(path: str, repeats: int) -> float:
    tool, dtype, section = PATHS[path]
    with tempfile.TemporaryDirectory() as dump:
        base, runner = Runner(None, dtype, section, "cpu", dump), Runner(tool, dtype, section, "cpu", dump)
        base.step()
        runner.step()  # warm-up of both
        plain, probed = [], []
        for r in range(repeats):  # interleaved, the order alternating
            if r % 2:
                probed.append(_timed(runner.step))
                plain.append(_timed(base.step))
            else:
                plain.append(_timed(base.step))
                probed.append(_timed(runner.step))
        runner.close()
    return statistics.median(probed) / statistics.median(plain)


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
    for path in [p.strip() for p in args.paths.split(",") if p.strip()]:
        if path not in PATHS:
            parser.error(f"--paths entry {path!r}; allowed: {', '.join(PATHS)}")
        ratio = time_ratio(path, args.repeats)
        added = None if args.no_transfers else transfers(path)
        rows.append({"path": path, "ratio": ratio, "transfers_per_step": added,
                     "target_ratio": TARGETS[path][0], "target_transfers": TARGETS[path][1]})
    costs = fixed_costs()
    print(f"{'path':40} {'probed/plain':>12} {'target':>7} {'transfers/step':>15} {'target':>7}")
    for r in rows:
        t = r["transfers_per_step"]
        tt = r["target_transfers"]
        print(f"{r['path']:40} {r['ratio']:12.2f} {r['target_ratio']:7.2f} {('n/a' if t is None else t):>15} "
              f"{('-' if tt is None else tt):>7}")
    print(f"\nstart()+stop()+step(), nothing selected: {costs['start_stop_step_ms']:.3f} ms (target 0.3)")
    print(f"unselected call over plain: C API {costs['unselected_c_call_us']:.2f} us, "
          f"Python-level API {costs['unselected_python_call_us']:.2f} us (target 1)")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"threads": torch.get_num_threads(), "rows": rows, "fixed": costs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
