"""Golden-file regression (pytest_msprobe.golden): missing/regen/pass cycle, byte-stable files,
each kind's seeded regression caught and clean runs passing, name validation, provenance."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import pytest

from probes.core.errors import ConfigError
from probes.grad_probe import csv_format
from probes.grad_probe.stats import GradStats
from pytest_msprobe.golden import GoldenStore, validate_name
from pytest_msprobe.golden.kinds import fb_bound, read_npz

PROVENANCE = {"torch": "2.13.0", "device": "cpu"}


@pytest.fixture(autouse=True)
def _fixed_date(monkeypatch, tmp_path):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")  # 2023-11-14
    monkeypatch.chdir(tmp_path)


def store(root: str = "golden", regen: bool = False, provenance: dict | None = None) -> GoldenStore:
    return GoldenStore(Path(root), regen=regen, provenance=PROVENANCE if provenance is None else provenance)


def recorded(name: str, check: str, *args, **kwargs):
    """Write the golden (the regen run), then return the outcome of a normal run on ``args``."""
    first = getattr(store(regen=True), check)(name, *args, **kwargs)
    assert first.regenerated and not first.ok
    return getattr(store(), check)


# ---------------------------------------------------------------------------------------------
# synthetic inputs


def apis(**overrides) -> dict:
    base = {
        "Functional.softmax": {"checked": 10, "flagged": 2, "worst_max_rel": 0.01, "threshold": 0.004,
                               "dtypes": ["torch.float16"]},
        "Torch.matmul": {"checked": 5, "flagged": 1, "worst_max_rel": "nan_mismatch", "threshold": 0.004,
                         "dtypes": ["torch.bfloat16"]},
        "Functional.gelu": {"checked": 7, "flagged": 0, "worst_max_rel": None, "threshold": None,
                            "dtypes": ["torch.float16"]},
    }
    for api, value in overrides.items():
        api = api.replace("__", ".")
        if value is None:
            base.pop(api, None)
        else:
            base[api] = {**base.get(api, {}), **value}
    return base


PARAMS = {"fc.weight": (8, 16), "fc.bias": (16,), "out/w 1": (4, 4)}


def grad_dump(root: Path, ranks=(0,), steps=3, params=None, seed=0, flip=None, scale=None, level="L1") -> Path:
    """A grad_probe dump with the package's own writers: a gradient per parameter drifting a
    little each step. ``flip=(rank, step, param, fraction)`` negates the first ``fraction`` of that
    gradient's elements; ``scale=(rank, step, param, factor)`` scales it (same directions)."""
    params = PARAMS if params is None else params
    rng = np.random.default_rng(seed)
    base = {p: rng.standard_normal(shape) for p, shape in params.items()}
    for rank in ranks:
        for step in range(steps):
            rows = []
            for p, shape in params.items():
                g = base[p] + 0.001 * step * np.sign(base[p])  # same signs every step
                if flip and flip[:3] == (rank, step, p):
                    flat = g.reshape(-1).copy()
                    n = int(round(flip[3] * flat.size))
                    flat[:n] = -flat[:n]
                    g = flat.reshape(shape)
                if scale and scale[:3] == (rank, step, p):
                    g = g * scale[3]
                rows.append(GradStats(p, tuple(shape), float(g.max()), float(g.min()), float(np.linalg.norm(g)),
                                      md5=("%08x" % (step + 1)) if level == "L0" else None))
                if level != "L0":
                    csv_format.write_direction(csv_format.direction_path(root, rank, step, p), g > 0)
            csv_format.write_summary_csv(csv_format.summary_csv_path(root, rank, step), level, [], rows)
    return root


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


# ---------------------------------------------------------------------------------------------
# the cycle: missing -> regen (fails once) -> passes


def test_missing_golden_fails_and_says_how_to_create_it():
    out = store().check_free_benchmark("suite/fb", apis())
    assert not out.ok and not out.regenerated
    assert "golden suite/fb (free_benchmark) not found" in out.message
    assert "pytest --msprobe-regen-golden" in out.message
    assert "review and commit golden/suite/fb/" in out.message
    assert not Path("golden").exists()  # a normal run never writes a golden


def test_regen_writes_fails_once_then_identical_data_passes():
    out = store(regen=True).check_free_benchmark("fb", apis())
    assert (out.ok, out.regenerated) == (False, True)
    assert out.message == "golden fb written to golden/fb/; rerun without --msprobe-regen-golden"
    assert sorted(p.name for p in Path("golden/fb").iterdir()) == ["apis.csv", "meta.json"]
    again = store().check_free_benchmark("fb", apis())
    assert again.ok, again.message
    assert "3 APIs within the golden's margin" in again.message


def test_regen_of_unchanged_golden_changes_nothing():
    store(regen=True).check_grad_run("g", grad_dump(Path("dump")))
    before = folder_bytes(Path("golden/g"))
    mtimes = {p.name: p.stat().st_mtime_ns for p in Path("golden/g").iterdir()}
    again = store(regen=True).check_grad_run("g", Path("dump"))
    assert again.regenerated and not again.ok and again.details["changed"] is False
    assert "(unchanged" in again.message
    assert folder_bytes(Path("golden/g")) == before
    assert {p.name: p.stat().st_mtime_ns for p in Path("golden/g").iterdir()} == mtimes


# ---------------------------------------------------------------------------------------------
# files: deterministic, small, diff-friendly


def test_golden_files_are_byte_stable(monkeypatch):
    dump = grad_dump(Path("dump"), ranks=(0, 1))
    ops = [{"op": "aten.add.Tensor", "cosine": 0.95, "max_abs_err": 0.25}]
    clock = iter([1.0e9, 1.7e9] * 1000)  # zip timestamps would differ if anything read the clock
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: next(clock, real_time()))
    for root in ("golden_a", "golden_b"):
        s = store(root, regen=True)
        s.check_free_benchmark("fb", apis())
        s.check_grad_run("grad", dump)
        s.check_online_dispatch("od", ops)
    for name in ("fb", "grad", "od"):
        a, b = folder_bytes(Path("golden_a") / name), folder_bytes(Path("golden_b") / name)
        assert a == b, name
    for name in ("fb", "grad", "od"):
        assert sum(len(v) for v in folder_bytes(Path("golden_a") / name).values()) < 16000


def test_free_benchmark_file_is_sorted_text_with_exact_floats():
    figures = apis(Functional__softmax={"worst_max_rel": 0.1 + 0.2})
    store(regen=True).check_free_benchmark("fb", figures)
    text = Path("golden/fb/apis.csv").read_bytes().decode("utf-8")
    assert text.splitlines() == [
        "api,worst_max_rel,dtypes,threshold,checked,flagged",
        "Functional.gelu,,torch.float16,,7,0",
        "Functional.softmax,0.30000000000000004,torch.float16,0.004,10,2",
        "Torch.matmul,nan_mismatch,torch.bfloat16,0.004,5,1",
    ]
    assert "\r" not in text
    assert store().check_free_benchmark("fb", figures).ok  # repr round trip: equal, not "within margin"


def test_meta_records_kind_versions_device_and_date():
    store(regen=True).check_online_dispatch("od", [])
    meta = json.loads(Path("golden/od/meta.json").read_text())
    assert meta["kind"] == "online_dispatch"
    assert meta["created"] == "2023-11-14"
    assert meta["made_with"]["torch"] == "2.13.0" and meta["made_with"]["device"] == "cpu"
    assert {"python", "numpy", "probes"} <= set(meta["made_with"])
    assert meta["files"] == ["failing_ops.csv"]


def test_failure_message_shows_who_made_the_golden_and_this_run():
    store(regen=True).check_online_dispatch("od", [])
    other = GoldenStore(Path("golden"), provenance={"torch": "2.14.0", "device": "cuda"})
    out = other.check_online_dispatch("od", [{"op": "aten.mul.Tensor", "cosine": 0.5, "max_abs_err": 1.0}])
    assert not out.ok
    assert "golden made with torch 2.13.0 on cpu, python " in out.message
    assert "(2023-11-14); this run: torch 2.14.0 on cuda, python " in out.message
    same = store().check_online_dispatch("od", [])
    assert same.ok and "this run: the same" in same.message


# ---------------------------------------------------------------------------------------------
# free_benchmark


def test_margin_rule_is_relative_with_an_absolute_floor():
    assert fb_bound(0.01) == pytest.approx(0.011)
    assert fb_bound(0.0) == pytest.approx(1e-4)
    assert fb_bound(0.0005) == pytest.approx(0.0006)  # 10% would be 5e-5: the floor wins
    assert fb_bound(0.01, margin=0.5, margin_abs=0.0) == pytest.approx(0.015)


def test_free_benchmark_clean_and_within_margin_pass():
    check = recorded("fb", "check_free_benchmark", apis())
    assert check("fb", apis()).ok
    assert check("fb", apis(Functional__softmax={"worst_max_rel": 0.0109})).ok


def test_free_benchmark_max_rel_growth_is_caught_with_statistics():
    check = recorded("fb", "check_free_benchmark", apis())
    out = check("fb", apis(Functional__softmax={"worst_max_rel": 0.02}))
    assert not out.ok and not out.regenerated
    lines = out.message.splitlines()
    assert lines[0].startswith("golden fb (free_benchmark) regressed: 1 of 3 APIs regressed")
    assert "Functional.softmax: max_rel 0.02 > allowed 0.011 (golden 0.01, +100%" in lines[1]
    assert out.details["failures"][0]["golden"] == 0.01 and out.details["failures"][0]["now"] == 0.02
    assert out.details["counts"]["regressed"] == 1
    assert "rule: a flagged API's max_rel may grow to golden + max(0.1 x golden, 0.0001)" in out.message
    assert "--msprobe-regen-golden" in lines[-1]


def test_free_benchmark_string_verdict_where_golden_had_a_number_fails():
    check = recorded("fb", "check_free_benchmark", apis())
    out = check("fb", apis(Functional__softmax={"worst_max_rel": "symbol_flipping"}))
    assert not out.ok
    assert "Functional.softmax: symbol_flipping where the golden had max_rel 0.01" in out.message
    # a NaN figure (as JSON round trips write it) is a verdict too
    out = check("fb", apis(Functional__softmax={"worst_max_rel": "nan"}))
    assert not out.ok and "Functional.softmax: nan where the golden had max_rel 0.01" in out.message


def test_free_benchmark_newly_flagged_api_fails():
    check = recorded("fb", "check_free_benchmark", apis())
    out = check("fb", apis(Functional__gelu={"flagged": 1, "worst_max_rel": 0.006, "threshold": 0.004},
                           Torch__exp={"checked": 3, "flagged": 3, "worst_max_rel": 0.5, "threshold": 0.004}))
    assert not out.ok
    assert "2 of 4 APIs regressed" in out.message
    lines = out.message.splitlines()
    assert lines[1].startswith("  Torch.exp: newly flagged, max_rel 0.5 (allowed: threshold 0.004; not in the golden")
    assert lines[2].startswith("  Functional.gelu: newly flagged, max_rel 0.006 (allowed: threshold 0.004; checked "
                               "clean in the golden")


def test_free_benchmark_improvements_and_missing_apis_are_information():
    check = recorded("fb", "check_free_benchmark", apis())
    out = check("fb", apis(Functional__softmax={"flagged": 0, "worst_max_rel": None}, Torch__matmul=None,
                           Torch__add={"checked": 2, "flagged": 0}))
    assert out.ok, out.message
    assert out.details["counts"] == {"apis": 4, "regressed": 0, "improved": 1, "not_checked": 1, "new_clean": 1}
    info = " ".join(out.details["info"])
    assert "Functional.softmax 0.01 -> clean" in info and "Torch.matmul" in info and "Torch.add" in info
    out = check("fb", apis(Functional__gelu={"dtypes": ["torch.bfloat16"]}))
    assert out.ok and "Functional.gelu torch.float16 -> torch.bfloat16" in out.message


def test_free_benchmark_failures_worst_first_and_capped():
    many = {f"api{i:02d}": {"checked": 1, "flagged": 1, "worst_max_rel": 0.01, "threshold": 0.004} for i in range(15)}
    check = recorded("fb", "check_free_benchmark", many)
    worse = {k: {**v, "worst_max_rel": 0.02 + int(k[3:]) * 0.001} for k, v in many.items()}
    out = check("fb", worse)
    lines = out.message.splitlines()
    assert "15 of 15 APIs regressed" in lines[0]
    assert lines[1].startswith("  api14:") and lines[10].startswith("  api05:")
    assert lines[11] == "  ... and 5 more (details['failures'])"
    assert len(out.details["failures"]) == 15


# ---------------------------------------------------------------------------------------------
# grad_run


def test_grad_run_identical_dump_passes_root_and_rank_folder():
    dump = grad_dump(Path("dump"), ranks=(0, 1))
    check = recorded("grad", "check_grad_run", dump)
    out = check("grad", dump)
    assert out.ok, out.message
    assert out.details["counts"]["cells"] == 2 * 3 * len(PARAMS)
    assert out.details["data"]["similarity"]["rank0"]["summary"] == [1.0, 1.0, 1.0]
    single = recorded("rank1", "check_grad_run", dump / "rank1")
    assert single("rank1", dump / "rank1").ok
    npz = read_npz(Path("golden/grad/grad_directions.npz"))
    assert npz["bits/rank1/step2/fc.weight"].dtype == np.uint8 and npz["bits/rank1/step2/fc.weight"].size == 16
    assert list(npz["shape/rank1/step2/fc.weight"]) == [8, 16]
    assert "bits/rank0/step0/out%2Fw%201" in npz


def test_grad_run_flipped_block_at_a_later_step_is_a_drop():
    check = recorded("grad", "check_grad_run", grad_dump(Path("dump")))
    bad = grad_dump(Path("bad"), flip=(0, 1, "fc.weight", 0.1))
    out = check("grad", bad, rtol=10.0, atol=10.0)  # statistics aside: the directions alone must fail
    assert not out.ok
    assert "1 direction flag(s)" in out.message
    line = next(x for x in out.message.splitlines() if "rank0 fc.weight" in x)
    assert "similarity 0.898438 dropped by 0.101562 > 0.03 from 1 at step 0" in line
    assert "[115/128 elements agree with the golden]" in line


def test_grad_run_flipped_block_at_the_first_step_and_statistics():
    check = recorded("grad", "check_grad_run", grad_dump(Path("dump")))
    out = check("grad", grad_dump(Path("bad"), flip=(0, 0, "fc.bias", 0.25)))
    assert not out.ok
    assert "rank0 fc.bias: similarity 0.75 < 0.97 at its first compared step (0)" in out.message
    # a gradient 10% larger in the same directions: statistics out of tolerance, directions fine
    out = check("grad", grad_dump(Path("scaled"), scale=(0, 2, "fc.weight", 1.1)))
    assert not out.ok
    assert "0 direction flag(s)" in out.message and "statistic(s) out of tolerance" in out.message
    line = next(x for x in out.message.splitlines() if "rank0 step 2 fc.weight norm:" in x)
    assert "golden 10.8" in line and "now 11.88" in line and "allowed ±0.108" in line
    assert check("grad", grad_dump(Path("scaled2"), scale=(0, 2, "fc.weight", 1.1)), rtol=0.2).ok


def test_grad_run_small_flip_within_the_rule_passes():
    check = recorded("grad", "check_grad_run", grad_dump(Path("dump")))
    out = check("grad", grad_dump(Path("ok"), flip=(0, 0, "fc.weight", 0.02)), rtol=10.0)
    assert out.ok, out.message
    assert "lowest direction similarity 0.976562" in out.message


def test_grad_run_missing_and_extra_params_steps_ranks_are_reported():
    check = recorded("grad", "check_grad_run", grad_dump(Path("dump"), ranks=(0, 1)))
    fewer = {k: v for k, v in PARAMS.items() if k != "fc.bias"}
    out = check("grad", grad_dump(Path("a"), ranks=(0, 1), params={**fewer, "fc.extra": (3,)}))
    assert not out.ok
    assert "rank0: 1 parameter(s) in the golden, not in this run: fc.bias (steps 0, 1, 2)" in out.message
    assert "rank0: 1 parameter(s) in this run, not in the golden: fc.extra (steps 0, 1, 2)" in out.message
    out = check("grad", grad_dump(Path("b"), ranks=(0,), steps=4))
    assert "rank1: in the golden, not in this run" in out.message
    assert "rank0: steps in this run only: 3" in out.message


def test_grad_run_failures_are_listed_structure_then_direction_then_figures():
    """A missing rank is read first, even beside statistics that became infinite: a run of another
    shape makes its figures moot."""
    check = recorded("grad", "check_grad_run", grad_dump(Path("dump"), ranks=(0, 1)))
    out = check("grad", grad_dump(Path("bad"), ranks=(0,), flip=(0, 1, "fc.weight", 0.1),
                                  scale=(0, 2, "fc.bias", math.inf)))
    listed = [line for line in out.message.splitlines() if line.startswith("  ")]

    def category(line: str) -> str:
        if "not in this run" in line:
            return "structure"
        return "direction" if "similarity" in line else "figure"

    order = [category(line) for line in listed]
    assert order[0] == "structure" and {"direction", "figure"} <= set(order), out.message
    assert order == sorted(order, key=["structure", "direction", "figure"].index), out.message
    assert "now inf" in listed[order.index("figure")]  # within a category, the farthest out first


def test_grad_run_l0_dump_compares_md5():
    dump = grad_dump(Path("dump"), level="L0")
    check = recorded("grad", "check_grad_run", dump)
    assert check("grad", dump).ok
    assert read_npz(Path("golden/grad/grad_directions.npz")) == {}


def test_grad_run_bad_dump_dir_is_a_config_error():
    Path("empty").mkdir()
    with pytest.raises(ConfigError, match="dump_dir"):
        store().check_grad_run("g", Path("empty"))
    with pytest.raises(ConfigError, match="dump_dir"):
        store().check_grad_run("g", Path("nowhere"))
    with pytest.raises(ConfigError, match="rtol"):
        store().check_grad_run("g", grad_dump(Path("dump")), rtol=-1)


# ---------------------------------------------------------------------------------------------
# online_dispatch


def test_online_dispatch_new_failing_op_fails_fixed_op_is_information():
    golden = [{"op": "aten.add.Tensor", "cosine": 0.95, "max_abs_err": 0.25},
              {"op": "aten.add.Tensor", "cosine": 0.9, "max_abs_err": 0.1},
              {"op": "aten.div.Tensor", "cosine": 0.98, "max_abs_err": 2.0}]
    check = recorded("od", "check_online_dispatch", golden)
    assert Path("golden/od/failing_ops.csv").read_text().splitlines() == [
        "op,calls,cosine,max_abs_err", "aten.add.Tensor,2,0.9,0.25", "aten.div.Tensor,1,0.98,2.0"]
    assert check("od", golden).ok
    out = check("od", golden[:2] + [{"op": "aten.mul.Tensor", "cosine": 0.5, "max_abs_err": "nan"}])
    assert not out.ok
    assert "1 of 2 failing ops are new (not failing in the golden)" in out.message
    assert ("aten.mul.Tensor: fails now (cosine 0.5, max_abs_err nan, 1 call(s)); the golden does not list it as "
            "failing (allowed: not failing)") in out.message
    assert "1 op(s) of the golden no longer fail: aten.div.Tensor" in out.message
    fixed = check("od", [])
    assert fixed.ok and fixed.details["counts"]["fixed"] == 2


def test_online_dispatch_bad_input_is_a_config_error():
    with pytest.raises(ConfigError, match=r"failing_ops\[0\]"):
        store().check_online_dispatch("od", [{"cosine": 0.5}])


# ---------------------------------------------------------------------------------------------
# names and odd goldens


@pytest.mark.parametrize("name", ["../x", "/abs", "a//b", "a/./b", "a/../b", "a b", "a/", "", "x\\y", "é", 5, None])
def test_bad_names_are_rejected(name):
    with pytest.raises(ConfigError, match="golden name") as err:
        store().check_online_dispatch(name, [])
    assert "letters, digits" in str(err.value)


def test_good_names_and_nested_goldens():
    assert validate_name("models/resnet-18_v1.2") == "models/resnet-18_v1.2"
    s = store(regen=True)
    s.check_online_dispatch("a", [])
    s.check_free_benchmark("a/b", apis())
    s.check_online_dispatch("a", [{"op": "x", "cosine": 0.1, "max_abs_err": 1.0}])  # rewriting a keeps a/b
    assert store().check_free_benchmark("a/b", apis()).ok


def test_kind_mismatch_and_unreadable_golden_fail_clearly():
    store(regen=True).check_online_dispatch("od", [])
    out = store().check_free_benchmark("od", apis())
    assert not out.ok and "holds a 'online_dispatch' result, but this check is 'free_benchmark'" in out.message
    Path("golden/od/failing_ops.csv").write_text("garbage\n")
    out = store().check_online_dispatch("od", [])
    assert not out.ok and "cannot read golden/od/" in out.message and "--msprobe-regen-golden" in out.message


def test_outcome_details_are_json_serialisable():
    check = recorded("fb", "check_free_benchmark", apis())
    out = check("fb", apis(Functional__softmax={"worst_max_rel": math.inf}))
    assert not out.ok
    json.dumps(out.details, allow_nan=False)
    dump = grad_dump(Path("dump"))
    check = recorded("grad", "check_grad_run", dump)
    nan_run = Path("nan")
    grad_dump(nan_run, steps=2)
    grad_dump(nan_run, steps=1, params={"fc.bias": (16,)}, scale=(0, 0, "fc.bias", math.nan))
    out = check("grad", nan_run)
    assert not out.ok and "rank0 step 0 fc.bias norm: golden 4.05951, now nan" in out.message
    json.dumps(out.details, allow_nan=False)


def test_grad_run_reads_the_plugin_watch_optimizer_folders():
    dump = grad_dump(Path("dump"))
    grad_dump(dump / "optimizer1", params={"head.w": (5,)}, seed=1)
    check = recorded("grad", "check_grad_run", dump)
    assert check("grad", dump).details["counts"]["cells"] == 3 * len(PARAMS) + 3
    grad_dump(Path("bad"))
    grad_dump(Path("bad") / "optimizer1", params={"head.w": (5,)}, seed=1, flip=(0, 0, "head.w", 0.2))
    out = check("grad", Path("bad"))
    assert not out.ok and "optimizer1/rank0 head.w: similarity 0.8 < 0.97" in out.message


# ---------------------------------------------------------------------------------------------
# one check routine, the kinds found by task name


def test_every_task_has_a_golden_kind():
    from probes.core.config import TASKS
    from pytest_msprobe.golden.kinds import KINDS

    assert tuple(KINDS) == TASKS
    assert [k.name for k in KINDS.values()] == ["free_benchmark", "grad_run", "online_dispatch"]
    assert all(k.snapshot is not None and k.compare is not None for k in KINDS.values())


def test_the_named_checks_are_the_one_check_by_task_name():
    dump = grad_dump(Path("dump"))
    s = store(regen=True)
    s.check("free_benchmark", "fb", apis())
    s.check("grad_probe", "grad", dump)
    s.check("online_dispatch", "od", [])
    now = apis(Functional__softmax={"worst_max_rel": 0.02})
    assert store().check("free_benchmark", "fb", now).message == store().check_free_benchmark("fb", now).message
    assert not store().check("free_benchmark", "fb", now).ok and store().check("free_benchmark", "fb", now, margin=2).ok
    assert store().check("grad_probe", "grad", dump, rtol=0.5).ok and store().check("online_dispatch", "od", []).ok
    with pytest.raises(ConfigError, match="margin_abs"):  # options are checked before the golden is read
        store().check("free_benchmark", "missing", apis(), margin_abs=-1)
    with pytest.raises(TypeError):
        store().check("online_dispatch", "od", [], margin=1)  # online_dispatch takes no options


def test_an_unknown_or_write_only_kind_is_not_checked():
    from pytest_msprobe.golden.kinds import Kind, csv_bytes

    with pytest.raises(ConfigError, match="free_benchmark, grad_probe, online_dispatch"):
        store().check("grad_run", "g", Path("dump"))  # the kind's name is not a task name
    written_only = Kind("notes", lambda rows: {"notes.csv": csv_bytes(["x"], rows)}, lambda folder: None)
    assert store().write("n", written_only, [[1]]) and Path("golden/n/notes.csv").read_text() == "x\n1\n"
    with pytest.raises(TypeError, match="'notes' is written, not checked"):
        store().check(written_only, "n", [[1]])
