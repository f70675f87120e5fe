"""Where the plugin keeps its objects in pytest's stash: a leaf, so that the catalogue's runner, the
golden checks and the reports reach the session without importing the plugin or the session's
module (no import cycle through them)."""

from __future__ import annotations

from typing import Any

import pytest

SESSION_KEY = pytest.StashKey[Any]()  # the PluginSession (pytest_msprobe.session) of the run


def session_of(config: pytest.Config) -> Any:
    """The plugin's session of this pytest run (a pytest_msprobe.session.PluginSession)."""
    return config.stash[SESSION_KEY]
