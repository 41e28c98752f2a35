"""The CLI's option table: flags reach the config under their own names, the help states the
defaults the code applies (also where chat differs), and ``packcli --help`` stays light."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest
from clirun import invoke

from packcli.cli import options
from packcli.config import (
    ChatConfig,
    ChatFlags,
    PlanConfig,
    PlanFlags,
    ReadConfig,
    ReadFlags,
    RunConfig,
    RunFlags,
    TokenizeConfig,
    TokenizeFlags,
    config_from_flags,
)


@pytest.mark.parametrize(
    ("flags", "config"),
    [
        (ReadFlags, ReadConfig),
        (TokenizeFlags, TokenizeConfig),
        (ChatFlags, ChatConfig),
        (PlanFlags, PlanConfig),
    ],
)
def test_flag_fields_are_config_fields(flags: type, config: type) -> None:
    """A field renamed on one side only would otherwise fail at run time ("unknown key")."""
    names = {f.name for f in dataclasses.fields(flags)}
    assert names <= {f.name for f in dataclasses.fields(config)}


def _help(alias: Any) -> str:
    return typing.get_args(alias)[1].help


def _bracket(alias: Any) -> str:
    return re.findall(r"\[([^\]]*)\]", _help(alias))[-1]


@pytest.mark.parametrize(
    ("alias", "section", "field"),
    [
        (options.TextField, "read", "text_field"),
        (options.BatchSize, "read", "batch_size"),
        (options.OnBadLine, "read", "on_bad_line"),
        (options.InputFormat, "read", "input_format"),
        (options.Bos, "tokenize", "bos"),
        (options.Backend, "tokenize", "backend"),
        (options.NumProc, "tokenize", "num_proc"),
        (options.SpecialInText, "tokenize", "special_in_text"),
        (options.Format, "chat", "format"),
        (options.MessagesField, "chat", "messages_field"),
        (options.TrainOn, "chat", "train_on"),
        (options.ShortLen, "plan", "short_len"),
        (options.LongLen, "plan", "long_len"),
        (options.Algorithm, "plan", "algorithm"),
        (options.Seed, "plan", "seed"),
        (options.Balance, "plan", "balance"),
    ],
)
def test_help_states_the_default_the_config_applies(alias: Any, section: str, field: str) -> None:
    cfg = config_from_flags(None, RunFlags(out="o"))
    assert _bracket(alias) == str(getattr(getattr(cfg, section), field))


@pytest.mark.parametrize(
    ("alias", "section", "field"),
    [(options.Eos, "tokenize", "eos"), (options.Overlong, "plan", "overlong")],
)
def test_help_states_text_and_chat_defaults(alias: Any, section: str, field: str) -> None:
    """--eos and --overlong default differently for chat and preference data: the help says both
    (it said only the text default, wrong for chat)."""
    values = {}
    for fmt in ("text", "chat", "preference"):
        cfg = config_from_flags(None, RunFlags(out="o", chat=ChatFlags(format=fmt)))
        values[fmt] = getattr(getattr(cfg, section), field)
    assert values["chat"] == values["preference"] != values["text"]
    assert _bracket(alias) == f"{values['text']}; chat and preference: {values['chat']}"


def test_every_pack_flag_reaches_its_config_field(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Each flag given a value other than its default arrives in the RunConfig pack runs with."""
    import packcli.stages.run

    seen: list[RunConfig] = []

    def fake_run_pack(cfg: RunConfig, **kwargs: Any) -> Any:
        seen.append(cfg)
        raise SystemExit(0)

    monkeypatch.setattr(packcli.stages.run, "run_pack", fake_run_pack)
    flags = {
        "--tokenizer": "tok.json",
        "--text-field": "body",
        "--eos": "7",
        "--bos": "<s>",
        "--short-len": "100",
        "--long-len": "1000",
        "--overlong": "truncate",
        "--algorithm": "ffd",
        "--seed": "5",
        "--balance": "attention",
        "--batch-size": "3",
        "--tokenizer-backend": "hf",
        "--num-proc": "2",
        "--special-in-text": "special",
        "--on-bad-line": "skip",
        "--split-bytes": "0",
        "--input-format": "jsonl",
        "--format": "chat",
        "--messages-field": "turns",
        "--chat-template": "chatml",
        "--train-on": "last",
        "--work-dir": str(tmp_path / "work"),
    }
    out = str(tmp_path / "out")
    invoke("pack", "a.jsonl", "b.jsonl", "-o", out, *[x for kv in flags.items() for x in kv])
    [cfg] = seen
    assert (cfg.out, cfg.work_dir) == (out, flags["--work-dir"])
    assert cfg.read == ReadConfig(
        inputs=("a.jsonl", "b.jsonl"),
        text_field="body",
        batch_size=3,
        on_bad_line="skip",
        split_bytes=0,
        input_format="jsonl",
    )
    assert cfg.tokenize == TokenizeConfig(
        tokenizer="tok.json",
        eos=7,
        bos="<s>",
        backend="hf",
        num_proc=2,
        special_in_text="special",
    )
    assert cfg.chat == ChatConfig(
        format="chat", messages_field="turns", chat_template="chatml", train_on="last"
    )
    assert cfg.plan == PlanConfig(
        short_len=100,
        long_len=1000,
        overlong="truncate",
        algorithm="ffd",
        seed=5,
        balance="attention",
    )


def test_cli_import_loads_neither_numpy_nor_pyarrow() -> None:
    """``packcli --help`` (and every task's start) pays only for typer and the config: the
    commands import their libraries when they run (stats pulled in numpy, ~0.2 s)."""
    code = (
        "import sys, packcli.cli; "
        "print(sorted(m for m in ('numpy', 'pyarrow', 'packcli.stages.run') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
