"""online_dispatch's scaled rule: a dtype-aware verdict next to msprobe's rule.

The documented rule (Cosine / MaxAbsErr) is blind to an fp32 kernel that computes in reduced
precision and to a small scale error; the scaled rule (the error at the output's scale, in ulps
of the output dtype) is not. Default rule="both": a leaf fails when either rule fails it.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import seeded_dispatch  # noqa: F401  (registers the seeded_dispatch:: custom ops)
import seeded_reduced
import torch
import torch.nn as nn
import torch.nn.functional as F
from repo_paths import REPO, SUPPORT

from probes.backends.torch_backend import BACKEND
from probes.core import dispatch_metrics as dm
from probes.core import scaled
from probes.core.errors import ConfigError
from probes.core.thresholds import DISPATCH_SCALED_THRESHOLD
from probes.online_dispatch.results import COLUMNS, EXTRA_COLUMNS
from probes.pytorch.online_dispatch import PtdbgDispatch
from pytest_msprobe.tools.online_dispatch import dispatch_arguments, dispatch_failure_message

XP = BACKEND.namespace(None)
ROOT = REPO


def read_csv(run_dir: Path) -> tuple[list[str], list[dict[str, str]]]:
    (path,) = run_dir.glob("compare_result_rank*.csv")
    with open(path, encoding="utf-8-sig", newline="") as fh:
        reader = csv.DictReader(fh)
        return list(reader.fieldnames or []), list(reader)


def outputs(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    return [r for r in rows if "_output" in r["NPU Name"]]


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def failing_names(run_dir: Path) -> list[str]:
    return [f["name"] for f in summary(run_dir)["failed_ops"]]


def example_models():
    spec = importlib.util.spec_from_file_location("example_models", ROOT / "examples" / "models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class TwoLayer(nn.Module):
    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


def train_step(model: nn.Module, x: torch.Tensor, disp: PtdbgDispatch) -> None:
    """Forward in one context, backward in another (msprobe: one direction per context)."""
    model.zero_grad(set_to_none=True)
    with disp:
        loss = model(x).pow(2).mean()
    with disp:
        loss.backward()


# 1. the seeded reduced-precision kernel -----------------------------------------------------------
@pytest.mark.parametrize("background", [False, True])
def test_reduced_precision_matmul_is_caught_by_the_scaled_rule_only(tmp_path, monkeypatch, background):
    seeded_reduced.install_reduced_linear(monkeypatch)
    torch.manual_seed(0)
    model, x = TwoLayer(), torch.randn(8, 16, 64)
    runs = {}
    for rule in ("both", "reference"):
        disp = PtdbgDispatch(dump_mode="auto", dump_path=str(tmp_path / rule), rule=rule, background=background)
        train_step(model, x, disp)
        runs[rule] = disp.run_dir
    # the default rule: the reduced matmuls fail, by the scaled rule alone, nothing else fails
    names = failing_names(runs["both"])
    assert names and all(n.startswith("reduced_mm_") for n in names), names
    assert "reduced_mm_1" in names and "reduced_mm_2" in names  # both forward matmuls
    header, rows = read_csv(runs["both"])
    bad = [r for r in outputs(rows) if r["Accuracy Reached or Not"] == "No"]
    assert bad and {r["FailedRule"] for r in bad} == {"scaled"}
    threshold_ulps = DISPATCH_SCALED_THRESHOLD["float32"] / 2.0**-23
    for r in bad:
        assert float(r["Cosine"]) > dm.COS_THRESHOLD and float(r["MaxAbsErr"]) < dm.MAX_ABS_ERR_MAX_THRESHOLD
        assert float(r["Scaled Error (ulp)"]) > 2 * threshold_ulps  # ~2^-11 relative: thousands of ulps
        assert "scaled error" in r["Err_message"]
    clean = [r for r in outputs(rows) if not r["NPU Name"].startswith("reduced_mm")]
    assert clean and all(float(r["Scaled Error (ulp)"]) < 64 for r in clean)
    s = summary(runs["both"])
    assert s["failed_rules"] == {"scaled": len(bad)} and s["config"]["rule"] == "both"
    assert s["failed_ops"][0]["dumped"] and s["failed_ops"][0]["leaves"][0]["failed_rule"] == "scaled"
    # msprobe's rule alone is blind to it (the blind spot the scaled rule closes)
    assert failing_names(runs["reference"]) == []
    _, ref_rows = read_csv(runs["reference"])
    assert all(r["FailedRule"] == "" for r in ref_rows)
    assert all(r["Scaled Error (ulp)"] == "" for r in ref_rows)  # not measured: msprobe's cost
    # and every figure of the documented rule is what the default rule wrote
    keep = ("NPU Name", "Cosine", "MaxAbsErr")
    assert [[r[k] for k in keep] for r in outputs(ref_rows)] == [[r[k] for k in keep] for r in outputs(rows)]


def test_seeded_reduced_op_is_defined_once_and_exact_in_float64():
    spec = importlib.util.spec_from_file_location("seeded_reduced_again", SUPPORT / "seeded_reduced.py")
    again = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(again)  # a second import under another name does not re-register
    a, b = torch.randn(5, 7, dtype=torch.float64), torch.randn(7, 3, dtype=torch.float64)
    assert torch.equal(again.reduced_precision_matmul(a, b), a @ b)
    a32, b32 = a.float(), b.float()
    rel = ((seeded_reduced.reduced_precision_matmul(a32, b32).double() - a @ b).abs().max() / (a @ b).abs().max())
    assert 1e-5 < rel < 2e-3  # TF32-like: 10 mantissa bits
    assert (seeded_reduced.round_mantissa(a32).view(torch.int32) & 0x1FFF).eq(0).all()


def test_one_percent_scale_error_is_caught_by_the_scaled_rule(tmp_path):
    torch.manual_seed(0)
    a, b = torch.randn(32, 64) / 8, torch.randn(64, 16) / 8
    runs = {}
    for rule in ("scaled", "reference"):
        with PtdbgDispatch(dump_mode="OFF", dump_path=str(tmp_path / rule), rule=rule) as disp:
            seeded_reduced.one_percent_matmul(a, b)
        runs[rule] = disp.run_dir
    assert failing_names(runs["scaled"]) == ["one_percent_mm_1"]
    (row,) = outputs(read_csv(runs["scaled"])[1])
    assert row["FailedRule"] == "scaled" and row["Cosine"] == "1.0"
    assert float(row["Scaled Error (ulp)"]) == pytest.approx(0.01 / 2.0**-23, rel=0.01)
    assert failing_names(runs["reference"]) == []  # Cosine 1.0, MaxAbsErr < 0.001: the README's blind spot


# 2. clean models --------------------------------------------------------------------------------
def test_example_transformer_fp32_forward_and_backward_is_clean(tmp_path):
    models = example_models()
    torch.manual_seed(0)
    model = models.TransformerBlock(d=32, heads=4)
    x, y = torch.randn(4, 16, 32), torch.randn(4, 16, 32)
    disp = PtdbgDispatch(dump_mode="auto", dump_path=str(tmp_path))
    with disp:
        loss = F.mse_loss(model(x), y)
    with disp:
        loss.backward()
    s = summary(disp.run_dir)
    assert s["failed_op_count"] == 0, s["failed_ops"]
    assert s["ops_compared"] > 20 and s["probe_errors"] == {}
    ulps = [float(r["Scaled Error (ulp)"]) for r in outputs(read_csv(disp.run_dir)[1]) if r["Scaled Error (ulp)"]]
    assert ulps and max(ulps) < DISPATCH_SCALED_THRESHOLD["float32"] / 2.0**-23


def test_small_llama_fp32_training_step_is_clean(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(config)
    ids = torch.randint(0, 512, (2, 16))
    disp = PtdbgDispatch(dump_mode="auto", dump_path=str(tmp_path))
    with disp:
        loss = model(input_ids=ids, labels=ids).loss
    with disp:
        loss.backward()
    s = summary(disp.run_dir)
    assert s["failed_op_count"] == 0, s["failed_ops"]
    assert s["ops_compared"] > 100 and s["probe_errors"] == {}


# 3. the noise-floor trap under every rule ---------------------------------------------------------
@pytest.mark.parametrize("rule", ["both", "scaled", "reference"])
def test_near_zero_key_bias_gradient_passes_under_every_rule(tmp_path, rule):
    """The key projection's bias gradient is zero in exact arithmetic: both sides hold rounding
    noise, so its scaled figure is huge on every CPU and under "both" and "scaled" the noise floor
    is what passes it. Its cosine is the ratio of two noises (0.897 with AVX-512 kernels, 0.953
    with AVX2 ones): msprobe's rule alone fails it on some CPUs only, and it passes either way."""
    torch.manual_seed(1)
    d, t, b = 16, 64, 4
    k, q, v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
    x = torch.randn(b, t, d)
    with PtdbgDispatch(dump_mode="auto", dump_path=str(tmp_path), rule=rule) as disp:
        a = torch.softmax(q(x) @ k(x).transpose(-1, -2) / d**0.5, -1)
        loss = (a @ v(x)).pow(2).mean()
    with disp:
        loss.backward()
    assert summary(disp.run_dir)["failed_op_count"] == 0
    bias = {r["NPU Name"]: r for r in outputs(read_csv(disp.run_dir)[1])}["sum_2_output"]
    assert bias["NPU Tensor Shape"] == "[1, 16]" and bias["Accuracy Reached or Not"] == "Yes"
    assert bias["FailedRule"] == ""
    if rule == "reference":  # the floor is consulted exactly when msprobe's rule fails the leaf
        literal_fails = dm.rule_fails(float(bias["Cosine"]), float(bias["MaxAbsErr"]))
        assert ("within the rounding-noise floor" in bias["Err_message"]) == literal_fails
        assert bias["Scaled Error (ulp)"] == ""
    else:
        assert float(bias["Scaled Error (ulp)"]) > DISPATCH_SCALED_THRESHOLD["float32"] / 2.0**-23
        assert "within the rounding-noise floor" in bias["Err_message"]
        assert float(bias["MaxAbsErr"]) <= float(bias["Noise Floor"])


@pytest.mark.parametrize("rule", ["both", "scaled", "reference"])
def test_unrelated_noise_fails_every_rule_and_the_floor_passes_it(tmp_path, monkeypatch, noise_sum_input, rule):
    """A sum that is rounding noise on the device and an unrelated tiny value in the reference,
    whatever order the CPU's kernel adds in (tests/conftest.py): both rules fail it on every CPU,
    the noise floor passes it under each, and without the floor it fails by the rule chosen."""
    values, _ = noise_sum_input()

    def sum_row(where: Path) -> dict[str, str]:
        with PtdbgDispatch(dump_mode="OFF", dump_path=str(where), rule=rule) as disp:
            values.sum(0)
        return {r["NPU Name"]: r for r in outputs(read_csv(disp.run_dir)[1])}["sum_1_output"]

    row = sum_row(tmp_path / "floor")
    assert float(row["Cosine"]) < 1e-3 and dm.rule_fails(float(row["Cosine"]), float(row["MaxAbsErr"]))
    assert float(row["MaxAbsErr"]) <= float(row["Noise Floor"])
    assert row["Accuracy Reached or Not"] == "Yes" and row["FailedRule"] == ""
    assert "within the rounding-noise floor" in row["Err_message"]
    if rule != "reference":
        assert float(row["Scaled Error (ulp)"]) > DISPATCH_SCALED_THRESHOLD["float32"] / 2.0**-23
    monkeypatch.setattr(dm, "NOISE_FLOOR_ULPS", 0.0)
    row = sum_row(tmp_path / "no-floor")
    assert row["Accuracy Reached or Not"] == "No" and row["FailedRule"] == rule


def test_real_defect_on_a_zero_gradient_still_fails_under_every_rule(tmp_path):
    torch.manual_seed(1)
    grad = torch.randn(4, 64, 16) * 1e-3
    grad -= grad.mean(dim=(0, 1))  # a bias gradient that is zero up to rounding
    for rule in ("both", "scaled", "reference"):
        with PtdbgDispatch(dump_mode="OFF", dump_path=str(tmp_path / rule), rule=rule) as disp:
            torch.ops.seeded_dispatch.bias_grad(grad)
        assert failing_names(disp.run_dir) == ["bias_grad_1"], rule


# 4. the verdict: rule selection, columns, options ---------------------------------------------------
def _figures(dev, ref, dtype=torch.float32):
    d, r = torch.tensor(dev, dtype=dtype), torch.tensor(ref, dtype=torch.float64)
    eps = torch.finfo(dtype).eps if dtype.is_floating_point else None
    figs = torch.cat([dm.leaf_figures(XP, d, r), dm.scaled_figure(XP, d, r, eps)]).tolist()
    if dm.needs_masked_pass(figs):
        figs = torch.cat([dm.masked_leaf_figures(XP, d, r), dm.scaled_figure(XP, d, r, eps, masked=True)]).tolist()
    return figs


def test_rule_reference_is_the_documented_verdict_exactly():
    """judge(rule="reference") on the full figure vector gives what the documented rule gives on
    the figures it has always had (no scaled figure), for random leaves and every edge case."""
    rng = random.Random(0)
    cases = [([1.0, 2.0, 3.0], [1.0, 2.0, 3.1]), ([0.0, 0.0], [1.0, 2.0]), ([1.0, 2.0], [-1.0, -2.0]),
             ([2.5], [2.6]), ([1.0, math.nan], [1.0, 3.0]), ([1.0, math.inf], [1.0, math.inf])]
    for _ in range(200):
        n = rng.choice([1, 2, 5, 40])
        ref = [rng.gauss(0, rng.choice([1e-6, 1e-2, 1.0, 100.0])) for _ in range(n)]
        dev = [x * (1 + rng.choice([0.0, 1e-7, 1e-3, 0.1, -2.0])) + rng.choice([0.0, 1e-4, 0.5, 2.0]) for x in ref]
        cases.append((dev, ref))
    for dev, ref in cases:
        figs = _figures(dev, ref)
        assert len(figs) == dm.LEAF_FIGURE_COUNT
        for floor in (0.0, 1e-3):
            old = dm.judge(figs[: dm.FIGURE_COUNT], len(dev), "float32", floor)
            new = dm.judge(figs, len(dev), "float32", floor, rule="reference")
            assert (new.accuracy, new.message, new.cosine, new.max_abs_err) == (old.accuracy, old.message, old.cosine,
                                                                                old.max_abs_err)
            assert new.failed_rule == ("reference" if new.failed else "")
            both = dm.judge(figs, len(dev), "float32", floor)
            assert both.failed == (new.failed or dm.judge(figs, len(dev), "float32", floor, rule="scaled").failed)


def test_failed_rule_names_the_rules_that_fail():
    sign = _figures([1.0, -2.0, 3.0], [1.0, 2.0, 3.0])  # the documented rule fails, and the scaled one
    assert dm.judge(sign, 3, "float32", 0.0).failed_rule == "both"
    assert dm.judge(sign, 3, "float32", 0.0, rule="scaled").failed_rule == "scaled"
    small = _figures([1.0, 2.0, 3.0 * 1.001], [1.0, 2.0, 3.0])  # 0.1 % off: the scaled rule alone
    v = dm.judge(small, 3, "float32", 0.0)
    assert v.failed_rule == "scaled" and v.cosine == 1.0 and v.scaled_ulps == pytest.approx(1e-3 / 2.0**-23, rel=1e-3)
    assert not dm.judge(small, 3, "float32", 0.0, rule="reference").failed
    assert not dm.judge(small, 3, "float32", 1.0).failed  # within the noise floor: passes every rule
    assert not dm.judge(small, 3, "bfloat16", 0.0).failed  # 0.1 % is an eighth of a bf16 ulp
    ints = _figures([1.0, 2.0], [1.0, 3.0], dtype=torch.int64)
    assert dm.judge(ints, 2, "int64", 0.0).failed_rule == "both" and dm.judge(ints, 2, "int64", 0.0).scaled_ulps == ""
    assert dm.judge(ints, 2, "int64", 0.0, rule="reference").failed_rule == "reference"
    nan = _figures([1.0, math.nan], [1.0, 2.0])
    assert dm.judge(nan, 2, "float32", 0.0).failed_rule == "both"
    # a Python scalar output is judged by the documented rule only
    assert not dm.judge(_figures([1.001], [1.0], torch.float64), 1, "float64", 0.0, scaled_applies=False).failed


def test_scaled_figure_of_half_precision_subnormals_is_half_an_ulp():
    """fp16 spacing is absolute below its smallest normal (6.1e-5): a correctly rounded result
    there scores at most half an ulp, not up to 1024 (the row floor stops at the smallest normal)."""
    ref = torch.rand(4, 64, dtype=torch.float64) * 1e-5
    dev = ref.to(torch.float16)
    figure = float(dm.scaled_figure(XP, dev, ref, torch.finfo(torch.float16).eps)[0])
    assert figure <= 0.5 * 2.0**-10


def test_csv_appends_failed_rule_and_scaled_error_after_the_old_columns(tmp_path):
    x = torch.randn(4, 4)
    with PtdbgDispatch(dump_path=str(tmp_path)) as disp:
        torch.relu(x @ x)
        torch.argmax(x, dim=1)
    header, rows = read_csv(disp.run_dir)
    assert tuple(header[: len(COLUMNS)]) == COLUMNS
    assert header[len(COLUMNS) : len(COLUMNS) + 5] == ["Error Balance", "Small Value Max Abs Err",
                                                       "Large Value Max Rel Err", "Single Benchmark", "Noise Floor"]
    assert header[-2:] == ["FailedRule", "Scaled Error (ulp)"] and tuple(header) == COLUMNS + EXTRA_COLUMNS
    out = {r["NPU Name"]: r for r in outputs(rows)}
    assert 0.0 <= float(out["mm_1_output"]["Scaled Error (ulp)"]) < 64
    assert out["argmax_1_output"]["Scaled Error (ulp)"] == ""  # integers: compared exactly
    assert all(r["FailedRule"] == "" and r["Scaled Error (ulp)"] == "" for r in rows if "_input" in r["NPU Name"])


@pytest.mark.parametrize("bad", ["scale", "Both", "", None, 1, ["both"]])
def test_bad_rule_is_a_config_error_naming_the_argument(tmp_path, bad):
    with pytest.raises(ConfigError) as info:
        PtdbgDispatch(dump_path=str(tmp_path), rule=bad)
    text = str(info.value)
    assert "rule" in text and '"both"' in text and '"reference"' in text and '"scaled"' in text
    assert not any(tmp_path.iterdir())  # checked before anything is created


def test_rule_flows_from_the_config_section_and_is_reported(tmp_path):
    config = SimpleNamespace(extra_sections={"online_dispatch": {"rule": "reference", "background": False}},
                             dump_path=tmp_path)
    args = dispatch_arguments(config)
    assert args["rule"] == "reference" and args["dump_mode"] == "auto"
    assert dispatch_arguments(config, {"rule": "scaled"})["rule"] == "scaled"
    disp = PtdbgDispatch(**args)
    assert disp.options.rule == "reference" and "rule='reference'" in repr(disp)
    with pytest.raises(ConfigError):
        PtdbgDispatch(**dispatch_arguments(config, {"rule": "strict"}))


def test_failure_message_names_the_rule(tmp_path, monkeypatch):
    seeded_reduced.install_reduced_linear(monkeypatch)
    torch.manual_seed(0)
    with PtdbgDispatch(dump_mode="OFF", dump_path=str(tmp_path)) as disp:
        TwoLayer()(torch.randn(8, 64))
    s = summary(disp.run_dir)
    text = dispatch_failure_message("t", s)
    assert "reduced_mm_1 (msprobe_test.reduced_mm.default)" in text and "ulp [scaled]" in text
    assert "rule (both)" in text and "scale" in text


def test_scaled_error_keeps_its_layout_for_other_callers():
    """probes/core/scaled.py is shared (free_benchmark): the fast path online_dispatch uses
    (`finite=True`, a float32 side raised chunk by chunk) gives the masked path's figure."""
    torch.manual_seed(0)
    ref = torch.randn(3, 300, 17, dtype=torch.float64)
    dev = (ref * (1 + 1e-4 * torch.randn_like(ref))).float()
    fast = scaled.scaled_error(XP, dev, ref, 2.0**-23, finite=True, chunk=1000)
    full = scaled.scaled_error(XP, dev.double(), ref, 2.0**-23, chunk=1000)
    assert fast.shape == full.shape == (scaled.SCALED_COUNT,)
    assert fast.tolist() == pytest.approx(full.tolist(), rel=1e-12)
    dev[1, 2, 3] = math.nan
    assert not math.isfinite(float(scaled.scaled_error(XP, dev, ref, 2.0**-23, finite=True)[0]))
    assert scaled.scaled_error(XP, dev, ref, 2.0**-23)[1] == 1
