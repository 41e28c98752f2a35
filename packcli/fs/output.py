"""Outputs on object storage, and which files of an output are packcli's.

* **Ownership.** packcli writes only where it writes (``writes_at``: the card,
  ``rejected.jsonl``, ``packcli.json``, ``stats/*.png``, ``data/long/`` and ``data/short/``),
  and there replaces or deletes only files its records say it wrote (``foreign_files``
  refuses others, local or remote: ``check_remote_output``).
* **Upload.** Object stores have no rename, so a remote ``--out`` is staged: the run works in
  a local folder (``urls.staging_root``: ``--work-dir``, else a cache folder named after the
  URL) exactly as a local run does. A write task puts each Parquet file as soon as it is
  written (``put_output_file``; with a URL work folder the task puts it itself,
  ``stages/workstore.py``), and ``upload_output`` then puts the rest, with one ``put_file``
  each (s3fs/gcsfs use one PUT, or a multipart/resumable upload that becomes visible only
  when complete), ``packcli.json`` last as the completion marker. Uploads are logged locally
  (size, sha256 and the store's version of what was put: an ETag, a generation), so a rerun
  after a kill uploads only what is missing or no longer what packcli put (never judged by
  size alone).
* **Download.** ``download_output`` brings an output back for ``verify`` and ``push``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

from packcli.errors import ConfigError, PackcliError
from packcli.fs.urls import (
    _fail,
    _join,
    _remote_info,
    listing,
    locate,
    redact,
    redact_text,
    same_version,
    stored_version,
)
from packcli.names import CONFIG_NAMES, MARKER, STATS_DIR, WORK_DIR, WORK_MARKER
from packcli.publish.marker import load_marker
from packcli.records import Record, parse_record

log = logging.getLogger(__name__)


_LOCK = threading.Lock()  # the upload log, and the count of files put

UPLOAD_LOG = "uploads.jsonl"
"""In the work folder: one line per file uploaded to a remote ``--out`` (url, size, sha256)."""
REMOTE_MARKER = f"{WORK_DIR}/{WORK_MARKER}"
"""Under a remote output: put before its first file, so a prefix whose ``packcli.json`` is not
there yet (a killed upload) is still recognised as packcli's."""


@dataclass(frozen=True)
class WorkMarker(Record):
    """``packcli-work.json``: marks a work folder as packcli's and names the output it was made
    for (a local path resolved, or a URL redacted); under a remote output (``REMOTE_MARKER``)
    it marks a started upload. ``packcli_work`` (1) is its version, so it has no version
    field: its bytes stay those every packcli wrote."""

    VERSION: ClassVar[int | None] = None

    packcli_work: int
    out: str

    @classmethod
    def naming(cls, out: str) -> WorkMarker:
        """The marker of a work folder made for the output ``out``."""
        return cls(packcli_work=1, out=out)

    def compact(self) -> bytes:
        """The marker as put under a remote output: one line, fields in order."""
        return json.dumps(self.to_json()).encode("utf-8")


def work_marker_of(data: object, path: Path | str) -> WorkMarker | None:
    """The work marker ``data`` (parsed JSON of ``path``) holds, or None when it is damaged,
    foreign or of another version: such a folder is not packcli's."""
    marker = parse_record(WorkMarker, data, path)
    return marker if marker is not None and marker.packcli_work == 1 else None


def check_remote_output(url: str, overwrite: bool, owned: frozenset[str] = frozenset()) -> None:
    """Refuse a remote prefix that holds files and no packcli marks (its ``packcli.json``, or
    the marker a started upload leaves), as a local ``--out`` is refused; and, ``--overwrite``
    or not, one holding files packcli did not write where it writes (``foreign_files``;
    ``owned``: what packcli's records say it put there, beside the prefix's packcli.json)."""
    fs, prefix = locate(url)
    try:
        if fs.isfile(prefix):
            raise ConfigError(f"output {redact(url)} exists and is not a folder")
        files = listing(fs, prefix)
        if not files:
            return
        meta = _remote_json(fs, prefix, MARKER) if MARKER in files else {}
        work_mark = _remote_json(fs, prefix, REMOTE_MARKER) if REMOTE_MARKER in files else {}
        started = work_marker_of(work_mark, REMOTE_MARKER) is not None
        claimed = bool(meta.get("run")) or started
    except PackcliError:
        raise
    except Exception as exc:
        raise _fail(url, "list", exc) from exc
    if not claimed and not overwrite:
        raise ConfigError(
            f"output {redact(url)} is not empty and is not a packcli output (no packcli.json "
            "or work folder marker of packcli); choose another --out or pass --overwrite"
        )
    theirs = foreign_files(files, owned | (marker_files(meta) if claimed else set()), claimed)
    refuse_foreign(f"output {redact(url)}", theirs, claimed)


def _remote_json(fs: Any, prefix: str, rel: str) -> dict[str, Any]:
    """A small JSON record on the store ({} when missing or not an object)."""
    try:
        data = json.loads(fs.cat_file(_join(prefix, rel)))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def remote_marker_files(url: str) -> set[str]:
    """The data files the ``packcli.json`` under ``url`` lists, when packcli wrote it."""
    fs, prefix = locate(url)
    try:
        meta = _remote_json(fs, prefix, MARKER)
    except Exception as exc:
        raise _fail(url, "read", exc) from exc
    return marker_files(meta) if meta.get("run") else set()


def marker_files(meta: dict[str, Any]) -> set[str]:
    """The data files a ``packcli.json`` lists (relative paths); none when it lists none."""
    found: set[str] = set()
    files = meta.get("files")
    for name in CONFIG_NAMES:
        entries = files.get(name) if isinstance(files, dict) else None
        for entry in entries if isinstance(entries, list) else []:
            if isinstance(entry, dict) and isinstance(entry.get("file"), str):
                found.add(f"data/{name}/{entry['file']}")
    return found


_TOP_FILES = frozenset({"README.md", "rejected.jsonl", MARKER})
_PACKCLI_TEMP = re.compile(r"(^|/)\.[^/]+\.tmp-\d+$")  # packcli.atomic's temp names


def writes_at(rel: str) -> bool:
    """Whether packcli writes, replaces or deletes files at ``rel`` of an output: the card,
    ``rejected.jsonl``, ``packcli.json``, ``stats/*.png``, and anything under ``data/long/``
    or ``data/short/`` (Parquet files there are read as the dataset's)."""
    if rel in _TOP_FILES:
        return True
    if rel.startswith(f"{STATS_DIR}/") and rel.endswith(".png") and rel.count("/") == 1:
        return True
    return any(rel.startswith(f"data/{name}/") for name in CONFIG_NAMES)


def foreign_files(
    present: Iterable[str], owned: set[str] | frozenset[str], claimed: bool
) -> list[str]:
    """The files of an output, by relative path, that packcli did not write and that sit
    where it writes (``writes_at``). ``owned``: the data files packcli's records say it
    wrote (a packcli.json's list, write records, the upload log). ``claimed``: the output
    carries packcli's marks, so its card, ``rejected.jsonl``, ``packcli.json`` and plots
    are packcli's (a foreign one was refused when the output was first claimed); files
    under ``data/`` must be in ``owned`` in any case. packcli's own temp files are its."""
    return sorted(
        rel
        for rel in present
        if writes_at(rel)
        and rel not in owned
        and not _PACKCLI_TEMP.search(rel)
        and (rel.startswith("data/") or not claimed)
    )


def first_few(names: list[str], n: int = 5) -> str:
    """The first ``n`` of ``names`` for a message, and how many more there are."""
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


def refuse_foreign(where: str, foreign: list[str], claimed: bool = False) -> None:
    """One line naming the foreign files (the first few) and what to do; nothing when none.
    ``claimed``: the output is packcli's, so the files may be a killed run's whose work
    folder was deleted since (no record of packcli's names them any more)."""
    if not foreign:
        return
    shown = first_few(foreign)
    lost = " (a killed run's files, once its work folder is deleted, are not known either)"
    raise ConfigError(
        f"{where} holds {len(foreign)} file(s) packcli did not write, where it writes its "
        f"output: {shown}; packcli never replaces or deletes other files (--overwrite "
        "included), and Parquet files under data/long/ or data/short/ would be read as part "
        f"of the dataset: move them out, or choose another --out{lost if claimed else ''}"
    )


def check_writable(url: str, what: str) -> None:
    """Put a small probe under ``url`` and delete it, before any work: a bucket that does not
    exist, or credentials that may not write there, fail now in one line naming the URL,
    not after the whole job has run. (The probe goes under ``.packcli/``, packcli's own.)"""
    import uuid

    fs, prefix = locate(url)
    probe = _join(prefix, f"{WORK_DIR}/probe-{uuid.uuid4().hex}")
    try:
        fs.pipe_file(probe, b"")
        fs.rm_file(probe)
    except Exception as exc:
        detail = redact_text(str(exc).strip().splitlines()[0]) if str(exc).strip() else ""
        raise ConfigError(
            f"{what} {redact(url)} is not writable: {type(exc).__name__}: {detail}".rstrip(": ")
            + "; nothing was read or written (check the bucket name and the credentials)"
        ) from None


@dataclass(frozen=True)
class Uploaded(Record):
    """One line of the upload log: ``file`` was put under ``url`` (redacted) with this size
    and sha256, and the store gave it ``version`` (an ETag, a generation). No record version
    of its own: ``version`` is the store's, and a line of an older packcli, without it, names
    a file that is put again (nothing says the store still holds those bytes) but is still
    packcli's."""

    VERSION: ClassVar[int | None] = None

    url: str
    file: str
    size: int
    sha256: str
    version: dict[str, str] | None = None


def uploaded_files(work: Path, url: str) -> set[str]:
    """The files the upload log (in ``work``) says packcli put under ``url``."""
    return set(_uploaded(work, url))


def _uploaded(work: Path, url: str) -> dict[str, Uploaded]:
    """What the upload log says was put under ``url``: file -> its last upload; a torn last
    line (a kill mid-append) is ignored. A line of an older packcli has no version: the file
    is put again (nothing says the store still holds those bytes)."""
    done: dict[str, Uploaded] = {}
    try:
        lines = (work / UPLOAD_LOG).read_bytes().splitlines()
    except OSError:
        return done
    shown = redact(url)
    for line in lines:
        try:
            data = json.loads(line)
        except ValueError:
            continue
        rec = parse_record(Uploaded, data, work / UPLOAD_LOG)
        if rec is not None and rec.url == shown:
            done[rec.file] = rec
    return done


def output_files(out: Path) -> dict[str, tuple[int, str | None]]:
    """The files of a finished local output that make the dataset, by relative path, with
    their size and (Parquet) sha256 from ``packcli.json``: the card, the Parquet files it
    lists, ``rejected.jsonl`` and ``stats/*.png`` not older than ``packcli.json``."""
    meta = load_marker(out)
    files: dict[str, tuple[int, str | None]] = {}
    for name in CONFIG_NAMES:
        for f in meta["files"][name]:
            files[f"data/{name}/{f['file']}"] = (int(f["bytes"]), f.get("sha256"))
    made = (out / MARKER).stat().st_mtime_ns
    extra = ["README.md", "rejected.jsonl"]
    extra += [f"{STATS_DIR}/{p.name}" for p in sorted((out / STATS_DIR).glob("*.png"))]
    for rel in extra:
        p = out / rel
        if p.is_file() and (not rel.startswith(STATS_DIR) or p.stat().st_mtime_ns >= made):
            files[rel] = (p.stat().st_size, None)
    return files


class Placed(NamedTuple):
    """A file a write task put on the store itself: its size and the store's version of it
    (``content_version``), as the task's write record has them."""

    size: int
    version: dict[str, str]


def upload_output(
    out: Path,
    work: Path,
    url: str,
    *,
    threads: int = 8,
    placed: dict[str, Placed] | None = None,
    owned: frozenset[str] = frozenset(),
) -> dict[str, int]:
    """Put the finished local output ``out`` under ``url``: each file whole, ``packcli.json``
    last. A file the upload log (in ``work``) records with the local size and sha256, and
    that the store still holds as packcli put it (the version the store gave then: an S3
    ETag, a generation; never only the size, which another file can share), is not put
    again. Files packcli put there earlier (the upload log, ``owned``: what the write tasks'
    records name; its card, rejected.jsonl and plots) that this output lacks are deleted
    before ``packcli.json``; nothing else is. The remote ``packcli.json`` is deleted first
    whenever anything else changes, so it never vouches for files that are not (yet) those
    it lists. ``placed``: files the write
    tasks already put there (a URL work folder): checked, never put from here."""
    from packcli.faults import crash_point
    from packcli.tokenize.shards import sha256_file

    fs, prefix = locate(url)
    files = output_files(out)
    files[MARKER] = ((out / MARKER).stat().st_size, None)
    shown = redact(url)

    def digest(rel: str) -> str:
        known = files[rel][1]
        return known if known else sha256_file(out / rel)

    placed = placed or {}
    try:
        remote = listing(fs, prefix)
        _check_placed(remote, placed, shown)
        logged = _uploaded(work, url)
        todo = [
            rel
            for rel, (size, _) in files.items()
            if rel not in placed
            and not _still_there(logged.get(rel), remote.get(rel), size, rel, digest)
        ]
        # Data files are packcli's by its records only; its own top files (rejected.jsonl,
        # plots) by where they are: the prefix is claimed now, and a foreign one was refused
        # when it was first claimed (``check_remote_output``).
        ours = owned | set(logged)
        ours |= {rel for rel in remote if writes_at(rel) and not rel.startswith("data/")}
        stale = sorted(rel for rel in remote if rel in ours and rel not in files)
        if todo or stale:
            _begin_changes(fs, prefix, shown, remote)
        body = [rel for rel in todo if rel != MARKER]
        count = [0]

        def put(rel: str) -> None:
            size = files[rel][0]
            target = _join(prefix, rel)
            fs.put_file(str(out / rel), target)
            _log_upload(work, shown, rel, size, digest(rel), stored_version(fs, target))
            with _LOCK:
                count[0] += 1
                n = count[0]
            crash_point(f"upload:{n}")

        with ThreadPoolExecutor(max(1, min(threads, len(body) or 1))) as pool:
            list(pool.map(put, body))
        for rel in stale:
            with contextlib.suppress(FileNotFoundError):
                fs.rm_file(_join(prefix, rel))
        if todo or stale:
            put(MARKER)  # last: the output is complete once it is there
    except PackcliError:
        raise
    except Exception as exc:
        raise _upload_failed(shown, exc) from exc
    uploaded = len(body) + 1 if todo or stale else 0
    skipped = len(files) - uploaded
    if skipped:
        log.info("%d file(s) already uploaded to %s", skipped, shown)
    return {"uploaded": uploaded, "skipped": skipped, "deleted": len(stale)}


def put_output_file(out: Path, work: Path, url: str, rel: str, size: int, sha256: str) -> None:
    """Put one finished output file under ``url`` now, while the other files are still
    being written (uploads overlap writing). It is logged as ``upload_output`` logs, so
    ``finalize`` finds it there and does not put it again. The write task has called
    ``begin_changes`` first. A file the log already has with this content and that the
    store still holds as it was put is not put again (a task killed after the upload and
    before its record writes the same bytes on the rerun)."""
    fs, prefix = locate(url)
    shown = redact(url)
    target = _join(prefix, rel)
    try:
        there = _remote_info(fs, target)
        if _still_there(_uploaded(work, url).get(rel), there, size, rel, lambda _: sha256):
            return
        fs.put_file(str(out / rel), target)
        _log_upload(work, shown, rel, size, sha256, stored_version(fs, target))
    except PackcliError:
        raise
    except Exception as exc:
        raise _upload_failed(shown, exc) from exc


def _upload_failed(shown: str, exc: Exception) -> PackcliError:
    """A store's error during an upload as one line; nothing vouches for the output yet."""
    return PackcliError(
        f"upload to {shown} failed: {type(exc).__name__}: {redact_text(str(exc))}; the "
        "output there is not marked complete: rerun the same command to resume"
    )


def begin_changes(url: str) -> None:
    """Before the first file of the output at ``url`` changes (a write task about to put
    Parquet files there): see ``_begin_changes``."""
    fs, prefix = locate(url)
    shown = redact(url)
    try:
        _begin_changes(fs, prefix, shown)
    except Exception as exc:
        raise _upload_failed(shown, exc) from exc


def _begin_changes(
    fs: Any, prefix: str, shown: str, remote: dict[str, dict[str, Any]] | None = None
) -> None:
    """Before a file of the output changes on the store: its ``packcli.json`` goes (it never
    vouches for a mix of old and new files) and the marker of a started upload is put (the
    prefix stays recognisably packcli's). ``remote``: a fresh listing, when there is one."""
    if remote is None:
        fs.invalidate_cache(prefix)
        there = {rel for rel in (MARKER, REMOTE_MARKER) if fs.exists(_join(prefix, rel))}
    else:
        there = {rel for rel in (MARKER, REMOTE_MARKER) if rel in remote}
    if MARKER in there:
        with contextlib.suppress(FileNotFoundError):  # another task's upload removed it
            fs.rm_file(_join(prefix, MARKER))
    if REMOTE_MARKER not in there:
        fs.pipe_file(_join(prefix, REMOTE_MARKER), WorkMarker.naming(shown).compact())


def _log_upload(
    work: Path, shown: str, rel: str, size: int, sha256: str, version: dict[str, str]
) -> None:
    """One line of the upload log: this file, this size and content, is under ``shown``,
    and the store gave it ``version``."""
    line = json.dumps(Uploaded(shown, rel, size, sha256, version).to_json())
    with _LOCK, open(work / UPLOAD_LOG, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")
    log.info("uploaded %s (%d bytes)", _join(shown, rel), size)


def _check_placed(remote: dict[str, dict[str, Any]], placed: dict[str, Placed], shown: str) -> None:
    """Every file a write task put on the store is there as its record says: its size and
    the version the store gave it (another file of the same size is not it)."""
    for rel, want in sorted(placed.items()):
        there = remote.get(rel)
        if (
            there is None
            or int(there.get("size", -1)) != want.size
            or not same_version(want.version, there)
        ):
            raise PackcliError(
                f"{_join(shown, rel)}: missing or not the file its write record says "
                f"({want.size} bytes, store version {want.version}); rerun the same command "
                "to write it again"
            )


def _still_there(
    logged: Uploaded | None,
    there: dict[str, Any] | None,
    size: int,
    rel: str,
    digest: Callable[[str], str],
) -> bool:
    """Whether an earlier upload of this very file (the log's size and sha256) is still on
    the store as it was put (its version there unchanged), so it need not be put again."""
    if not (logged and there and int(there.get("size", -1)) == size == logged.size):
        return False
    return same_version(logged.version or {}, there) and logged.sha256 == digest(rel)


def download_output(
    url: str,
    dest: Path,
    *,
    card: bool = True,
    plots: bool = False,
    data: Callable[[str], bool] | None = None,
) -> list[str]:
    """Copy a remote output's ``packcli.json``, the files it lists and its ``rejected.jsonl``
    (with ``card`` its README.md, with ``plots`` its ``stats/*.png``) into ``dest``; returns
    them relative.
    ``data``: which listed files (``data/<config>/<file>``) to copy, all when None (``inspect``
    needs one). ``packcli.json`` comes first, so the plots are newer, as ``push`` wants them:
    plots on the store are always the current output's (``upload_output`` puts only fresh
    ones and deletes the others)."""
    fs, prefix = locate(url)
    try:
        remote = listing(fs, prefix)
        if MARKER not in remote:
            raise PackcliError(
                f"{redact(url)}: no {MARKER}, so the output is missing or incomplete"
            )
        wanted = [MARKER]
        _fetch(fs, prefix, dest, MARKER)
        try:
            meta = load_marker(dest)
            listed = [f"data/{n}/{f['file']}" for n in CONFIG_NAMES for f in meta["files"][n]]
            listed = [rel for rel in listed if data is None or data(rel)]
        except (ValueError, KeyError, TypeError):
            return wanted  # verify names what is wrong with it
        if card:
            listed.append("README.md")
        listed.append("rejected.jsonl")  # the quarantine the report counts (verify checks it)
        if plots:
            listed += sorted(
                r for r in remote if r.startswith(f"{STATS_DIR}/") and r.endswith(".png")
            )
        for rel in listed:
            if rel in remote:  # a missing file is for verify / push to name
                _fetch(fs, prefix, dest, rel)
                wanted.append(rel)
    except PackcliError:
        raise
    except Exception as exc:
        raise _fail(url, "download", exc) from exc
    return wanted


def _fetch(fs: Any, prefix: str, dest: Path, rel: str) -> None:
    target = dest / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    fs.get_file(_join(prefix, rel), str(target))


def fetch_output_file(url: str, rel: str, dest: Path) -> Path:
    """One file of the output at ``url`` (``data/<config>/<file>``), fetched to ``dest /
    rel``: a verify task reads the files of its part one at a time this way."""
    fs, prefix = locate(url)
    shown = f"{redact(url).rstrip('/')}/{rel}"
    try:
        _fetch(fs, prefix, dest, rel)
    except FileNotFoundError:
        raise PackcliError(f"{shown}: listed in packcli.json but not there") from None
    except OSError as exc:
        raise PackcliError(f"{shown}: cannot be read ({exc})") from None
    return dest / rel


def reword(text: str, local: Path, url: str) -> str:
    """A message about a downloaded copy, naming the remote output instead."""
    return text.replace(str(local), redact(url).rstrip("/"))
