"""The write stage's per-file records, ``write/<config>-<i>.json``: first a claim naming the
file about to be written (so a kill mid-write leaves a file packcli's records own), then,
once the file is whole and where the output is, what ``packcli.json`` lists of it.

Beside ``stages/write.py``, which writes them; ``finalize`` and the ownership check read
them. Same reader and writer as the tokenize stage's records (``packcli.tokenize.records``):
one of another version is not done (the file is written again).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from packcli.records import Record


def file_record_name(config: str, index: int) -> str:
    """The record's file name in ``write/``."""
    return f"{config}-{index:05d}.json"


@dataclass(frozen=True)
class FileClaim(Record):
    """Written before the file: names it, without a fingerprint (so: not done)."""

    file: str

    @staticmethod
    def named(data: dict[str, Any]) -> str | None:
        """The file a write record of any version or state names (a bare name), or None:
        what packcli wrote is its own to replace, whichever packcli wrote it."""
        file = data.get("file")
        return file if isinstance(file, str) and "/" not in file else None


@dataclass(frozen=True)
class FileRecord(Record):
    """A finished output file: what ``packcli.json`` lists of it (``listing``), the
    fingerprint it was written for, and on a remote output the store's version of it."""

    fingerprint: str
    file: str
    rows: int
    tokens: int
    bytes: int
    sha256: str
    store_version: dict[str, str] | None = field(default=None, metadata={"omit": True})

    def listing(self) -> dict[str, Any]:
        """The file's entry in ``packcli.json`` (its ``files`` lists)."""
        return {
            "file": self.file,
            "rows": self.rows,
            "tokens": self.tokens,
            "bytes": self.bytes,
            "sha256": self.sha256,
        }
