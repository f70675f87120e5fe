"""Where the accumulation test ratio's limit comes from (probes/core/accumulation.py, RATIO_LIMIT).

    python benchmarks/calibrate_accumulation.py                # this process's kernel paths, ~20 s
    python benchmarks/calibrate_accumulation.py --all-paths    # also every ISA path MKL / oneDNN / ATen take
    python benchmarks/calibrate_accumulation.py --json out.json

For matrix products (M x K @ K x N) and sums (K terms per output) in float32, float16 and
bfloat16, on four kinds of inputs (signed uniform, one-signed uniform, normal, signed
log-uniform over 16 binades) and K = 1 .. 4,096, it measures the largest test ratio of

* correct kernels: PyTorch's CPU kernels, NumPy's (OpenBLAS / pairwise sums), a naive
  left-to-right sum with every addition rounded to the accumulation dtype (the worst order a real
  kernel uses), and for the half types the float32 accumulation rounded once at the end;
* reduced-precision kernels that no correct kernel is: float32 products on TF32-, bfloat16- and
  float16-rounded inputs; half-precision sums and products whose running total is kept in the
  half type itself.

It prints, per dtype, the largest ratio of any correct kernel and the smallest of any defect (K >=
8: a sum of two half-precision terms is correctly rounded whatever it accumulates in), and exits non-zero when RATIO_LIMIT does not lie
between them. `--all-paths` reruns the measurement under ATEN_CPU_CAPABILITY = default / avx2,
MKL_CBWR = COMPATIBLE / AVX2 and ONEDNN_MAX_CPU_ISA = SSE41 / AVX2: the code paths other CPUs
(AMD, older Intel) take, so the limit is calibrated on more than this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from probes.core.accumulation import RATIO_LIMIT, accumulation_ratio  # noqa: E402
from probes.core.ulps import round_to  # noqa: E402

LENGTHS = (1, 2, 8, 32, 128, 512, 1024, 4096)
# a sum of two half-precision terms is correctly rounded whatever it accumulates in: a defect shows from 8
MIN_DEFECT_K = 8
DATA = ("signed", "positive", "normal", "log-spread")
DTYPES = ("float32", "float16", "bfloat16")
PATHS = {
    "native": {},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "generic": {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "SSE41"},
}


def draw(kind: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if kind == "signed":
        return rng.uniform(-1.0, 1.0, shape)
    if kind == "positive":
        return rng.uniform(0.0, 1.0, shape)
    if kind == "normal":
        return rng.standard_normal(shape)
    return np.exp2(rng.uniform(-8.0, 8.0, shape)) * rng.choice([-1.0, 1.0], shape)


def to_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    """x rounded to `dtype`, as float64."""
    return round_to(x, dtype)


def running_sum(terms: np.ndarray, dtype: str) -> np.ndarray:
    """Sum over the last axis left to right, every partial sum rounded to `dtype`."""
    acc = np.zeros(terms.shape[:-1])
    for k in range(terms.shape[-1]):
        acc = to_dtype(acc + terms[..., k], dtype)
    return acc


def tf32(x: np.ndarray) -> np.ndarray:
    bits = x.astype(np.float32).view(np.int32).astype(np.int64)
    return ((bits + 0x1000) & ~0x1FFF).astype(np.int32).view(np.float32).astype(np.float64)


def product_kernels(dtype: str) -> dict[str, tuple[bool, object]]:
    """name -> (correct?, fn(a, b) -> out as float64), a and b exact in `dtype`."""
    import torch

    tdt = getattr(torch, dtype)

    def torch_mm(a, b):
        return torch.matmul(torch.from_numpy(a).to(tdt), torch.from_numpy(b).to(tdt)).double().numpy()

    def terms(a, b, rounding):
        return rounding(np.einsum("mk,kn->mnk", a, b))  # each product rounded as the kernel would

    kernels: dict[str, tuple[bool, object]] = {"torch": (True, torch_mm)}
    if dtype == "float32":
        kernels["numpy"] = (True, lambda a, b: (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float64))
        kernels["left-to-right"] = (True, lambda a, b: running_sum(terms(a, b, lambda p: to_dtype(p, dtype)), dtype))
        kernels["TF32 inputs"] = (False, lambda a, b: torch_mm(tf32(a), tf32(b)))
        kernels["bfloat16 inputs"] = (False, lambda a, b: torch_mm(to_dtype(a, "bfloat16"), to_dtype(b, "bfloat16")))
        kernels["float16 inputs"] = (False, lambda a, b: torch_mm(to_dtype(a, "float16"), to_dtype(b, "float16")))
    else:
        kernels["float32 left-to-right"] = (True, lambda a, b: to_dtype(
            running_sum(terms(a, b, lambda p: to_dtype(p, "float32")), "float32"), dtype))
        kernels[f"{dtype} left-to-right"] = (False, lambda a, b: running_sum(
            terms(a, b, lambda p: to_dtype(p, dtype)), dtype))
    return kernels


def sum_kernels(dtype: str) -> dict[str, tuple[bool, object]]:
    import torch

    tdt = getattr(torch, dtype)
    kernels: dict[str, tuple[bool, object]] = {
        "torch": (True, lambda x: torch.from_numpy(x).to(tdt).sum(-1).double().numpy())}
    if dtype == "float32":
        kernels["numpy"] = (True, lambda x: x.astype(np.float32).sum(-1).astype(np.float64))
        kernels["left-to-right"] = (True, lambda x: running_sum(x, dtype))
    else:
        kernels["float32 left-to-right"] = (True, lambda x: to_dtype(running_sum(x, "float32"), dtype))
        kernels[f"{dtype} left-to-right"] = (False, lambda x: running_sum(x, dtype))
    return kernels


def measure(seeds: int = 3) -> list[dict]:
    import torch

    torch.set_num_threads(1)
    rows = []
    for dtype in DTYPES:
        for op, kernels in (("matmul", product_kernels(dtype)), ("sum", sum_kernels(dtype))):
            for name, (correct, fn) in kernels.items():
                for k in LENGTHS:
                    worst = 0.0
                    for kind in DATA:
                        for seed in range(seeds):
                            rng = np.random.default_rng([seed, k, DATA.index(kind)])
                            if op == "matmul":
                                a = to_dtype(draw(kind, (16, k), rng), dtype)
                                b = to_dtype(draw(kind, (k, 32), rng), dtype)
                                ref, mag, out = a @ b, np.abs(a) @ np.abs(b), fn(a, b)
                            else:
                                x = to_dtype(draw(kind, (256, k), rng), dtype)
                                ref, mag, out = x.sum(-1), np.abs(x).sum(-1), fn(x)
                            worst = max(worst, float(accumulation_ratio(out, ref, mag, k, dtype).max()))
                    rows.append({"op": op, "dtype": dtype, "kernel": name, "correct": correct, "K": k, "ratio": worst})
    return rows


def summarise(rows: list[dict]) -> bool:
    ok = True
    for dtype in DTYPES:
        mine = [r for r in rows if r["dtype"] == dtype]
        correct = max((r for r in mine if r["correct"]), key=lambda r: r["ratio"])
        defects = [r for r in mine if not r["correct"] and r["K"] >= MIN_DEFECT_K]
        weakest = min(defects, key=lambda r: r["ratio"])
        limit = RATIO_LIMIT[dtype]
        fits = correct["ratio"] < limit < weakest["ratio"]
        ok &= fits
        print(f"{dtype}: correct kernels <= {correct['ratio']:.3g} ({correct['op']} {correct['kernel']} K={correct['K']}"
              f"{' ' + correct['path'] if 'path' in correct else ''}); defects >= {weakest['ratio']:.3g} "
              f"({weakest['op']} {weakest['kernel']} K={weakest['K']}); limit {limit}: {'fits' if fits else 'DOES NOT FIT'}")
    return ok


def table(rows: list[dict]) -> None:
    keys = sorted({(r["dtype"], r["op"], r["kernel"], r["correct"]) for r in rows},
                  key=lambda t: (DTYPES.index(t[0]), t[1], not t[3], t[2]))
    print(f"{'dtype':9} {'op':6} {'kernel':24} {'ok':3} " + " ".join(f"K={k:<6}" for k in LENGTHS))
    for dtype, op, kernel, correct in keys:
        by_k = {}
        for r in rows:
            if (r["dtype"], r["op"], r["kernel"]) == (dtype, op, kernel):
                by_k[r["K"]] = max(by_k.get(r["K"], 0.0), r["ratio"])
        print(f"{dtype:9} {op:6} {kernel:24} {'yes' if correct else 'no':3} "
              + " ".join(f"{by_k.get(k, float('nan')):<8.3g}" for k in LENGTHS))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--all-paths", action="store_true", help="rerun under the other CPUs' kernel paths too")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--rows-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    rows = measure()
    if args.rows_only:
        print(json.dumps(rows))
        return 0
    for r in rows:
        r["path"] = "native"
    if args.all_paths:
        for path, env in PATHS.items():
            if path == "native":
                continue
            done = subprocess.run([sys.executable, __file__, "--rows-only"], env={**os.environ, **env},
                                  capture_output=True, text=True, check=True)
            for r in json.loads(done.stdout):
                if r["kernel"] == "torch":  # only PyTorch's kernels change with the path
                    rows.append(dict(r, path=path))
    table(rows)
    fits = summarise(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0 if fits else 1


if __name__ == "__main__":
    sys.exit(main())
