"""Calibration of online_dispatch's scaled rule on PyTorch's own CPU kernels.

Runs real workloads forward and backward under ``PtdbgDispatch`` on the CPU, where every op is
re-run in float64, and collects the scaled figure (the CSV's ``Scaled Error (ulp)``: the error at
the output's scale in ulps of the output dtype, probes/core/scaled.py) of every float output leaf:

- the example models (examples/models.py: TransformerBlock, MLP) in fp32, bf16, fp16;
- a randomly initialised Hugging Face LlamaForCausalLM (2 layers, hidden 128, intermediate 256,
  4 heads, vocab 512; skipped without ``transformers``) in fp32, bf16;
- conv / norm / pool layers (Conv1d/2d, ConvTranspose2d, BatchNorm, GroupNorm, InstanceNorm,
  max / avg / adaptive pools);
- reductions over long rows (sum / mean / softmax / log_softmax / logsumexp / var / norm / cumsum
  over 1e5 elements, a sum over 1e6, a matmul with K = 16384) and elementwise math over wide ranges.

Per dtype it prints the distribution (max, p99.9, p99) of the figure over all output leaves, and
over the leaves the noise floor does not pass (probes/core/dispatch_metrics.py), the op with the
largest figure, and the threshold of ``DISPATCH_SCALED_THRESHOLD`` with its margin. Then the
seeded defect (tests/support/seeded_reduced.py: nn.Linear through an fp32 matmul whose inputs keep 10
mantissa bits, TF32-like, or 7, bf16-like) on the same fp32 models: the figure of the defective
matmuls and how many the default rule flags.

    python benchmarks/online_dispatch_calibration.py            # everything (~1-2 min on 2 cores)
    python benchmarks/online_dispatch_calibration.py --quick    # fewer workloads
"""

from __future__ import annotations

import argparse
import csv
import logging
import re
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "examples", ROOT / "tests" / "support"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from probes.core.thresholds import DISPATCH_SCALED_THRESHOLD, MACHINE_EPS  # noqa: E402
from probes.pytorch.online_dispatch import PtdbgDispatch  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_NAME = re.compile(r"^(?P<op>.+)_\d+_output(\.\d+)*$")


class Leaf:
    __slots__ = ("workload", "op", "dtype", "ulps", "max_abs", "floor", "ref_max", "failed", "message")

    def __init__(self, workload: str, row: dict[str, str]) -> None:
        m = _NAME.match(row["NPU Name"])
        self.workload = workload
        self.op = m.group("op") if m else row["NPU Name"]
        self.dtype = row["NPU Tensor Dtype"].replace("torch.", "")
        self.ulps = float(row["Scaled Error (ulp)"])
        self.max_abs = float(row["MaxAbsErr"])
        self.floor = float(row["Noise Floor"]) if row["Noise Floor"] else 0.0
        bench = [abs(float(row[k])) for k in ("Bench max", "Bench min") if row[k] not in ("", "nan", "inf", "-inf")]
        self.ref_max = max(bench) if bench else 0.0
        self.failed = row["FailedRule"]
        self.message = row["Err_message"]

    @property
    def above_floor(self) -> bool:
        """Not passed by the noise floor: judged by the rules."""
        return self.max_abs > self.floor

    @property
    def signal(self) -> bool:
        """The reference output is above the noise floor: not rounding noise of a value that is
        zero in exact arithmetic (the key-bias gradient; a conv bias before a norm layer)."""
        return self.ref_max > self.floor


# workloads ----------------------------------------------------------------------------------------
def _train(model: nn.Module, x: Any, loss_fn: Callable[[Any], torch.Tensor]) -> Callable[[PtdbgDispatch], None]:
    def run(disp: PtdbgDispatch) -> None:
        with disp:
            loss = loss_fn(model(x))
        with disp:
            loss.backward()

    return run


def example_transformer(dtype: torch.dtype) -> Callable[[PtdbgDispatch], None]:
    from models import TransformerBlock

    torch.manual_seed(0)
    model = TransformerBlock(d=32, heads=4).to(dtype)
    x = torch.randn(4, 16, 32, dtype=dtype)
    y = torch.randn(4, 16, 32)
    return _train(model, x, lambda out: F.mse_loss(out.float(), y))


def example_mlp(dtype: torch.dtype) -> Callable[[PtdbgDispatch], None]:
    from models import MLP

    torch.manual_seed(0)
    model = MLP().to(dtype)
    x = torch.randn(64, 32, dtype=dtype)
    y = torch.randint(0, 10, (64,))
    return _train(model, x, lambda out: F.cross_entropy(out.float(), y))


def llama(dtype: torch.dtype) -> Callable[[PtdbgDispatch], None] | None:
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        return None
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128)
    model = LlamaForCausalLM(config).to(dtype)
    ids = torch.randint(0, 512, (2, 32))
    return _train(model, ids, lambda out: out.logits.float().reshape(-1, 512)[:-1].log_softmax(-1).mean().neg())


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.c2 = nn.Conv2d(16, 32, 3, stride=2)
        self.gn = nn.GroupNorm(4, 32)
        self.up = nn.ConvTranspose2d(32, 8, 2, stride=2)
        self.c1d = nn.Conv1d(8, 8, 5, padding=2)
        self.inorm = nn.InstanceNorm1d(8, affine=True)
        self.head = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.max_pool2d(F.relu(self.bn(self.c1(x))), 2)
        h = F.avg_pool2d(F.silu(self.gn(self.c2(h))), 2, ceil_mode=True)
        h = self.up(h)
        h = self.inorm(self.c1d(h.flatten(2)))
        return self.head(F.adaptive_avg_pool1d(F.gelu(h), 1).squeeze(-1))


def conv_net(dtype: torch.dtype) -> Callable[[PtdbgDispatch], None]:
    torch.manual_seed(0)
    model = ConvNet().to(dtype)
    x = torch.randn(4, 3, 32, 32, dtype=dtype)
    y = torch.randint(0, 10, (4,))
    return _train(model, x, lambda out: F.cross_entropy(out.float(), y))


def reductions(dtype: torch.dtype) -> Callable[[PtdbgDispatch], None]:
    torch.manual_seed(0)
    n = 100_000
    # a positive row too (no cancellation), small enough that fp16 sums stay finite
    xs = [torch.randn(4, n, dtype=dtype).requires_grad_(), (torch.rand(4, n, dtype=dtype) * 0.3).requires_grad_()]
    big = torch.randn(1_000_000, dtype=dtype)
    a, b = torch.randn(32, 16384, dtype=dtype), torch.randn(16384, 32, dtype=dtype)

    def run(disp: PtdbgDispatch) -> None:
        with disp:
            losses = []
            for x in xs:
                losses += [x.sum(-1), x.mean(-1), torch.softmax(x, -1).pow(2).sum(-1), F.log_softmax(x, -1).mean(-1),
                           torch.logsumexp(x, -1), x.var(-1), x.std(-1), torch.linalg.vector_norm(x, dim=-1),
                           x.cumsum(-1)[:, -1], x.amax(-1), x.float().sum(-1)]
            big.sum()
            a @ b
            loss = torch.stack([v.float() for v in losses]).sum()
        with disp:
            loss.backward()

    return run


def elementwise(dtype: torch.dtype) -> Callable[[PtdbgDispatch], None]:
    torch.manual_seed(0)
    x = (torch.randn(64, 1024) * 4).to(dtype).requires_grad_()
    pos = (torch.rand(64, 1024) * 100 + 0.1).to(dtype).requires_grad_()
    wide = (torch.randn(64, 1024) * 1e3).to(dtype)

    def run(disp: PtdbgDispatch) -> None:
        with disp:
            outs = [torch.exp(x.clamp(max=10)), torch.tanh(x), torch.sigmoid(x), torch.erf(x), F.gelu(x),
                    F.gelu(x, approximate="tanh"), F.silu(x), F.softplus(x), torch.sin(x), torch.cos(x),
                    torch.log(pos), torch.sqrt(pos), torch.rsqrt(pos), pos.pow(1.7), torch.atan2(x, pos),
                    x / pos, torch.expm1(x.clamp(max=10)), torch.log1p(pos)]
            torch.sin(wide), torch.cos(wide)
            loss = sum(o.float().sum() for o in outs)
        with disp:
            loss.backward()

    return run


WORKLOADS: dict[str, tuple[Callable[[torch.dtype], Any], tuple[str, ...]]] = {
    "example TransformerBlock": (example_transformer, ("float32", "bfloat16", "float16")),
    "example MLP": (example_mlp, ("float32", "bfloat16", "float16")),
    "LlamaForCausalLM 2x128": (llama, ("float32", "bfloat16")),
    "conv/norm/pool": (conv_net, ("float32", "bfloat16", "float16")),
    "long reductions": (reductions, ("float32", "bfloat16", "float16")),
    "elementwise math": (elementwise, ("float32", "bfloat16", "float16")),
}
QUICK = ("example TransformerBlock", "LlamaForCausalLM 2x128", "long reductions")


def collect(workload: str, run: Callable[[PtdbgDispatch], None], root: str) -> list[Leaf]:
    disp = PtdbgDispatch(dump_mode="OFF", dump_path=root, debug=True, background=False)
    run(disp)
    (path,) = disp.run_dir.glob("compare_result_rank*.csv")
    with open(path, encoding="utf-8-sig", newline="") as fh:
        rows = list(csv.DictReader(fh))
    return [Leaf(workload, r) for r in rows if "_output" in r["NPU Name"] and r["Scaled Error (ulp)"] not in ("", None)]


# report -------------------------------------------------------------------------------------------
def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q, method="higher")) if values.size else float("nan")


def distribution(leaves: list[Leaf]) -> dict[str, Any]:
    v = np.array([leaf.ulps for leaf in leaves])
    worst = max(leaves, key=lambda leaf: leaf.ulps) if leaves else None
    return {"n": int(v.size), "max": float(v.max()) if v.size else float("nan"), "p99.9": _pct(v, 99.9),
            "p99": _pct(v, 99), "worst": f"{worst.op} ({worst.workload})" if worst else ""}


def print_calibration(leaves: list[Leaf]) -> None:
    print("\nScaled figure of PyTorch's CPU kernels against float64, in ulps of the output dtype")
    print("all: every float output leaf; signal: leaves whose reference is above the noise floor (not the")
    print("rounding noise of an exact zero); judged: leaves the noise floor does not pass (the rules decide)\n")
    header = (f"{'dtype':<9} {'leaves':>6} {'max':>8} {'p99.9':>7} {'p99':>6} | {'signal':>6} {'max':>8} {'p99.9':>7} "
              f"{'p99':>6} | {'judged':>6} {'max':>6} | {'threshold':>9} {'margin':>7}")
    print(header)
    print("-" * len(header))
    for name in ("float32", "bfloat16", "float16"):
        mine = [leaf for leaf in leaves if leaf.dtype == name]
        if not mine:
            continue
        d_all = distribution(mine)
        d_sig = distribution([leaf for leaf in mine if leaf.signal])
        d_j = distribution([leaf for leaf in mine if leaf.above_floor])
        thr = DISPATCH_SCALED_THRESHOLD[name] / MACHINE_EPS[name]
        margin = thr / d_sig["p99.9"] if d_sig["n"] and d_sig["p99.9"] > 0 else float("inf")
        judged_max = f"{d_j['max']:>6.3g}" if d_j["n"] else f"{'-':>6}"
        print(f"{name:<9} {d_all['n']:>6} {d_all['max']:>8.3g} {d_all['p99.9']:>7.3g} {d_all['p99']:>6.3g} | "
              f"{d_sig['n']:>6} {d_sig['max']:>8.3g} {d_sig['p99.9']:>7.3g} {d_sig['p99']:>6.3g} | "
              f"{d_j['n']:>6} {judged_max} | {thr:>9.4g} {margin:>6.1f}x")
    print("(margin: threshold over the signal leaves' p99.9)")
    print("\nLargest figures per dtype (op [workload] ulps, reference max / noise floor):")
    for name in ("float32", "bfloat16", "float16"):
        ranked = sorted((leaf for leaf in leaves if leaf.dtype == name), key=lambda x: -x.ulps)
        shown: list[str] = []
        ops: set[str] = set()
        for leaf in ranked:
            if leaf.op in ops:
                continue
            ops.add(leaf.op)
            ratio = leaf.ref_max / leaf.floor if leaf.floor > 0 else float("inf")
            shown.append(f"{leaf.op} [{leaf.workload}] {leaf.ulps:.3g} ({ratio:.2g})")
            if len(shown) == 5:
                break
        if shown:
            print(f"  {name}: " + "; ".join(shown))
    failed = [leaf for leaf in leaves if leaf.failed]
    overflow = [leaf for leaf in failed if "inf/nan differ" in leaf.message]
    precision = [leaf for leaf in failed if leaf not in overflow]
    print(f"\nclean kernels flagged by the default rule for precision: {len(precision)}"
          + (": " + ", ".join(sorted({f'{x.op} ({x.dtype}, {x.failed})' for x in precision})) if precision else ""))
    if overflow:
        print(f"flagged for inf/NaN where float64 is finite (the dtype's range, both rules): {len(overflow)}: "
              + ", ".join(sorted({f"{x.op} ({x.dtype}, {x.workload})" for x in overflow})))


def defects(root: str, quick: bool) -> None:
    """The seeded reduced-precision linear on the fp32 models: the figure of each defective matmul."""
    import seeded_reduced

    class Patch:
        def __init__(self) -> None:
            self.saved: list[tuple[Any, str, Any]] = []

        def setattr(self, obj: Any, name: str, value: Any) -> None:
            self.saved.append((obj, name, getattr(obj, name)))
            setattr(obj, name, value)

        def undo(self) -> None:
            for obj, name, value in reversed(self.saved):
                setattr(obj, name, value)

    print("\nSeeded defect: nn.Linear through an fp32 matmul of inputs rounded to k mantissa bits (fp32 ulps)")
    header = f"{'workload':<26} {'bits':>4} {'matmuls':>7} {'min':>8} {'median':>8} {'max':>8}  {'flagged':>7}  ops failing"
    print(header)
    print("-" * len(header))
    names = [w for w in ("example TransformerBlock", "example MLP", "LlamaForCausalLM 2x128", "conv/norm/pool")
             if not quick or w in QUICK]
    for bits in (10, 7):
        for workload in names:
            patch = Patch()
            seeded_reduced.install_reduced_linear(patch, mantissa_bits=bits)
            try:
                run = WORKLOADS[workload][0](torch.float32)
                if run is None:
                    continue
                leaves = collect(workload, run, root)
            finally:
                patch.undo()
            mm = [leaf for leaf in leaves if leaf.op == "reduced_mm"]
            v = np.array([leaf.ulps for leaf in mm])
            flagged = sum(1 for leaf in mm if leaf.failed)
            others = sorted({leaf.op for leaf in leaves if leaf.failed and leaf.op != "reduced_mm"})
            print(f"{workload:<26} {bits:>4} {len(mm):>7} {v.min():>8.4g} {np.median(v):>8.4g} {v.max():>8.4g}  "
                  f"{flagged:>3}/{len(mm):<3}  {', '.join(others) or '-'}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the example transformer, Llama and the reductions only")
    ap.add_argument("--no-defects", action="store_true", help="skip the seeded-defect table")
    args = ap.parse_args(argv)
    logging.getLogger("probes").setLevel(logging.ERROR)
    t0 = time.perf_counter()
    leaves: list[Leaf] = []
    skipped: list[str] = []
    with tempfile.TemporaryDirectory() as root:
        for workload, (make, dtypes) in WORKLOADS.items():
            if args.quick and workload not in QUICK:
                continue
            for name in dtypes:
                try:
                    run = make(DTYPES[name])
                    if run is None:
                        skipped.append(f"{workload} ({name}): transformers not installed")
                        continue
                    got = collect(f"{workload} {name}", run, root)
                except (RuntimeError, NotImplementedError) as exc:  # a dtype without CPU kernels
                    skipped.append(f"{workload} ({name}): {type(exc).__name__}: {str(exc).splitlines()[0][:100]}")
                    continue
                leaves += got
        print_calibration(leaves)
        if not args.no_defects:
            defects(root, args.quick)
    if skipped:
        print("\nskipped: " + "; ".join(skipped))
    by_dtype: dict[str, int] = defaultdict(int)
    for leaf in leaves:
        by_dtype[leaf.dtype] += 1
    print(f"\n{len(leaves)} output leaves ({dict(by_dtype)}); {time.perf_counter() - t0:.0f} s; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    return 0


if __name__ == "__main__":
    sys.exit(main())
