"""The ``"free_benchmark"`` section: its table of keys, and the rules that tie keys together.

Defaults are the reference's, except ``max_sample`` (20 as msprobe's docs say; its code used 15).
Unlike the reference, ``scope`` must be a list (the reference wraps a bare string), and the
scope/list conflict and list element types are checked here instead of when the service is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from probes.core.config_fields import keys_of, option, parse_fields, section_to_dict
from probes.core.config_parsers import Choice, StrList, boolean, non_negative_int, positive_int
from probes.core.errors import ConfigError
from probes.core.rules import FREE_BENCHMARK_RULES

__all__ = [
    "ADD_NOISE_STYLES",
    "FREE_BENCHMARK_KEYS",
    "FUZZ_DEVICES",
    "FUZZ_LEVELS",
    "FUZZ_STAGES",
    "HANDLER_TYPES",
    "PERT_MODES",
    "FreeBenchmarkConfig",
    "parse_free_benchmark",
]

PERT_MODES = ("improve_precision", "add_noise", "bit_noise", "change_value", "no_change", "to_cpu")
HANDLER_TYPES = ("check", "fix")
FUZZ_STAGES = ("forward", "backward")
FUZZ_DEVICES = ("npu", "cpu")
FUZZ_LEVELS = ("L1",)
ADD_NOISE_STYLES = ("ulp", "reference")

_P = "free_benchmark."


@dataclass(frozen=True)
class FreeBenchmarkConfig:
    """The ``"free_benchmark"`` section, validated; each field is one JSON key."""

    scope: tuple[str, ...] = option("scope", StrList(), (), "exact API call names to check; () = all")
    # the reference's spelling: the JSON key is "list"
    api_list: tuple[str, ...] = option("list", StrList(), (), "substrings of the API names to check; () = all")
    fuzz_device: str = option("fuzz_device", Choice(FUZZ_DEVICES), "npu",
                              '"npu": perturb on the original call\'s device; "cpu": re-run on the CPU (to_cpu)')
    pert_mode: str = option("pert_mode", Choice(PERT_MODES), "improve_precision", "how the inputs are perturbed")
    handler_type: str = option("handler_type", Choice(HANDLER_TYPES), "check",
                               '"check" reports; "fix" replaces the output with the more accurate one')
    fuzz_level: str = option("fuzz_level", Choice(FUZZ_LEVELS), "L1", "the reference's only level")
    fuzz_stage: str = option("fuzz_stage", Choice(FUZZ_STAGES), "forward", "which pass is perturbed")
    if_preheat: bool = option("if_preheat", boolean, False, "tune the ratio rule's thresholds on the first steps")
    preheat_step: int = option("preheat_step", positive_int, 15, "steps of preheat")
    max_sample: int = option("max_sample", positive_int, 20, "calls sampled per API in each preheat step")
    add_noise_style: str = option("add_noise_style", Choice(ADD_NOISE_STYLES), "ulp",
                                  '"reference" keeps msprobe 8.3.3\'s add_noise', extension=True)
    rule: str = option("rule", Choice(FREE_BENCHMARK_RULES), "reference",
                       '"reference": msprobe\'s element-wise ratio rule, the drop-in default for a config.json; '
                       '"scaled": the scale-aware rule the pytest plugin gates on', extension=True)
    compiled_first: int = option("compiled_first", non_negative_int, 1,
                                 "the first calls of each torch.compile graph that are checked", extension=True)
    compiled_every: int = option("compiled_every", non_negative_int, 0,
                                 "then every n-th call of each graph (0: none)", extension=True)

    def to_dict(self) -> dict[str, Any]:
        """The section as JSON data with the reference's key names, so it can be fed back to load_config."""
        return section_to_dict(self)


#: Keys of the ``"free_benchmark"`` section, in the reference's spelling ("list", not "api_list").
FREE_BENCHMARK_KEYS = keys_of(FreeBenchmarkConfig)


def parse_free_benchmark(fb: Any) -> FreeBenchmarkConfig:
    """Validate the free_benchmark section: per-key types and values first, then combination rules."""
    cfg = FreeBenchmarkConfig(**parse_fields(FreeBenchmarkConfig, fb, _P))
    _check_combinations(cfg)
    return cfg


def _check_combinations(cfg: FreeBenchmarkConfig) -> None:
    # to_cpu <=> cpu, both directions: "npu" means "the original call's device", which to_cpu
    # cannot use; and the CPU comparison path only knows how to judge to_cpu results.
    if cfg.pert_mode == "to_cpu" and cfg.fuzz_device != "cpu":
        raise ConfigError(
            _P + "fuzz_device",
            cfg.fuzz_device,
            'free_benchmark.pert_mode "to_cpu" re-runs the API on the CPU and needs fuzz_device "cpu"',
            hint='set "fuzz_device": "cpu", or choose another pert_mode',
        )
    if cfg.fuzz_device == "cpu" and cfg.pert_mode != "to_cpu":
        raise ConfigError(
            _P + "pert_mode",
            cfg.pert_mode,
            'free_benchmark.fuzz_device "cpu" allows only pert_mode "to_cpu"',
            hint='set "pert_mode": "to_cpu", or set "fuzz_device": "npu" to perturb on the original device',
        )
    if cfg.handler_type == "fix":
        _check_fix(cfg)
    if cfg.if_preheat and cfg.rule == "scaled":
        raise ConfigError(
            _P + "if_preheat",
            cfg.if_preheat,
            'preheat learns thresholds for the element-wise ratio rule; with "rule": "scaled" it must be false',
            hint='the scaled rule judges each output at its own scale and needs no warm-up: set "if_preheat": false, '
                 'or "rule": "reference" to tune msprobe\'s rule',
        )
    if cfg.fuzz_stage == "backward" and not cfg.api_list and not cfg.scope:
        raise ConfigError(
            _P + "list",
            list(cfg.api_list),
            'a non-empty list or scope of APIs when free_benchmark.fuzz_stage is "backward" '
            "(each checked call costs two extra vector-Jacobian products)",
            hint='name the APIs to check, e.g. "list": ["matmul"], or call names in scope, e.g. '
                 '"scope": ["Functional.linear.0.backward"]',
        )
    if cfg.scope and cfg.api_list:
        raise ConfigError(
            _P + "scope",
            list(cfg.scope),
            f"empty when free_benchmark.list is set (got list={list(cfg.api_list)!r}): scope and list conflict",
            hint="use only one of them: scope for exact API names, list for name substrings",
        )


def _check_fix(cfg: FreeBenchmarkConfig) -> None:
    """fix replaces the real output, so only perturbations that are more accurate may be used."""
    if cfg.pert_mode not in ("improve_precision", "to_cpu"):
        raise ConfigError(
            _P + "pert_mode",
            cfg.pert_mode,
            'handler_type "fix" replaces the real output, so pert_mode must be "improve_precision" or "to_cpu"',
            hint='use handler_type "check" to only report',
        )
    if cfg.fuzz_stage != "forward":
        raise ConfigError(
            _P + "fuzz_stage",
            cfg.fuzz_stage,
            'handler_type "fix" works on forward outputs only, so fuzz_stage must be "forward"',
            hint='use handler_type "check" for the backward stage',
        )
    if cfg.if_preheat:
        raise ConfigError(
            _P + "if_preheat",
            cfg.if_preheat,
            'preheat tunes the check thresholds and cannot be used with handler_type "fix"; it must be false',
            hint='set "if_preheat": false, or use handler_type "check"',
        )
