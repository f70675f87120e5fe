"""Inputs for named torch APIs: `api_inputs` turns a row of the input table into a Hypothesis
strategy of `(args, kwargs)` such that `api(*args, **kwargs)` runs.

Why a table and forms: which values an API accepts, how its inputs' shapes relate and which kwargs
it needs are facts about the API, not code, so a row states them (`pytest_msprobe.api.input_table`)
and a few shape relations shared by all rows draw them (`pytest_msprobe.api.input_forms`); names
are looked up in `pytest_msprobe.api.api_names`. This module gathers them under one import. Every
tensor comes from `pytest_msprobe.api.exact_tensors` (what `pytest_msprobe.api.strategies.tensors`
draws), so its values are exact in the dtype, and the whole input shrinks towards small shapes and
simple values. torch is imported when a strategy is drawn, not on import.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Tuple

from hypothesis import strategies as st

from probes.core.errors import ConfigError
from pytest_msprobe.api import exact_tensors as exact
from pytest_msprobe.api.api_names import api_spec, canonical_name, known_apis, resolve_api, suggest_api
from pytest_msprobe.api.input_forms import FORM_RANK, FORMS, Inputs
from pytest_msprobe.api.input_table import API_TABLE, ApiSpec, Domain

__all__ = ["Domain", "ApiSpec", "API_TABLE", "FORMS", "api_inputs", "api_spec", "known_apis", "canonical_name",
           "resolve_api", "suggest_api"]


def _shapes_strategy(shapes: Any) -> st.SearchStrategy | None:
    if shapes is None or isinstance(shapes, st.SearchStrategy):
        return shapes
    if isinstance(shapes, tuple) and all(isinstance(s, int) for s in shapes):
        return st.just(shapes)
    if isinstance(shapes, (list, tuple)) and shapes and all(
            isinstance(s, (list, tuple)) and all(isinstance(d, int) for d in s) for s in shapes):
        return st.sampled_from([tuple(s) for s in shapes])
    raise ConfigError("shapes", shapes, "None, a shape tuple, a list of shape tuples (one is drawn per example) "
                      "or a Hypothesis strategy of shapes, for the API's first input")


def api_inputs(api: str, dtype: Any, *, shapes: Any = None, kwargs: Mapping[str, Any] | None = None,
               device: str = "cpu", form: str | None = None) -> st.SearchStrategy[Tuple[tuple, Dict[str, Any]]]:
    """A strategy of `(args, kwargs)` such that `resolve_api(api)(*args, **kwargs)` runs.

    api: a public dotted name ("torch.nn.functional.softmax", "torch.Tensor.add") or a catalog
    name ("Functional.softmax", "Tensor.__add__"). dtype: a float dtype (name or torch dtype) of
    the float inputs. shapes: the first input's shape (a tuple, a list of tuples, or a strategy);
    the other inputs' shapes follow from it. kwargs: added to the row's kwargs and overriding them;
    a value that is a strategy is drawn per example. form: for an API outside the table, the shape
    relation to use (a key of FORMS); inputs then take the default domain.
    """
    if form is not None:
        if form not in FORMS:
            raise ConfigError("form", form, f"one of {', '.join(sorted(FORMS))}")
        try:
            base = api_spec(api)
            row = ApiSpec(base.names, form, base.domains, base.kwargs, base.rank, base.min_side, base.no_cpu)
        except ConfigError:
            row = ApiSpec((canonical_name(api),), form, rank=FORM_RANK.get(form, (1, 3)))
    else:
        row = api_spec(api)
    name = exact.dtype_name(dtype)
    if name not in exact.FLOAT_DTYPES:
        raise ConfigError("dtype", dtype, f"a float dtype for API inputs: {', '.join(exact.FLOAT_DTYPES)}")
    root = type(dtype).__module__.partition(".")[0]
    if root == "mindspore":
        raise ConfigError("dtype", dtype, "a dtype name or a torch dtype: the input table describes torch APIs")
    user = dict(kwargs or {})
    shape_strategy = _shapes_strategy(shapes)
    build = FORMS[row.form]

    @st.composite
    def draw_inputs(draw: Callable[[st.SearchStrategy], Any]) -> Tuple[tuple, Dict[str, Any]]:
        merged = dict(row.kwargs)
        merged.update({k: draw(v) if isinstance(v, st.SearchStrategy) else v for k, v in user.items()})
        return build(Inputs(draw, row, name, device, shape_strategy, api), merged)

    return draw_inputs()
