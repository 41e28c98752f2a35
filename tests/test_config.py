"""Config: YAML defaults mirror the dataclasses; validation says what to change."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from packcli.config import RunConfig, build_config, load_yaml
from packcli.errors import ConfigError

CONFIGS = Path(__file__).parent.parent / "configs"


def test_pretrain_yaml_equals_dataclass_defaults() -> None:
    from_yaml = build_config(load_yaml(CONFIGS / "pretrain.yaml"))
    assert from_yaml == RunConfig()


def test_flags_override_yaml(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("plan:\n  short_len: 100\n  long_len: 1000\nread:\n  text_field: body\n")
    cfg = build_config(load_yaml(f), {"plan": {"long_len": 2000, "seed": None}})
    assert (cfg.plan.short_len, cfg.plan.long_len, cfg.plan.seed) == (100, 2000, 0)
    assert cfg.read.text_field == "body"
    assert dataclasses.asdict(cfg)["plan"]["long_len"] == 2000


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("plan:\n  short_len: 10\n  long_len: 5\n", "tiers must be increasing"),
        ("plan:\n  overlong: chop\n", "overlong must be one of"),
        ("plan:\n  algorithm: magic\n", "algorithm must be one of"),
        ("plann:\n  short_len: 3\n", "unknown section"),
        ("plan:\n  shortlen: 3\n", "unknown key"),
        ("plan: [1, 2]\n", "must be a mapping"),
        ("tokenize:\n  eos: [1]\n", "token string or an id"),
        ("read:\n  batch_size: 0\n", "batch_size"),
        ("write:\n  compression: brotli9\n", "compression"),
        ("tokenize:\n  num_proc: -2\n", "num_proc"),
        ("tokenize:\n  backend: spacy\n", "backend"),
        ("read:\n  on_bad_line: ignore\n", "on_bad_line"),
        ("chat:\n  format: chat\nplan:\n  overlong: split\n", "never split"),
        ("chat:\n  train_on: users\n", "train_on"),
        ("plan: {short_len: 3\n", "invalid YAML"),
    ],
)
def test_invalid_configs(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=message):
        build_config(load_yaml(f))
