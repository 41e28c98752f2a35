"""What an input's name says: its format (jsonl, Parquet, Arrow) and a jsonl file's compression.

Pure name rules with no I/O, so every other reader module (and the planner of units of work)
can ask them without opening anything.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

SUPPORTED_SUFFIXES: tuple[str, ...] = (".jsonl", ".jsonl.gz", ".jsonl.zst")
"""jsonl file name endings the reader accepts (matched case-insensitively)."""

FORMAT_SUFFIXES: dict[str, tuple[str, ...]] = {
    "jsonl": SUPPORTED_SUFFIXES,
    "parquet": (".parquet",),
    # Arrow IPC, file or stream format (``.arrows``; ``datasets`` writes streams as .arrow).
    "arrow": (".arrow", ".arrows", ".feather", ".ipc"),
}
"""File formats by name ending: found in folders and globs, and read as that format."""

HUB_PREFIX = "hf-dataset:"
"""An input spec naming a Hub dataset: ``hf-dataset:OWNER/NAME[@REVISION][/PATH]``."""


def compression(path: Path | str) -> str | None:
    """``"plain"``, ``"gzip"`` or ``"zstd"`` from the file name, or ``None`` if unsupported."""
    name = os.fspath(path).lower()
    if name.endswith(".jsonl"):
        return "plain"
    if name.endswith(".jsonl.gz"):
        return "gzip"
    if name.endswith(".jsonl.zst"):
        return "zstd"
    return None


def suffix_format(path: Path | str) -> str | None:
    """``"jsonl"``, ``"parquet"`` or ``"arrow"`` from the file name, or ``None``."""
    name = os.fspath(path).lower()
    return next((f for f, ends in FORMAT_SUFFIXES.items() if name.endswith(ends)), None)


def file_format(path: Path | str, input_format: str = "auto") -> str | None:
    """How a resolved input file is read: as the forced columnar format whatever its name
    (``--input-format parquet|arrow``), else by its name (jsonl's says its compression)."""
    return input_format if input_format in ("parquet", "arrow") else suffix_format(path)


def splittable(path: Path | str) -> bool:
    """Whether byte ranges of ``path`` can be read on their own (uncompressed jsonl only:
    gzip and zstd streams cannot be entered mid-way)."""
    return compression(path) == "plain"


def suffix_list(formats: Sequence[str] = ("jsonl",)) -> str:
    """The name endings of ``formats``, for messages."""
    return ", ".join(s for f in formats for s in FORMAT_SUFFIXES[f])


def wanted_formats(input_format: str) -> tuple[str, ...]:
    """File formats that folders and globs yield under ``input_format``."""
    if input_format in ("jsonl", "parquet", "arrow"):
        return (input_format,)
    return ("arrow",) if input_format == "hf-disk" else tuple(FORMAT_SUFFIXES)
