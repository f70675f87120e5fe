"""The API precision catalogue: ulp errors, the golden gate, seeded defects it must
catch on a clean golden, and `pytest --pyargs pytest_msprobe.catalogue` end to end (regen, gate,
CSV, report section, pytest-xdist, the simulated NPU)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import seeded_catalogue as sc
import torch
from repo_paths import REPO, SUPPORT

from probes.backends.hardware import hardware_identity
from probes.core.thresholds import SIGNIFICAND_BITS
from probes.core.ulps import UlpSummary, round_to, spacing, ulp_errors
from pytest_msprobe.catalogue import gate
from pytest_msprobe.catalogue.cases import opinfo_available, opinfo_cases, table_cases
from pytest_msprobe.catalogue.measure import measure_torch
from pytest_msprobe.catalogue.records import CatalogueCase, NothingToMeasure

SOURCES = ["table"] + (["opinfo"] if opinfo_available() else [])


# ulps -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_spacing_is_the_gap_between_neighbours_and_subnormal_below_the_normal_range(dtype):
    tdt = getattr(torch, dtype)
    x = torch.tensor([1.0, 1.5, 3.0, 1000.0, -0.3], dtype=tdt)
    gaps = (torch.nextafter(x.float().abs(), torch.tensor(math.inf)).to(tdt).double() - x.double().abs()).numpy()
    if dtype == "float32":
        assert spacing(x.double().numpy(), dtype) == pytest.approx(gaps)
    smallest_subnormal = 2.0 ** (-126 if dtype != "float16" else -14) * 2.0 ** -(SIGNIFICAND_BITS[dtype] - 1)
    assert spacing(np.array([0.0, smallest_subnormal, 1e-300]), dtype).tolist() == [smallest_subnormal] * 3
    eps = torch.finfo(tdt).eps
    assert spacing(np.array([1.0]), dtype)[0] == eps


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_a_correctly_rounded_result_scores_at_most_half_an_ulp(dtype):
    ref = torch.randn(64, 33, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 100
    out = ref.to(getattr(torch, dtype)).double()
    err = ulp_errors(out.numpy(), ref.numpy(), dtype)
    assert err.max() <= 0.5 and err.max() > 0.2
    one_off = ulp_errors((out * (1 + 4 * torch.finfo(getattr(torch, dtype)).eps)).numpy(), ref.numpy(), dtype)
    assert one_off.max() > 3.0  # four ulps off reads as about four


def test_cancellation_zeros_and_non_finite_values_have_their_rule():
    # an element that is zero in exact arithmetic, computed as rounding noise of its row's scale
    ref = np.array([[1.0] * 15 + [0.0]])
    noisy = ref.copy()
    noisy[0, -1] = 2.0**-26  # a quarter of an ulp of the terms: would be ~2^23 ulps of its own
    assert ulp_errors(noisy, ref, "float32").max() <= 0.5  # judged at the row's scale
    # a whole row that is exactly zero, output nonzero: measured in subnormal steps, i.e. huge
    assert ulp_errors(np.full((1, 16), 1e-30), np.zeros((1, 16)), "float32").max() > 1e10
    assert ulp_errors(np.zeros((1, 16)), np.zeros((1, 16)), "float32").max() == 0.0
    # overflow: the right answer in the dtype is inf; NaN against NaN agrees; a wrong special fails
    out = np.array([np.inf, np.nan, 1.0, np.inf])
    ref = np.array([1e39, np.nan, np.inf, 1.0])
    assert ulp_errors(out, ref, "float32").tolist() == [0.0, 0.0, math.inf, math.inf]
    bf16_max = 3.3895313892515355e38
    assert round_to(np.array([3.39e38, 3.397e38, -0.0]), "bfloat16").tolist() == [bf16_max, math.inf, -0.0]
    assert UlpSummary.of([np.arange(1000.0)]) == UlpSummary(1000, 999.0, 990.0)  # a measured value, never interpolated


def test_unknown_dtype_is_a_clear_error():
    with pytest.raises(ValueError, match="float16, bfloat16, float32, float64"):
        ulp_errors(np.zeros(2), np.zeros(2), "int8")


# the gate ---------------------------------------------------------------------------------------
def _case(source: str, api: str, dtype: str) -> CatalogueCase:
    cases = opinfo_cases() if source == "opinfo" else table_cases()
    return next(c for c in cases if c.api == api and c.dtype == dtype)


def _golden_of(result) -> dict:
    return {(result.api, result.dtype): gate.GoldenRow(result.source, result.samples, result.max_ulp, result.p99_ulp,
                                                       result.verdict)}


def _judged(result, golden) -> dict:
    """Judged as on the machine whose golden rows `golden` are."""
    return gate.judge(result.to_dict(), _here(golden), regen=False)


def _here(own, **others) -> gate.Goldens:
    return gate.Goldens("cpu", "this-machine", own, others)


DEFECTS = [("rsqrt", "Torch.rsqrt", "float32"), ("sum", "Torch.sum", "bfloat16"), ("matmul", "Torch.matmul", "float32")]


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize(("defect", "api", "dtype"), DEFECTS, ids=[d[0] for d in DEFECTS])
def test_seeded_defect_regresses_against_a_clean_golden(source, defect, api, dtype, monkeypatch):
    """rsqrt through a bfloat16 intermediate, a bfloat16 sum accumulating in bfloat16, a float32
    matmul on TF32-rounded inputs: each passes its own clean golden and fails once seeded."""
    case = _case(source, api, dtype)
    clean = measure_torch(case, "cpu", verdict=False)
    golden = _golden_of(clean)
    again = _judged(measure_torch(case, "cpu", verdict=False), golden)
    assert again["status"] == gate.OK, again["message"]
    monkeypatch.setattr(torch, defect, sc.DEFECTS[defect])
    bad = _judged(measure_torch(case, "cpu", verdict=False), golden)
    assert bad["status"] == gate.REGRESSED and gate.failing(bad)
    assert "regressed" in bad["message"] and "max ulp" in bad["message"] and api in bad["message"]


def test_gate_rules_new_accepted_newly_flagged_broken_and_regen():
    row = {"api": "Torch.x", "dtype": "float32", "device": "cpu", "max_ulp": 3.0, "p99_ulp": 1.0, "verdict": "pass"}
    assert gate.judge(dict(row), _here(None), False)["status"] == gate.MEASURED
    assert gate.judge(dict(row, verdict="flagged"), _here(None), False)["status"] == gate.FLAGGED
    assert gate.judge(dict(row), _here({}), False)["status"] == gate.NEW
    g = _here({("Torch.x", "float32"): gate.GoldenRow("table", 4, 3.0, 1.0, "pass")})
    assert gate.judge(dict(row, max_ulp=gate.ulp_bound(3.0)), g, False)["status"] == gate.OK
    assert gate.judge(dict(row, max_ulp=gate.ulp_bound(3.0) * 1.01), g, False)["status"] == gate.REGRESSED
    assert gate.judge(dict(row, p99_ulp=math.inf), g, False)["status"] == gate.REGRESSED
    assert gate.judge(dict(row, verdict="flagged"), g, False)["status"] == gate.NEWLY_FLAGGED
    known = _here({("Torch.x", "float32"): gate.GoldenRow("table", 4, 3.0, 1.0, "flagged")})
    assert gate.judge(dict(row, verdict="flagged"), known, False)["status"] == gate.ACCEPTED
    inf = _here({("Torch.x", "float32"): gate.GoldenRow("table", 4, math.inf, math.inf, "flagged")})
    assert gate.judge(dict(row, max_ulp=math.inf, p99_ulp=math.inf, verdict="flagged"), inf, False)["status"] == gate.ACCEPTED
    broken = gate.judge(dict(row, error="RuntimeError: no kernel"), g, False)
    assert broken["status"] == gate.BROKEN and "raises" in broken["message"]
    assert gate.judge(dict(row, error="RuntimeError: no kernel"), _here(None), False)["status"] == gate.SKIPPED
    assert gate.judge(dict(row, max_ulp=1e9), g, True)["status"] == gate.REGENERATED


# end to end -------------------------------------------------------------------------------------
def _run(pytester, *args, source="table", defect=None):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MSPROBE_CATALOGUE_SOURCE", source)
        mp.setenv("PYTHONPATH", str(SUPPORT))  # -p seeded_catalogue
        if defect:
            mp.setenv("MSPROBE_SEEDED_DEFECT", defect)
        return pytester.runpytest_subprocess("--pyargs", "pytest_msprobe.catalogue", "-p", "no:cacheprovider",
                                             "-p", "seeded_catalogue", f"--msprobe-dump-path={pytester.path / 'out'}",
                                             *args)


def _csv(pytester) -> list[dict[str, str]]:
    with open(pytester.path / "out" / "catalogue.csv", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


SELECT = "Torch.rsqrt or Torch.matmul or Torch.exp-"


@pytest.mark.slow
def test_catalogue_end_to_end_regen_gate_and_a_seeded_defect(pytester):
    pytester.makeini("[pytest]\n")
    first = _run(pytester, "-k", SELECT)
    first.assert_outcomes(passed=9)
    first.stdout.fnmatch_lines(["*msprobe API precision catalogue*", "*9 measured*",
                                "*no catalogue golden for this machine: golden/catalogue/cpu/*/ does not exist*",
                                "*gated without it, on any machine: the accumulation test ratio on 3*",
                                "*create it on this machine: *--msprobe-regen-golden*"])
    rows = _csv(pytester)
    assert list(rows[0]) == gate.CSV_HEADER and len(rows) == 9
    assert {r["status"] for r in rows} == {gate.MEASURED} and {r["device"] for r in rows} == {"cpu"}
    page = (pytester.path / "out" / "report.html").read_text(encoding="utf-8")
    assert 'id="catalogue"' in page and "Torch.rsqrt" in page and "<script" not in page.lower()

    regen = _run(pytester, "-k", SELECT, "--msprobe-regen-golden")
    regen.assert_outcomes(passed=9)
    regen.stdout.fnmatch_lines(["*golden written*catalogue*cpu*"])
    folder = pytester.path / "golden" / "catalogue" / "cpu" / hardware_identity("cpu").key
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["kind"] == "catalogue" and meta["made_with"]["torch"] == torch.__version__
    assert meta["made_with"]["device"] == "cpu" and meta["hardware"] == hardware_identity("cpu").to_dict()
    golden_rows = list(csv.DictReader(open(folder / "catalogue.csv", encoding="utf-8")))
    assert len(golden_rows) == 9

    clean = _run(pytester, "-k", SELECT)
    clean.assert_outcomes(passed=9)
    assert {r["status"] for r in _csv(pytester)} == {gate.OK}

    seeded = _run(pytester, "-k", SELECT, defect="rsqrt")
    # float32 regresses in ulps; float16 is flagged by free_benchmark, whose improve_precision
    # re-runs it through the now defective float32 kernel
    seeded.assert_outcomes(passed=7, failed=2)
    seeded.stdout.fnmatch_lines(["*Torch.rsqrt (float32, cpu) regressed: max ulp*",
                                 "*FAILED*test_api_precision?Torch.rsqrt-float32?*"])
    rows = {(r["api"], r["dtype"]): r for r in _csv(pytester)}
    bad = rows[("Torch.rsqrt", "float32")]
    assert bad["status"] == gate.REGRESSED and float(bad["max_ulp"]) > 1000 * float(bad["golden_max_ulp"])
    assert rows[("Torch.rsqrt", "float16")]["status"] == gate.NEWLY_FLAGGED
    assert {r["status"] for k, r in rows.items() if k[0] != "Torch.rsqrt"} == {gate.OK}


@pytest.mark.slow
def test_catalogue_under_xdist_merges_every_worker(pytester):
    pytest.importorskip("xdist")
    pytester.makeini("[pytest]\n")
    result = _run(pytester, "-k", SELECT, "-n", "2")
    result.assert_outcomes(passed=9)
    assert len(_csv(pytester)) == 9


@pytest.mark.slow
def test_catalogue_on_the_simulated_npu_catches_a_fused_operator_defect(pytester):
    pytester.makeini("[pytest]\n")
    args = ("--msprobe-simulated-npu", "--msprobe-device=npu")
    regen = _run(pytester, *args, "--msprobe-regen-golden", source="npu")
    regen.assert_outcomes(passed=12)  # 4 fused operators x 3 dtypes
    npu_golden = pytester.path / "golden" / "catalogue" / "npu" / "simulated-npu-cpu-backed"
    assert (npu_golden / "catalogue.csv").is_file()
    assert json.loads((npu_golden / "meta.json").read_text())["hardware"]["soc"] == "Simulated NPU (CPU-backed)"
    _run(pytester, *args, source="npu").assert_outcomes(passed=12)
    seeded = _run(pytester, *args, "--msprobe-simulated-npu-defect", "npu_rms_norm=reduced_precision", source="npu")
    seeded.assert_outcomes(passed=9, failed=3)
    rows = _csv(pytester)
    assert {r["device"] for r in rows} == {"npu"}
    assert {r["api"] for r in rows if r["status"] == gate.REGRESSED} == {"NPU.npu_rms_norm"}


def test_the_repo_golden_covers_the_catalogue_on_this_cpu():
    """CI gates golden/catalogue/cpu/ (README's test command runs the catalogue): it must exist,
    be readable, and hold rows of every source this machine runs."""
    root = REPO / "golden"
    folders = gate.stored(root, "cpu")
    assert folders and gate.UNRECORDED not in folders  # every CPU golden records its hardware
    rows = gate.load(folders[sorted(folders)[0]])
    sources = {r.source for r in rows.values()}
    assert "opinfo" in sources or "table" in sources
    assert len(rows) > 100


def test_ci_templates_run_the_catalogue_and_the_suite_and_can_regenerate():
    yaml = pytest.importorskip("yaml")
    root = REPO / "examples" / "ci"
    gh = yaml.safe_load((root / "github-actions-ascend.yml").read_text())
    steps = gh["jobs"]["precision"]["steps"]
    script = "\n".join(s.get("run", "") for s in steps)
    assert gh["jobs"]["precision"]["runs-on"] == ["self-hosted", "ascend"]
    assert "--pyargs pytest_msprobe.catalogue --msprobe-device=npu" in script
    assert "--msprobe-task=free_benchmark" in script and "$REGEN" in script
    assert "regen" in gh[True]["workflow_dispatch"]["inputs"]  # yaml reads the key "on" as True
    gl = yaml.safe_load((root / "gitlab-ci-ascend.yml").read_text())
    gate_job, regen_job = gl["npu-precision"], gl["npu-precision-regen"]
    assert any("--pyargs pytest_msprobe.catalogue --msprobe-device=npu" in line for line in gate_job["script"])
    assert regen_job["when"] == "manual" and any("--msprobe-regen-golden" in line for line in regen_job["script"])
    assert "golden/" in regen_job["artifacts"]["paths"]


def test_mindspore_catalogue_measures_mint_and_catches_a_seeded_defect(monkeypatch):
    """The MindSpore side: mint APIs of the table, scored against MindSpore's own float64 run, and a
    float32 kernel computing through float16 regresses against its clean golden."""
    ms = pytest.importorskip("mindspore")
    from mindspore import mint

    from pytest_msprobe.catalogue.cases import mindspore_cases
    from pytest_msprobe.catalogue.measure import measure

    cases = {c.id: c for c in mindspore_cases()}
    assert "Mint.exp-float32" in cases and "MintFunctional.softmax-float16" in cases
    case = cases["Mint.exp-float32"]
    clean = measure(case, "cpu")
    assert clean.samples > 0 and clean.max_ulp < 64 and clean.verdict in ("pass", "n/a")
    golden = _golden_of(clean)
    assert _judged(measure(case, "cpu"), golden)["status"] == gate.OK  # deterministic inputs: the same figures
    original = mint.exp

    def exp_through_float16(x, *args, **kwargs):
        if x.dtype == ms.float32:
            return original(x.astype(ms.float16), *args, **kwargs).astype(ms.float32)
        return original(x, *args, **kwargs)

    monkeypatch.setattr(mint, "exp", exp_through_float16)
    bad = _judged(measure(case, "cpu"), golden)
    assert bad["status"] == gate.REGRESSED and bad["max_ulp"] > 100 * max(clean.max_ulp, 1.0)
    monkeypatch.undo()
    with pytest.raises(NothingToMeasure, match="MindSpore"):  # no bfloat16 kernel on the CPU build
        measure(cases["Mint.exp-bfloat16"], "cpu")


def test_unknown_catalogue_source_is_a_clear_error(monkeypatch):
    from probes.core.errors import ConfigError
    from pytest_msprobe.catalogue.cases import all_cases

    monkeypatch.setenv("MSPROBE_CATALOGUE_SOURCE", "opinfos")
    with pytest.raises(ConfigError, match="MSPROBE_CATALOGUE_SOURCE.*auto, opinfo, table, mindspore, npu"):
        all_cases()


# structure -------------------------------------------------------------------------------------
def _catalogue_imports() -> dict[str, set[str]]:
    """module -> the catalogue modules it imports, at any level (a function-level import is an
    import too: hiding a cycle there only defers it)."""
    import ast

    import pytest_msprobe.catalogue as package

    folder = Path(package.__file__).parent
    names = {p.stem for p in folder.glob("*.py")}
    out: dict[str, set[str]] = {}
    for path in folder.glob("*.py"):
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "pytest_msprobe.catalogue":
                deps |= {a.name for a in node.names if a.name in names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pytest_msprobe.catalogue."):
                deps.add(node.module.rsplit(".", 1)[1])
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{path.name} imports private {private} from {node.module}"
        out[path.stem] = deps
    return out


def test_the_catalogue_modules_import_each_other_without_a_cycle():
    imports = _catalogue_imports()
    assert imports["records"] == set() and imports["draws"] == set()  # the shared leaves
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        for dep in imports.get(module, ()):
            assert dep not in path, "import cycle: " + " -> ".join(path + [dep])
            if dep not in done:
                visit(dep, path + [dep])
        done.add(module)

    for module in imports:
        visit(module, [module])


def test_a_case_seed_is_stable_and_a_free_benchmark_summary_reads_as_a_verdict():
    from pytest_msprobe.catalogue.records import FLAGGED, NOT_CHECKED, PASS, summary_verdict

    case = CatalogueCase("Torch.exp", "float16", "table", "Torch.exp", "Torch.exp")
    assert case.seed == CatalogueCase("Torch.exp", "float16", "opinfo", "Torch.exp", "x").seed  # by ref and dtype
    assert case.seed != CatalogueCase("Torch.exp", "float32", "table", "Torch.exp", "Torch.exp").seed
    assert case.seed == 641412323  # the goldens' inputs: a new seed would move every figure
    flagged = {"apis": {"Torch.exp": {"checked": 4, "flagged": 1, "worst_max_rel": 0.012345, "threshold": 0.004}}}
    assert summary_verdict("Torch.exp", flagged) == (FLAGGED, "1 of 4 calls flagged (worst 0.0123 > 0.004)")
    assert summary_verdict("Torch.exp", {"apis": {"Torch.exp": {"checked": 4}}}) == (PASS, "4 calls checked")
    skipped = {"not_checked": {"no float input": ["Torch.exp"]}}
    assert summary_verdict("Torch.exp", skipped) == (NOT_CHECKED, "no float input")
