"""The API precision catalogue: one test per API x dtype (``pytest --pyargs pytest_msprobe.catalogue``).

See pytest_msprobe/catalogue/__init__.py. The tests run without the session's probe
(--msprobe-task): each starts its own free_benchmark run around its API.
"""

from __future__ import annotations

import pytest

from pytest_msprobe.catalogue.cases import all_cases
from pytest_msprobe.catalogue.run import run_case

CASES = all_cases()

pytestmark = pytest.mark.msprobe_off


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_api_precision(case, request):
    run_case(case, request.node)
