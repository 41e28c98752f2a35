"""The work folder and the output folder: their layout, records and ownership.

What every stage shares: fingerprints (what a result depends on), reading records back,
and the rule that packcli writes only into folders that carry its marks
(``check_output``/``claim_output``); ``uncomplete`` removes the completion marker just
before something it vouches for changes."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from packcli.atomic import atomic_write_json
from packcli.config import ReadConfig, RunConfig
from packcli.errors import ConfigError
from packcli.fs import (
    WorkMarker,
    check_remote_output,
    check_writable,
    foreign_files,
    marker_files,
    redact,
    refuse_foreign,
    work_marker_of,
    writes_at,
)
from packcli.names import CONFIG_NAMES, MARKER, OUT_LOCK, TOKENS_DIR, WORK_DIR, WORK_MARKER
from packcli.publish.marker import peek_marker, read_json_object
from packcli.records import Record, read_record
from packcli.stages.workstore import check_remote_work, work_store
from packcli.stages.write_records import FileClaim

log = logging.getLogger(__name__)


REJECTED = "rejected.jsonl"


def fingerprint(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode("utf-8")).hexdigest()


read_json = read_json_object  # a record, or {} when missing or damaged (packcli/publish/marker.py)


PROBE_PREFIX = ".packcli-probe-"
"""The folder ``check_local_writable`` makes and removes at once (another task's probe may
be there for an instant)."""


def _is_work_folder(work: Path, out: Path | None) -> bool:
    """Whether ``work`` holds packcli's marker (naming ``out``, when given: a work folder
    elsewhere claims only the output it was made for). A work folder of a packcli without
    markers is recognised by its tokenize stage record."""
    marker = read_work_marker(work)
    if marker is not None:
        return out is None or marker.out == str(out.resolve())
    from packcli.tokenize.records import STAGE, StageRecord

    return out is None and StageRecord.recognised(read_json(work / TOKENS_DIR / STAGE))


def _is_output(out: Path) -> bool:
    """Whether ``out`` holds a packcli.json that packcli wrote (not merely a file of that name)."""
    run = peek_marker(out).get("run")
    return isinstance(run, dict) and "packcli_version" in run


def _only_starting(out: Path) -> bool:
    """True when ``out`` holds nothing but what a run starting this instant makes before its
    marker is in place (the lock file, an empty work folder or its marker's temp file), so
    concurrent tokenize tasks on a new folder do not refuse each other."""
    for entry in out.iterdir():
        if entry.name == OUT_LOCK or entry.name.startswith(PROBE_PREFIX):
            continue
        if (
            entry.name == WORK_DIR
            and entry.is_dir()
            and all(f.name.startswith(f".{WORK_MARKER}.tmp-") for f in entry.iterdir())
        ):
            continue
        return False
    return True


def check_output_folder(out: Path, overwrite: bool, work: Path | None = None) -> None:
    """Refuse to write into a non-empty folder that is not a packcli output.

    Ours means packcli's own marks: a packcli.json it wrote, or a work folder marker (inside
    ``out``, or the ``--work-dir`` one naming ``out``). A folder that merely has a ``data/``
    subfolder is not ours: packcli would replace its README.md and delete its Parquet files.
    """
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output {out} exists and is not a folder")
    if not out.exists() or overwrite or _only_starting(out):
        return
    if _is_output(out) or _is_work_folder(out / WORK_DIR, None):
        return
    if work is not None and _is_work_folder(work, out):
        return
    raise ConfigError(
        f"output folder {out} is not empty and is not a packcli output (no packcli.json or "
        "work folder marker of packcli); choose another --out or pass --overwrite"
    )


def check_output(cfg: RunConfig, overwrite: bool = False) -> None:
    """``check_output_folder`` for ``cfg``'s output: the local folder, and for a remote
    ``--out`` also the prefix on the store (foreign files there are refused alike). Then,
    ``--overwrite`` or not, files packcli did not write that sit where it writes (a card,
    a ``rejected.jsonl``, Parquet files under ``data/<config>/``) are refused, named: packcli
    would replace or delete them, or they would be read as part of the dataset."""
    check_output_folder(cfg.out_path, overwrite, cfg.work_path)
    owned = frozenset(owned_outputs(cfg))
    if cfg.remote_out:
        check_remote_output(cfg.remote_out, overwrite, owned)
    else:
        out = cfg.out_path
        present = _output_files(out)
        claimed = _is_output(out) or _is_work_folder(out / WORK_DIR, None)
        claimed = claimed or _is_work_folder(cfg.work_path, out)
        theirs = foreign_files(present, owned, claimed)
        refuse_foreign(f"output folder {out}", theirs, claimed)
    if cfg.remote_work:
        check_remote_work(cfg.remote_work, work_marker(cfg), WORK_MARKER, overwrite)
    # Then where the run will write, before any work: a typo'd bucket or a read-only disk
    # fails now, not after the job (the local folders of a URL output are the staging
    # folder or this process's mirror).
    check_local_writable(cfg.out_path, "output folder")
    if cfg.work_path.resolve() != (cfg.out_path / WORK_DIR).resolve():
        check_local_writable(cfg.work_path, "work folder")
    if cfg.remote_out:
        check_writable(cfg.remote_out, "output")
    if cfg.remote_work:
        check_writable(cfg.remote_work, "work folder")


def check_local_writable(folder: Path, what: str) -> None:
    """Whether ``folder`` can be made and written: a probe folder is made (and removed) in
    it, or in its nearest existing parent when it is not there yet (nothing is left)."""
    import tempfile

    base = folder
    while not base.exists() and base.parent != base:
        base = base.parent
    reason = "" if base.is_dir() else "not a folder"
    if not reason:
        try:
            os.rmdir(tempfile.mkdtemp(prefix=PROBE_PREFIX, dir=base))
        except OSError as exc:
            reason = exc.strerror or str(exc)
    if reason:
        raise ConfigError(
            f"{what} {folder} cannot be created or written ({base}: {reason}); nothing was "
            "read or written: choose another folder or fix its permissions"
        ) from None


OWNED_DIR = "owned"
"""In the work folder: lists of the data files earlier outputs' ``packcli.json`` named, kept
when the output was claimed (the marker goes as soon as a file it vouches for changes, and
packcli may still have to delete those files), one file per list, named by its content."""


@dataclass(frozen=True)
class OwnedFiles(Record):
    """``owned/<hash>.json``: data files an earlier output's ``packcli.json`` listed, sorted
    (relative to the output). No version field: the file is named by its bytes."""

    VERSION: ClassVar[int | None] = None

    files: list[str]

    def name(self) -> str:
        """Its file name in ``OWNED_DIR``: the content's fingerprint, so the same list is
        kept once."""
        return f"{fingerprint(self.to_json())[:16]}.json"


def read_owned(path: Path) -> OwnedFiles | None:
    """A kept list, or None (logged) when it is damaged: the files it named are then not
    known to be packcli's, so they are refused as another's, never deleted."""
    owned = read_record(OwnedFiles, path)
    if owned is None:
        log.warning("%s: damaged list of files packcli wrote, ignored", path)
    return owned


def owned_outputs(cfg: RunConfig) -> set[str]:
    """The output's data files packcli's own records say it wrote, by relative path: the
    write records (a record names its file before the file is written), the lists kept from
    earlier ``packcli.json`` files (``OWNED_DIR``) and the one there now, and for a URL
    output the upload log. Only these are ever deleted or replaced."""
    store = work_store(cfg)
    store.pull_records("write")
    store.pull_records(OWNED_DIR)
    work = cfg.work_path
    owned: set[str] = set()
    for path in (work / "write").glob("*-*.json"):
        name, file = path.name.split("-", 1)[0], FileClaim.named(read_json(path))
        if name in CONFIG_NAMES and file is not None:
            owned.add(f"data/{name}/{file}")
    for path in (work / OWNED_DIR).glob("*.json"):
        kept = read_owned(path)
        owned.update(kept.files if kept is not None else ())
    if _is_output(cfg.out_path):
        owned |= marker_files(peek_marker(cfg.out_path))
    return owned | store.uploaded()


def _keep_owned(cfg: RunConfig) -> None:
    """Keep the data files the output's ``packcli.json`` lists (local, and on the store for
    a URL output) in the work folder before anything can delete that marker."""
    store = work_store(cfg)
    files = marker_files(peek_marker(cfg.out_path)) if _is_output(cfg.out_path) else set()
    files |= store.published_files()
    if not files:
        return
    kept = OwnedFiles(sorted(files))
    rel = f"{OWNED_DIR}/{kept.name()}"
    if read_record(OwnedFiles, cfg.work_path / rel) == kept:  # a damaged copy is rewritten
        return
    (cfg.work_path / OWNED_DIR).mkdir(parents=True, exist_ok=True)
    atomic_write_json(cfg.work_path / rel, kept.to_json())
    store.push(rel)


def _output_files(out: Path) -> list[str]:
    """The files of a local output where packcli writes (``writes_at``), relative."""
    if not out.is_dir():
        return []
    found = [p for p in ("README.md", "rejected.jsonl", MARKER) if (out / p).is_file()]
    found += [f"stats/{p.name}" for p in (out / "stats").glob("*.png")]
    for name in CONFIG_NAMES:
        base = out / "data" / name
        if base.is_dir():
            found += [p.relative_to(out).as_posix() for p in base.rglob("*") if not p.is_dir()]
    return [rel for rel in found if writes_at(rel)]


def claim_output(cfg: RunConfig) -> None:
    """Create the output and work folders and mark the work folder as packcli's, naming its
    output (idempotent: every task of a stage writes the same bytes)."""
    out = require_out(cfg)
    out.mkdir(parents=True, exist_ok=True)
    work = cfg.work_path
    work.mkdir(parents=True, exist_ok=True)
    marker = work_marker(cfg)
    if read_work_marker(work) != marker:
        atomic_write_json(work / WORK_MARKER, marker.to_json())
    work_store(cfg).claim(marker, WORK_MARKER)
    _keep_owned(cfg)


def work_marker(cfg: RunConfig) -> WorkMarker:
    """The work folder's marker: it names the output it was made for (a URL work folder's,
    the output's redacted URL)."""
    out = redact(cfg.out) if cfg.remote_work else str(cfg.out_path.resolve())
    return WorkMarker.naming(out)


def read_work_marker(work: Path) -> WorkMarker | None:
    """The marker of the local work folder ``work``; None when it has none, or one that is
    damaged or foreign (then the folder is not packcli's)."""
    path = work / WORK_MARKER
    return work_marker_of(read_json(path), path)


def uncomplete(cfg: RunConfig) -> None:
    """Remove the completion marker just before this run changes something it vouches for
    (tokenized shards, the shard index, a Parquet file): a run that fails validation, or that
    reuses everything, leaves a finished output finished. (A remote output's own marker
    goes when its first file changes: ``fs.begin_changes``, from the write stage.)"""
    (cfg.out_path / MARKER).unlink(missing_ok=True)


def require_out(cfg: RunConfig) -> Path:
    if not cfg.out:
        raise ConfigError("no output folder given: pass --out OUT")
    return cfg.out_path


def recorded_read(read: ReadConfig) -> dict[str, Any]:
    """The read settings as recorded: input URLs without any secret they carry."""
    return {**dataclasses.asdict(read), "inputs": [redact(str(s)) for s in read.inputs]}
