"""Moved to :mod:`pytest_msprobe.golden.kinds`; this name stays importable for existing code (the same module object)."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("pytest_msprobe.golden.kinds")
