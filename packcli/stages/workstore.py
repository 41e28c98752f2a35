"""The work folder on object storage (``--work-dir s3://...``), for tasks that share no disk.

On a Ray cluster, or a Slurm array, whose nodes share no file system, each task must read
what the stages before it made and leave what it makes where the next stage can read it:
the store. The stages keep working on plain local paths; in this mode the work folder and
the output folder they see (``RunConfig.work_path`` / ``out_path``) are a *mirror*: a folder
of this process alone under packcli's cache, emptied when a stage starts and when it ends,
and the store is the truth. A stage pulls the records it reads and pushes what it makes,
each file whole in one put (object stores have no rename, but a put becomes visible only
once complete), a completion record after what it vouches for, as on disk it is renamed
into place last:

* a tokenize task pushes a unit's shards, manifests and rejects, then its ``_SUCCESS.json``,
  and removes the unit's local folder, so a node holds one unit's shards at a time;
* the plan stage and the report read only the columns they need of each shard, by ranged
  reads (``TokenShards``), never the token ids;
* a write task fetches a shard the first time its rows need it, puts each Parquet file
  straight under the remote ``--out``, then pushes the file's record;
* ``finalize`` checks every record against the store's listing and puts the card and
  ``packcli.json`` last.

Resume is the local rule read through the store: a unit whose record carries the current
fingerprint and whose shards are all there at their recorded sizes, each still the version the
store gave it when it was put (``STORED``), is reused; a Parquet file whose record carries the
current fingerprint and which is there at its recorded size and ``store_version`` is not
written again. A size alone never vouches for content: another file can have it. A killed
task loses at most the unit or file it was making.

Without a URL work folder the same calls are no-ops (``LocalWork``), and a remote ``--out``
alone is made on this disk and uploaded (``StagingWork``), so the stages have one code path:
``work_store(cfg)`` is the one place that asks where the folders are.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import re
import shutil
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, ClassVar, Self, TypeVar, cast

from packcli.names import CONFIG_NAMES, OUT_LOCK, TASK_LOCKS, TOKENS_DIR, WORK_LOCK
from packcli.records import Record, parse_record

if TYPE_CHECKING:
    from packcli.fs import WorkMarker
    from packcli.stages.write_records import FileRecord

log = logging.getLogger(__name__)

# Lock files stay when a mirror is emptied: the command holding them is still running.
_KEEP = frozenset({OUT_LOCK, WORK_LOCK, TASK_LOCKS})
_SHARD_MANIFEST = re.compile(r"^shard-\d+\.json$")
_PUT_THREADS = 8
UNITS = f"{TOKENS_DIR}/files"
STORED = "_STORED.json"
"""In a unit folder on the store: the store's version (ETag, generation) of each file put,
taken right after the puts; resume trusts a shard only while the store still has it."""


@dataclass(frozen=True)
class StoredVersions(Record):
    """``STORED``: each file put of a unit (by name in its folder) -> the version the store
    gave it. The file is the mapping itself, so this record reads and writes its one field
    as the whole object; no version field (its bytes stay those every packcli wrote)."""

    VERSION: ClassVar[int | None] = None

    versions: dict[str, dict[str, str]]

    def to_json(self) -> dict[str, Any]:
        return dict(self.versions)

    @classmethod
    def from_json(cls, data: object, path: Path | str, prefix: str = "") -> Self:
        return super().from_json({"versions": data}, path, prefix)


F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def _is_record(rel: str) -> bool:
    """Files a stage reads back: everything but the shards and their per-shard manifests
    (the unit's ``_SUCCESS.json`` lists those manifests)."""
    from packcli.tokenize.records import UNIT_STAMP

    name = rel.rsplit("/", 1)[-1]
    return not (name.endswith(".arrow") or _SHARD_MANIFEST.match(name) or name == UNIT_STAMP)


class LocalWork:
    """The work folder and the output on this machine's disk (``local``, ``out``): nothing to
    pull or push, and a finished output file is where it was written.

    This class is the interface every stage uses, whatever the storage: ``StagingWork``
    (a remote ``--out``) and ``WorkStore`` (a URL ``--work-dir``) give the same calls their
    meaning there, so a stage never asks where its folders are."""

    remote = False

    def __init__(self, local: Path, out: Path) -> None:
        self.local = local
        self.out = out

    def pull(self, *rels: str) -> None:
        pass

    def pull_records(self, under: str = "") -> None:
        pass

    def push(self, *rels: str) -> None:
        pass

    def remove(self, *rels: str) -> None:
        pass

    def claim(self, marker: WorkMarker, marker_rel: str) -> None:
        pass

    def fresh(self) -> None:
        pass

    def clear(self) -> None:
        pass

    def shown(self, rel: str) -> str:
        """``rel`` of the work folder as a message names it."""
        return str(self.local / rel)

    def record_name(self, out: Path) -> str:
        """The work folder as ``packcli.json`` records it: relative to the output when inside
        it, so outputs can move."""
        try:
            return str(self.local.resolve().relative_to(out.resolve()))
        except ValueError:
            return str(self.local.resolve())

    def holds(self, rel: str) -> bool:
        """Whether a file a record names (``rel``) is there to be read."""
        return (self.local / rel).is_file()

    def intact(self, files: dict[str, Any], under: str) -> bool:
        """Whether the files of a record (``rel -> [size, sha256]``, all under ``under``) are
        as written: re-hashed on this disk, so a damaged or edited file is made again."""
        from packcli.tokenize.shards import sha256_file

        for rel, (size, digest) in files.items():
            path = self.local / rel
            if not path.is_file() or path.stat().st_size != size or sha256_file(path) != digest:
                return False
        return True

    # Tokenized units (``tokens/files/<key>/``): what resume and the stale-unit sweep ask.

    def unit_keys(self) -> set[str]:
        """Keys of the unit folders there are."""
        return {f.name for f in (self.local / UNITS).glob("*")}

    def done_units(self, units: Iterable[dict[str, Any]]) -> set[str]:
        """Keys of the complete units: a record with the unit's fingerprint and every shard
        it lists still whole (a truncated shard is tokenized again, not read as garbage)."""
        from packcli.records import read_record
        from packcli.tokenize.records import SUCCESS, UnitRecord
        from packcli.tokenize.shards import shard_intact

        done = set()
        for unit in units:
            folder = self.local / UNITS / unit["key"]
            record = read_record(UnitRecord, folder / SUCCESS)  # None: redo it
            if (
                record is not None
                and record.fingerprint == unit["fingerprint"]
                and all(shard_intact(folder, m) for m in record.shards)
            ):
                done.add(unit["key"])
        return done

    def unit_finished(self, key: str) -> None:
        pass

    def drop_unit(self, key: str) -> None:
        shutil.rmtree(self.local / UNITS / key, ignore_errors=True)

    # Output files (``rel`` under the output: ``data/<config>/<file>``): how a write task
    # finds, places and removes them, and how finalize publishes the finished output.

    def begin_output(self) -> None:
        """Before the first output file changes (the local ``packcli.json`` is gone already:
        ``work.uncomplete``)."""

    def output_written(self, rel: str, record: FileRecord) -> bool:
        """Whether the output file that its current write record (``record``) names is there."""
        return (self.out / rel).is_file()

    def place_output(self, rel: str, size: int, sha256: str) -> dict[str, str] | None:
        """A file just written at ``out/rel`` (``size`` bytes, its ``sha256``) goes where
        the output is; returns the store's version of it for its record (None here)."""
        return None

    def remove_output(self, rel: str) -> None:
        """Delete an output file packcli wrote (missing is fine)."""
        (self.out / rel).unlink(missing_ok=True)

    def publish(
        self,
        files: dict[str, list[dict[str, Any]]],
        versions: dict[str, dict[str, str]],
        *,
        owned: frozenset[str],
        threads: int,
    ) -> None:
        """After ``packcli.json`` is written: make the output the finished one wherever it is
        (``files``: what it lists; ``versions``: the store's version of each file a write
        task put there; ``owned``: what packcli's records say it wrote)."""

    def uploaded(self) -> set[str]:
        """The output files the upload log says packcli put on the store."""
        return set()

    def published_files(self) -> set[str]:
        """The data files the remote output's ``packcli.json`` lists."""
        return set()


class StagingWork(LocalWork):
    """A work folder on this disk for an output on the store (``out_url``): the output is made
    in the local staging folder ``out``; a write task puts each file there as soon as it is
    written (uploads overlap writing) and finalize puts the rest, ``packcli.json`` last."""

    def __init__(self, local: Path, out: Path, out_url: str) -> None:
        super().__init__(local, out)
        self.out_url = out_url

    def begin_output(self) -> None:
        """The remote ``packcli.json`` goes too (``fs.begin_changes``)."""
        from packcli.fs import begin_changes

        begin_changes(self.out_url)

    def place_output(self, rel: str, size: int, sha256: str) -> dict[str, str] | None:
        from packcli.fs import put_output_file

        put_output_file(self.out, self.local, self.out_url, rel, size, sha256)
        return None

    def publish(
        self,
        files: dict[str, list[dict[str, Any]]],
        versions: dict[str, dict[str, str]],
        *,
        owned: frozenset[str],
        threads: int,
    ) -> None:
        """Every file is final here: put what the store lacks, ``packcli.json`` last."""
        from packcli.fs import upload_output

        placed = self._placed(files, versions)
        upload_output(
            self.out, self.local, self.out_url, threads=threads, placed=placed, owned=owned
        )

    def _placed(
        self, files: dict[str, list[dict[str, Any]]], versions: dict[str, Any]
    ) -> dict[str, Any]:
        """The files the write tasks put on the store themselves: none, they were staged."""
        return {}

    def uploaded(self) -> set[str]:
        from packcli.fs import uploaded_files

        return uploaded_files(self.local, self.out_url)

    def published_files(self) -> set[str]:
        from packcli.fs import remote_marker_files

        return remote_marker_files(self.out_url)


class WorkStore(StagingWork):
    """A work folder on object storage (``url``) seen through the local mirror ``local``, with
    the remote output ``out_url`` (mirrored in ``out``) that write tasks put their Parquet
    files under, straight from the mirror."""

    remote = True

    def __init__(self, url: str, local: Path, out_url: str, out: Path) -> None:
        from packcli.fs import locate

        super().__init__(local, out, out_url)
        self.url = url
        self.fs, self.prefix = locate(url)
        self.out_fs, self.out_prefix = locate(out_url)
        self._fetch_locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        self._listings: dict[str, dict[str, Any]] = {}

    # ------------------------------------------------------------------ paths and errors

    def _remote(self, rel: str) -> str:
        return f"{self.prefix.rstrip('/')}/{rel}" if rel else self.prefix.rstrip("/")

    def _out(self, rel: str) -> str:
        return f"{self.out_prefix.rstrip('/')}/{rel}"

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """A store call; its failure as one line naming the work folder (redacted)."""
        from packcli.fs import redact, store_call

        failed = f"work folder {redact(self.url)}: cannot {what}"
        return store_call(fn, failed, "rerun the same command to resume")

    # ------------------------------------------------------------------ listing

    def listing(self, under: str = "") -> dict[str, int]:
        """Files under ``under`` (relative to the work folder) with their sizes."""
        return self._sizes(self.fs, self._remote(under), under, f"list {under or '/'}")

    def out_listing(self, under: str = "") -> dict[str, dict[str, Any]]:
        """Files under ``under`` of the remote output, with the store's info of each (its
        size and version fields)."""
        base = self._out(under) if under else self.out_prefix
        return self._infos(self.out_fs, base, under, "list the output")

    def infos(self, under: str = "") -> dict[str, dict[str, Any]]:
        """Files under ``under`` of the work folder, with the store's info of each."""
        return self._infos(self.fs, self._remote(under), under, f"list {under or '/'}")

    def _sizes(self, fs: Any, base: str, under: str, what: str) -> dict[str, int]:
        found = self._infos(fs, base, under, what)
        return {rel: int(info.get("size") or 0) for rel, info in found.items()}

    def _infos(self, fs: Any, base: str, under: str, what: str) -> dict[str, dict[str, Any]]:
        from packcli.fs import listing

        found = self._call(what, lambda: listing(fs, base))
        lead = f"{under.rstrip('/')}/" if under else ""
        return {lead + rel: info for rel, info in found.items()}

    def children(self, under: str) -> set[str]:
        """Names of the folders and files directly under ``under``."""
        return {rel[len(under) + 1 :].split("/", 1)[0] for rel in self.listing(under)}

    def _listed(self, key: str, list_them: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """One listing per folder object, taken at its first use (from any thread)."""
        with self._lock:
            if key not in self._listings:
                self._listings[key] = list_them()
            return self._listings[key]

    def intact(self, files: dict[str, Any], under: str) -> bool:
        """On the store: there at their recorded sizes, by one listing of ``under`` for all
        the records asked about (not a GET a record), so reuse fetches nothing."""
        stored = self._listed(under, lambda: self.listing(under))
        return all(stored.get(rel) == size for rel, (size, _) in files.items())

    def holds(self, rel: str) -> bool:
        """On the store, a record is put after the file it names: the file is there (its
        reader fetches it, and checks its sha256)."""
        return True

    def shown(self, rel: str) -> str:
        from packcli.fs import redact

        return redact(f"{self.url}/{rel}")

    def record_name(self, out: Path) -> str:
        from packcli.fs import redact

        return redact(self.url)

    # ------------------------------------------------------------------ pull

    def _get(self, rel: str) -> bool:
        """Download ``rel`` into the mirror (under a temp name, then renamed); False when
        the store does not have it."""
        target = self.local / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        # Not packcli.atomic: the temp is named per thread (mirror threads may fetch the same
        # file at once), and there is no fsync: this is a cache of what the store keeps.
        tmp = target.with_name(f".{target.name}.get-{threading.get_ident()}")

        def get() -> bool:
            try:
                self.fs.get_file(self._remote(rel), str(tmp))
            except FileNotFoundError:
                return False
            return True

        if not self._call(f"read {rel}", get):
            tmp.unlink(missing_ok=True)
            return False
        os.replace(tmp, target)
        return True

    def pull(self, *rels: str) -> None:
        """Make each local file what the store has: fetched, or removed when not there."""
        for rel in rels:
            if not self._get(rel):
                (self.local / rel).unlink(missing_ok=True)

    def pull_records(self, under: str = "") -> None:
        """Mirror every record under ``under`` (all but shards and shard manifests): fetch
        what the store has, remove local records it does not have."""
        remote = {rel for rel in self.listing(under) if _is_record(rel)}
        base = self.local / under if under else self.local
        if base.is_dir():
            for path in base.rglob("*"):
                rel = path.relative_to(self.local).as_posix()
                stale = path.is_file() and _is_record(rel) and rel not in remote
                if stale and path.name not in _KEEP and not rel.startswith(f"{TASK_LOCKS}/"):
                    path.unlink()
        with ThreadPoolExecutor(_PUT_THREADS) as pool:
            list(pool.map(self._get, sorted(remote)))

    def read_json(self, rel: str) -> dict[str, Any]:
        """A record straight from the store ({} when missing or unreadable)."""
        from packcli.fs import json_object

        return self._call(f"read {rel}", lambda: json_object(self.fs, self._remote(rel)))

    def fetch(self, rel: str, size: int | None = None) -> Path:
        """The local copy of ``rel`` (a shard), downloaded on first use; safe from threads."""
        path = self.local / rel
        with self._lock:
            lock = self._fetch_locks.setdefault(rel, threading.Lock())
        with lock:
            if not path.is_file() or (size is not None and path.stat().st_size != size):
                self._get(rel)
        return path

    def open(self, rel: str) -> BinaryIO:
        """A remote file for ranged reads (a shard's footer and one column's buffers)."""

        def opener() -> BinaryIO:
            try:
                return cast(BinaryIO, self.fs.open(self._remote(rel), "rb", cache_type="none"))
            except TypeError:  # a filesystem without fsspec's buffered-file options
                return cast(BinaryIO, self.fs.open(self._remote(rel), "rb"))

        return self._call(f"read {rel}", opener)

    # ------------------------------------------------------------------ push

    def _put(self, rel: str) -> None:
        local = str(self.local / rel)
        self._call(f"write {rel}", lambda: self.fs.put_file(local, self._remote(rel)))

    def push(self, *rels: str) -> None:
        """Put local files on the store, each whole, in the order given."""
        for rel in rels:
            self._put(rel)

    def push_folder(self, rel: str, last: str) -> None:
        """Put a finished unit folder: its old record goes first (it never vouches for files
        being replaced), then every file, then the remote files it no longer has, then the
        store's version of each file put (``STORED``), then ``last`` (the record); the
        local folder is removed after."""
        from packcli.fs import content_version

        folder = self.local / rel
        files = sorted(
            p.relative_to(self.local).as_posix() for p in folder.rglob("*") if p.is_file()
        )
        record, stored = f"{rel}/{last}", f"{rel}/{STORED}"
        self.remove(record)
        body = [
            f
            for f in files
            if f not in (record, stored) and not f.rsplit("/", 1)[-1].startswith(".")
        ]
        with ThreadPoolExecutor(_PUT_THREADS) as pool:
            list(pool.map(self._put, body))
        there = self.infos(rel)
        self.remove(*sorted(set(there) - set(body) - {record, stored}))
        versions = {f[len(rel) + 1 :]: content_version(there.get(f, {})) for f in body}
        body_json = json.dumps(StoredVersions(versions).to_json(), indent=1, sort_keys=True).encode(
            "utf-8"
        )
        where = self._remote(stored)
        self._call(f"write {stored}", lambda: self.fs.pipe_file(where, body_json))
        self.push(record)
        shutil.rmtree(folder)

    def remove(self, *rels: str) -> None:
        """Delete files from the store (missing ones are fine)."""
        for rel in rels:
            self._call(f"delete {rel}", functools.partial(_rm, self.fs, self._remote(rel)))

    # ------------------------------------------------------------------ tokenized units

    def unit_keys(self) -> set[str]:
        return self.children(UNITS)

    def done_units(self, units: Iterable[dict[str, Any]]) -> set[str]:
        """Keys of the units the store holds complete: a record with the unit's fingerprint
        and every shard it lists there at its recorded size and as the store had it when put
        (``STORED``; one listing for all units)."""
        from packcli.fs import same_version
        from packcli.tokenize.records import SUCCESS, UnitRecord

        found = self.infos(UNITS)
        done = set()
        for unit in units:
            rel = f"{UNITS}/{unit['key']}"
            if f"{rel}/{SUCCESS}" not in found:
                continue
            record = parse_record(
                UnitRecord, self.read_json(f"{rel}/{SUCCESS}"), f"{rel}/{SUCCESS}"
            )
            if record is None or record.fingerprint != unit["fingerprint"]:
                continue
            # The store's version of each shard as it was put: a shard replaced since (the
            # same size, other tokens) is not the one the record vouches for. A damaged
            # list vouches for none: the unit is tokenized again.
            listed = parse_record(
                StoredVersions, self.read_json(f"{rel}/{STORED}"), f"{rel}/{STORED}"
            )
            stored = {} if listed is None else listed.versions

            def intact(
                name: str, size: int, rel: str = rel, stored: dict[str, dict[str, str]] = stored
            ) -> bool:
                there = found.get(f"{rel}/{name}")
                return (
                    there is not None
                    and int(there.get("size") or 0) == size
                    and name in stored
                    and same_version(stored[name], there)
                )

            if all(intact(m.file, m.bytes) for m in record.shards):
                done.add(unit["key"])
        return done

    def unit_finished(self, key: str) -> None:
        """Put a unit just tokenized here, its record last, and free its local folder."""
        from packcli.tokenize.records import SUCCESS

        self.push_folder(f"{UNITS}/{key}", SUCCESS)

    def drop_unit(self, key: str) -> None:
        self.remove(*sorted(self.listing(f"{UNITS}/{key}")))
        super().drop_unit(key)

    # ------------------------------------------------------------------ the remote output

    def output_written(self, rel: str, record: FileRecord) -> bool:
        """There at its recorded size, and as the store had it when put (one listing of the
        output's ``data/``, taken when first asked)."""
        from packcli.fs import same_version

        there = self._listed("out:data", lambda: self.out_listing("data")).get(rel)
        return (
            there is not None
            and int(there.get("size") or 0) == record.bytes
            and same_version(record.store_version or {}, there)
        )

    def place_output(self, rel: str, size: int, sha256: str) -> dict[str, str] | None:
        """Put the file straight under the remote ``--out``, then drop the local copy; its
        record keeps the store's version of it (for reuse, and finalize's check)."""
        from packcli.fs import stored_version

        local, target = self.out / rel, self._out(rel)
        self._call(f"write {rel} of the output", lambda: self.out_fs.put_file(str(local), target))
        version = self._call(
            f"stat {rel} of the output", lambda: stored_version(self.out_fs, target)
        )
        local.unlink()
        return version

    def remove_output(self, rel: str) -> None:
        """Delete a file of the remote ``--out`` (missing is fine), and its local copy."""
        target = self._out(rel)
        self._call(f"delete {rel} of the output", lambda: _rm(self.out_fs, target))
        super().remove_output(rel)

    def _placed(
        self, files: dict[str, list[dict[str, Any]]], versions: dict[str, Any]
    ) -> dict[str, Any]:
        """Every data file: the write tasks put them, so ``publish`` checks them against
        their records and never puts them from here."""
        from packcli.fs import Placed

        return {
            rel: Placed(int(f["bytes"]), versions.get(rel, {}))
            for name in CONFIG_NAMES
            for f in files[name]
            for rel in [f"data/{name}/{f['file']}"]
        }

    def uploaded(self) -> set[str]:
        """None to add: the upload log is in this process's mirror; the write records name
        every data file."""
        return set()

    def claim(self, marker: WorkMarker, marker_rel: str) -> None:
        """Mark the work folder as packcli's, naming its output (the output prefix is marked
        when its first file goes there: ``fs.begin_changes``)."""
        if self.work_marker(marker_rel) != marker:
            body = json.dumps(marker.to_json(), indent=2, sort_keys=True).encode("utf-8")
            where = self._remote(marker_rel)
            self._call("write its marker", lambda: self.fs.pipe_file(where, body))

    def work_marker(self, marker_rel: str) -> WorkMarker | None:
        """The work folder's marker on the store (None: none, damaged or foreign)."""
        from packcli.fs import work_marker_of

        return work_marker_of(self.read_json(marker_rel), self.shown(marker_rel))

    # ------------------------------------------------------------------ the mirror

    def clear(self) -> None:
        """Empty this process's mirror (all but held lock files): the store is the truth."""
        for root in (self.local, self.out):
            if root.is_dir():
                _clear_tree(root)

    def fresh(self) -> None:
        """An empty mirror, its two folders there (a stage writes into them at once)."""
        self.clear()
        for root in (self.local, self.out):
            root.mkdir(parents=True, exist_ok=True)


def _rm(fs: Any, path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        fs.rm_file(path)


def _clear_tree(folder: Path) -> None:
    """Remove ``folder`` except lock files held inside it (the work folder's ``locks``)."""
    for entry in folder.iterdir():
        if entry.name in _KEEP:
            continue
        if entry.is_dir() and not entry.is_symlink():
            _clear_tree(entry)
        else:
            entry.unlink()
    with contextlib.suppress(OSError):  # a held lock file is still inside
        folder.rmdir()


def work_store(cfg: Any) -> LocalWork:
    """The work folder of ``cfg`` (a RunConfig) and its output: on the store, on this disk
    with the output on the store, or both on this disk. The one place that asks which."""
    if cfg.remote_work:
        return WorkStore(cfg.remote_work, cfg.work_path, cfg.out, cfg.out_path)
    if cfg.remote_out:
        return StagingWork(cfg.work_path, cfg.out_path, cfg.remote_out)
    return LocalWork(cfg.work_path, cfg.out_path)


_depth = threading.local()


def in_mirror(fn: F) -> F:
    """For a stage entry point ``fn(cfg, ...)``: with a URL work folder, the outermost stage
    of this thread starts and ends with an empty mirror, so nothing a stage reads comes from
    an earlier task of the same process (Ray reuses worker processes) but from the store."""

    @functools.wraps(fn)
    def run(cfg: Any, *args: Any, **kwargs: Any) -> Any:
        depth = getattr(_depth, "n", 0)
        store = work_store(cfg)
        if depth == 0:
            store.fresh()
        _depth.n = depth + 1
        try:
            return fn(cfg, *args, **kwargs)
        finally:
            _depth.n = depth
            if depth == 0:
                store.clear()

    return cast(F, run)


def check_remote_work(url: str, marker: WorkMarker, marker_rel: str, overwrite: bool) -> None:
    """Refuse a work folder URL that holds files but not packcli's marker naming this output
    (the rule a local ``--work-dir`` follows): packcli would delete files there."""
    from packcli.errors import ConfigError
    from packcli.fs import redact

    store = WorkStore(url, Path(), marker.out, Path())
    files = store.listing()
    if not files or overwrite or store.work_marker(marker_rel) == marker:
        return
    raise ConfigError(
        f"work folder {redact(url)} is not empty and is not packcli's work folder for "
        f"{marker.out}; choose another --work-dir or pass --overwrite"
    )
