"""What each tool costs a torch.compile'd training step (issue 24): a Hugging Face LlamaForCausalLM
(random init, 2 layers, hidden 128, batch 4 x 64, AdamW) compiled with Inductor, on the CPU.

    python benchmarks/compiled_overhead.py                  # fp32, ~3 min on 2 cores (cold Inductor cache: +1 min)
    python benchmarks/compiled_overhead.py --dtype bfloat16 --repeats 7 --json results/compiled.json

Per tool, three figures against the plain compiled step, in one process:

* **compile**: the first step (Dynamo tracing, the backend's compilation, the first run) with the
  probe on, over the plain first step. The Inductor cache is warm for both (the script compiles
  once before measuring), so this is the probe's own share of a compilation.
* **steady**: steps with the default sampling (each graph's first call checked, then none), probed
  over plain, interleaved repeats: what a long run pays.
* **checked**: a step whose graphs are all checked (free_benchmark improve_precision: the float64
  re-run of the forward graph and the eager run next to it; online_dispatch: the float64 CPU
  re-run), probed over plain: what one sampled check costs. Target: within 2x.

Also: Dynamo's graph count and graph breaks with and without the probe (they must be equal), and
whether the loss is bit-identical. Needs torch and transformers (a dev extra).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for extra in (ROOT, ROOT / "tests" / "support"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

import torch  # noqa: E402

TOOLS = ("free_benchmark", "online_dispatch", "grad_probe")
CHECKED_TARGET = 2.0


class Step:
    """A compiled Llama training step; `tool` wraps it in a probe (sampling given by `every`)."""

    def __init__(self, dtype: torch.dtype, tool: str | None, every: int, dump: str) -> None:
        from llama_model import tiny_llama, token_batch

        from probes.pytorch import PrecisionDebugger
        from probes.pytorch.online_dispatch import PtdbgDispatch

        self.model = tiny_llama(dtype)
        self.compiled = torch.compile(self.model)
        self.ids = token_batch()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.tool, self.dbg, self.disp = tool, None, None
        sampling = {"compiled_first": 1, "compiled_every": every}
        if tool == "free_benchmark":
            self.dbg = PrecisionDebugger(config={"task": "free_benchmark", "dump_path": dump, "free_benchmark": {
                "pert_mode": "improve_precision", "rule": "scaled", "list": ["Graph"], **sampling}})
        elif tool == "grad_probe":
            self.dbg = PrecisionDebugger(config={"task": "grad_probe", "dump_path": dump})
            self.dbg.monitor(self.opt)
        elif tool == "online_dispatch":
            self.disp = PtdbgDispatch(dump_path=dump, background=False, **sampling)

    def __call__(self) -> torch.Tensor:
        context = self.disp if self.disp is not None else self.dbg
        if context is not None:
            context.__enter__()
        try:
            self.opt.zero_grad(set_to_none=True)
            loss = self.compiled(input_ids=self.ids, labels=self.ids).loss
            loss.backward()
            self.opt.step()
        finally:
            if context is not None:
                context.__exit__(None, None, None)
            if self.dbg is not None and self.tool == "grad_probe":
                self.dbg.step()
        return loss.detach()


def _timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _counts() -> tuple[int, int]:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())


def measure(tool: str, dtype: torch.dtype, repeats: int, steps: int) -> dict[str, Any]:
    from torch._dynamo.utils import counters

    out: dict[str, Any] = {"tool": tool}
    with tempfile.TemporaryDirectory() as tmp:
        torch._dynamo.reset()
        counters.clear()
        plain = Step(dtype, None, 0, tmp)
        plain_first = _timed(plain)
        plain_counts = _counts()
        torch._dynamo.reset()
        counters.clear()
        probed = Step(dtype, tool, 0, f"{tmp}/steady")
        probed_first = _timed(probed)
        out["graphs_plain"], out["breaks_plain"] = plain_counts
        out["graphs_probed"], out["breaks_probed"] = _counts()
        out["compile_ratio"] = probed_first / plain_first
        out["first_step_s"] = (plain_first, probed_first)
        steady_plain, steady_probed = [], []
        for r in range(repeats):
            for fn, sink in ((plain, steady_plain), (probed, steady_probed))[:: 1 if r % 2 == 0 else -1]:
                sink.append(_timed(lambda fn=fn: [fn() for _ in range(steps)]) / steps)
        out["plain_ms"] = 1000 * statistics.median(steady_plain)
        out["steady_ratio"] = statistics.median(steady_probed) / statistics.median(steady_plain)
        if tool != "grad_probe":
            checked = Step(dtype, tool, 1, f"{tmp}/checked")
            checked.compiled = probed.compiled  # the same compiled model: no second compilation
            checked.model, checked.opt = probed.model, probed.opt
            checked()
            times = []
            for _ in range(repeats):
                times.append(_timed(checked))
            out["checked_ratio"] = statistics.median(times) / statistics.median(steady_plain)
        torch.manual_seed(0)
        a = Step(dtype, None, 0, tmp)
        torch._dynamo.reset()
        torch.manual_seed(0)
        b = Step(dtype, tool, 0, f"{tmp}/identity")
        out["bit_identical"] = bool(torch.equal(a(), b()))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--tools", default=",".join(TOOLS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3, help="steps per timed loop (steady state)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    Step(dtype, None, 0, tempfile.mkdtemp())()  # warm Inductor's cache: compile ratios compare like with like
    rows = [measure(tool, dtype, args.repeats, args.steps) for tool in args.tools.split(",")]
    print(f"compiled Llama training step ({args.dtype}, Inductor, {torch.get_num_threads()} threads)")
    print(f"{'tool':16} {'graphs':>9} {'breaks':>7} {'bit-identical':>13} {'plain ms':>9} {'compile':>8} "
          f"{'steady':>7} {'checked':>8}")
    ok = True
    for r in rows:
        checked = r.get("checked_ratio")
        ok &= r["graphs_plain"] == r["graphs_probed"] and r["breaks_plain"] == r["breaks_probed"] and r["bit_identical"]
        print(f"{r['tool']:16} {r['graphs_plain']:>4}/{r['graphs_probed']:<4} {r['breaks_plain']:>3}/{r['breaks_probed']:<3}"
              f" {str(r['bit_identical']):>13} {r['plain_ms']:>9.1f} {r['compile_ratio']:>7.2f}x {r['steady_ratio']:>6.2f}x"
              f" {(f'{checked:.2f}x' if checked is not None else '-'):>8}")
    print(f"checked-step target: within {CHECKED_TARGET}x of the plain compiled step")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
