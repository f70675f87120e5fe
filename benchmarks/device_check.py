"""One short check of the three tools on an accelerator (CUDA or an Ascend NPU), for the day a
machine with one is lent: a small transformer trains a few steps plain and under each tool; the
script prints what each tool found, its time ratio against the plain step and the host
transfers per step, and exits non-zero when a tool crashed (probes run in strict mode, so an
error inside a probe is a crash here, not a recorded skip).

    python benchmarks/device_check.py                       # auto: npu, else cuda, else cpu
    python benchmarks/device_check.py --device cuda --json results/device_check.json
    python benchmarks/device_check.py --simulate --seed-defect   # on the simulated NPU (CPU only)

On an NPU the model uses torch_npu's fused operators (npu_rms_norm, npu_swiglu, npu_rotary_mul),
the ones NPU users most need checked; elsewhere the same math in plain PyTorch. ``--simulate``
runs on pytest_msprobe.testing.simulated_npu; ``--seed-defect`` (with it) makes npu_rms_norm compute
in bfloat16, and the script then also fails when free_benchmark or online_dispatch does not name
it. Host transfers per step are counted exactly on the simulated NPU, from
torch.cuda.set_sync_debug_mode's warnings on CUDA (synchronising calls), and not at all on a
real NPU ("n/a"). Takes well under 5 minutes on a GPU or NPU (about a minute on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

DEFECT_OP = "npu_rms_norm"


# --------------------------------------------------------------------------------------- model
class _Fused:
    """torch_npu's fused operators when importable, else their math in plain PyTorch."""

    def __init__(self) -> None:
        try:
            import torch_npu  # type: ignore[import-not-found]
        except Exception:
            torch_npu = None
        self.npu = torch_npu

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self.npu is not None:
            return self.npu.npu_rms_norm(x, weight, 1e-6)[0]
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * weight

    def swiglu(self, x: torch.Tensor) -> torch.Tensor:
        if self.npu is not None:
            return self.npu.npu_swiglu(x, -1)
        a, b = x.chunk(2, dim=-1)
        return F.silu(a) * b

    def rotary(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.npu is not None:
            return self.npu.npu_rotary_mul(x, cos, sin)
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, fused: _Fused) -> None:
        super().__init__()
        self.heads, self.fused = heads, fused
        self.norm1 = nn.Parameter(torch.ones(dim))
        self.norm2 = nn.Parameter(torch.ones(dim))
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.up = nn.Linear(dim, 4 * dim, bias=False)
        self.down = nn.Linear(2 * dim, dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.fused.rms_norm(x, self.norm1)).split(d, dim=-1)
        q, k, v = (t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        q, k = self.fused.rotary(q, cos, sin), self.fused.rotary(k, cos, sin)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, d))
        return x + self.down(self.fused.swiglu(self.up(self.fused.rms_norm(x, self.norm2))))


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int = 256, dim: int = 64, heads: int = 4, layers: int = 2, seq: int = 32) -> None:
        super().__init__()
        fused = _Fused()
        self.fused = fused
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, fused) for _ in range(layers))
        self.norm = nn.Parameter(torch.ones(dim))
        self.head = nn.Linear(dim, vocab, bias=False)
        half = dim // heads // 2
        freqs = torch.outer(torch.arange(seq).float(), 1.0 / (10000 ** (torch.arange(half).float() / half)))
        angles = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", angles.cos()[None, None], persistent=False)
        self.register_buffer("sin", angles.sin()[None, None], persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        cos, sin = self.cos.to(x.dtype), self.sin.to(x.dtype)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.head(self.fused.rms_norm(x, self.norm))


# -------------------------------------------------------------------------------- measurement
class TransferCounter:
    """Host transfers (device->host copies, synchronising calls) during a block, where countable."""

    def __init__(self, device: str, simulation: Any) -> None:
        self.device, self.simulation = device, simulation
        self.count: int | None = None

    @contextlib.contextmanager
    def counting(self):  # type: ignore[no-untyped-def]
        if self.simulation is not None:
            self.simulation.reset_host_transfers()
            yield
            self.count = self.simulation.host_transfers
        elif self.device == "cuda":
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    yield
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            self.count = sum("synchroniz" in str(w.message) for w in caught)
        else:
            yield
            self.count = None


def _sync(device: str) -> None:
    module = getattr(torch, device, None)
    if device != "cpu" and module is not None and hasattr(module, "synchronize"):
        module.synchronize()


def _train_step(model: nn.Module, opt: torch.optim.Optimizer, tokens: torch.Tensor) -> torch.Tensor:
    opt.zero_grad(set_to_none=True)
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    return loss.detach()


def _setup(device: str, dtype: torch.dtype) -> tuple[nn.Module, torch.optim.Optimizer, torch.Tensor]:
    torch.manual_seed(0)
    model = TinyTransformer().to(device=device, dtype=dtype)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 256, (4, 33)).to(device)
    return model, opt, tokens


def _timed(device: str, steps: int, one_step: Callable[[int], None]) -> float:
    times = []
    for i in range(steps):
        _sync(device)
        start = time.perf_counter()
        one_step(i)
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _run_tool(name: str, device: str, dtype: torch.dtype, steps: int, dump: Path, counter: TransferCounter,
              plain_s: float) -> dict[str, Any]:
    from probes.pytorch import PrecisionDebugger
    from probes.pytorch.online_dispatch import PtdbgDispatch

    model, opt, tokens = _setup(device, dtype)
    _train_step(model, opt, tokens)  # warm-up outside the probe
    result: dict[str, Any] = {"tool": name, "dtype": str(dtype).replace("torch.", "")}
    transfers: list[int | None] = []
    if name.startswith("free_benchmark"):
        # the backward stage needs a list: the fused ops where torch_npu is there, their math elsewhere
        fused = ["npu_rms_norm", "npu_swiglu"] if model.fused.npu is not None else ["rsqrt", "silu"]
        section = {"improve_precision": {"pert_mode": "improve_precision", "rule": "scaled"},
                   "add_noise": {"pert_mode": "add_noise", "rule": "scaled"},
                   "backward": {"pert_mode": "improve_precision", "rule": "scaled", "fuzz_stage": "backward",
                                "list": ["linear", *fused]}}[name.split(":")[1]]
        dbg = PrecisionDebugger(config={"task": "free_benchmark", "dump_path": str(dump), "strict": True,
                                        "free_benchmark": section})

        def step(i: int) -> None:
            with counter.counting():
                dbg.start()
                try:
                    _train_step(model, opt, tokens)
                finally:
                    dbg.stop()
                dbg.step()
            transfers.append(counter.count)

        probed = _timed(device, steps, step)
        summary = dbg.summary()
        result["findings"] = sorted({r["api_name"].rsplit(".", 2)[0] for r in summary["flagged"]})
        result["checked"] = sum(s["checked"] for s in summary["apis"].values())
    elif name == "online_dispatch":
        disp = PtdbgDispatch(dump_mode="auto", dump_path=str(dump))

        def step(i: int) -> None:
            with counter.counting():
                with disp:
                    _train_step(model, opt, tokens)
            transfers.append(counter.count)

        probed = _timed(device, steps, step)
        summary = json.loads((Path(disp.run_dir) / "summary.json").read_text())
        result["findings"] = sorted({op["name"].rsplit("_", 1)[0] for op in summary["failed_ops"]})
        result["checked"] = summary["ops_compared"]
        result["errors"] = summary.get("errors") or {}
        if result["errors"]:
            raise RuntimeError(f"online_dispatch recorded errors: {result['errors']}")
    else:  # grad_probe
        dbg = PrecisionDebugger(config={"task": "grad_probe", "dump_path": str(dump), "strict": True,
                                        "grad_probe": {"grad_level": "L1"}})
        dbg.monitor(model)

        def step(i: int) -> None:
            with counter.counting():
                _train_step(model, opt, tokens)
            transfers.append(counter.count)

        try:
            probed = _timed(device, steps, step)
        finally:
            dbg.stop()
        rows = sorted((dump / "rank0").glob("grad_summary_*.csv"))
        result["findings"] = []
        result["checked"] = len(rows)
        if len(rows) != steps:
            raise RuntimeError(f"grad_probe wrote {len(rows)} step files for {steps} steps")
    result["ratio"] = probed / plain_s if plain_s > 0 else float("nan")
    counted = [t for t in transfers if t is not None]
    result["transfers_per_step"] = max(counted) if counted else None
    return result


def _plain(device: str, dtype: torch.dtype, steps: int, counter: TransferCounter) -> tuple[float, list[int]]:
    """Seconds per plain step and its host transfers (where countable)."""
    model, opt, tokens = _setup(device, dtype)
    _train_step(model, opt, tokens)
    transfers: list[int | None] = []

    def plain(i: int) -> None:
        with counter.counting():
            _train_step(model, opt, tokens)
        transfers.append(counter.count)

    seconds = _timed(device, steps, plain)
    return seconds, [t for t in transfers if t is not None]


TOOLS = ("free_benchmark:improve_precision", "free_benchmark:add_noise", "free_benchmark:backward",
         "online_dispatch", "grad_probe")


def run(device: str, dtypes: list[torch.dtype], steps: int, simulation: Any, out: Path) -> list[dict[str, Any]]:
    counter = TransferCounter(device, simulation)
    results = []
    for dtype in dtypes:
        plain_s, counted = _plain(device, dtype, steps, counter)
        results.append({"tool": "plain", "dtype": str(dtype).replace("torch.", ""), "ratio": 1.0,
                        "seconds_per_step": plain_s, "transfers_per_step": max(counted) if counted else None,
                        "findings": [], "checked": 0})
        for tool in TOOLS:
            dump = out / f"{tool.replace(':', '_')}_{results[-1]['dtype']}"
            try:
                results.append(_run_tool(tool, device, dtype, steps, dump, counter, plain_s))
            except Exception as exc:
                results.append({"tool": tool, "dtype": str(dtype).replace("torch.", ""), "crash":
                                f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
    return results


def _table(results: list[dict[str, Any]]) -> str:
    lines = [f"{'tool':34} {'dtype':9} {'ratio':>7} {'transfers/step':>14} {'checked':>8}  findings"]
    for r in results:
        if "crash" in r:
            lines.append(f"{r['tool']:34} {r['dtype']:9} CRASHED: {r['crash'].splitlines()[0][:120]}")
            continue
        t = r.get("transfers_per_step")
        lines.append(f"{r['tool']:34} {r['dtype']:9} {r['ratio']:7.2f} {('n/a' if t is None else t):>14} "
                     f"{r['checked']:>8}  {', '.join(r['findings']) or '-'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto", choices=("auto", "npu", "cuda", "cpu"))
    parser.add_argument("--simulate", action="store_true", help="run on the simulated NPU (implies --device npu)")
    parser.add_argument("--seed-defect", action="store_true",
                        help=f"with --simulate: {DEFECT_OP} computes in bfloat16; fail unless the tools name it")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated: float32, bfloat16, float16")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per configuration (default 3)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--verbose", action="store_true", help="keep the probes' log lines (one per finding)")
    args = parser.parse_args(argv)
    if not args.verbose:
        logging.getLogger("probes").setLevel(logging.ERROR)
    if args.seed_defect and not args.simulate:
        parser.error("--seed-defect needs --simulate (a real device's kernels cannot be seeded)")
    dtypes = [getattr(torch, name.strip()) for name in args.dtypes.split(",") if name.strip()]

    stack = contextlib.ExitStack()
    simulation = None
    if args.simulate:
        from pytest_msprobe.testing import simulated_npu

        defects = {DEFECT_OP: "reduced_precision"} if args.seed_defect else {}
        simulation = stack.enter_context(simulated_npu(defects=defects))
        device = "npu"
    else:
        from probes.backends.devices import resolve_device

        device = resolve_device(args.device)
    with stack, tempfile.TemporaryDirectory(prefix="msprobe_device_check_") as tmp:
        begin = time.perf_counter()
        results = run(device, dtypes, args.steps, simulation, Path(tmp))
        elapsed = time.perf_counter() - begin
    name = "simulated NPU" if args.simulate else device
    print(f"device_check on {name} ({', '.join(str(d).replace('torch.', '') for d in dtypes)}; "
          f"{args.steps} steps each; {elapsed:.0f} s)")
    print(_table(results))
    status = 0
    crashed = [r for r in results if "crash" in r]
    for r in crashed:
        print(f"\n--- {r['tool']} ({r['dtype']}) crashed ---\n{r['traceback']}", file=sys.stderr)
        status = 1
    if args.seed_defect:
        want = f"NPU.{DEFECT_OP}"
        for tool in ("free_benchmark:improve_precision", "online_dispatch"):
            hits = [r for r in results if r["tool"] == tool and r.get("dtype") == "float32"]
            if hits and want not in hits[0].get("findings", []):
                print(f"seeded defect not found: {tool} did not name {want}", file=sys.stderr)
                status = 1
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"device": name, "seconds": elapsed, "results": [
            {k: v for k, v in r.items() if k != "traceback"} for r in results]}, indent=1))
    return status


if __name__ == "__main__":
    sys.exit(main())
