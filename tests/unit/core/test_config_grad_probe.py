"""Tests for the grad_probe section of probes.core.config (msprobe's keys and checks)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from probes.core.config import GRAD_PROBE_KEYS, GradProbeConfig, load_config
from probes.core.errors import ConfigError


def gcfg(gp: dict[str, Any] | None = None, **top: Any) -> dict[str, Any]:
    """A valid grad_probe config, with top-level keys and grad_probe keys replaced."""
    out: dict[str, Any] = {"task": "grad_probe", "dump_path": "./out"}
    out.update(top)
    if gp is not None:
        out["grad_probe"] = gp
    return out


P = "grad_probe."

# (id, config, key the error must name, bad value the message must show, extra text the message must hold)
BAD_CONFIGS: list[tuple[str, dict[str, Any], str, object, str]] = [
    # grad_level
    ("level-L3", gcfg({"grad_level": "L3"}), P + "grad_level", "L3", '"L2"'),
    ("level-lower", gcfg({"grad_level": "l1"}), P + "grad_level", "l1", 'did you mean "L1"'),
    ("level-mix", gcfg({"grad_level": "mix"}), P + "grad_level", "mix", '"L0"'),
    ("level-int", gcfg({"grad_level": 1}), P + "grad_level", 1, "string"),
    # param_list
    ("param_list-string", gcfg({"param_list": "fc.weight"}), P + "param_list", "fc.weight", 'write ["fc.weight"]'),
    ("param_list-object", gcfg({"param_list": {"a": 1}}), P + "param_list", {"a": 1}, "list"),
    ("param_list-int-entry", gcfg({"param_list": ["a", 3]}), P + "param_list[1]", 3, "string"),
    ("param_list-empty-entry", gcfg({"param_list": [""]}), P + "param_list[0]", "", "non-empty"),
    ("param_list-null-entry", gcfg({"param_list": [None]}), P + "param_list[0]", None, "string"),
    # bounds
    ("bounds-empty", gcfg({"bounds": []}), P + "bounds", [], "non-empty"),
    ("bounds-number", gcfg({"bounds": 1}), P + "bounds", 1, "list"),
    ("bounds-string", gcfg({"bounds": "-1,0,1"}), P + "bounds", "-1,0,1", "list"),
    ("bounds-string-entry", gcfg({"bounds": [-1, "0"]}), P + "bounds[1]", "0", "string"),
    ("bounds-bool", gcfg({"bounds": [True, 2]}), P + "bounds[0]", True, "boolean"),
    ("bounds-null-entry", gcfg({"bounds": [0, None]}), P + "bounds[1]", None, "null"),
    ("bounds-nan", gcfg({"bounds": [0, float("nan")]}), P + "bounds[1]", float("nan"), "finite"),
    ("bounds-inf", gcfg({"bounds": [0, float("inf")]}), P + "bounds[1]", float("inf"), "finite"),
    ("bounds-minus-inf", gcfg({"bounds": [float("-inf"), 0]}), P + "bounds[0]", float("-inf"), "finite"),
    ("bounds-above-int64", gcfg({"bounds": [0, 2**63]}), P + "bounds[1]", 2**63, str(2**63 - 1)),
    ("bounds-below-int64", gcfg({"bounds": [-(2**63) - 1, 0]}), P + "bounds[0]", -(2**63) - 1, str(-(2**63))),
    ("bounds-huge-float", gcfg({"bounds": [0, 1e19]}), P + "bounds[1]", 1e19, "in ["),
    ("bounds-duplicate", gcfg({"bounds": [-1, 0, 0, 1]}), P + "bounds[2]", 0, "strictly ascending"),
    ("bounds-descending", gcfg({"bounds": [1, 0]}), P + "bounds[1]", 0, "write [0, 1]"),
    ("bounds-nested", gcfg({"bounds": [[0, 1]]}), P + "bounds[0]", [0, 1], "list"),
    # the section itself
    ("section-list", gcfg(grad_probe=[1]), "grad_probe", [1], "object"),
    # a bad section is reported even when another task runs
    ("free_benchmark-task-bad-section", gcfg({"bounds": []}, task="free_benchmark"), P + "bounds", [], "non-empty"),
]


@pytest.mark.parametrize(("config", "key", "value", "text"), [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS])
def test_bad_config_names_key_value_and_allowed(config: dict[str, Any], key: str, value: object, text: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(config)
    err = info.value
    assert err.key == key
    assert repr(value) in str(err)
    assert text in str(err)
    assert f"invalid config {key}=" in str(err)


def test_bad_config_table_is_big_enough() -> None:
    assert len(BAD_CONFIGS) >= 12


def test_defaults_for_grad_probe_task_without_section() -> None:
    c = load_config(gcfg())
    assert c.grad_probe == GradProbeConfig()
    assert c.grad_probe.grad_level == "L1"
    assert c.grad_probe.param_list == ()
    assert c.grad_probe.bounds == (-1, 0, 1)
    assert "grad_probe" not in c.extra_sections


def test_nulls_mean_defaults() -> None:
    c = load_config(gcfg({"grad_level": None, "param_list": None, "bounds": None}))
    assert c.grad_probe == GradProbeConfig()


def test_section_parsed_for_other_tasks_and_absent_otherwise() -> None:
    c = load_config(gcfg({"grad_level": "L2"}, task="free_benchmark"))
    assert c.grad_probe == GradProbeConfig(grad_level="L2")
    assert load_config(gcfg(task="free_benchmark")).grad_probe is None


def test_values_kept_as_given() -> None:
    gp = {"grad_level": "L0", "param_list": ["fc1.weight", "fc1.weight", "a/b c"], "bounds": [-0.01, 0, 1e-5, 2]}
    c = load_config(gcfg(gp))
    assert c.grad_probe is not None
    assert c.grad_probe.grad_level == "L0"
    assert c.grad_probe.param_list == ("fc1.weight", "fc1.weight", "a/b c")
    assert c.grad_probe.bounds == (-0.01, 0, 1e-5, 2)
    assert [type(b) for b in c.grad_probe.bounds] == [float, int, float, int]  # str() builds the header
    assert dict(c.extra_sections["grad_probe"]) == gp


@pytest.mark.parametrize("bounds", [[0], [-(2**63), 2**63 - 1], [-1.5, -1, 0.0, 3]])
def test_edge_bounds_accepted(bounds: list[Any]) -> None:
    assert load_config(gcfg({"bounds": bounds})).grad_probe.bounds == tuple(bounds)  # type: ignore[union-attr]


@pytest.mark.parametrize("level", ["L0", "L1", "L2", "mix", "debug", None])
def test_top_level_level_is_not_forced_for_grad_probe(level: str | None) -> None:
    c = load_config(gcfg(level=level))
    assert c.level == (level or "L1")


def test_top_level_level_still_validated() -> None:
    with pytest.raises(ConfigError, match="level"):
        load_config(gcfg(level="L9"))


def test_unknown_section_key_warns_with_suggestion() -> None:
    with pytest.warns(UserWarning, match=r"grad_probe\.'?grad_lvl") as record:
        c = load_config(gcfg({"grad_lvl": "L2"}))
    assert 'did you mean "grad_level"' in str(record[0].message)
    assert c.grad_probe == GradProbeConfig()


def test_reference_section_raises_no_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_config(gcfg({"grad_level": "L1", "param_list": [], "bounds": [-1, 0, 1]}, rank=[], step=[]))


def test_overrides_plain_and_dotted() -> None:
    c = load_config(gcfg({"bounds": [0, 1]}), overrides={"grad_level": "L2", "grad_probe.param_list": ["w"]})
    assert c.grad_probe == GradProbeConfig(grad_level="L2", param_list=("w",), bounds=(0, 1))
    with pytest.raises(ConfigError) as info:
        load_config(gcfg(), overrides={"grad_probe.bounds": []})
    assert info.value.key == P + "bounds"
    with pytest.raises(ConfigError, match="overrides"):
        load_config(gcfg(), overrides={"grad_probe.levels": "L2"})
    # an override alone creates the section for another task as well
    fb = load_config(gcfg(task="free_benchmark"), overrides={"grad_level": "L0"})
    assert fb.grad_probe == GradProbeConfig(grad_level="L0")


@pytest.mark.parametrize(
    "config",
    [
        gcfg(),
        gcfg({"grad_level": "L2", "param_list": ["a.weight"], "bounds": [-0.1, 0, 1e-5]}, step=[3, "5-6"], rank=[0]),
        gcfg({"grad_level": "L0"}),
        gcfg({"bounds": [1]}, task="free_benchmark", level="L1"),
    ],
    ids=["defaults", "full", "partial-section", "free_benchmark-with-section"],
)
def test_to_dict_round_trip(config: dict[str, Any], tmp_path: Path) -> None:
    original = load_config(config)
    data = original.to_dict()
    assert load_config(data) == original
    path = tmp_path / "c.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    again = load_config(path)
    assert again == original
    assert hash(again) == hash(original)
    assert again.grad_probe == original.grad_probe


def test_overridden_section_round_trips() -> None:
    original = load_config(gcfg(), overrides={"grad_level": "L2"})
    assert load_config(original.to_dict()) == original


def test_grad_probe_config_to_dict() -> None:
    assert GradProbeConfig().to_dict() == {"grad_level": "L1", "param_list": [], "bounds": [-1, 0, 1]}
    assert tuple(GradProbeConfig().to_dict()) == GRAD_PROBE_KEYS


def test_grad_probe_config_is_frozen_and_hashable() -> None:
    g = load_config(gcfg({"param_list": ["a"]})).grad_probe
    with pytest.raises(AttributeError):
        g.grad_level = "L2"  # type: ignore[misc, union-attr]
    assert hash(g) == hash(GradProbeConfig(param_list=("a",)))
