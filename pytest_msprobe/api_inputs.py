"""Moved to :mod:`pytest_msprobe.api.inputs`; this name stays importable for existing code (the same module object)."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("pytest_msprobe.api.inputs")
