"""packcli.names: one definition per allowed-value set, and the messages that list them."""

from __future__ import annotations

import typing
from collections.abc import Callable

import pytest

import packcli.chat.mask
import packcli.collate
import packcli.config
import packcli.pack.binpack
import packcli.pack.plan
import packcli.pack.plan_config
import packcli.publish.card
import packcli.stages.executors
import packcli.tokenize.backends
from packcli import names
from packcli.config import PlanConfig, ReadConfig, TokenizeConfig, WriteConfig
from packcli.errors import ConfigError


def test_every_module_uses_the_one_definition() -> None:
    same = [
        (packcli.config.TRAIN_ON, names.TRAIN_ON),
        (packcli.chat.mask.TRAIN_ON, names.TRAIN_ON),
        (packcli.config.INPUT_FORMATS, names.INPUT_FORMATS),
        (packcli.pack.plan_config.OVERLONG_POLICIES, names.OVERLONG_POLICIES),
        (packcli.tokenize.backends.BACKENDS, names.BACKENDS),
        (packcli.stages.executors.EXECUTORS, names.EXECUTORS),
        (packcli.pack.plan.CONFIGS, names.CONFIG_NAMES),
        (packcli.publish.card.CONFIG_NAMES, names.CONFIG_NAMES),
        (packcli.publish.card.MARKER, names.MARKER),
        (packcli.publish.card.STATS_DIR, names.STATS_DIR),
        (packcli.collate.IGNORE_INDEX, names.IGNORE_INDEX),
        (packcli.pack.binpack.ALGORITHMS, names.PLAN_ALGORITHMS),
    ]
    assert all(a is b for a, b in same)
    assert typing.get_args(packcli.pack.binpack.Algorithm) == names.PLAN_ALGORITHMS


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
