"""An export's records: one per part (the files one tokenized shard or one packed Parquet
file became) and the marker ``packcli-export.json``, written last, that lists them all.

Resume: a part is done when its record has this export's fingerprint and every file it lists
is there with its size and sha256 (hashed again: an edited file is rewritten, not trusted);
on object storage, at its size and still the version the store gave it when it was put
(``store_version``: an ETag, a generation; ``place.py``). Before any file is written, the
claim (``.packcli-export/_claim.json``) names every file the export will write, so a killed
run's files stay known as this export's and are never refused as another's. The marker is
removed when an export starts, so a folder whose marker is there is complete.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from packcli.atomic import atomic_write_json
from packcli.publish.marker import read_json_object
from packcli.tokenize.shards import sha256_file

EXPORT_MARKER = "packcli-export.json"
PARTS_DIR = ".packcli-export"  # per-part records (hidden: not data a framework should glob)
EXPORT_VERSION = 1  # bump when any writer's bytes change, so older parts are rewritten


def fingerprint(settings: dict[str, Any]) -> str:
    """sha256 of an export's settings and of the pack it reads (its run fingerprint)."""
    blob = json.dumps({"version": EXPORT_VERSION, **settings}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()


@dataclass(frozen=True)
class ExportedFile:
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
        data = asdict(self)
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
class PartRecord:
    """A finished part: its files and what they hold."""

    name: str
    fingerprint: str
    files: tuple[ExportedFile, ...]
    documents: int
    tokens: int
    stats: dict[str, int]  # format-specific sums (rows, segments, trained tokens...)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["files"] = [f.to_json() for f in self.files]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PartRecord:
        return cls(
            name=str(data["name"]),
            fingerprint=str(data["fingerprint"]),
            files=tuple(_file_of(f) for f in data["files"]),
            documents=int(data["documents"]),
            tokens=int(data["tokens"]),
            stats={str(k): int(v) for k, v in data.get("stats", {}).items()},
        )


def _file_of(data: dict[str, Any]) -> ExportedFile:
    version = data.get("store_version") or {}
    return ExportedFile(
        path=str(data["path"]),
        bytes=int(data["bytes"]),
        sha256=str(data["sha256"]),
        store_version={str(k): str(v) for k, v in version.items()},
    )


def part_rel(name: str) -> str:
    """The part's record, relative to the export folder."""
    return f"{PARTS_DIR}/{name}.json"


def part_path(dest: Path, name: str) -> Path:
    return dest / part_rel(name)


def parse_part(data: dict[str, Any], fp: str) -> PartRecord | None:
    """A complete record for fingerprint ``fp`` (a pending or another export's: None)."""
    try:
        record = PartRecord.from_json(data) if data else None
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return record if record is not None and record.fingerprint == fp else None


def done_part(dest: Path, name: str, fp: str) -> PartRecord | None:
    """The part's record when it is complete for fingerprint ``fp``, else None."""
    record = parse_part(read_json_object(part_path(dest, name)), fp)
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
class ExportMarker:
    """``packcli-export.json``: what was exported from which pack, and every file's sha256."""

    format: str
    fingerprint: str
    source: str
    pack_fingerprint: str
    settings: dict[str, Any]
    parts: tuple[PartRecord, ...]
    extra_files: tuple[ExportedFile, ...]  # files of the whole export (metadata, lists)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["parts"] = [p.to_json() for p in self.parts]
        data["extra_files"] = [f.to_json() for f in self.extra_files]
        data["documents"] = sum(p.documents for p in self.parts)
        data["tokens"] = sum(p.tokens for p in self.parts)
        return data

    def write(self, dest: Path) -> None:
        atomic_write_json(dest / EXPORT_MARKER, self.to_json())


def read_export_marker(dest: Path) -> dict[str, Any]:
    """The marker as written (``{}`` when there is none: not a complete export)."""
    return read_json_object(dest / EXPORT_MARKER)
