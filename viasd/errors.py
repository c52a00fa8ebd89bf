"""User-facing error types.

Every error a user can cause by configuration or input (an unknown method, a vocabulary
mismatch, an out-of-range threshold, a missing data file, ...) is raised as a
:class:`ConfigError` whose message names the fix. Entry points catch it and print one line
instead of a traceback.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """Bad user input or configuration; the message says how to fix it."""


def check(condition: bool, message: str) -> None:
    """Raise :class:`ConfigError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(message)
