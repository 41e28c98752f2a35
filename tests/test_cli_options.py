"""The CLI's option table: flags reach the config under their own names, the help says where
chat defaults differ, and ``packcli --help`` stays light."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest
from clirun import invoke

from packcli.cli.flags import (
    ChatFlags,
    PlanFlags,
    ReadFlags,
    RunFlags,
    SourceFlags,
    TokenizeFlags,
    config_from_flags,
)
from packcli.config import ChatConfig, PlanConfig, ReadConfig, RunConfig, TokenizeConfig

SECTIONS = [
    ("read", ReadFlags, ReadConfig),
    ("tokenize", TokenizeFlags, TokenizeConfig),
    ("chat", ChatFlags, ChatConfig),
    ("plan", PlanFlags, PlanConfig),
]


@pytest.mark.parametrize(("section", "flags", "config"), SECTIONS)
def test_flag_fields_are_config_fields(section: str, flags: type, config: type) -> None:
    """A field renamed on one side only would otherwise fail at run time ("unknown key")."""
    names = {f.name for f in dataclasses.fields(flags)}
    assert names <= {f.name for f in dataclasses.fields(config)}


def _help(flags: type, field: str) -> str:
    return typing.get_args(typing.get_type_hints(flags, include_extras=True)[field])[1].help


def _defaults(fmt: str) -> RunConfig:
    return config_from_flags(
        None, RunFlags(out="o", source=SourceFlags(inputs=[], chat=ChatFlags(format=fmt)))
    )


def test_the_help_says_both_defaults_where_chat_differs() -> None:
    """Where chat and preference data get another default than text (--eos, --overlong), the
    help says both (it said only the text default, wrong for chat); elsewhere one holds."""
    differ = set()
    for section, flags, _ in SECTIONS:
        for field in (f.name for f in dataclasses.fields(flags)):
            if field == "format":  # the one flag that chooses the data, not a default of it
                continue
            text, chat, preference = (
                getattr(getattr(_defaults(fmt), section), field)
                for fmt in ("text", "chat", "preference")
            )
            assert chat == preference, field
            says_both = "; chat and preference: " in _help(flags, field)
            assert says_both == (chat != text), field
            if says_both:
                differ.add(field)
    assert differ == {"eos", "overlong"}


SOURCE_FLAGS = {
    "--tokenizer": "tok.json",
    "--text-field": "body",
    "--eos": "7",
    "--bos": "<s>",
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
}
PLAN_FLAGS = {
    "--short-len": "100",
    "--long-len": "1000",
    "--overlong": "truncate",
    "--algorithm": "ffd",
    "--seed": "5",
    "--balance": "attention",
}
SOURCE_CONFIG = {
    "read": ReadConfig(
        inputs=("a.jsonl", "b.jsonl"),
        text_field="body",
        batch_size=3,
        on_bad_line="skip",
        split_bytes=0,
        input_format="jsonl",
    ),
    "tokenize": TokenizeConfig(
        tokenizer="tok.json",
        eos=7,
        bos="<s>",
        backend="hf",
        num_proc=2,
        special_in_text="special",
    ),
    "chat": ChatConfig(
        format="chat", messages_field="turns", chat_template="chatml", train_on="last"
    ),
}
PLAN_CONFIG = PlanConfig(
    short_len=100, long_len=1000, overlong="truncate", algorithm="ffd", seed=5, balance="attention"
)


@pytest.mark.parametrize(
    ("command", "inputs", "flags", "sections"),
    [
        (
            "pack",
            ["a.jsonl", "b.jsonl"],
            {**SOURCE_FLAGS, **PLAN_FLAGS},
            {**SOURCE_CONFIG, "plan": PLAN_CONFIG},
        ),
        # --format chat: the plan's chat default (a dialogue is never split)
        (
            "tokenize",
            ["a.jsonl", "b.jsonl"],
            SOURCE_FLAGS,
            {**SOURCE_CONFIG, "plan": PlanConfig(overlong="drop")},
        ),
        ("plan", [], PLAN_FLAGS, {"plan": PLAN_CONFIG}),
    ],
)
def test_every_flag_reaches_its_config_field(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    command: str,
    inputs: list[str],
    flags: dict[str, str],
    sections: dict[str, Any],
) -> None:
    """Each flag of a command given a value other than its default arrives in the RunConfig
    the command runs with (the sections it has no flags for keep their defaults)."""
    import packcli.stages.plan
    import packcli.stages.run
    import packcli.stages.work

    seen: list[RunConfig] = []

    def stop(cfg: RunConfig, **kwargs: Any) -> Any:
        seen.append(cfg)
        raise SystemExit(0)

    monkeypatch.setattr(packcli.stages.run, "run_pack", stop)
    monkeypatch.setattr(packcli.stages.work, "check_output", stop)
    monkeypatch.setattr(packcli.stages.plan, "plan_stage", stop)
    work = str(tmp_path / "work")
    out = str(tmp_path / "out")
    invoke(
        command, *inputs, "-o", out, "--work-dir", work, *[x for kv in flags.items() for x in kv]
    )
    [cfg] = seen
    assert (cfg.out, cfg.work_dir) == (out, work)
    default = RunConfig()
    for name in ("read", "tokenize", "chat", "plan"):
        assert getattr(cfg, name) == sections.get(name, getattr(default, name)), name


def test_cli_import_loads_neither_numpy_nor_pyarrow() -> None:
    """``packcli --help`` (and every task's start) pays only for typer and the config: the
    commands import their libraries when they run (stats pulled in numpy, ~0.2 s)."""
    code = (
        "import sys, packcli.cli; "
        "print(sorted(m for m in ('numpy', 'pyarrow', 'packcli.stages.run') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_text_pack_imports_no_chat_or_push_modules(
    toy_tokenizer_path: Path, make_corpus: Any, tmp_path: Path
) -> None:
    """A text ``packcli pack`` leaves chat's worker pool (multiprocessing), chat's offsets
    check and the push side unimported: a few ms each of every small run's fixed cost."""
    corpus = make_corpus([5, 40, 300])
    args = ["pack", str(corpus), "-t", str(toy_tokenizer_path), "-o", str(tmp_path / "o"), "-q"]
    unwanted = (
        "multiprocessing",
        "packcli.chat.render_pool",
        "packcli.chat.offsets",
        "packcli.publish.push",
        "packcli.publish.remote",
    )
    code = (
        f"import sys; sys.argv = {['packcli', *args]!r}\n"
        "from packcli.cli import main\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        f"print(sorted(m for m in {unwanted!r} if m in sys.modules))\n"
        "print('packcli.stages.run' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-2:] == ["[]", "True"], done.stdout + done.stderr
