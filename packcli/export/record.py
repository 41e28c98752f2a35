"""An export's records: one per part (the files one tokenized shard or one packed Parquet
file became) and the marker ``packcli-export.json``, written last, that lists them all.

Resume: a part is done when its record has this export's fingerprint and every file it lists
is there with its size and sha256 (hashed again: an edited file is rewritten, not trusted);
on object storage, at its size and still the version the store gave it when it was put
(``store_version``: an ETag, a generation; ``place.py``). Before any file is written, the
claim (``.packcli-export/_claim.json``) names every file the export will write, so a killed
run's files stay known as this export's and are never refused as another's. The marker is
removed when an export starts, so a folder whose marker is there is complete.

The records are read and written by ``packcli.records``, without a version field: the
marker's bytes are the export's, and ``EXPORT_VERSION`` is in every fingerprint, so a record
of another version has another fingerprint and its part is written again.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

from packcli.atomic import atomic_write_json
from packcli.publish.marker import read_json_object
from packcli.records import Fields, Record, parse_record
from packcli.tokenize.shards import sha256_file

EXPORT_MARKER = "packcli-export.json"
PARTS_DIR = ".packcli-export"  # per-part records (hidden: not data a framework should glob)
EXPORT_VERSION = 1  # bump when any writer's bytes change, so older parts are rewritten


def fingerprint(settings: dict[str, Any]) -> str:
    """sha256 of an export's settings and of the pack it reads (its run fingerprint)."""
    blob = json.dumps({"version": EXPORT_VERSION, **settings}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()


@dataclass(frozen=True)
class ExportedFile(Fields):
    """One written file, relative to the export folder."""

    path: str
    bytes: int
    sha256: str
    store_version: dict[str, str] = field(default_factory=dict)  # on a store: as it was put

    @classmethod
    def of(cls, dest: Path, path: Path) -> ExportedFile:
        return cls(path.relative_to(dest).as_posix(), path.stat().st_size, sha256_file(path))

    def stored(self, version: dict[str, str]) -> ExportedFile:
        return replace(self, store_version=dict(version))

    def to_json(self) -> dict[str, Any]:
        """Without ``store_version`` when it has none: a local export's records as before."""
        data = super().to_json()
        if not self.store_version:
            del data["store_version"]
        return data

    def intact(self, dest: Path) -> bool:
        path = dest / self.path
        return (
            path.is_file()
            and path.stat().st_size == self.bytes
            and sha256_file(path) == self.sha256
        )


@dataclass(frozen=True)
class PartRecord(Record):
    """A finished part: its files and what they hold."""

    VERSION: ClassVar[int | None] = None  # EXPORT_VERSION is in its fingerprint

    name: str
    fingerprint: str
    files: tuple[ExportedFile, ...]
    documents: int
    tokens: int
    stats: dict[str, int] = field(default_factory=dict)  # format-specific sums (rows...)


def part_rel(name: str) -> str:
    """The part's record, relative to the export folder."""
    return f"{PARTS_DIR}/{name}.json"


def part_path(dest: Path, name: str) -> Path:
    return dest / part_rel(name)


def parse_part(data: dict[str, Any], fp: str, path: Path | str) -> PartRecord | None:
    """A complete record for fingerprint ``fp`` (a pending, damaged or another export's:
    None)."""
    record = parse_record(PartRecord, data, path) if data else None
    return record if record is not None and record.fingerprint == fp else None


def done_part(dest: Path, name: str, fp: str) -> PartRecord | None:
    """The part's record when it is complete for fingerprint ``fp``, else None."""
    path = part_path(dest, name)
    record = parse_part(read_json_object(path), fp, path)
    if record is None:
        return None
    return record if all(f.intact(dest) for f in record.files) else None


def write_part(dest: Path, record: PartRecord) -> None:
    path = part_path(dest, record.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, record.to_json())


CLAIM = f"{PARTS_DIR}/_claim.json"  # no part is named with a leading "_"


def named_files(data: object) -> set[str]:
    """The files a part record, the claim or the marker names, relative (none when ``data``
    is not a JSON object: a damaged record names nothing)."""
    if not isinstance(data, dict):
        return set()
    entries: list[Any] = [*(data.get("files") or []), *(data.get("extra_files") or [])]
    for part in data.get("parts") or []:
        entries += (part.get("files") or []) if isinstance(part, dict) else []
    found: set[str] = set()
    for entry in entries:
        rel = entry.get("path") if isinstance(entry, dict) else entry
        if isinstance(rel, str):
            found.add(rel)
    return found


@dataclass(frozen=True)
class ExportMarker(Record):
    """``packcli-export.json``: what was exported from which pack, and every file's sha256
    (and the documents and tokens of all parts, summed)."""

    VERSION: ClassVar[int | None] = None  # its bytes are the export's

    format: str
    fingerprint: str
    source: str
    pack_fingerprint: str
    settings: dict[str, Any]
    parts: tuple[PartRecord, ...]
    extra_files: tuple[ExportedFile, ...]  # files of the whole export (metadata, lists)
    # The parts' sums, written for readers of the marker; derived, so never read back.
    documents: int = field(init=False)
    tokens: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "documents", sum(p.documents for p in self.parts))
        object.__setattr__(self, "tokens", sum(p.tokens for p in self.parts))

    def write(self, dest: Path) -> None:
        atomic_write_json(dest / EXPORT_MARKER, self.to_json())


def read_export_marker(dest: Path) -> dict[str, Any]:
    """The marker as written (``{}`` when there is none: not a complete export)."""
    return read_json_object(dest / EXPORT_MARKER)
