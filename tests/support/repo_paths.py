"""Where the tests find the repository and their helpers, wherever a test module sits under tests/."""

from __future__ import annotations

from pathlib import Path

SUPPORT = Path(__file__).resolve().parent  # the tests' helper modules (on sys.path: tests/conftest.py)
REPO = SUPPORT.parents[1]
