"""Measure one catalogue case: ulp errors against a float64 CPU reference, and free_benchmark's verdict.

For each of the case's sample inputs (made on the CPU in the case's dtype, so every value is
exact in it, then moved to the device under test):

* the API runs on the device, through its public name looked up at call time (a probe or a
  seeded defect patched onto the name is what runs);
* the same API runs on the CPU on the inputs raised to float64 (or complex128): the reference;
* every floating output leaf is brought to the host once and scored in ulps of its dtype
  (probes.core.ulps: zeros, subnormals and cancellation are treated there).

Then the samples run again on the device under free_benchmark with pert_mode improve_precision
and `list` set to the API alone: the verdict is "pass" (checked, nothing flagged), "flagged",
"not checked" (with the probe's reason) or "n/a" (the probe never re-runs this API, or the rule
cannot judge this dtype).

On the CPU the measurement runs with one intra-op thread: a reduction's order, and so its last
bits, then depend on neither the machine's core count nor pytest-xdist, and goldens compare.
"""

from __future__ import annotations

import functools
import warnings
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import numpy as np

from probes.core.accumulation import accumulation_ratio
from probes.core.errors import ConfigError
from probes.core.trees import iter_leaves, tree_map
from probes.core.ulps import ULP_DTYPES, ulp_errors
from pytest_msprobe.catalogue import accumulating, fp8_ops, npu_ops
from pytest_msprobe.catalogue.draws import draw_examples
from pytest_msprobe.catalogue.measurement import (
    Failure,
    ProbeCannotJudge,
    free_benchmark_verdict_of,
    measure_samples,
)
from pytest_msprobe.catalogue.mindspore_ops import measure_mindspore
from pytest_msprobe.catalogue.records import NOT_APPLICABLE, SAMPLES, CatalogueCase, CatalogueResult


# samples ----------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _opinfo_entries() -> dict[str, Any]:
    from pytest_msprobe.catalogue.opinfo_ops import build_corpus

    entries, _ = build_corpus()
    return {e.name: e for e in entries}


# Reductions and products are also measured once at a realistic length: accumulation errors (a
# half-precision running sum, reduced-precision products) grow with the number of terms and hide
# in the few-element samples that test suites use. API table form -> first input's shape.
LONG_SHAPES = {"reduce": (4, 1024), "unary_dim": (4, 1024), "matmul": (16, 1024), "linear": (16, 1024),
               "addmm": (16, 1024), "bmm": (2, 16, 1024)}
# forms whose long sample reduces along its last (1,024-long) axis: an error of its own per row
REDUCING_FORMS = ("reduce", "unary_dim")


def torch_samples(case: CatalogueCase, count: int = SAMPLES) -> list[tuple[Callable[..., Any], Any, tuple, dict]]:
    """(call, inp, args, kwargs) per sample, inputs on the CPU in the case's dtype; `call(inp,
    args, kwargs)` runs the API through its public name, looked up at call time."""
    import torch

    torch.manual_seed(case.seed)
    dtype = getattr(torch, case.dtype)
    if case.source == "npu":
        run = npu_ops.call(case.ref)
        return [(run, *s) for s in npu_ops.samples(case.ref, dtype, count)]
    if case.source == "fp8":
        run = fp8_ops.call(case.api)
        return [(run, *s) for s in fp8_ops.samples(case, count)]
    if case.source == "opinfo":
        entry = _opinfo_entries()[case.ref]
        samples: list[tuple[Callable[..., Any], Any, tuple, dict]] = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for s in entry.opinfo.sample_inputs("cpu", dtype, requires_grad=False):
                samples.append((entry.call, s.input, tuple(s.args), dict(s.kwargs)))
                if len(samples) >= count:
                    break
        return samples + _long_sample(case, case.key)
    from pytest_msprobe.api.strategies import api_inputs

    drawn = draw_examples(api_inputs(case.ref, case.dtype), count + 1, case.seed)[1:]  # not the all-zero first
    return [(_public(case.ref), args[0], tuple(args[1:]), kwargs) for args, kwargs in drawn] + _long_sample(
        case, case.ref)


def _public(name: str) -> Callable[..., Any]:
    from pytest_msprobe.api.inputs import resolve_api

    def call(inp: Any, args: tuple, kwargs: dict) -> Any:
        return resolve_api(name)(inp, *args, **kwargs)

    return call


def _long_sample(case: CatalogueCase, name: str) -> list[tuple[Callable[..., Any], Any, tuple, dict]]:
    """The long sample of an API of the table whose form accumulates (LONG_SHAPES), else []."""
    from pytest_msprobe.api.inputs import api_spec
    from pytest_msprobe.api.strategies import api_inputs

    try:
        row = api_spec(name)
    except ConfigError:
        return []
    shape = LONG_SHAPES.get(row.form)
    if shape is None or not row.rank[0] <= len(shape) <= row.rank[1]:
        return []
    (args, kwargs), = draw_examples(api_inputs(row.name, case.dtype, shapes=shape), 3, case.seed + 1)[-1:]
    args = _spread(args, row, case.seed)
    if row.form in REDUCING_FORMS:  # along the long axis, one sum per row: several chances to show
        kwargs = {**kwargs, "dim": -1}
    return [(_public(row.name), args[0], tuple(args[1:]), kwargs)]


def _spread(args: tuple, row: Any, seed: int) -> tuple:
    """The drawn structure (shapes, dims, flags) with every float input refilled by seeded values
    spread over its domain: Hypothesis favours special values (repeats, tiny ones), and an
    accumulation error shows on typical ones."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    out, position = [], 0
    for a in args:
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            domain = row.domain(position)
            position += 1
            u = torch.rand(a.shape, generator=gen, dtype=torch.float64)
            values = domain.lo + (domain.hi - domain.lo) * u
            if domain.symmetric:
                values = torch.where(torch.rand(a.shape, generator=gen) < 0.5, -values, values)
            a = values.to(a.dtype)
        out.append(a)
    return tuple(out)


# measuring ------------------------------------------------------------------------------------
@contextmanager
def _single_thread(device: str) -> Iterator[None]:
    import torch

    if device != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _float_leaves(tree: Any) -> dict[tuple, Any]:
    import torch

    out = {}
    for path, leaf in iter_leaves(tree):
        if isinstance(leaf, torch.Tensor) and (leaf.is_floating_point() or leaf.is_complex()):
            out[path] = leaf
    return out


def _dtype_name(t: Any) -> str | None:
    import torch

    if t.is_complex():
        return {torch.complex32: "float16", torch.complex64: "float32", torch.complex128: "float64"}.get(t.dtype)
    name = str(t.dtype).replace("torch.", "")
    return name if name in ULP_DTYPES else None


def _host(t: Any) -> np.ndarray:
    import torch

    t = t.detach()
    if t.layout != torch.strided:
        t = t.to_dense()
    if t.is_complex():
        t = torch.view_as_real(t.resolve_conj())
    return t.to("cpu", torch.float64).numpy()


def sample_errors(out: Any, ref: Any) -> list[np.ndarray]:
    """ulp errors of every floating output leaf of one sample against its reference leaf."""
    errors = []
    refs = _float_leaves(ref)
    for path, leaf in _float_leaves(out).items():
        r = refs.get(path)
        name = _dtype_name(leaf)
        if r is None or name is None or tuple(r.shape) != tuple(leaf.shape):
            continue
        errors.append(ulp_errors(_host(leaf), _host(r), name).reshape(-1))
    return errors


def sample_ratios(kind: str, call: Callable[..., Any], ref_in: tuple, out: Any, ref: Any) -> list[np.ndarray]:
    """Accumulation test ratios (probes.core.accumulation) of every floating output leaf of one
    sample: the terms' magnitude and number come from the operator run in float64 on the
    inputs' absolute values and on all-ones inputs (pytest_msprobe.catalogue.accumulating)."""
    import torch

    def floats(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        return lambda x: fn(x) if isinstance(x, torch.Tensor) and x.is_floating_point() else x

    inp, args, kwargs = ref_in
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        magnitudes = _float_leaves(call(*tree_map(floats(torch.abs), (inp, args, accumulating.positive_coefficients(kwargs)))))
        ones = (_float_leaves(call(*tree_map(floats(torch.ones_like), (inp, args, kwargs))))
                if kind == accumulating.PRODUCTS else {})
    first = next((t for _, t in iter_leaves((inp, args)) if isinstance(t, torch.Tensor)), None)
    refs = _float_leaves(ref)
    ratios = []
    for path, leaf in _float_leaves(out).items():
        r, m, name = refs.get(path), magnitudes.get(path), _dtype_name(leaf)
        if r is None or m is None or name is None or leaf.is_complex() or tuple(m.shape) != tuple(leaf.shape):
            continue
        count = accumulating.term_count(kind, _host(ones[path]) if path in ones else None,
                                        first.numel() if first is not None else 1, leaf.numel())
        ratios.append(accumulation_ratio(_host(leaf), _host(r), _host(m), count, name))
    return ratios


def _to_device(tree: Any, device: str) -> Any:
    import torch

    if device == "cpu":
        return tree
    return tree_map(lambda x: x.to(device) if isinstance(x, torch.Tensor) else x, tree)


class TorchFramework:
    """PyTorch's part of the shared measurement (pytest_msprobe.catalogue.measurement): a sample
    is (call, inp, args, kwargs) of torch_samples, run on copies so an in-place API leaves it as
    drawn for the next run."""

    def __init__(self, device: str, probe_config: Any = None) -> None:
        self.device = device
        self.probe_config = probe_config

    def reference(self, sample: tuple) -> Any:
        from pytest_msprobe.catalogue.opinfo_ops import copy_tree, upcast

        call, inp, args, kwargs = sample
        return call(*tree_map(upcast, copy_tree((inp, args, kwargs))))

    def run(self, sample: tuple) -> Any:
        from pytest_msprobe.catalogue.opinfo_ops import copy_tree

        call, inp, args, kwargs = sample
        return call(*_to_device(copy_tree((inp, args, kwargs)), self.device))

    def errors(self, out: Any, ref: Any) -> list[np.ndarray]:
        return sample_errors(out, ref)

    def ratios(self, kind: str, sample: tuple, out: Any, ref: Any) -> list[np.ndarray]:
        from pytest_msprobe.catalogue.opinfo_ops import copy_tree, upcast

        call, inp, args, kwargs = sample
        return sample_ratios(kind, call, tree_map(upcast, copy_tree((inp, args, kwargs))), out, ref)

    def nothing_to_measure(self, case: CatalogueCase, failures: list[Failure]) -> str | None:
        if any(not f.on_reference for f in failures):
            return None  # the device run raises: a row of its own (broken against a golden that measured it)
        why = failures[0].text if failures else "no floating-point output"
        return f"{case.api} ({case.dtype}): nothing to measure: {why}"

    def verdict(self, case: CatalogueCase, samples: list[tuple]) -> tuple[str, str]:
        return free_benchmark_verdict(case, self.device, samples, self.probe_config)


def measure_torch(case: CatalogueCase, device: str, probe_config: Any = None, samples: int = SAMPLES,
                  verdict: bool = True) -> CatalogueResult:
    """Measure a PyTorch case (module docstring); NothingToMeasure when there is nothing to score."""
    with _single_thread(device):
        return measure_samples(case, TorchFramework(device, probe_config), torch_samples(case, samples), verdict)


def free_benchmark_verdict(case: CatalogueCase, device: str, inputs: list[tuple],
                           probe_config: Any = None) -> tuple[str, str]:
    """Run the samples on the device under free_benchmark improve_precision, `list` = the API."""
    from probes.pytorch import PrecisionDebugger
    from pytest_msprobe.catalogue.opinfo_ops import copy_tree

    if case.exclusion:
        return NOT_APPLICABLE, f"free_benchmark never re-runs {case.key}: {case.exclusion}"

    def debugger_for(dump_path: str) -> Any:
        config = probe_config
        if config is None:
            from probes.core.config import load_config

            config = load_config(None, task="free_benchmark", dump_path=dump_path, overrides={
                "pert_mode": "improve_precision", "list": [case.key], "rule": "scaled"})
        if case.dtype == "float32" and config.free_benchmark.rule == "reference":
            raise ProbeCannotJudge("msprobe's ratio rule has nothing to upcast in float32 (--msprobe-rule=scaled does)")
        return PrecisionDebugger(config=config)

    def rerun(call: Callable[..., Any], inp: Any, args: tuple, kwargs: dict) -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return call(*_to_device(copy_tree((inp, args, kwargs)), device))

    return free_benchmark_verdict_of(case.key, debugger_for, (functools.partial(rerun, *s) for s in inputs))


def measure(case: CatalogueCase, device: str, probe_config: Any = None, samples: int = SAMPLES) -> CatalogueResult:
    """Measure a case on its framework: PyTorch's on `device`, MindSpore's on its configured target."""
    if case.framework == "mindspore":
        return measure_mindspore(case, samples)
    return measure_torch(case, device, probe_config, samples)


