"""Examples per second of Hypothesis tests driven by pytest_msprobe.api.strategies, API call included.

The issue's target: generated per-API tests run at least 20 Hypothesis examples per second for
elementwise APIs on small tensors. Each row is one `@given(api_inputs(api, dtype))` test that calls
the API, run for --examples examples (generation only: no shrinking, nothing fails); the rate is
examples / wall time. Two references run in the same process, so the figures can be read on a
loaded machine: `plain hypothesis` (a test drawing a list of 10 floats and calling nothing, the
engine's own ceiling here) and `hnp.arrays fp16` (Hypothesis's numpy arrays with per-cell fp16
elements, the textbook alternative to our few-draws arrays).

    python benchmarks/strategies_speed.py                  # ~1 min on 2 idle cores
    python benchmarks/strategies_speed.py --examples 100 --apis Torch.exp,Torch.add
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

from pytest_msprobe.api.inputs import api_inputs, resolve_api  # noqa: E402
from pytest_msprobe.api.strategies import shapes  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "strategies_speed.json"
TARGET = 20.0  # examples per second, elementwise APIs on small tensors
ELEMENTWISE = ("Torch.exp", "Torch.add", "Functional.gelu", "Tensor.__mul__", "Torch.div")
OTHERS = ("Functional.softmax", "Torch.matmul", "Functional.layer_norm", "Functional.conv2d")
DTYPES = ("float32", "float16", "bfloat16")


def _rate(strategy: Any, body: Callable[[Any], None], examples: int) -> float:
    count = [0]

    @settings(max_examples=examples, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def test(value: Any) -> None:
        count[0] += 1
        body(value)

    start = time.perf_counter()
    test()
    return count[0] / (time.perf_counter() - start)


def _call(fn: Callable[..., Any]) -> Callable[[Any], None]:
    def body(args_kwargs: Any) -> None:
        args, kwargs = args_kwargs
        fn(*args, **kwargs)

    return body


def measure(apis: list[str], examples: int) -> list[dict[str, Any]]:
    rows = [{"api": "plain hypothesis", "dtype": "-", "kind": "reference",
             "rate": _rate(st.lists(st.floats(), max_size=10), lambda v: None, examples)}]
    naive = hnp.arrays("float16", shapes(), elements=st.floats(width=16, allow_nan=False, allow_infinity=False))
    rows.append({"api": "hnp.arrays fp16 + exp", "dtype": "float16", "kind": "reference",
                 "rate": _rate(naive, lambda a: torch.exp(torch.from_numpy(a)), examples)})
    for api in apis:
        fn = resolve_api(api)
        kind = "elementwise" if api in ELEMENTWISE else "structured"
        for dtype in DTYPES:
            _rate(api_inputs(api, dtype), _call(fn), 3)  # warm-up: first kernels, lazy imports
            rows.append({"api": api, "dtype": dtype, "kind": kind,
                         "rate": _rate(api_inputs(api, dtype), _call(fn), examples)})
    for r in rows:
        r["verdict"] = "ok" if r["kind"] != "elementwise" or r["rate"] >= TARGET else "SLOW"
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=200, help="examples per row (default 200)")
    ap.add_argument("--apis", default=",".join(ELEMENTWISE + OTHERS), help="comma list of API names")
    ap.add_argument("--json", default=str(RESULTS), help="where to write the JSON results")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # small tensors: threads only add overhead and noise
    load_before = os.getloadavg()[0]
    rows = measure([a for a in args.apis.split(",") if a], args.examples)
    print(f"{'api':<26}{'dtype':<10}{'kind':<13}{'examples/s':>11}  target")
    for r in rows:
        target = f">={TARGET:g} {r['verdict']}" if r["kind"] == "elementwise" else ""
        print(f"{r['api']:<26}{r['dtype']:<10}{r['kind']:<13}{r['rate']:>11.1f}  {target}")
    load = (load_before, os.getloadavg()[0])
    print(f"load average (1 min) before/after: {load[0]:.1f}/{load[1]:.1f} on {os.cpu_count()} cores")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"examples": args.examples, "target": TARGET, "load_average": load,
                               "torch": torch.__version__, "rows": rows}, indent=1))
    return 0 if all(r["verdict"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
