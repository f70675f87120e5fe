"""API names: the spellings users write ("torch.nn.functional.softmax", "F.softmax") mapped to the
catalog spelling of the input table ("Functional.softmax"), lookups of a row, and the torch
callable behind a name.

Why apart from the drawing: the marker and the catalogue look names up, suggest close ones and
resolve callables without drawing anything; torch is imported only by `resolve_api`.
"""

from __future__ import annotations

from typing import Any, Callable, Tuple

from probes.core.errors import ConfigError
from probes.core.hints import close_matches, did_you_mean
from pytest_msprobe.api.input_forms import FORMS
from pytest_msprobe.api.input_table import API_TABLE, BY_NAME, ApiSpec

__all__ = ["canonical_name", "known_apis", "api_spec", "suggest_api", "resolve_api"]

_PREFIXES = (
    ("torch.nn.functional.", "Functional."), ("nn.functional.", "Functional."), ("F.", "Functional."),
    ("functional.", "Functional."), ("torch.Tensor.", "Tensor."), ("tensor.", "Tensor."), ("torch.", "Torch."),
)


def canonical_name(api: str) -> str:
    """The catalog spelling ("Functional.softmax") of a public dotted name
    ("torch.nn.functional.softmax") or of a catalog name; other strings come back unchanged."""
    if api.startswith(("Torch.", "Functional.", "Tensor.", "NPU.")):
        return api
    for prefix, family in _PREFIXES:
        if api.startswith(prefix):
            return family + api[len(prefix):]
    return api


def known_apis() -> Tuple[str, ...]:
    """Every name of the table (catalog spelling), sorted."""
    return tuple(sorted(BY_NAME))


def api_spec(api: str) -> ApiSpec:
    """The table row of `api` (a public dotted name, a catalog name, or a bare name naming one
    row). Unknown: ConfigError naming the API and the close known ones."""
    name = canonical_name(api)
    row = BY_NAME.get(name)
    if row is not None:
        return row
    if "." not in name:
        rows = {r.name: r for r in API_TABLE for n in r.names if n.rsplit(".", 1)[-1] == name}
        if len(rows) == 1:
            return next(iter(rows.values()))
    close = suggest_api(api)
    hint = (f"{close} " if close else "") + (
        f"For an API outside the table pass form= (one of {', '.join(sorted(FORMS))}) and kwargs= "
        "to api_inputs, or give the test an explicit strategy of (args, kwargs) built with "
        "pytest_msprobe.api.strategies.tensors")
    raise ConfigError("api", api, f"an API of the input table ({len(BY_NAME)} names, see known_apis())", hint=hint)


_PUBLIC_PREFIX = {"Torch": "torch.", "Functional": "torch.nn.functional.", "Tensor": "torch.Tensor."}


def suggest_api(api: str) -> str:
    """``did you mean "..."?`` for a name the table does not know, else "".

    The suggestions are spelled the way the user spelled the family (``torch.nn.functional.sofmax``
    gets ``torch.nn.functional.softmax``, ``F.sofmax`` gets ``F.softmax``, ``Functional.sofmax``
    the catalog name), so the fix is a copy of the hint; other families get their public names."""
    spelling = dict(_PUBLIC_PREFIX)
    if api.startswith(tuple(f"{family}." for family in spelling)):
        spelling = {family: f"{family}." for family in spelling}
    else:
        for prefix, family in _PREFIXES:
            if api.startswith(prefix):
                spelling[family.rstrip(".")] = prefix
                break
    spelled = [spelling[family] + rest for family, _, rest in (n.partition(".") for n in known_apis())]
    if "." in api:
        return did_you_mean(api, spelled)
    by_last: dict[str, list[str]] = {}  # a bare name: matched on the last dotted part
    for name in spelled:
        by_last.setdefault(name.rsplit(".", 1)[-1], []).append(name)
    return did_you_mean(api, [n for last in close_matches(api, by_last) for n in by_last[last]])


def resolve_api(api: str) -> Callable[..., Any]:
    """The torch callable named by a public dotted name or a catalog name (in the table or not)."""
    import torch
    import torch.nn.functional as F

    name = canonical_name(api)
    family, _, rest = name.partition(".")
    roots = {"Torch": torch, "Functional": F, "Tensor": torch.Tensor}
    obj: Any = roots.get(family)
    try:
        if obj is None:
            raise AttributeError(family)
        for part in rest.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise ConfigError("api", api, "a torch API: torch.X, torch.nn.functional.X, torch.Tensor.X "
                          "or a catalog name Torch.X / Functional.X / Tensor.X") from None
    return obj
