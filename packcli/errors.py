"""Exceptions the CLI maps to clear messages and exit codes.

Every error a user can cause derives from ``PackcliError`` so the CLI has one place that turns
them into a one-line message and exit status 1, while genuine bugs still show a traceback.
"""

from __future__ import annotations


class PackcliError(Exception):
    """A problem with the user's input, configuration or environment (not a bug)."""


class ConfigError(PackcliError):
    """An invalid option or config-file value; the message says what to change."""


class InputError(PackcliError):
    """Bad input data; the message names ``file:line`` (or a byte offset) and the reason."""


class VerifyError(PackcliError):
    """An output folder violates one of the packing invariants."""


def require_one_of(what: str, value: object, allowed: tuple[str, ...]) -> None:
    """A setting outside its allowed values (``packcli.names``) as one line naming both."""
    if value not in allowed:
        raise ConfigError(f"{what} must be one of {', '.join(allowed)}, got {value!r}")
