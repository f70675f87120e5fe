"""The catalogue as a fleet runs it: goldens that know their hardware, and limits that hold on
every machine (the accumulation test ratio, the cross-machine ulp limit).

A correct kernel of another machine (another BLAS, another ISA path) never reads as "regressed";
the seeded defects (rsqrt through bfloat16, a bfloat16 sum accumulating in bfloat16, a TF32
matmul) fail by name with this machine's golden, with only another machine's, and with none."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import seeded_catalogue as sc
import torch
from repo_paths import REPO, SUPPORT

from probes.backends.hardware import cpu_identity, hardware_identity, slug
from probes.core.accumulation import RATIO_LIMIT, accumulation_ratio
from probes.core.ulps import round_to
from pytest_msprobe.catalogue import accumulating, gate, golden_files
from pytest_msprobe.catalogue.cases import opinfo_available, opinfo_cases, table_cases
from pytest_msprobe.catalogue.measure import measure_torch
from pytest_msprobe.golden.store import validate_name

pytestmark = pytest.mark.slow  # subprocess pytest sessions / multi-process jobs: minutes in all

REPO_GOLDEN = REPO / "golden"
SOURCES = ["table"] + (["opinfo"] if opinfo_available() else [])
# the source the repo's CPU golden was measured with (README's test command: OpInfo with the dev extra)
REPO_SOURCE = "opinfo" if opinfo_available() else "table"
DEFECTS = [("rsqrt", "Torch.rsqrt", "float32"), ("sum", "Torch.sum", "bfloat16"), ("matmul", "Torch.matmul", "float32")]


def _case(source: str, api: str, dtype: str):
    cases = opinfo_cases() if source == "opinfo" else table_cases()
    return next(c for c in cases if c.api == api and c.dtype == dtype)


def _row(result) -> gate.GoldenRow:
    return gate.GoldenRow(result.source, result.samples, result.max_ulp, result.p99_ulp, result.verdict, result.ratio)


# the test ratio ----------------------------------------------------------------------------------
def _sums(dtype: str, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = round_to(np.random.default_rng(seed).uniform(-1, 1, (64, k)), dtype)
    return x, x.sum(-1), np.abs(x).sum(-1)


def _running_sum(x: np.ndarray, dtype: str) -> np.ndarray:
    acc = np.zeros(x.shape[0])
    for i in range(x.shape[1]):
        acc = round_to(acc + x[:, i], dtype)
    return acc


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_half_precision_sum_accumulated_in_float32_passes_and_one_accumulated_in_its_own_dtype_fails(dtype):
    x, ref, mag = _sums(dtype, 512)
    correct = round_to(_running_sum(x, "float32"), dtype)  # any order in float32, rounded once
    assert accumulation_ratio(correct, ref, mag, 512, dtype).max() <= 1.0
    defect = _running_sum(x, dtype)
    assert accumulation_ratio(defect, ref, mag, 512, dtype).max() > 10 * RATIO_LIMIT[dtype]


def test_float32_products_of_any_summation_order_pass_and_reduced_precision_inputs_fail():
    rng = np.random.default_rng(1)
    a, b = (round_to(rng.uniform(-1, 1, s), "float32") for s in ((16, 256), (256, 24)))
    ref, mag = a @ b, np.abs(a) @ np.abs(b)
    products = np.einsum("mk,kn->mnk", a, b)
    orders = {"torch": torch.from_numpy(a).float() @ torch.from_numpy(b).float(),
              "numpy": a.astype(np.float32) @ b.astype(np.float32),
              "left to right": _running_sum(round_to(products, "float32").reshape(-1, 256), "float32").reshape(16, 24),
              "right to left": _running_sum(round_to(products[..., ::-1], "float32").reshape(-1, 256),
                                            "float32").reshape(16, 24)}
    for name, out in orders.items():
        ratio = accumulation_ratio(np.asarray(out, dtype=np.float64), ref, mag, 256, "float32").max()
        assert ratio < RATIO_LIMIT["float32"] / 2, name
    for name, narrow in (("TF32", sc._tf32), ("bfloat16", lambda t: t.bfloat16().float())):
        out = narrow(torch.from_numpy(a).float()) @ narrow(torch.from_numpy(b).float())
        assert accumulation_ratio(out.double().numpy(), ref, mag, 256, "float32").max() > 10 * RATIO_LIMIT["float32"], name


def test_ratio_special_values_and_exact_zeros():
    ref = np.array([0.0, 1e39, np.nan, 1.0, 1.0])
    out = np.array([0.0, np.inf, np.nan, np.inf, 1.0])
    mag = np.array([0.0, 1e39, 1.0, 1.0, 1.0])
    assert accumulation_ratio(out, ref, mag, 4, "float32").tolist() == [0.0, 0.0, 0.0, np.inf, 0.0]
    assert accumulation_ratio(np.array([1e-30]), np.array([0.0]), np.array([0.0]), 1, "float32")[0] > 1e6
    with pytest.raises(ValueError, match="float16, bfloat16, float32, float64"):
        accumulation_ratio(np.zeros(1), np.zeros(1), np.zeros(1), 1, "int8")


def test_accumulating_families_count_terms_with_padding_bias_and_means():
    assert accumulating.family("Torch.matmul") == accumulating.PRODUCTS
    assert accumulating.family("Functional.conv2d") == accumulating.PRODUCTS
    assert accumulating.family("Mint.mean") == accumulating.MEANS
    assert accumulating.family("Torch.norm[nuc]") is None and accumulating.family("Torch.exp") is None
    assert accumulating.positive_coefficients({"alpha": -2.0, "beta": -0.5, "dim": -1}) == {
        "alpha": 2.0, "beta": 0.5, "dim": -1}
    ones = torch.nn.functional.conv1d(torch.ones(1, 2, 5, dtype=torch.float64), torch.ones(3, 2, 3, dtype=torch.float64),
                                      torch.ones(3, dtype=torch.float64), padding=1)
    counts = accumulating.term_count(accumulating.PRODUCTS, ones.numpy(), 10, 15)
    assert counts[0, 0].tolist() == [5.0, 7.0, 7.0, 7.0, 5.0]  # 2 channels x 3 taps + bias, fewer at the padded edges
    assert accumulating.term_count(accumulating.MEANS, None, 4096, 4) == 1024.0


# hardware identity -------------------------------------------------------------------------------
INTEL = {"vendor_id": "GenuineIntel", "model name": "Intel(R) Xeon(R) Platinum 8480+",
         "flags": "fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile avx512_fp16"}
AMD = {"vendor_id": "AuthenticAMD", "model name": "AMD EPYC 9654 96-Core Processor",
       "flags": "fpu avx2 avx512f avx512_bf16"}


def test_cpu_identity_tells_vendors_extensions_and_forced_paths_apart():
    intel, amd = cpu_identity(INTEL, {}), cpu_identity(AMD, {})
    assert intel.key != amd.key and intel.key.startswith("intel-") and amd.key.startswith("amd-")
    assert "amx" in intel.key and "amx" not in amd.key and "avx512bf16" in amd.key
    assert "EPYC 9654" in amd.description and amd.details["model"] == AMD["model name"]
    renamed = cpu_identity(dict(INTEL, **{"model name": "Intel(R) Xeon(R) Processor"}), {})
    assert renamed.key == intel.key  # the model is recorded, not keyed: a VM hides it
    forced = cpu_identity(INTEL, {"MKL_CBWR": "COMPATIBLE"})
    assert forced.key != intel.key and forced.key.endswith("mklcbwr.compatible")
    arm = cpu_identity({"CPU implementer": "0x48", "Features": "fp asimd sve"}, {})
    assert arm.key.startswith("hisilicon-")
    for identity in (intel, amd, forced, arm, hardware_identity("cpu")):
        validate_name(gate.golden_name("cpu", identity.key))  # a folder name a golden can live under
    assert slug("NVIDIA H200 sm90") == "nvidia-h200-sm90"


def test_cuda_identity_is_the_device_model_and_compute_capability(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=0: (9, 0))
    identity = hardware_identity("cuda")
    assert identity.key == "nvidia-h200-sm90" and identity.details["compute_capability"] == "9.0"
    with pytest.raises(ValueError, match="cpu, cuda, npu"):
        hardware_identity("tpu")


def test_every_golden_records_its_hardware_and_says_so_when_another_machine_made_it(tmp_path):
    from pytest_msprobe.golden.store import GoldenStore

    amd = cpu_identity(AMD, {}).to_dict()
    made = GoldenStore(tmp_path, regen=True, provenance={"device": "cpu"}, hardware=amd)
    made.check_online_dispatch("od", [])
    assert json.loads((tmp_path / "od" / "meta.json").read_text())["hardware"]["key"] == amd["key"]
    here = GoldenStore(tmp_path, provenance={"device": "cpu"}, hardware=cpu_identity(INTEL, {}).to_dict())
    outcome = here.check_online_dispatch("od", [])
    assert outcome.ok and "measured on another machine: AMD EPYC 9654" in outcome.message


# the gate on other machines ----------------------------------------------------------------------
def _numpy_kernels() -> dict:
    """float32 matrix products through NumPy's BLAS (OpenBLAS in NumPy's wheels), not PyTorch's."""
    def np_matmul(a, b, *args, **kwargs):
        return torch.from_numpy(np.matmul(a.numpy(), b.numpy()))

    def np_addbmm(c, b1, b2, *, beta=1, alpha=1, **kwargs):
        return torch.from_numpy(beta * c.numpy() + alpha * np.matmul(b1.numpy(), b2.numpy()).sum(0)).to(c.dtype)

    return {"matmul": np_matmul, "mm": np_matmul, "bmm": np_matmul, "addbmm": np_addbmm}


def test_numpy_blas_float32_products_pass_the_gate_made_with_torch_kernels(monkeypatch):
    """NumPy's float32 GEMMs, judged as a machine with no golden of its own against the repo's CPU
    golden (measured with PyTorch's MKL kernels): another implementation, never 'regressed'."""
    golden = gate.goldens(REPO_GOLDEN, "cpu", "numpy-openblas")
    assert golden.own is None and golden.others
    measured = {}
    for name in _numpy_kernels():
        measured[name] = measure_torch(_case(REPO_SOURCE, f"Torch.{name}", "float32"), "cpu", verdict=False)
    for name, kernel in _numpy_kernels().items():
        monkeypatch.setattr(torch, name, kernel)
    differs = 0
    for name in _numpy_kernels():
        numpy_run = measure_torch(_case(REPO_SOURCE, f"Torch.{name}", "float32"), "cpu", verdict=False)
        differs += numpy_run.max_ulp != measured[name].max_ulp
        judged = gate.judge(numpy_run.to_dict(), golden, regen=False)
        assert judged["status"] == gate.MEASURED, judged["message"]
        assert numpy_run.ratio < RATIO_LIMIT["float32"] / 2
        assert "no golden for this machine (numpy-openblas)" in judged["message"]
    assert differs >= 2  # it is another implementation: its figures are not torch's


def test_a_golden_recorded_on_another_machine_judges_by_machine_independent_limits_only(tmp_path):
    """The same golden, with meta.json naming this machine or another: a correct kernel 3x over
    another machine's figures regresses against its own machine's golden only."""
    here = hardware_identity("cpu").key
    case = _case(REPO_SOURCE, "Torch.matmul", "float32")
    result = measure_torch(case, "cpu", verdict=False)
    lower = gate.GoldenRow(result.source, result.samples, result.max_ulp / 3, result.p99_ulp / 3, "pass", result.ratio)
    folder = tmp_path / "golden" / gate.golden_name("cpu", here)
    folder.mkdir(parents=True)
    (folder / gate.GOLDEN_FILE).write_bytes(gate.render({(case.api, "float32"): lower})[gate.GOLDEN_FILE])
    meta = {"kind": "catalogue", "hardware": {"key": here}}
    (folder / "meta.json").write_text(json.dumps(meta))
    own = gate.judge(result.to_dict(), gate.goldens(tmp_path / "golden", "cpu", here), regen=False)
    assert own["status"] == gate.REGRESSED and "max ulp" in own["message"]
    golden_files.forget()
    # another machine than this one, whichever CPU this is
    other = next(k for k in ("amd-avx512-mkl-avx512bf16", "intel-amx-mkl-amx") if k != here)
    (folder / "meta.json").write_text(json.dumps(dict(meta, hardware={"key": other})))
    golden = gate.goldens(tmp_path / "golden", "cpu", here)
    assert golden.own is None and list(golden.others) == [other]
    foreign = gate.judge(result.to_dict(), golden, regen=False)
    assert foreign["status"] == gate.MEASURED and foreign["golden"] == other
    assert f"against the golden of {other}" in foreign["message"]
    golden_files.forget()


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize(("defect", "api", "dtype"), DEFECTS, ids=[d[0] for d in DEFECTS])
def test_seeded_defects_fail_with_this_machines_golden_another_machines_and_none(source, defect, api, dtype,
                                                                                  monkeypatch):
    case = _case(source, api, dtype)
    clean = measure_torch(case, "cpu")
    rows = {(api, dtype): _row(clean)}
    with_own = gate.Goldens("cpu", "here", rows)
    only_elsewhere = gate.Goldens("cpu", "here", None, {"elsewhere": rows})
    with_none = gate.Goldens("cpu", "here", None)
    for golden in (with_own, only_elsewhere, with_none):
        assert not gate.failing(gate.judge(clean.to_dict(), golden, regen=False))
    monkeypatch.setattr(torch, defect, sc.DEFECTS[defect])
    bad = measure_torch(case, "cpu")
    expected = {"with_own": gate.REGRESSED, "only_elsewhere": gate.OVER_LIMIT,
                "with_none": gate.FLAGGED if defect == "rsqrt" else gate.OVER_LIMIT}
    for label, golden in (("with_own", with_own), ("only_elsewhere", only_elsewhere), ("with_none", with_none)):
        judged = gate.judge(bad.to_dict(), golden, regen=False)
        assert judged["status"] == expected[label], (label, judged["message"])
        assert judged["message"].startswith(f"{api} ({dtype}, cpu)")
    if defect != "rsqrt":  # the accumulating ones exceed the machine-independent limit by far
        assert bad.ratio > 5 * RATIO_LIMIT[dtype] and clean.ratio < RATIO_LIMIT[dtype]


def test_a_known_accumulation_error_is_accepted_on_every_machine_until_it_grows():
    row = {"api": "Functional.conv_transpose1d", "dtype": "float16", "device": "cpu", "max_ulp": 1.4, "p99_ulp": 1.0,
           "verdict": "pass", "ratio": 15.6}
    none = gate.Goldens("cpu", "here", None)
    over = gate.judge(dict(row), none, False)
    assert over["status"] == gate.OVER_LIMIT and "known.csv" in over["message"] and "create this machine's golden" in (
        over["message"])
    listed = gate.Goldens("cpu", "here", None, known={("Functional.conv_transpose1d", "float16"):
                                                      gate.KnownError(15.6, "col2im adds in float16")})
    accepted = gate.judge(dict(row), listed, False)
    assert accepted["status"] == gate.ACCEPTED and "col2im adds in float16" in accepted["message"]
    assert gate.judge(dict(row, ratio=gate.cross_machine_bound(15.6) * 1.1), listed, False)["status"] == gate.OVER_LIMIT
    # this machine's golden: the known error holds its number, then regresses when it grows
    own = gate.Goldens("cpu", "here", {("Functional.conv_transpose1d", "float16"):
                                       gate.GoldenRow("opinfo", 4, 1.4, 1.0, "pass", 15.6)})
    assert gate.judge(dict(row), own, False)["status"] == gate.ACCEPTED
    assert gate.judge(dict(row, ratio=40.0), own, False)["status"] == gate.REGRESSED
    # under the limit in this machine's golden, over it now: a kernel that lost its accumulation
    clean = gate.Goldens("cpu", "here", {("Functional.conv_transpose1d", "float16"):
                                         gate.GoldenRow("opinfo", 4, 1.4, 1.0, "pass", 0.9)})
    assert gate.judge(dict(row), clean, False)["status"] == gate.OVER_LIMIT


def test_the_repo_known_list_reads_and_names_its_reasons():
    golden = gate.goldens(REPO_GOLDEN, "cpu", hardware_identity("cpu").key)
    assert golden.known and all(k.reason and k.ratio > RATIO_LIMIT["float16"] for k in golden.known.values())


# the whole fleet, end to end ---------------------------------------------------------------------
# PyTorch's CPU kernels on the code paths other CPUs take: MKL's generic path (what it runs on AMD),
# no AVX-512 in ATen, oneDNN without AVX-512 (no bf16/fp16 convolution paths)
OTHER_PATHS = {
    "generic": {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "SSE41"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
}
# the APIs whose figures move between those paths (and the seeded ones)
FLEET_SELECT = ("Torch.matmul or Torch.mm- or Torch.bmm- or Torch.addbmm or Torch.tensordot or conv_transpose1d "
                "or conv3d or cholesky or slogdet or logdet or Torch.linalg.lu or pinv or bessel_y0 or "
                "multilabel_soft_margin_loss or hinge_embedding_loss or Torch.sum- or Torch.rsqrt")


def _catalogue(tmp_path: Path, env: dict[str, str], *args: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    out = tmp_path / "out"
    shutil.rmtree(out, ignore_errors=True)
    done = subprocess.run([sys.executable, "-m", "pytest", "--pyargs", "pytest_msprobe.catalogue", "-q",
                           "-p", "no:cacheprovider", "-p", "seeded_catalogue", "-k", FLEET_SELECT,
                           f"--msprobe-dump-path={out}", *args],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(SUPPORT), **env},
                          capture_output=True, text=True, timeout=600)
    rows = list(csv.DictReader(open(out / "catalogue.csv", encoding="utf-8"))) if (out / "catalogue.csv").is_file() else []
    return done, rows


@pytest.mark.skipif(REPO_SOURCE != "opinfo", reason="the repo's CPU golden is measured on OpInfo samples (expecttest)")
@pytest.mark.parametrize("path", sorted(OTHER_PATHS))
def test_the_repo_golden_holds_on_the_kernel_paths_of_other_cpus(path, tmp_path):
    """README's test command on another CPU: its kernels differ, it has no golden of its own, and
    nothing fails; seeded, the same run fails by name."""
    done, rows = _catalogue(tmp_path, OTHER_PATHS[path])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert rows and {r["hardware"] for r in rows if r["status"] != gate.SKIPPED} != {hardware_identity("cpu").key}
    assert not [r for r in rows if r["status"] in gate.FAILING]
    assert "no catalogue golden for this machine" in done.stdout
    seeded, rows = _catalogue(tmp_path, {**OTHER_PATHS[path], "MSPROBE_SEEDED_DEFECT": "matmul"})
    assert seeded.returncode == 1
    failed = {(r["api"], r["dtype"]) for r in rows if r["status"] in gate.FAILING}
    assert ("Torch.matmul", "float32") in failed and all(api == "Torch.matmul" for api, _ in failed)
