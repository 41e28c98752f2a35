"""packcli.names: the allowed-value sets, and the messages that list them."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from packcli.config import PlanConfig, ReadConfig, TokenizeConfig, WriteConfig
from packcli.errors import ConfigError


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: TokenizeConfig(backend="x"),
            "tokenize.backend must be auto, hf, fastokens or gigatoken, got 'x'",
        ),
        (
            lambda: TokenizeConfig(special_in_text="x"),
            "tokenize.special_in_text must be text or special, got 'x'",
        ),
        (
            lambda: ReadConfig(inputs=("a",), on_bad_line="x"),
            "read.on_bad_line must be error or skip",
        ),
        (lambda: PlanConfig(balance="x"), "plan.balance must be none or attention, got 'x'"),
        (
            lambda: WriteConfig(compression="x"),
            "write.compression must be zstd, snappy, gzip, lz4 or none, got 'x'",
        ),
    ],
)
def test_the_messages_that_list_allowed_values_are_unchanged(
    make: Callable[[], object], message: str
) -> None:
    with pytest.raises(ConfigError) as exc:
        make()
    assert str(exc.value).startswith(message)


def test_the_old_backend_name_is_still_accepted() -> None:
    assert TokenizeConfig(backend="tiktoken").backend == "tiktoken"
