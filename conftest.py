"""Root conftest: makes the repository importable without installation when tests run from a
checkout, and keeps the example suite's module importable. Hypothesis keeps its files (example
database, constants cache) outside the checkout: by default it writes ``.hypothesis/`` into the
working directory, which for this suite and the jobs it starts is the repository."""

import getpass
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _hypothesis_outside_the_checkout() -> None:
    """Before collection (Hypothesis's plugin caches the constants of local modules then)."""
    if os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
        return  # the caller chose a place
    try:
        from hypothesis.configuration import set_hypothesis_home_dir
    except ImportError:
        return
    try:
        user = getpass.getuser()
    except Exception:  # no user name (some containers): still one folder per machine
        user = "user"
    set_hypothesis_home_dir(Path(tempfile.gettempdir()) / f"pytest-msprobe-hypothesis-{user}")


_hypothesis_outside_the_checkout()
