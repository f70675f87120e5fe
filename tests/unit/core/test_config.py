"""Tests for probes.core.config: every bad config fails early with a message naming key and value."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from probes.core.config import (
    FREE_BENCHMARK_KEYS,
    TASKS,
    FreeBenchmarkConfig,
    ProbeConfig,
    load_config,
    parse_index_list,
)
from probes.core.errors import ConfigError


def cfg(fb: dict[str, Any] | None = None, **top: Any) -> dict[str, Any]:
    """A valid free_benchmark config, with top-level keys and free_benchmark keys replaced."""
    out: dict[str, Any] = {"task": "free_benchmark", "dump_path": "./out"}
    out.update(top)
    if fb is not None:
        out["free_benchmark"] = fb
    return out


def without(key: str) -> dict[str, Any]:
    out = cfg()
    del out[key]
    return out


# (id, config, key the error must name, bad value the message must show, extra text the message must hold)
BAD_CONFIGS: list[tuple[str, dict[str, Any], str, object, str]] = [
    # task
    ("task-missing", without("task"), "task", None, "grad_probe"),
    ("task-statistics", cfg(task="statistics"), "task", "statistics", "not supported"),
    ("task-tensor", cfg(task="tensor"), "task", "tensor", "not supported"),
    ("task-int", cfg(task=1), "task", 1, "free_benchmark"),
    ("task-typo", cfg(task="free_benchmrk"), "task", "free_benchmrk", 'did you mean "free_benchmark"'),
    # dump_path
    ("dump_path-missing", without("dump_path"), "dump_path", None, "required"),
    ("dump_path-empty", cfg(dump_path=""), "dump_path", "", "non-empty"),
    ("dump_path-blank", cfg(dump_path="   "), "dump_path", "   ", "non-empty"),
    ("dump_path-int", cfg(dump_path=5), "dump_path", 5, "string"),
    ("dump_path-list", cfg(dump_path=["a"]), "dump_path", ["a"], "string"),
    # rank / step
    ("rank-string", cfg(rank="1"), "rank", "1", "write [1]"),
    ("rank-int", cfg(rank=3), "rank", 3, "write [3]"),
    ("rank-negative", cfg(rank=[-1]), "rank[0]", -1, "1000000"),
    ("rank-too-big", cfg(rank=[0, 1_000_001]), "rank[1]", 1_000_001, "1000000"),
    ("rank-bool", cfg(rank=[True]), "rank[0]", True, "boolean"),
    ("rank-inverted", cfg(rank=["4-2"]), "rank[0]", "4-2", 'write "2-4"'),
    ("rank-range-too-big", cfg(rank=["0-1000001"]), "rank[0]", "0-1000001", "1000000"),
    ("rank-too-many", cfg(rank=["0-999999", 1_000_000]), "rank", ["0-999999", 1_000_000], "at most"),
    ("rank-garbage", cfg(rank=["a-b"]), "rank[0]", "a-b", "range"),
    ("rank-negative-string", cfg(rank=["-1"]), "rank[0]", "-1", "range"),
    ("rank-float", cfg(rank=[1.5]), "rank[0]", 1.5, "number"),
    ("rank-quoted-number", cfg(rank=["5"]), "rank[0]", "5", "write 5"),
    ("step-string-range", cfg(step="0-3"), "step", "0-3", 'write ["0-3"]'),
    ("step-object", cfg(step={"a": 1}), "step", {"a": 1}, "list"),
    ("step-null-element", cfg(step=[None]), "step[0]", None, "null"),
    ("step-inverted", cfg(step=[1, "9-3"]), "step[1]", "9-3", "inverted"),
    # level / strict
    ("level-L0-free_benchmark", cfg(level="L0"), "level", "L0", "API-level (L1)"),
    ("level-mix-free_benchmark", cfg(level="mix"), "level", "mix", "API-level (L1)"),
    ("level-unknown", cfg(level="L3"), "level", "L3", '"debug"'),
    ("level-int", cfg(level=1), "level", 1, "string"),
    ("strict-string", cfg(strict="yes"), "strict", "yes", "true or false"),
    ("strict-int", cfg(strict=1), "strict", 1, "true or false"),
    # sections
    ("section-string", cfg(free_benchmark="on"), "free_benchmark", "on", "object"),
    ("section-list", cfg(free_benchmark=[]), "free_benchmark", [], "object"),
    ("grad_probe-section-string", cfg(grad_probe="x"), "grad_probe", "x", "object"),
    # scope / list
    ("scope-string", cfg({"scope": "relu"}), "free_benchmark.scope", "relu", 'write ["relu"]'),
    ("scope-int-element", cfg({"scope": [1]}), "free_benchmark.scope[0]", 1, "string"),
    (
        "scope-empty-element",
        cfg({"scope": ["Torch.relu.0.forward", ""]}),
        "free_benchmark.scope[1]",
        "",
        "non-empty",
    ),
    ("scope-object", cfg({"scope": {"a": 1}}), "free_benchmark.scope", {"a": 1}, "list"),
    ("list-string", cfg({"list": "relu"}), "free_benchmark.list", "relu", 'write ["relu"]'),
    ("list-int", cfg({"list": 3}), "free_benchmark.list", 3, "list"),
    ("list-none-element", cfg({"list": ["relu", None]}), "free_benchmark.list[1]", None, "string"),
    # enumerated strings
    ("fuzz_device-gpu", cfg({"fuzz_device": "gpu"}), "free_benchmark.fuzz_device", "gpu", '"npu"'),
    ("fuzz_device-int", cfg({"fuzz_device": 1}), "free_benchmark.fuzz_device", 1, "string"),
    (
        "fuzz_device-upper",
        cfg({"fuzz_device": "NPU"}),
        "free_benchmark.fuzz_device",
        "NPU",
        'did you mean "npu"',
    ),
    ("pert_mode-unknown", cfg({"pert_mode": "noise"}), "free_benchmark.pert_mode", "noise", "bit_noise"),
    (
        "pert_mode-list",
        cfg({"pert_mode": ["add_noise"]}),
        "free_benchmark.pert_mode",
        ["add_noise"],
        "string",
    ),
    ("pert_mode-empty", cfg({"pert_mode": ""}), "free_benchmark.pert_mode", "", "improve_precision"),
    (
        "handler_type-preheat",
        cfg({"handler_type": "preheat"}),
        "free_benchmark.handler_type",
        "preheat",
        '"fix"',
    ),
    ("handler_type-bool", cfg({"handler_type": True}), "free_benchmark.handler_type", True, "string"),
    ("fuzz_level-L2", cfg({"fuzz_level": "L2"}), "free_benchmark.fuzz_level", "L2", '"L1"'),
    ("fuzz_stage-both", cfg({"fuzz_stage": "both"}), "free_benchmark.fuzz_stage", "both", '"backward"'),
    (
        "add_noise_style-bad",
        cfg({"add_noise_style": "fancy"}),
        "free_benchmark.add_noise_style",
        "fancy",
        '"ulp"',
    ),
    # booleans / integers
    (
        "if_preheat-string-true",
        cfg({"if_preheat": "true"}),
        "free_benchmark.if_preheat",
        "true",
        "use JSON true",
    ),
    (
        "if_preheat-string-false",
        cfg({"if_preheat": "false"}),
        "free_benchmark.if_preheat",
        "false",
        "use JSON false",
    ),
    ("if_preheat-int", cfg({"if_preheat": 1}), "free_benchmark.if_preheat", 1, "true or false"),
    ("preheat_step-zero", cfg({"preheat_step": 0}), "free_benchmark.preheat_step", 0, "> 0"),
    ("preheat_step-string", cfg({"preheat_step": "15"}), "free_benchmark.preheat_step", "15", "integer"),
    ("max_sample-negative", cfg({"max_sample": -1}), "free_benchmark.max_sample", -1, "> 0"),
    ("max_sample-true", cfg({"max_sample": True}), "free_benchmark.max_sample", True, "not a boolean"),
    ("max_sample-float", cfg({"max_sample": 2.5}), "free_benchmark.max_sample", 2.5, "integer"),
    # combination rules (handler / stage / pert_mode / preheat)
    (
        "fix-add_noise",
        cfg({"handler_type": "fix", "pert_mode": "add_noise"}),
        "free_benchmark.pert_mode",
        "add_noise",
        '"fix"',
    ),
    (
        "fix-no_change",
        cfg({"handler_type": "fix", "pert_mode": "no_change"}),
        "free_benchmark.pert_mode",
        "no_change",
        "improve_precision",
    ),
    (
        "fix-backward",
        cfg({"handler_type": "fix", "fuzz_stage": "backward", "list": ["relu"]}),
        "free_benchmark.fuzz_stage",
        "backward",
        '"forward"',
    ),
    (
        "fix-preheat",
        cfg({"handler_type": "fix", "if_preheat": True}),
        "free_benchmark.if_preheat",
        True,
        '"fix"',
    ),
    ("to_cpu-npu", cfg({"pert_mode": "to_cpu"}), "free_benchmark.fuzz_device", "npu", "to_cpu"),
    (
        "to_cpu-explicit-npu",
        cfg({"pert_mode": "to_cpu", "fuzz_device": "npu"}),
        "free_benchmark.fuzz_device",
        "npu",
        '"cpu"',
    ),
    (
        "cpu-improve_precision",
        cfg({"fuzz_device": "cpu", "pert_mode": "improve_precision"}),
        "free_benchmark.pert_mode",
        "improve_precision",
        '"to_cpu"',
    ),
    (
        "cpu-default-pert_mode",
        cfg({"fuzz_device": "cpu"}),
        "free_benchmark.pert_mode",
        "improve_precision",
        "cpu",
    ),
    ("backward-no-list", cfg({"fuzz_stage": "backward"}), "free_benchmark.list", [], "backward"),
    (
        "scope-and-list",
        cfg({"scope": ["Torch.relu.0.forward"], "list": ["relu"]}),
        "free_benchmark.scope",
        ["Torch.relu.0.forward"],
        "conflict",
    ),
]


def _check(exc: ConfigError, key: str, value: object, extra: str) -> None:
    msg = str(exc)
    assert exc.key == key, msg
    assert key in msg
    assert repr(value) in msg, msg
    assert extra in msg, msg


@pytest.mark.parametrize(
    ("config", "key", "value", "extra"), [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS]
)
def test_bad_config_is_rejected(config: dict[str, Any], key: str, value: object, extra: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(config)
    _check(info.value, key, value, extra)


def test_bad_config_table_is_large_and_distinct() -> None:
    ids = [c[0] for c in BAD_CONFIGS]
    assert len(ids) == len(set(ids))
    assert len(BAD_CONFIGS) >= 30


@pytest.mark.parametrize(
    ("config", "key", "value", "extra"), [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS]
)
def test_bad_config_is_rejected_from_a_file(
    tmp_path: Path, config: dict[str, Any], key: str, value: object, extra: str
) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    _check(info.value, key, value, extra)


# -------------------------------------------------------------------------------------------------
# files, overrides and keyword arguments


def test_invalid_json_gives_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{\n  "task": "free_benchmark",\n  "dump_path": "x"\n  "rank": []\n}\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"line 4, column 3") as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_non_json_extension_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(cfg()), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"\.json") as info:
        load_config(str(path))
    assert str(path) in str(info.value)


def test_missing_file_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "nope.json"
    with pytest.raises(ConfigError, match="missing") as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_directory_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "dir.json"
    path.mkdir()
    with pytest.raises(ConfigError, match="directory"):
        load_config(path)


def test_top_level_must_be_an_object(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(ConfigError, match="JSON object at the top level"):
        load_config(path)


def test_bad_source_type_is_rejected() -> None:
    with pytest.raises(ConfigError, match="source"):
        load_config(5)  # type: ignore[arg-type]


def test_bad_override_key_lists_allowed_keys() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(cfg(), overrides={"pert_mod": "add_noise"})
    msg = str(info.value)
    assert info.value.key == "overrides"
    assert "'pert_mod'" in msg
    assert "pert_mode" in msg and "rank" in msg
    assert 'did you mean "pert_mode"' in msg


def test_bad_dotted_override_key_is_rejected() -> None:
    with pytest.raises(ConfigError, match="free_benchmark.bogus"):
        load_config(cfg(), overrides={"free_benchmark.bogus": 1})


@pytest.mark.parametrize(
    ("overrides", "key", "value"),
    [
        ({"pert_mode": "nonsense"}, "free_benchmark.pert_mode", "nonsense"),
        ({"rank": "0"}, "rank", "0"),
        ({"max_sample": 0}, "free_benchmark.max_sample", 0),
        ({"if_preheat": "true"}, "free_benchmark.if_preheat", "true"),
        ({"level": "L2"}, "level", "L2"),
        ({"list": "relu"}, "free_benchmark.list", "relu"),
        ({"task": "statistics"}, "task", "statistics"),
    ],
)
def test_override_values_are_validated_like_file_values(
    overrides: dict[str, Any], key: str, value: object
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(cfg(), overrides=overrides)
    assert info.value.key == key
    assert repr(value) in str(info.value)


def test_override_can_break_a_combination() -> None:
    with pytest.raises(ConfigError, match="to_cpu"):
        load_config(cfg({"fuzz_device": "cpu", "pert_mode": "to_cpu"}), overrides={"fuzz_device": "npu"})


def test_keyword_step_uses_the_json_syntax() -> None:
    with pytest.raises(ConfigError, match=r"write \[1\]") as info:
        load_config(cfg(), step="1")
    assert info.value.key == "step"
    assert load_config(cfg(), step=[3, "0-1"]).step == (0, 1, 3)


def test_keyword_task_and_dump_path_are_validated() -> None:
    with pytest.raises(ConfigError, match="not supported"):
        load_config(cfg(), task="tensor")
    with pytest.raises(ConfigError, match="dump_path"):
        load_config(cfg(), dump_path="")


def test_overrides_must_be_a_mapping() -> None:
    with pytest.raises(ConfigError, match="overrides"):
        load_config(cfg(), overrides=[("rank", [0])])  # type: ignore[arg-type]


# -------------------------------------------------------------------------------------------------
# good paths


def test_defaults_when_section_missing() -> None:
    c = load_config({"task": "free_benchmark", "dump_path": "out"})
    assert c == ProbeConfig(task="free_benchmark", dump_path="out")
    fb = c.free_benchmark
    assert fb == FreeBenchmarkConfig()
    assert fb.max_sample == 20
    assert fb.preheat_step == 15
    assert fb.pert_mode == "improve_precision"
    assert fb.fuzz_device == "npu"
    assert fb.handler_type == "check"
    assert fb.fuzz_stage == "forward"
    assert fb.fuzz_level == "L1"
    assert fb.if_preheat is False
    assert fb.add_noise_style == "ulp"
    assert (c.rank, c.step, c.level, c.strict) == ((), (), "L1", False)
    assert dict(c.extra_sections) == {}


def test_reference_template_section_loads() -> None:
    fb = {
        "scope": [],
        "list": [],
        "fuzz_device": "npu",
        "pert_mode": "improve_precision",
        "handler_type": "check",
        "fuzz_level": "L1",
        "fuzz_stage": "forward",
        "if_preheat": False,
        "preheat_step": 15,
        "max_sample": 20,
    }
    c = load_config(cfg(fb, rank=[], step=[], level="L1"))
    assert c.free_benchmark == FreeBenchmarkConfig()


def test_null_means_default() -> None:
    fb = dict.fromkeys(FREE_BENCHMARK_KEYS)
    c = load_config(cfg(fb, rank=None, step=None, level=None, strict=None))
    assert c == ProbeConfig(task="free_benchmark", dump_path="./out")
    assert load_config(cfg(free_benchmark=None)).free_benchmark == FreeBenchmarkConfig()


def test_null_override_resets_to_default() -> None:
    c = load_config(cfg({"pert_mode": "add_noise"}), overrides={"pert_mode": None})
    assert c.free_benchmark.pert_mode == "improve_precision"


def test_rank_and_step_expansion() -> None:
    c = load_config(cfg(rank=[0, "2-4", 3], step=["5-5", 1, " 7 - 8 ", 1]))
    assert c.rank == (0, 2, 3, 4)
    assert c.step == (1, 5, 7, 8)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, ()),
        ([], ()),
        ((2, 1), (1, 2)),
        ([0, "2-4", 3], (0, 2, 3, 4)),
        (["0-0"], (0,)),
        ([1_000_000], (1_000_000,)),
        (["999998-1000000"], (999_998, 999_999, 1_000_000)),
    ],
)
def test_parse_index_list(value: object, expected: tuple[int, ...]) -> None:
    assert parse_index_list("rank", value) == expected


def test_parse_index_list_uses_the_given_key() -> None:
    with pytest.raises(ConfigError, match=r"my\.steps\[0\]"):
        parse_index_list("my.steps", [-3])


def test_overrides_and_kwargs_win_over_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(cfg({"pert_mode": "add_noise", "max_sample": 5}, rank=[1], step=[1], strict=False)),
        encoding="utf-8",
    )
    c = load_config(
        path,
        task="free_benchmark",
        dump_path="elsewhere",
        step=["3-4"],
        overrides={"pert_mode": "bit_noise", "rank": [0, 2], "strict": True, "free_benchmark.list": ["relu"]},
    )
    assert c.dump_path == "elsewhere"
    assert c.step == (3, 4)
    assert c.rank == (0, 2)
    assert c.strict is True
    assert c.free_benchmark.pert_mode == "bit_noise"
    assert c.free_benchmark.api_list == ("relu",)
    assert c.free_benchmark.max_sample == 5  # not overridden: from the file


def test_kwargs_win_over_overrides() -> None:
    c = load_config(cfg(), overrides={"step": [1], "dump_path": "a"}, step=[2], dump_path="b")
    assert (c.step, c.dump_path) == ((2,), "b")


def test_task_from_kwarg_only() -> None:
    c = load_config({"dump_path": "d"}, task="free_benchmark")
    assert c.task == "free_benchmark"
    assert load_config(None, task="grad_probe", dump_path="d").task == "grad_probe"


def test_dump_path_kept_as_given_and_not_created(tmp_path: Path) -> None:
    target = tmp_path / "not" / "yet"
    c = load_config(cfg(dump_path="rel/../path"))
    assert c.dump_path == "rel/../path"
    c = load_config(cfg(), dump_path=target)
    assert c.dump_path == str(target)
    assert not target.exists()


def test_unknown_top_level_key_warns() -> None:
    with pytest.warns(UserWarning, match="'dump_pth'") as record:
        c = load_config({**cfg(), "dump_pth": "x"})
    assert "dump_path" in str(record[0].message)  # the known keys are listed
    assert c.dump_path == "./out"


def test_unknown_section_key_warns() -> None:
    with pytest.warns(UserWarning, match=r"free_benchmark\.'?max_samples") as record:
        load_config(cfg({"max_samples": 3}))
    assert 'did you mean "max_sample"' in str(record[0].message)
    assert record[0].filename == __file__  # points at the caller of load_config


def test_msprobe_keys_are_silently_accepted() -> None:
    config = {
        **cfg(),
        "is_deterministic": False,
        "enable_dataloader": False,
        "acl_config": "",
        "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"},
        "tensor": {"scope": []},
        "overflow_check": {"overflow_nums": 1},
        "run_ut": {"white_list": []},
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = load_config(config)
    assert dict(c.extra_sections) == {}


def test_other_task_sections_are_kept_raw() -> None:
    gp = {"grad_level": "L1", "param_list": [], "bounds": [-1, 0, 1]}
    c = load_config(cfg(grad_probe=gp, online_dispatch={"dump_mode": "all"}))
    assert dict(c.extra_sections["grad_probe"]) == gp
    assert dict(c.extra_sections["online_dispatch"]) == {"dump_mode": "all"}
    gp["grad_level"] = "L2"  # the config does not alias the caller's data
    assert c.extra_sections["grad_probe"]["grad_level"] == "L1"


def test_other_tasks_accept_other_levels() -> None:
    assert load_config(cfg(task="grad_probe", level="L0")).level == "L0"


def test_valid_combinations() -> None:
    to_cpu = load_config(cfg({"fuzz_device": "cpu", "pert_mode": "to_cpu", "handler_type": "fix"}))
    assert to_cpu.free_benchmark.pert_mode == "to_cpu"
    backward = load_config(cfg({"fuzz_stage": "backward", "list": ["matmul"], "pert_mode": "add_noise"}))
    assert backward.free_benchmark.api_list == ("matmul",)
    preheat = load_config(cfg({"if_preheat": True, "preheat_step": 3, "max_sample": 7}))
    assert (preheat.free_benchmark.preheat_step, preheat.free_benchmark.max_sample) == (3, 7)
    scope = load_config(cfg({"scope": ["Torch.relu.0.forward"], "list": []}))
    assert scope.free_benchmark.scope == ("Torch.relu.0.forward",)
    ref = load_config(cfg({"pert_mode": "add_noise", "add_noise_style": "reference"}))
    assert ref.free_benchmark.add_noise_style == "reference"


def test_selects_step_and_rank() -> None:
    everything = load_config(cfg())
    assert everything.selects_step(0) and everything.selects_step(123456)
    assert everything.selects_rank(0) and everything.selects_rank(7)
    some = load_config(cfg(rank=[1, "3-4"], step=["1-1000000"]))  # the largest list allowed: 1e6 entries
    assert [r for r in range(6) if some.selects_rank(r)] == [1, 3, 4]
    assert some.selects_step(1) and some.selects_step(1_000_000)
    assert not some.selects_step(0) and not some.selects_step(1_000_001) and not some.selects_step(-1)


def test_to_dict_round_trip(tmp_path: Path) -> None:
    original = load_config(
        cfg(
            {"list": ["relu", "matmul"], "fuzz_stage": "backward", "pert_mode": "bit_noise", "max_sample": 9},
            rank=["0-2"],
            step=[5, 1],
            strict=True,
            grad_probe={"grad_level": "L1"},
        )
    )
    data = original.to_dict()
    text = json.dumps(data)  # JSON-serialisable
    assert data["free_benchmark"]["list"] == ["relu", "matmul"]
    assert "api_list" not in data["free_benchmark"]
    assert data["rank"] == [0, 1, 2] and data["step"] == [1, 5]
    assert load_config(data) == original
    path = tmp_path / "summary_config.json"
    path.write_text(text, encoding="utf-8")
    assert load_config(path) == original
    assert hash(load_config(path)) == hash(original)


def test_configs_are_frozen() -> None:
    c = load_config(cfg())
    with pytest.raises(AttributeError):
        c.task = "grad_probe"  # type: ignore[misc]
    with pytest.raises(TypeError):
        c.extra_sections["x"] = {}  # type: ignore[index]


def test_missing_task_lists_all_tasks() -> None:
    with pytest.raises(ConfigError) as info:
        load_config({"dump_path": "d"})
    for t in TASKS:
        assert t in str(info.value)


def test_core_config_imports_no_framework() -> None:
    code = (
        "import sys, probes.core.config; "
        "bad = [m for m in ('torch', 'mindspore', 'numpy') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_backward_stage_accepts_scope_alone():
    config = load_config(cfg({"fuzz_stage": "backward", "scope": ["Functional.linear.0.backward"]}))
    assert config.free_benchmark.scope == ("Functional.linear.0.backward",)
