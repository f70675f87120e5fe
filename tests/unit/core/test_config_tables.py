"""Each config section is declared once, as a table: the keys, defaults, parsing, to_dict, the
overrides, PtdbgDispatch's signature and the docs' examples must all agree with it."""

from __future__ import annotations

import ast
import inspect
import json
import re
from types import SimpleNamespace
from typing import Any

import pytest
from repo_paths import REPO

from probes.core.config import (
    FREE_BENCHMARK_KEYS,
    GRAD_PROBE_KEYS,
    GRAD_PROBE_OWN_KEYS,
    TOP_LEVEL_KEYS,
    FreeBenchmarkConfig,
    GradProbeConfig,
    ProbeConfig,
    load_config,
)
from probes.core.config_fields import fields_of, keys_of
from probes.core.errors import ConfigError
from probes.online_dispatch.options import (
    CONFIG_SECTION_KEYS,
    DispatchOptions,
    check_config_section,
    validate,
)

DOCS = REPO / "docs"
BAD = {"not": "a valid value of any key"}  # a JSON object: no key of any table accepts one

# (section name in the config, table); the top level has no section name
JSON_TABLES = [("", ProbeConfig), ("free_benchmark", FreeBenchmarkConfig), ("grad_probe", GradProbeConfig)]
JSON_FIELDS = [pytest.param(section, name, f, id=f"{section or 'top'}.{f.key}")
               for section, cls in JSON_TABLES for name, f in fields_of(cls)]
DISPATCH_FIELDS = [pytest.param(name, f, id=f.key) for name, f in fields_of(DispatchOptions)]


def _config(section: str, key: str, value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"task": "grad_probe", "dump_path": "./out"}
    if section:
        out[section] = {key: value}
    else:
        out[key] = value
    return out


# the exported key tuples ------------------------------------------------------------------------
def test_the_key_tuples_are_the_tables():
    assert TOP_LEVEL_KEYS == ("task", "dump_path", "rank", "step", "level", "strict")
    assert FREE_BENCHMARK_KEYS == (
        "scope", "list", "fuzz_device", "pert_mode", "handler_type", "fuzz_level", "fuzz_stage", "if_preheat",
        "preheat_step", "max_sample", "add_noise_style", "rule", "compiled_first", "compiled_every")
    assert (GRAD_PROBE_KEYS, GRAD_PROBE_OWN_KEYS) == (("grad_level", "param_list", "bounds"), ("fp8_health",))
    assert CONFIG_SECTION_KEYS == ("dump_mode", "api_list", "debug", "tag", "process_num", "background", "rule",
                                   "compiled_first", "compiled_every")


@pytest.mark.parametrize("cls", [FreeBenchmarkConfig, GradProbeConfig])
def test_defaults_and_to_dict_come_from_the_table(cls):
    default = cls()
    for name, f in fields_of(cls):
        assert getattr(default, name) == f.default
    written = [f.key for _, f in fields_of(cls) if f.write_default]
    assert list(default.to_dict()) == written


def test_a_key_left_out_at_its_default_is_written_once_set():
    assert "fp8_health" not in GradProbeConfig().to_dict()
    assert GradProbeConfig(fp8_health=("float8_e5m2",)).to_dict()["fp8_health"] == ["float8_e5m2"]


# every key of every table: a bad value names the key and what is allowed ------------------------
@pytest.mark.parametrize("section, name, f", JSON_FIELDS)
def test_a_bad_value_names_the_key_and_the_allowed_values(section, name, f):
    with pytest.raises(ConfigError) as info:
        load_config(_config(section, f.key, BAD))
    dotted = f"{section}.{f.key}" if section else f.key
    assert info.value.key == dotted and info.value.value == BAD
    text = str(info.value)
    assert text.startswith(f"invalid config {dotted}=") and info.value.allowed and info.value.allowed in text
    for choice in f.choices:
        assert f'"{choice}"' in text


@pytest.mark.parametrize("section, name, f", [p for p in JSON_FIELDS if p.values[0]])
def test_null_and_the_written_default_parse_to_the_default(section, name, f):
    written = [f.default] if not f.write_default else [getattr(load_config(_config(section, f.key, None)),
                                                               section).to_dict()[f.key]]
    for value in [None, *written]:
        assert getattr(getattr(load_config(_config(section, f.key, value)), section), name) == f.default


@pytest.mark.parametrize("section, name, f", JSON_FIELDS)
def test_every_key_can_be_overridden_plainly_and_dotted(section, name, f):
    dotted = f"{section}.{f.key}" if section else f.key
    for key in {f.key, dotted}:
        with pytest.raises(ConfigError) as info:
            load_config({"task": "grad_probe", "dump_path": "./out"}, overrides={key: BAD})
        assert info.value.key == dotted  # reached the key's own parser, not "unknown override"


@pytest.mark.parametrize("name, f", DISPATCH_FIELDS)
def test_a_bad_dispatch_argument_names_it_and_creates_nothing(tmp_path, name, f):
    with pytest.raises(ConfigError) as info:
        validate(**{"dump_path": str(tmp_path / "run"), f.key: BAD})
    assert info.value.key == f.key and info.value.value == BAD
    for choice in f.choices:
        assert f'"{choice}"' in str(info.value)
    assert not (tmp_path / "run").exists()


def test_ptdbg_dispatch_takes_the_table_as_its_signature(tmp_path):
    pytest.importorskip("torch")
    from probes.pytorch.online_dispatch import PtdbgDispatch

    params = inspect.signature(PtdbgDispatch).parameters
    assert tuple(params) == keys_of(DispatchOptions)
    assert {k: p.default for k, p in params.items()} == {f.key: f.default for _, f in fields_of(DispatchOptions)}
    positional = PtdbgDispatch("all", None, False, str(tmp_path), "t", 0, False, "scaled", 2, 3)
    assert positional.options.as_dict() == {
        "dump_mode": "all", "api_list": [], "debug": False, "dump_path": str(tmp_path.resolve()), "tag": "t",
        "process_num": 0, "background": False, "rule": "scaled", "compiled_first": 2, "compiled_every": 3}
    with pytest.raises(TypeError, match="PtdbgDispatch.*'dump_mod'"):
        PtdbgDispatch(dump_mod="all", dump_path=str(tmp_path))


def test_the_config_section_takes_every_option_but_dump_path():
    check_config_section(dict.fromkeys(CONFIG_SECTION_KEYS))
    with pytest.raises(ConfigError) as info:
        check_config_section({"dump_path": "x"})
    assert info.value.key == "online_dispatch.dump_path"
    assert all(k in info.value.allowed for k in CONFIG_SECTION_KEYS)


def test_the_plugin_accepts_exactly_the_sections_keys(tmp_path):
    from pytest_msprobe.tools.online_dispatch import dispatch_arguments

    config = SimpleNamespace(extra_sections={"online_dispatch": dict.fromkeys(CONFIG_SECTION_KEYS, 0)},
                             dump_path=tmp_path)
    assert set(dispatch_arguments(config)) == set(CONFIG_SECTION_KEYS) | {"dump_path"}
    config.extra_sections = {"online_dispatch": {"dump_pth": 0}}
    with pytest.raises(ConfigError) as info:
        dispatch_arguments(config)
    assert set(re.findall(r"\w+", info.value.allowed)) - {"one", "of"} == set(CONFIG_SECTION_KEYS)


# the docs' examples are the tables' --------------------------------------------------------------
def _json_object_after(text: str, key: str) -> dict[str, Any]:
    m = re.search(rf'"{key}":\s*(\{{[^{{}}]*\}})', text)
    assert m, f'no "{key}": {{...}} in the docs'
    return json.loads(m.group(1))


def test_the_migration_example_holds_msprobes_keys_at_their_defaults():
    text = (DOCS / "migrating-from-msprobe.md").read_text(encoding="utf-8")
    block = re.search(r"```json\n(.*?)```", text, re.S).group(1)
    fb = _json_object_after(block, "free_benchmark")
    assert tuple(fb) == keys_of(FreeBenchmarkConfig, extension=False)
    assert fb == {k: v for k, v in FreeBenchmarkConfig().to_dict().items() if k in fb}
    top = json.loads(block)
    assert tuple(k for k in top if k != "free_benchmark") == keys_of(ProbeConfig, extension=False)


def test_our_keys_are_documented():
    docs = "\n".join(p.read_text(encoding="utf-8") for p in sorted(DOCS.glob("*.md")))
    ours = [f.key for _, cls in JSON_TABLES for _, f in fields_of(cls) if f.extension]
    assert ours and all(f'"{key}"' in docs for key in ours)


def test_the_grad_probe_example_is_the_default_section():
    text = (DOCS / "grad_probe.md").read_text(encoding="utf-8")
    example = _json_object_after(text, "grad_probe")
    assert tuple(example) == GRAD_PROBE_KEYS and example == GradProbeConfig().to_dict()
    assert all(f'"{key}"' in text for key in GRAD_PROBE_OWN_KEYS)


def test_the_online_dispatch_page_shows_the_tables_signature():
    text = (DOCS / "online_dispatch.md").read_text(encoding="utf-8")
    block = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    comments = " ".join(line.split("#", 1)[1].strip() for line in block.splitlines() if "#" in line)
    msprobes = comments.split("msprobe's signature:", 1)[1].split(";", 1)[0]
    assert tuple(n.strip() for n in msprobes.split(",")) == keys_of(DispatchOptions, extension=False)
    new = dict(re.findall(r'(\w+)=("[^"]*"|\d+)', comments.split("new:", 1)[1]))
    defaults = {f.key: f.default for _, f in fields_of(DispatchOptions)}
    assert tuple(new) == keys_of(DispatchOptions, extension=True)
    assert {k: ast.literal_eval(v) for k, v in new.items()} == {k: defaults[k] for k in new}
