"""The allowed values and output names that several modules check or write, defined once.

A leaf module (it imports nothing of packcli), so the config, the readers, the planner, the
writer, the publishing side and ``packcli.collate`` can all use it without importing one
another.
"""

from __future__ import annotations

from typing import Literal, get_args

# -- the output folder -------------------------------------------------------------------------

ConfigName = Literal["long", "short"]
CONFIG_NAMES: tuple[str, ...] = get_args(ConfigName)
"""The two dataset configs (``data/long``, ``data/short``), the default first (typed ``str``:
records keyed by them are ``dict[str, ...]``)."""
MARKER = "packcli.json"  # config + report + file hashes; written last, marks a complete output
STATS_DIR = "stats"  # plots written by `packcli stats`, embedded in the card
OUT_LOCK = ".packcli.lock"  # in the output folder, while `pack` runs
WORK_DIR = ".packcli"  # the work folder, inside the output unless --work-dir moves it
TOKENS_DIR = "tokens"  # in the work folder: the tokenize stage's shards and records
WORK_MARKER = "packcli-work.json"  # in the work folder: marks it as packcli's
WORK_LOCK = "lock"  # in the work folder, while `pack` runs
TASK_LOCKS = "locks"  # in the work folder: one file per stage task index

IGNORE_INDEX = -100
"""The label of a token that carries no loss (segment starts, prompts, padding)."""

# -- allowed values of options -----------------------------------------------------------------

InputFormat = Literal["auto", "jsonl", "parquet", "arrow", "hf-disk", "hub"]
INPUT_FORMATS: tuple[InputFormat, ...] = get_args(InputFormat)
"""Values of ``--input-format``: ``auto`` decides per file by its name (and per folder: a
``save_to_disk`` folder is read as one); the others force it (``packcli/read/columnar.py``)."""

BadLinePolicy = Literal["error", "skip"]
BAD_LINE_POLICIES: tuple[BadLinePolicy, ...] = get_args(BadLinePolicy)
"""Values of ``--on-bad-line`` (``ReadOptions.on_bad_line``)."""

Backend = Literal["auto", "hf", "fastokens", "gigatoken"]
BACKENDS: tuple[Backend, ...] = get_args(Backend)
"""Tokenizer backends of ``--backend``: ``auto`` picks the fastest that matches HF exactly."""
BACKEND_ALIASES: dict[str, str] = {"tiktoken": "fastokens"}
"""Old names accepted for a backend: ``tiktoken`` was the fast path (a tiktoken encoding
derived from tokenizer.json), replaced by fastokens, which reproduces HF on every tokenizer
it did and on more, faster."""

SpecialInText = Literal["text", "special"]
SPECIAL_IN_TEXT: tuple[SpecialInText, ...] = get_args(SpecialInText)
"""Values of ``--special-in-text``: how a special token's string inside a document is encoded."""

OverlongPolicy = Literal["split", "truncate", "drop"]
OVERLONG_POLICIES: tuple[OverlongPolicy, ...] = get_args(OverlongPolicy)
"""What ``--overlong`` does with a document longer than ``--long-len``."""

PlanAlgorithm = Literal["bfd", "ffd", "wrapped"]
PLAN_ALGORITHMS: tuple[PlanAlgorithm, ...] = get_args(PlanAlgorithm)
"""Values of ``--algorithm`` (the planner of the long config; ``packcli.binpack``'s)."""

BalanceMode = Literal["none", "attention"]
BALANCE_MODES: tuple[BalanceMode, ...] = get_args(BalanceMode)
"""Values of ``--balance``: whether long documents move out of the costliest long rows."""

Compression = Literal["zstd", "snappy", "gzip", "lz4", "none"]
COMPRESSIONS: tuple[Compression, ...] = get_args(Compression)
"""Values of ``write.compression``: the Parquet codecs pyarrow writes."""

DataFormat = Literal["text", "chat", "preference"]
DATA_FORMATS: tuple[DataFormat, ...] = get_args(DataFormat)
"""Values of ``--format``: what a record of the input is."""

TrainOn = Literal["assistant", "last", "all"]
TRAIN_ON: tuple[TrainOn, ...] = get_args(TrainOn)
"""Values of ``--train-on``: which tokens of a dialogue carry loss."""

Executor = Literal["local", "ray"]
EXECUTORS: tuple[Executor, ...] = get_args(Executor)
"""Values of ``--executor``: where the stage tasks run."""


def one_of(values: tuple[str, ...]) -> str:
    """``"a, b or c"``: allowed values as messages list them."""
    return f"{', '.join(values[:-1])} or {values[-1]}" if len(values) > 1 else values[0]


# ``packcli inspect --chars``: characters of a segment's text shown at each end.
PREVIEW_CHARS = 40
