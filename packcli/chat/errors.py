"""The chat stage's two errors: one for a dialogue (the bad-line policy applies), one for
the template (the run stops)."""

from __future__ import annotations

from packcli.errors import ConfigError, InputError


class ChatFormatError(InputError, ValueError):
    """A dialogue is malformed, or the chat template rejected it. The message is the reason;
    the reader prefixes ``file:line``. ``index`` is the dialogue's position in a batch."""

    def __init__(self, reason: str, *, index: int | None = None) -> None:
        super().__init__(reason)
        self.index = index


class ChatTemplateError(ConfigError):
    """The chat template cannot be found or compiled, or it broke the sandbox or a budget."""
