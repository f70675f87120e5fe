"""grad_probe comparison side: GradComparator, the 0.97/0.03 rule, the assertion and the CLI.

Dumps are synthesised with numpy in msprobe's layout: per rank
``grad_summary_{N}.csv`` (UTF-8 BOM, CRLF, ``param_name,max,min,norm,shape`` or with ``MD5`` at L0)
and ``step{N}/{param}.npy`` holding ``g > 0`` as bool in the gradient's shape (L1/L2 only).
"""

from __future__ import annotations

import csv
import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from probes.__main__ import main as cli
from probes.grad_probe.assertion import assert_grad_directions_close
from probes.grad_probe.comparator import (
    EMPTY,
    MD5_DIFFERS,
    MD5_EQUAL,
    MISSING_A,
    MISSING_B,
    NOT_BOOL,
    OK,
    SHAPE_MISMATCH,
    GradComparator,
    GradComparison,
)
from probes.grad_probe.direction_rule import (
    FIRST_STEP_MIN,
    MAX_DROP,
    REASON_DROP,
    REASON_FIRST_STEP,
    Flag,
    apply_rule,
    first_flagged_step,
    flag_series,
)

SHAPES = {"0.weight": (3, 4), "0.bias": (3,), "2.weight": (2, 3)}


# ---------------------------------------------------------------------------------------------
# synthetic dumps


def crc(g: np.ndarray) -> str:
    return f"{zlib.crc32(np.ascontiguousarray(g, dtype=np.float32).tobytes()):08x}"


def write_grad_csv(path: Path, grads: dict[str, np.ndarray], level: str = "L1") -> None:
    header = ["param_name", *(["MD5"] if level == "L0" else []), "max", "min", "norm", "shape"]
    with open(path, "w", encoding="utf-8-sig", newline="") as fh:
        w = csv.writer(fh, lineterminator="\r\n")
        w.writerow(header)
        for name, g in grads.items():
            g32 = g.astype(np.float32)
            stats = [float(g32.max()), float(g32.min()), float(np.linalg.norm(g32))] if g.size else ["", "", ""]
            w.writerow([name, *([crc(g)] if level == "L0" else []), *stats, str(list(g.shape))])


def write_rank(rank_dir: Path, steps: dict[int, dict[str, np.ndarray]], level: str = "L1") -> Path:
    rank_dir.mkdir(parents=True, exist_ok=True)
    for n, grads in steps.items():
        write_grad_csv(rank_dir / f"grad_summary_{n}.csv", grads, level)
        if level != "L0":
            (rank_dir / f"step{n}").mkdir(exist_ok=True)
            for name, g in grads.items():
                np.save(rank_dir / f"step{n}" / f"{name}.npy", g > 0)
    return rank_dir


def random_run(seed: int = 0, n_steps: int = 4, shapes=None) -> dict[int, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    shapes = shapes or SHAPES
    return {n: {name: rng.standard_normal(shape) for name, shape in shapes.items()} for n in range(n_steps)}


def flipped(run, param: str, from_step: int):
    return {n: {k: (-g if (k == param and n >= from_step) else g) for k, g in grads.items()}
            for n, grads in run.items()}


def rows_of(path: Path) -> list[list[str]]:
    with open(path, encoding="utf-8-sig", newline="") as fh:
        return list(csv.reader(fh))


@pytest.fixture
def pair(tmp_path):
    """Two dump roots with rank0 from the same random run; returns (root_a, root_b, run)."""
    run = random_run()
    write_rank(tmp_path / "a" / "rank0", run)
    write_rank(tmp_path / "b" / "rank0", run)
    return tmp_path / "a", tmp_path / "b", run


# ---------------------------------------------------------------------------------------------
# the rule


def test_rule_thresholds_are_the_documented_ones():
    assert (FIRST_STEP_MIN, MAX_DROP) == (0.97, 0.03)


def test_rule_first_step_and_drop_are_strict():
    assert flag_series("p", [(0, 0.97), (1, 0.94)]) == []  # 0.97 is not < 0.97; 0.03 drop is not > 0.03
    assert flag_series("p", [(0, 1.0), (1, 0.97)]) == []  # binary 0.030000000000000027 still not a drop
    [f] = flag_series("p", [(0, 0.9699), (1, 0.9699)])
    assert (f.step, f.reason, f.previous) == (0, REASON_FIRST_STEP, None)


def test_rule_docs_example_drop_is_flagged():
    flags = flag_series("layer.weight", [(0, 0.99), (1, 0.992), (2, 0.98945), (3, 0.956872)])
    assert flags == [Flag("layer.weight", 3, 0.956872, REASON_DROP, 0.98945, 2)]


def test_rule_skips_none_and_measures_from_previous_value():
    flags = flag_series("p", [(0, None), (1, 0.99), (2, None), (3, 0.95), (4, 0.94)])
    assert [(f.step, f.reason, f.previous, f.previous_step) for f in flags] == [(3, REASON_DROP, 0.99, 1)]
    # first *compared* step is the first non-None one
    assert [f.step for f in flag_series("p", [(0, None), (1, 0.5)])] == [1]


def test_apply_rule_sorted_by_step_then_row_order_summary_last():
    sim = {"b": {0: 0.5, 1: 0.5}, "a": {0: 1.0, 1: 0.5}}
    flags = apply_rule(sim, [1, 0], {0: 0.9, 1: 0.9})
    assert [(f.step, f.param) for f in flags] == [(0, "b"), (0, "summary"), (1, "a")]
    assert first_flagged_step(flags) == 0 and first_flagged_step([]) is None
    with pytest.raises(ValueError):
        apply_rule(sim, [0, 1], first_step_min=1.5)


# ---------------------------------------------------------------------------------------------
# compare / compare_distributed


def test_identical_runs_all_one_no_flags(pair, tmp_path):
    a, b, run = pair
    out = tmp_path / "out"
    dist = GradComparator.compare_distributed(a, b, out)
    assert dist.rank_status == {0: "ok"} and dist.ok
    res = dist[0]
    assert isinstance(res, GradComparison)
    assert res.steps == [0, 1, 2, 3] and res.params == list(SHAPES)
    assert all(res.similarity[p][s] == 1.0 and res.status[p][s] == OK for p in res.params for s in res.steps)
    assert res.summary == {s: 1.0 for s in res.steps} and res.flags == []
    rows = rows_of(out / "rank0" / "similarities.csv")
    assert rows[0] == ["step", "0", "1", "2", "3"]
    assert [r[0] for r in rows[1:]] == [*SHAPES, "summary"]
    assert all(r[1:] == ["1.0"] * 4 for r in rows[1:])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rank_status"] == {"rank0": "ok"} and summary["first_flagged_step"] is None
    assert json.loads((out / "rank0" / "summary.json").read_text())["state"] == "ok"
    assert_grad_directions_close(a, b, plots=False)
    assert_grad_directions_close(a / "rank0", b / "rank0", plots=False)


def test_flipped_parameter_flagged_at_step_two(tmp_path):
    run = random_run(1)
    write_rank(tmp_path / "a" / "rank0", run)
    write_rank(tmp_path / "b" / "rank0", flipped(run, "0.bias", 2))
    res = GradComparator.compare(tmp_path / "a" / "rank0", tmp_path / "b" / "rank0", tmp_path / "out", plots=False)
    assert res.first_flagged_step() == 2
    assert res.similarity["0.bias"] == {0: 1.0, 1: 1.0, 2: 0.0, 3: 0.0}
    at2 = [f for f in res.flags if f.step == 2]
    assert [f.param for f in at2] == ["0.bias", "summary"]
    assert at2[0].reason == REASON_DROP and at2[0].previous == 1.0
    assert res.summary[2] == pytest.approx(18 / 21)
    evidence = tmp_path / "evidence"
    with pytest.raises(AssertionError) as info:
        assert_grad_directions_close(tmp_path / "a", tmp_path / "b", out=evidence, plots=False)
    msg = str(info.value)
    assert "First flagged step: 2" in msg and "0.bias" in msg and "0.03" in msg and "0.97" in msg
    assert "[0/3 elements agree]" in msg and str(evidence) in msg
    assert (evidence / "rank0" / "similarities.csv").exists()


def test_first_step_similarity_095_flagged(tmp_path):
    g = np.linspace(1, 100, 100)  # all positive
    h = g.copy()
    h[:5] *= -1  # 5 of 100 directions differ -> 0.95
    write_rank(tmp_path / "a", {0: {"w": g}, 1: {"w": g}})
    write_rank(tmp_path / "b", {0: {"w": h}, 1: {"w": h}})
    res = GradComparator.compare(tmp_path / "a", tmp_path / "b", None)
    assert res.similarity["w"] == {0: 0.95, 1: 0.95}
    assert [(f.param, f.step, f.reason) for f in res.flags] == [("w", 0, REASON_FIRST_STEP),
                                                                ("summary", 0, REASON_FIRST_STEP)]
    with pytest.raises(AssertionError, match=r"(?s)First flagged step: 0.*w: similarity 0\.95 < 0\.97"):
        assert_grad_directions_close(tmp_path / "a", tmp_path / "b", plots=False)


def _worked_example_runs():
    """An example checked against msprobe's comparator: 0.weight (12 elements), 0.bias (3), 2.weight (6), 4 steps."""
    same = {"0.weight": [6, 5, 7, 6], "0.bias": [2, 1, 0, 1], "2.weight": [3, 3, 0, 3]}
    shapes = {"0.weight": (3, 4), "0.bias": (3,), "2.weight": (2, 3)}
    a, b = {}, {}
    for n in range(4):
        a[n], b[n] = {}, {}
        for name, shape in shapes.items():
            g = np.arange(1, int(np.prod(shape)) + 1, dtype=np.float64).reshape(shape)
            h = g.copy().reshape(-1)
            h[same[name][n]:] *= -1
            a[n][name], b[n][name] = g, h.reshape(shape)
    return a, b


def test_spec_worked_example_numbers(tmp_path):
    ra, rb = _worked_example_runs()
    write_rank(tmp_path / "a", ra)
    write_rank(tmp_path / "b", rb)
    GradComparator.compare(tmp_path / "a", tmp_path / "b", tmp_path / "out", plots=False)
    rows = rows_of(tmp_path / "out" / "similarities.csv")
    assert rows[0] == ["step", "0", "1", "2", "3"]
    assert rows[1] == ["0.weight", "0.5", "0.4166666666666667", "0.5833333333333334", "0.5"]
    assert rows[-1] == ["summary", "0.5238095238095238", "0.42857142857142855", "0.3333333333333333",
                        "0.47619047619047616"]


def test_similarities_csv_has_bom_and_crlf(pair, tmp_path):
    a, b, _ = pair
    GradComparator.compare(a / "rank0", b / "rank0", tmp_path / "out", plots=False)
    raw = (tmp_path / "out" / "similarities.csv").read_bytes()
    assert raw.startswith(b"\xef\xbb\xbfstep,0,1,2,3\r\n")
    assert raw.count(b"\r\n") == raw.count(b"\n") == 1 + len(SHAPES) + 1


def test_numeric_parameter_names_stay_strings_and_order_is_the_first_csv(tmp_path):
    rng = np.random.default_rng(3)
    grads = {"1": rng.standard_normal(4), "0": rng.standard_normal(5), "10": rng.standard_normal(2)}
    write_rank(tmp_path / "a", {0: grads, 1: grads})
    write_rank(tmp_path / "b", {0: grads, 1: grads})
    # a parameter that only has direction files at step 1 is appended, sorted
    for side in ("a", "b"):
        np.save(tmp_path / side / "step1" / "zz.npy", np.ones(3, bool))
        np.save(tmp_path / side / "step1" / "00.npy", np.ones(3, bool))
    res = GradComparator.compare(tmp_path / "a", tmp_path / "b", tmp_path / "out", plots=False)
    assert res.params == ["1", "0", "10", "00", "zz"]
    assert all(isinstance(p, str) for p in res.params)
    assert res.similarity["0"] == {0: 1.0, 1: 1.0}
    assert res.status["zz"] == {0: "absent", 1: OK}
    assert [r[0] for r in rows_of(tmp_path / "out" / "similarities.csv")] == ["step", "1", "0", "10", "00", "zz",
                                                                              "summary"]


def test_missing_npy_on_one_side_is_a_status_and_the_rest_is_compared(pair, tmp_path):
    a, b, _ = pair
    os.remove(b / "rank0" / "step1" / "0.bias.npy")
    os.remove(a / "rank0" / "step2" / "2.weight.npy")
    res = GradComparator.compare(a / "rank0", b / "rank0", tmp_path / "out", plots=False)
    assert res.status["0.bias"][1] == MISSING_B and res.similarity["0.bias"][1] is None
    assert res.status["2.weight"][2] == MISSING_A
    assert res.similarity["0.weight"] == {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0}
    assert res.summary[1] == 1.0 and res.flags == []
    assert res.problems() == [("0.bias", 1, MISSING_B), ("2.weight", 2, MISSING_A)]
    rows = rows_of(tmp_path / "out" / "similarities.csv")
    assert {len(r) for r in rows} == {5}
    assert rows[2] == ["0.bias", "1.0", "", "1.0", "1.0"]
    with pytest.raises(AssertionError, match="missing_b"):
        assert_grad_directions_close(a, b, plots=False)
    assert_grad_directions_close(a, b, plots=False, strict=False)


def test_shape_mismatch_and_not_bool_are_statuses(pair, tmp_path):
    a, b, _ = pair
    np.save(b / "rank0" / "step0" / "0.weight.npy", np.ones((4, 3), bool))
    np.save(b / "rank0" / "step1" / "0.bias.npy", np.ones(3, np.float32))
    res = GradComparator.compare(a / "rank0", b / "rank0", None)
    assert res.status["0.weight"][0] == SHAPE_MISMATCH and res.status["0.bias"][1] == NOT_BOOL
    assert res.similarity["0.weight"][0] is None and res.similarity["0.weight"][1] == 1.0
    assert res.summary[0] == 1.0  # the bad cell is left out of the summary


def test_pt_files_are_not_accepted(pair, tmp_path):
    a, b, _ = pair
    for side in (a, b):
        os.remove(side / "rank0" / "step0" / "0.bias.npy")
        (side / "rank0" / "step0" / "0.bias.pt").write_bytes(b"not a numpy file")
    res = GradComparator.compare(a / "rank0", b / "rank0", None)
    assert res.status["0.bias"][0] == "absent" and res.similarity["0.bias"][0] is None


def test_empty_gradients_write_zero_with_status_empty(tmp_path):
    run = {0: {"e": np.zeros((0, 3)), "w": np.ones(4)}}
    write_rank(tmp_path / "a", run)
    write_rank(tmp_path / "b", run)
    res = GradComparator.compare(tmp_path / "a", tmp_path / "b", tmp_path / "out", plots=False)
    assert res.status["e"][0] == EMPTY and res.similarity["e"][0] == 0.0 and res.flags == []
    assert rows_of(tmp_path / "out" / "similarities.csv")[1] == ["e", "0"]


def test_rank_present_on_one_side_is_a_rank_status(pair, tmp_path):
    a, b, run = pair
    write_rank(a / "rank1", run)
    write_rank(b / "rank2", run)
    out = tmp_path / "out"
    dist = GradComparator.compare_distributed(a, b, out, plots=False)
    assert dist.rank_status == {0: "ok", 1: MISSING_B, 2: MISSING_A}
    assert list(dist) == [0] and dist[0].flags == [] and not dist.ok
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rank_status"] == {"rank0": "ok", "rank1": MISSING_B, "rank2": MISSING_A}
    assert not (out / "rank1").exists()
    with pytest.raises(AssertionError, match="rank1: missing_b"):
        assert_grad_directions_close(a, b, plots=False)


def test_l0_dumps_compared_by_md5(tmp_path):
    run = random_run(5, n_steps=3)
    other = flipped(run, "0.weight", 1)
    write_rank(tmp_path / "a" / "rank0", run, level="L0")
    write_rank(tmp_path / "b" / "rank0", other, level="L0")
    dist = GradComparator.compare_distributed(tmp_path / "a", tmp_path / "b", tmp_path / "out", plots=False)
    res = dist[0]
    assert res.mode == {0: "md5", 1: "md5", 2: "md5"}
    assert res.status["0.weight"] == {0: MD5_EQUAL, 1: MD5_DIFFERS, 2: MD5_DIFFERS}
    assert res.similarity["0.weight"] == {0: 1.0, 1: 0.0, 2: 0.0}
    assert res.status["0.bias"] == {0: MD5_EQUAL, 1: MD5_EQUAL, 2: MD5_EQUAL}
    assert res.summary == {0: 1.0, 1: 9 / 21, 2: 9 / 21}  # weighted by element count from `shape`
    assert res.first_flagged_step() == 1


def test_pictures_are_640x480_pngs_with_summary(pair, tmp_path):
    a, b, _ = pair
    out = tmp_path / "out"
    GradComparator.compare(a / "rank0", b / "rank0", out)
    pics = sorted(p.name for p in (out / "similarities_picture").iterdir())
    assert pics == sorted(f"{n}_similarities.png" for n in [*SHAPES, "summary"])
    for name in pics:
        head = (out / "similarities_picture" / name).read_bytes()[:24]
        assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
        assert struct.unpack(">II", head[16:24]) == (640, 480)


def test_parameter_named_summary_does_not_collide(tmp_path):
    rng = np.random.default_rng(7)
    run = {n: {"summary": rng.standard_normal(4), "w": rng.standard_normal(6)} for n in range(2)}
    other = flipped(run, "summary", 1)
    write_rank(tmp_path / "a", run)
    write_rank(tmp_path / "b", other)
    out = tmp_path / "out"
    res = GradComparator.compare(tmp_path / "a", tmp_path / "b", out)
    assert res.params == ["summary", "w"] and res.row_names["summary"] == "summary (parameter)"
    rows = rows_of(out / "similarities.csv")
    assert [r[0] for r in rows] == ["step", "summary (parameter)", "w", "summary"]
    assert rows[1] == ["summary (parameter)", "1.0", "0.0"] and rows[3] == ["summary", "1.0", "0.6"]
    assert {(f.param, f.step) for f in res.flags} == {("summary (parameter)", 1), ("summary", 1)}
    assert (out / "similarities_picture" / "summary%20%28parameter%29_similarities.png").exists()
    assert (out / "similarities_picture" / "summary_similarities.png").exists()


def test_inputs_are_only_read(pair, tmp_path):
    a, b, _ = pair

    def snapshot(root):
        return {str(p): (p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(root.rglob("*"))}

    before = snapshot(a), snapshot(b)
    for p in [*a.rglob("*"), *b.rglob("*"), a, b]:
        p.chmod(0o555 if p.is_dir() else 0o444)
    try:
        GradComparator.compare_distributed(a, b, tmp_path / "out", plots=False)
    finally:
        for p in [a, b, *a.rglob("*"), *b.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
    assert (snapshot(a), snapshot(b)) == before


def test_no_rank_folders_is_an_error(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with pytest.raises(ValueError, match="no rank"):
        GradComparator.compare_distributed(tmp_path / "a", tmp_path / "b", tmp_path / "out")
    with pytest.raises(FileNotFoundError, match="path2"):
        GradComparator.compare(tmp_path / "a", tmp_path / "nope", None)


# ---------------------------------------------------------------------------------------------
# CLI


def test_cli_clean_run_exits_0(pair, tmp_path, capsys):
    a, b, _ = pair
    assert cli(["grad-compare", str(a), str(b), str(tmp_path / "out"), "--no-plots"]) == 0
    text = capsys.readouterr().out
    assert "no parameter flagged" in text and "summary" in text and "1.000000" in text


def test_cli_flags_seeded_defect_exits_1(tmp_path, capsys):
    run = random_run(2)
    write_rank(tmp_path / "a" / "rank0", run)
    write_rank(tmp_path / "b" / "rank0", flipped(run, "2.weight", 2))
    code = cli(["grad-compare", str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "out"), "--no-plots"])
    assert code == 1
    text = capsys.readouterr().out
    assert "first flagged step 2" in text and "step 2  2.weight" in text


def test_cli_thresholds_are_options(tmp_path):
    g = np.linspace(1, 100, 100)
    h = g.copy()
    h[:5] *= -1
    write_rank(tmp_path / "a", {0: {"w": g}})
    write_rank(tmp_path / "b", {0: {"w": h}})
    args = ["grad-compare", str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "out"), "--no-plots"]
    assert cli(args) == 1
    assert cli([*args, "--first-step-min", "0.9", "--max-drop", "0.1"]) == 0


def test_cli_usage_errors_exit_2(tmp_path, capsys):
    (tmp_path / "a").mkdir()
    assert cli(["grad-compare", str(tmp_path / "a"), str(tmp_path / "missing"), str(tmp_path / "out")]) == 2
    assert f"DIR_B does not exist: {tmp_path / 'missing'}" in capsys.readouterr().err
    assert cli(["grad-compare", str(tmp_path / "a")]) == 2
    assert cli([]) == 2
    assert cli(["grad-compare", str(tmp_path / "a"), str(tmp_path / "a"), "o", "--max-drop", "-1"]) == 2


def test_python_dash_m_probes(pair, tmp_path):
    a, b, _ = pair
    proc = subprocess.run([sys.executable, "-m", "probes", "grad-compare", str(a), str(b), str(tmp_path / "out"),
                           "--no-plots"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    mods = subprocess.run([sys.executable, "-c", "import probes.__main__, probes.grad_probe.comparator, "
                           "probes.grad_probe.plots, sys; print('torch' in sys.modules, 'matplotlib' in sys.modules)"],
                          capture_output=True, text=True, check=True)
    assert mods.stdout.split() == ["False", "False"]


def test_mindspore_graph_mode_header_and_steps_in_one_run_only(tmp_path):
    run = random_run(4, n_steps=3)
    write_rank(tmp_path / "a", run)
    write_rank(tmp_path / "b", {n: g for n, g in run.items() if n < 2})
    for csv_path in (tmp_path / "a").glob("*.csv"):  # MindSpore graph mode spells it Param_name
        text = csv_path.read_bytes().replace(b"param_name", b"Param_name", 1)
        csv_path.write_bytes(text)
    res = GradComparator.compare(tmp_path / "a", tmp_path / "b", None)
    assert res.steps == [0, 1] and res.params == list(SHAPES) and res.steps_only_a == [2]
    assert res.flags == [] and res.problems() == [] and not res.ok
    with pytest.raises(AssertionError, match=r"steps in one run only: a=\[2\] b=\[\]"):
        assert_grad_directions_close(tmp_path / "a", tmp_path / "b", plots=False)


def test_compare_on_dump_roots_explains_itself(pair):
    a, b, _ = pair
    res = GradComparator.compare(a, b, None)
    assert res.steps == [] and res.state == "no_common_steps" and "compare_distributed" in res.notes[-1]
    with pytest.raises(AssertionError, match="no step present in both runs"):
        assert_grad_directions_close(a / "rank0" / "step0", b / "rank0" / "step0", plots=False)


def test_progress_counter_on_stderr(pair, capsys, monkeypatch):
    a, b, _ = pair
    monkeypatch.setitem(sys.modules, "tqdm", None)  # force the fallback counter
    GradComparator.compare(a / "rank0", b / "rank0", None, progress=True)
    assert "calculate similarities (by step): 12/12" in capsys.readouterr().err


def test_l0_empty_gradient_with_equal_hash_is_similar(tmp_path):
    run = {0: {"e": np.zeros((0,)), "w": np.ones(3)}}
    write_rank(tmp_path / "a", run, level="L0")
    write_rank(tmp_path / "b", run, level="L0")
    res = GradComparator.compare(tmp_path / "a", tmp_path / "b", None)
    assert res.similarity["e"] == {0: 1.0} and res.summary == {0: 1.0} and res.flags == []


def test_a_comparison_built_by_hand_needs_only_its_folders():
    res = GradComparison("a", "b", steps=[0], params=["w"], similarity={"w": {0: 0.5}}, status={"w": {0: OK}},
                         summary={0: 0.5}, summary_status={0: OK})
    assert res.out is None and res.flags == [] and res.state == "ok" and res.ok
    empty = GradComparison("a", "b")
    assert empty.state == "no_common_steps" and not empty.ok
    assert empty.to_dict()["steps"] == [] and empty.first_step_min == FIRST_STEP_MIN and empty.max_drop == MAX_DROP


def test_the_rule_is_a_leaf_below_the_comparator_and_the_assertion():
    # each module imported alone: which grad_probe modules come with it (a cycle would bring the others)
    code = ("import sys; import probes.grad_probe.{0}; "
            "print(' '.join(sorted(m.rsplit('.', 1)[-1] for m in sys.modules if m.startswith('probes.grad_probe.'))))")
    loaded = {m: subprocess.run([sys.executable, "-c", code.format(m)], capture_output=True, text=True,
                                check=True).stdout.split() for m in ("direction_rule", "comparator", "assertion")}
    assert loaded["direction_rule"] == ["direction_rule"]
    assert "assertion" not in loaded["comparator"] and "direction_rule" in loaded["comparator"]
    assert {"comparator", "direction_rule"} <= set(loaded["assertion"])
