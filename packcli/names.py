"""The allowed values and output names that several modules check or write, defined once.

A leaf module (it imports nothing of packcli), so the config, the readers, the planner, the
writer, the publishing side and ``packcli.collate`` can all use it without importing one
another: the output names lived in ``card.py`` before, which made ``fs.py`` import the card
and closed the circle card -> write -> config -> fs -> card.
"""

from __future__ import annotations

# -- the output folder -------------------------------------------------------------------------

CONFIG_NAMES: tuple[str, ...] = ("long", "short")
"""The two dataset configs (``data/long``, ``data/short``), the default first."""
MARKER = "packcli.json"  # config + report + file hashes; written last, marks a complete output
STATS_DIR = "stats"  # plots written by `packcli stats`, embedded in the card

IGNORE_INDEX = -100
"""The label of a token that carries no loss (segment starts, prompts, padding)."""

# -- allowed values of options -----------------------------------------------------------------

INPUT_FORMATS: tuple[str, ...] = ("auto", "jsonl", "parquet", "arrow", "hf-disk", "hub")
"""Values of ``--input-format``: ``auto`` decides per file by its name (and per folder: a
``save_to_disk`` folder is read as one); the others force it (``packcli/read/columnar.py``)."""

BAD_LINE_POLICIES: tuple[str, ...] = ("error", "skip")
"""Values of ``--on-bad-line`` (``ReadOptions.on_bad_line``)."""

BACKENDS: tuple[str, ...] = ("auto", "hf", "fastokens", "gigatoken")
"""Tokenizer backends of ``--backend``: ``auto`` picks the fastest that matches HF exactly."""
BACKEND_ALIASES: dict[str, str] = {"tiktoken": "fastokens"}
"""Old names accepted for a backend: ``tiktoken`` was the fast path (a tiktoken encoding
derived from tokenizer.json), replaced by fastokens, which reproduces HF on every tokenizer
it did and on more, faster."""

SPECIAL_IN_TEXT: tuple[str, ...] = ("text", "special")
"""Values of ``--special-in-text``: how a special token's string inside a document is encoded."""

OVERLONG_POLICIES: tuple[str, ...] = ("split", "truncate", "drop")
"""What ``--overlong`` does with a document longer than ``--long-len``."""

PLAN_ALGORITHMS: tuple[str, ...] = ("bfd", "ffd", "wrapped")
"""Values of ``--algorithm`` (the planner of the long config; ``packcli.binpack``'s)."""

BALANCE_MODES: tuple[str, ...] = ("none", "attention")
"""Values of ``--balance``: whether long documents move out of the costliest long rows."""

COMPRESSIONS: tuple[str, ...] = ("zstd", "snappy", "gzip", "lz4", "none")
"""Values of ``write.compression``: the Parquet codecs pyarrow writes."""

DATA_FORMATS: tuple[str, ...] = ("text", "chat", "preference")
"""Values of ``--format``: what a record of the input is."""

TRAIN_ON: tuple[str, ...] = ("assistant", "last", "all")
"""Values of ``--train-on``: which tokens of a dialogue carry loss."""

EXECUTORS: tuple[str, ...] = ("local", "ray")
"""Values of ``--executor``: where the stage tasks run."""


def one_of(values: tuple[str, ...]) -> str:
    """``"a, b or c"``: allowed values as messages list them."""
    return f"{', '.join(values[:-1])} or {values[-1]}" if len(values) > 1 else values[0]


# ``packcli inspect --chars``: characters of a segment's text shown at each end.
PREVIEW_CHARS = 40
