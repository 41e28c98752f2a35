"""The write stage's records, in ``write/``: per output file (``<config>-<i>.json``) first a
claim naming the file about to be written (so a kill mid-write leaves a file packcli's
records own), then, once the file is whole and where the output is, what ``packcli.json``
lists of it; per group its tail shard's record (``tail-group-NNNNN.json``); and the write
settings the files were written with (``config.json``).

Beside ``stages/write.py``, which writes them; ``finalize`` and the ownership check read
them. Same reader and writer as every record (``packcli.records``): one of another version is
not done (the file, the tail shard is written again; the settings are those of this run).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from packcli.records import Fields, Record

WRITE_DIR = "write"  # in the work folder
WRITE_SETTINGS = "config.json"  # in write/: the write settings, as run


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
class Listing(Fields):
    """An output file as ``packcli.json`` lists it (its ``files`` lists)."""

    file: str
    rows: int
    tokens: int
    bytes: int
    sha256: str


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

    def listing(self) -> Listing:
        """The file's entry in ``packcli.json`` (its ``files`` lists)."""
        return Listing(self.file, self.rows, self.tokens, self.bytes, self.sha256)


def tail_shard_name(part_name: str) -> str:
    """A group's tail shard (``.arrow``) and its record (``.json``), without the suffix."""
    return f"tail-{part_name}"


@dataclass(frozen=True)
class TailShard(Record):
    """A group's tail shard: the tokens of the pieces it released (``pieces`` of them), cut
    for the fingerprint of the write; the tail's writer checks its bytes and hash."""

    fingerprint: str
    file: str
    pieces: int
    bytes: int
    sha256: str


@dataclass(frozen=True)
class WriteSettings(Record):
    """``write/config.json``: ``WriteConfig``'s fields as the write tasks ran (finalize
    reports them, whichever command wrote the files)."""

    write: dict[str, Any]
