"""Exceptions that reach the user: each message names what was wrong and what is allowed."""

from __future__ import annotations


class ConfigError(ValueError):
    """An invalid configuration value.

    Raised before any hook is installed, so a bad config never leaves the model half-probed.
    The message always names the key (dotted path), the offending value and what is allowed.
    """

    def __init__(self, key: str, value: object, allowed: str, hint: str = "") -> None:
        self.key = key
        self.value = value
        self.allowed = allowed
        msg = f"invalid config {key}={value!r}: {allowed}"
        if hint:
            msg += f". {hint}"
        super().__init__(msg)


class ProbeError(RuntimeError):
    """An error inside a probe, raised only in strict mode (otherwise it is recorded)."""


class NotMeasurable(Exception):
    """An output leaf has no values a probe can measure (a meta or fake tensor, a tensor
    subclass of unknown layout): the call is skipped with this reason, not counted as an error."""
