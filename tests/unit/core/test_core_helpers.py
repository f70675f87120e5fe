"""The shared helpers every error message and report uses: close-match hints, figures in text,
the versions a result records, atomic writes."""

from __future__ import annotations

import math
import sys

from probes.core.hints import close_matches, did_you_mean
from probes.core.number_format import short_number
from probes.core.versions import imported_frameworks, versions
from probes.core.writers import CsvAppender, csv_field, json_value, write_bytes_atomic, write_json_atomic


def test_close_matches_fold_case_first_and_keep_the_users_prefix():
    assert close_matches("BF16", ["bf16", "fp16", "bfloat16"])[0] == "bf16"
    names = ["Functional.softmax", "torch.nn.functional.softmax", "torch.softmax", "torch.nn.functional.silu"]
    assert close_matches("torch.nn.functional.sofmax", names)[0] == "torch.nn.functional.softmax"
    assert close_matches("zzz", names) == []
    assert close_matches("x", []) == []


def test_did_you_mean_quotes_the_matches_or_says_what_is_allowed():
    assert did_you_mean("scaeld", ["scaled", "reference"]) == 'did you mean "scaled"?'
    assert did_you_mean("zzz", ["scaled"], otherwise="allowed: scaled") == "allowed: scaled"


def test_short_number():
    assert short_number(0.000123456) == "0.0001235"
    assert short_number(math.inf) == "inf" and short_number(None) == "-" and short_number(None, missing="") == ""
    assert short_number(3) == "3" and short_number("nan_mismatch") == "nan_mismatch"
    assert short_number(0.9999871, digits=6, fixed=True) == "0.999987" and short_number(1.0, 6, fixed=True) == "1.000000"


def test_versions_read_what_ran():
    out = versions("pytest", "numpy", "no-such-distribution-anywhere")
    assert set(out) == {"python", "pytest", "numpy"}
    assert out["python"] == ".".join(map(str, sys.version_info[:3]))
    assert "python" not in versions("pytest", python=False)
    assert set(imported_frameworks()) <= {"torch", "mindspore", "torch_npu"}


def test_atomic_write_leaves_no_temporary(tmp_path):
    target = tmp_path / "sub" / "f.bin"
    write_bytes_atomic(target, b"abc")
    write_bytes_atomic(target, b"de")
    assert target.read_bytes() == b"de" and [p.name for p in target.parent.iterdir()] == ["f.bin"]


def test_json_summary_writes_non_finite_floats_and_odd_keys_as_strings(tmp_path):
    """A value json's C encoder takes as it is goes out unchanged; one with a non-finite float or a
    key it refuses goes through the conversion: the file is plain JSON either way, line per key."""
    import json

    target = tmp_path / "summary.json"
    data = {"plain": {"a": [1, 2.5, None, True], "n": {"x": (1, 2)}, 3: "int key"},
            "nonfinite": {"worst": math.inf, "rows": [math.nan, -math.inf, 1.0]},
            "tuple_key": {(1, 2): 0.5}}
    write_json_atomic(target, data)
    text = target.read_text()
    assert json.loads(text) == {"plain": {"a": [1, 2.5, None, True], "n": {"x": [1, 2]}, "3": "int key"},
                                "nonfinite": {"worst": "inf", "rows": ["nan", "-inf", 1.0]},
                                "tuple_key": {"(1, 2)": 0.5}}
    assert len(text.splitlines()) == 2 + len(data)  # braces and a line per top-level key
    # values encoded beforehand (a per-step summary's unchanged rows) give the same bytes
    rows = [{"max_rel": math.inf, "shape": "torch.Size([2])"}, {"max_rel": 1.5, "detail": {"ratio": math.nan}}]
    data["rows"] = rows
    write_json_atomic(target, data)
    whole = target.read_bytes()
    write_json_atomic(target, data, encoded={"rows": "[" + ", ".join(json_value(r) for r in rows) + "]"})
    assert target.read_bytes() == whole
    assert json.loads(whole)["rows"][0]["max_rel"] == "inf"


def test_csv_appender_writes_rendered_lines_and_cell_lists_in_order_as_csv_writer_would(tmp_path):
    """A tool may hand over a line it rendered itself (csv_field's quoting) between lists of cells."""
    import csv
    import io

    rows = [["a", "[4, 8]", 1.5], ["b", 'say "hi"', ""], ["c\nd", "e\r", -0.0]]
    rendered = [",".join(csv_field(c) if isinstance(c, str) else repr(c) for c in row) for row in rows]
    expected = io.StringIO()
    writer = csv.writer(expected, lineterminator="\r\n")
    writer.writerow(["h1", "h2", "h3"])
    writer.writerows(rows * 2)
    out = CsvAppender(tmp_path / "x.csv", ["h1", "h2", "h3"], newline="\r\n")
    out.add_all([rendered[0], rows[1], rows[2]])  # a line, then two lists
    out.flush()
    out.add_all([rows[0], rendered[1], rendered[2]])  # a list, then two lines
    out.flush()
    assert (tmp_path / "x.csv").read_bytes() == expected.getvalue().encode()
