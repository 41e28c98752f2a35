"""Where an export's files go, behind one interface: a local folder (``LocalDest``) or a
folder on object storage (``StoreDest``), so ``run.py`` writes every part one way and never
asks which.

Both make a part's files in a local folder (``folder``: the destination itself, or for a URL
a staging folder under packcli's cache), under temp names renamed into place, read back
and compared before the part is recorded. On a store ``finish_part`` then puts each file
whole (``fs.put_output_file``: one PUT, or a multipart upload visible only once complete;
logged in the staging folder, and not put again while the store holds it as it was put),
takes the store's size and version of it (one HEAD), puts the part's record after its files
and deletes the staged copies: the local disk holds one part at a time. The marker goes last.

Ownership, as ``pack --out`` has it: before anything is written, a file already at a path
this export writes is refused unless a record of this export's names it (a part record, the
claim, the marker, the upload log): an export never replaces another's files. The claim,
written once the check passes, names every file the export will write, so the files of a
run killed before their part's record stay known as the export's.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from packcli.atomic import atomic_write_json, json_bytes
from packcli.export.record import (
    CLAIM,
    EXPORT_MARKER,
    PARTS_DIR,
    ExportedFile,
    ExportMarker,
    PartRecord,
    done_part,
    named_files,
    parse_part,
    part_rel,
    write_part,
)
from packcli.export.source import ExportError
from packcli.faults import crash_point
from packcli.publish.marker import read_json_object
from packcli.records import Record, parse_record

T = TypeVar("T")
_READ_THREADS = 8


@dataclass(frozen=True)
class ExportClaim(Record):
    """``CLAIM``: every file the export writes (relative, sorted, with those earlier runs
    claimed), written once the ownership check passes and before any of them. No version
    field: it only names files, and its bytes stay those every packcli wrote."""

    VERSION: ClassVar[int | None] = None

    files: list[str]


def claimed(data: object, path: Path | str) -> set[str]:
    """The files the claim ``data`` (parsed JSON of ``path``) names, carried into the next
    claim; none when it does not read as one (a file only it named is then refused as
    another's, should an export plan to write there: never replaced)."""
    claim = parse_record(ExportClaim, data, path)
    return set() if claim is None else set(claim.files)


def foreign(
    planned: set[str], present: Iterable[str], records: Iterable[dict[str, Any]], marker: Any
) -> list[str]:
    """The files at paths this export writes (``planned``) that no record of it names:
    another's, never to be replaced. A marker there is the export's when it reads as one."""
    owned: set[str] = set()
    for data in records:
        owned |= named_files(data)
    if isinstance(marker, dict) and marker.get("format") and isinstance(marker.get("parts"), list):
        owned |= named_files(marker) | {EXPORT_MARKER}
    return sorted(rel for rel in set(present) & planned if rel not in owned)


def refuse_foreign(where: str, found: list[str]) -> None:
    """One line naming the foreign files (the first few) and what to do; nothing when none."""
    if not found:
        return
    from packcli.fs.output import first_few

    shown = first_few(found)
    raise ExportError(
        f"export folder {where} holds {len(found)} file(s) this export did not write, where "
        f"it writes: {shown}; packcli never replaces or deletes other files: move them out, "
        "or choose another --dest"
    )


class LocalDest:
    """An export folder on this disk: files are made in place."""

    remote = False

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.where = str(folder)

    def shown(self, rel: str) -> str:
        """A file of the export as the frameworks' path lists name it."""
        return str((self.folder / rel).resolve())

    def begin(self, planned: set[str]) -> None:
        """Refuse another's files where the export writes, claim the paths, and remove the
        marker (the folder is complete again only when everything is)."""
        planned = planned | {EXPORT_MARKER}
        self.folder.mkdir(parents=True, exist_ok=True)
        parts = self.folder / PARTS_DIR
        records = [read_json_object(p) for p in sorted(parts.glob("*.json"))]
        present = [rel for rel in planned if (self.folder / rel).is_file()]
        marker = read_json_object(self.folder / EXPORT_MARKER)
        refuse_foreign(self.where, foreign(planned, present, records, marker))
        files = claimed(read_json_object(self.folder / CLAIM), self.folder / CLAIM) | planned
        parts.mkdir(exist_ok=True)
        atomic_write_json(self.folder / CLAIM, ExportClaim(sorted(files)).to_json())
        (self.folder / EXPORT_MARKER).unlink(missing_ok=True)

    def done_part(self, name: str, fp: str) -> PartRecord | None:
        return done_part(self.folder, name, fp)

    def finish_part(self, record: PartRecord) -> PartRecord:
        write_part(self.folder, record)
        return record

    def finish_file(self, rel: str) -> ExportedFile:
        """A file of the whole export (a path list, a metadata file), just written."""
        return ExportedFile.of(self.folder, self.folder / rel)

    def finish(self, marker: ExportMarker) -> None:
        marker.write(self.folder)


class StoreDest:
    """An export folder on object storage (``url``), made part by part in a local staging
    folder named after the URL (its upload log stays there, so a rerun on this machine
    does not put again what the store still holds)."""

    remote = True

    def __init__(self, url: str) -> None:
        from packcli.fs import locate, redact, url_folder

        self.url = url.rstrip("/")
        self.fs, prefix = locate(self.url)
        self.prefix = prefix.rstrip("/")
        self.where = redact(self.url)
        self.stage = url_folder("exports", self.url)
        self.folder = self.stage / "files"
        self._there: dict[str, dict[str, Any]] = {}
        self._records: dict[str, dict[str, Any]] = {}
        self._puts = 0

    def _key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}"

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """A store call; its failure as one line naming the export folder."""
        from packcli.fs import store_call

        then = "it is not marked complete: rerun the same command to resume"
        return store_call(fn, f"export folder {self.where}: cannot {what}", then, ExportError)

    def _read_json(self, rel: str) -> dict[str, Any]:
        """A small record on the store ({} when missing or not a JSON object)."""
        from packcli.fs import json_object

        return self._call(f"read {rel}", lambda: json_object(self.fs, self._key(rel)))

    def _pipe(self, rel: str, body: bytes) -> None:
        self._call(f"write {rel}", lambda: self.fs.pipe_file(self._key(rel), body))

    def shown(self, rel: str) -> str:
        return f"{self.where}/{rel}"

    def begin(self, planned: set[str]) -> None:
        """As ``LocalDest.begin``, from one listing of the folder on the store (kept for
        ``done_part``) and its records; the staging folder starts empty."""
        from packcli.fs import check_writable, listing, uploaded_files

        planned = planned | {EXPORT_MARKER}
        check_writable(self.url, "export folder")
        there = self._call("list it", lambda: listing(self.fs, self.prefix))
        rels = sorted(r for r in there if r.startswith(f"{PARTS_DIR}/") and r.endswith(".json"))
        with ThreadPoolExecutor(_READ_THREADS) as pool:  # small GETs: latency, not bytes
            records = dict(zip(rels, pool.map(self._read_json, rels), strict=True))
        marker = self._read_json(EXPORT_MARKER) if EXPORT_MARKER in there else {}
        logged = {"files": sorted(uploaded_files(self.stage, self.url))}
        found = foreign(planned, there, [*records.values(), logged], marker)
        refuse_foreign(self.where, found)
        files = claimed(records.get(CLAIM, {}), self.shown(CLAIM)) | planned
        self._pipe(CLAIM, json_bytes(ExportClaim(sorted(files)).to_json()))
        if EXPORT_MARKER in there:
            self._call("remove its marker", lambda: _rm(self.fs, self._key(EXPORT_MARKER)))
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder.mkdir(parents=True)
        self._there, self._records = there, records

    def done_part(self, name: str, fp: str) -> PartRecord | None:
        """The part's record, when every file it lists is on the store at its size and as
        the store had it when it was put (``fs.same_version``: never the size alone)."""
        from packcli.fs import same_version

        record = parse_part(self._records.get(part_rel(name), {}), fp, part_rel(name))
        if record is None:
            return None
        for f in record.files:
            there = self._there.get(f.path)
            if there is None or int(there.get("size") or -1) != f.bytes:
                return None
            if not same_version(f.store_version, there):
                return None
        return record

    def _put(self, f: ExportedFile) -> ExportedFile:
        """Put one staged file, check the store's size of it, take its version, and free
        the local copy."""
        from packcli.fs import content_version, put_output_file

        put_output_file(self.folder, self.stage, self.url, f.path, f.bytes, f.sha256)
        key = self._key(f.path)

        def head() -> dict[str, Any]:
            self.fs.invalidate_cache(key)
            return dict(self.fs.info(key))

        found = self._call(f"stat {f.path}", head)
        if int(found.get("size") or -1) != f.bytes:
            raise ExportError(
                f"{self.shown(f.path)}: the store holds {found.get('size')} bytes after the "
                f"upload of {f.bytes}; rerun the same command to put it again"
            )
        (self.folder / f.path).unlink(missing_ok=True)
        self._puts += 1
        crash_point(f"export-put:{self._puts}")
        return f.stored(content_version(found))

    def finish_part(self, record: PartRecord) -> PartRecord:
        """The part's files up, then its record (which vouches for them) after."""
        from dataclasses import replace

        record = replace(record, files=tuple(self._put(f) for f in record.files))
        self._pipe(part_rel(record.name), json_bytes(record.to_json()))
        return record

    def finish_file(self, rel: str) -> ExportedFile:
        return self._put(ExportedFile.of(self.folder, self.folder / rel))

    def finish(self, marker: ExportMarker) -> None:
        """``packcli-export.json`` last: the folder on the store is complete once it is."""
        self._pipe(EXPORT_MARKER, json_bytes(marker.to_json()))


def _rm(fs: Any, path: str) -> None:
    import contextlib

    with contextlib.suppress(FileNotFoundError):
        fs.rm_file(path)


Dest = LocalDest | StoreDest


def destination(dest: str) -> Dest:
    """The export folder ``dest``: a URL on object storage, or a local folder."""
    from packcli.fs import is_url, local_path

    return StoreDest(dest) if is_url(dest) else LocalDest(Path(local_path(dest)))
