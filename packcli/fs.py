"""Where data lives: fsspec URLs (``s3://``, ``gs://``, ``hf://``, ...) next to local paths.

One module knows about URLs, so the readers, the pipeline and the tools keep working on
plain paths and call in here only where a URL can reach them:

* **Inputs.** ``list_tree`` lists a URL's files with the filesystem's own ``find``
  (one listing, whose sizes and versions are kept), ``open_binary`` streams one through
  an fsspec file object (seekable, ranged reads: byte spans and the damaged-stream check
  work as on disk) and ``open_arrow`` hands one to pyarrow. A remote file's identity, for
  resume, is its URL, size and every version field the filesystem's ``info`` gives
  (``remote_version``): S3 ``ETag``, ``VersionId`` (versioned buckets) and
  ``LastModified``; GCS ``generation``, ``etag`` and ``updated``; the Hub ``blob_id``
  (the git blob / LFS object id); others their ``mtime``/``created``. A file rewritten
  with other bytes therefore never reuses old shards.
* **Outputs.** Object stores have no rename, so a remote ``--out`` is staged: the run works
  in a local folder (``staging_root``: ``--work-dir``, else a cache folder named after the
  URL) exactly as a local run does. A write task puts each Parquet file as soon as it is
  written (``put_output_file``), and ``upload_output`` then puts the rest, with one
  ``put_file`` each (s3fs/gcsfs use one PUT, or a multipart/resumable upload that becomes
  visible only when complete), ``packcli.json`` last as the completion marker.
  Uploads are logged locally (size, sha256 and the store's version of what was put: an
  ETag, a generation), so a rerun after a kill uploads only what is missing or no longer
  what packcli put (never judged by size alone); only files packcli's records say it
  wrote are ever deleted (``foreign_files`` refuses others where it writes);
  ``download_output`` brings an output back for ``verify`` and ``push``.
* **Credentials** come only from each filesystem's usual environment and config files
  (``AWS_*`` and ``~/.aws``, ``GOOGLE_APPLICATION_CREDENTIALS`` / gcloud, ``HF_TOKEN``);
  packcli has no option for them. A URL can still carry a secret (``ftp://user:pw@host``,
  a signed ``?X-Amz-Signature=``); ``redact`` blanks those parts in everything packcli
  prints or records.
* **Extras stay optional.** A URL whose filesystem package is missing fails with one line
  naming the extra (``pip install 'packcli[s3]'``).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import re
import socket
import tempfile
import threading
import urllib.parse
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

from packcli.errors import ConfigError, InputError, PackcliError
from packcli.names import CONFIG_NAMES, MARKER, STATS_DIR
from packcli.publish.marker import load_marker

log = logging.getLogger(__name__)

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"]+")
_SECRET_QUERY = re.compile(
    r"sig|signature|token|key|secret|password|credential|auth|^x-(amz|goog)-"
)

EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}
"""URL schemes whose filesystem is a packcli extra (``pip install 'packcli[EXTRA]'``)."""

UPLOAD_LOG = "uploads.jsonl"
"""In the work folder: one line per file uploaded to a remote ``--out`` (url, size, sha256)."""
REMOTE_MARKER = ".packcli/packcli-work.json"
"""Under a remote output: put before its first file, so a prefix whose ``packcli.json`` is not
there yet (a killed upload) is still recognised as packcli's."""

# Display URL -> (filesystem, its path): a file is opened with the filesystem instance that
# listed it (an fsspec URL's credentials live in the instance, never in the display URL).
_LOCATED: dict[str, tuple[Any, str]] = {}
# Display URL -> the info dict of the listing that found it (size, version fields).
_INFO: dict[str, dict[str, Any]] = {}
_LOCK = threading.Lock()


# --------------------------------------------------------------------------- URLs


def is_url(spec: object) -> bool:
    """Whether ``spec`` is an fsspec URL to be read through fsspec (``file://`` is not: it
    is a local path, read as one)."""
    if not isinstance(spec, str):
        return False
    m = _URL.match(spec)
    return m is not None and m.group(1).lower() != "file"


def local_path(spec: str) -> str:
    """A ``file://`` URL as the local path it names; anything else unchanged."""
    if spec.lower().startswith("file://"):
        # Not urlparse: a local file URL has no query or fragment, so a '?' or '#' in it is
        # part of a file name (a glob's '?' too), as in the same path given plainly.
        rest = spec[len("file://") :]
        if rest.lower().startswith("localhost/"):
            rest = rest[len("localhost") :]
        if not rest.startswith("/"):
            raise ConfigError(f"{spec}: not a local file URL: write file:///absolute/path")
        return urllib.parse.unquote(rest)
    return spec


def redact(url: str) -> str:
    """``url`` with any password in it and secret-looking query values replaced by ``***``,
    for messages and records (a signed URL's signature, ``ftp://user:pw@host``)."""
    if not is_url(url):
        return url
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:***@{host}" if ":" in userinfo else f"***@{host}"
    query = parts.query
    if query:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
        query = "&".join(f"{k}={'***' if _SECRET_QUERY.search(k.lower()) else v}" for k, v in pairs)
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact_text(text: str) -> str:
    """Every URL inside ``text`` redacted (a command line, an error message)."""
    return _URL_IN_TEXT.sub(lambda m: redact(m.group(0)), text)


def _missing_package(url: str, exc: Exception) -> ConfigError:
    scheme = _URL.match(url).group(1).lower()  # type: ignore[union-attr]
    extra = EXTRAS.get(scheme)
    if extra:
        package = "s3fs" if extra == "s3" else "gcsfs"
        return ConfigError(
            f"{redact(url)}: {scheme}:// URLs need {package}, which is not installed: "
            f"pip install 'packcli[{extra}]'"
        )
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return ConfigError(f"{redact(url)}: no filesystem for {scheme}:// ({first})")


def locate(url: str) -> tuple[Any, str]:
    """The fsspec filesystem and path of ``url``: the instance that listed it when it came
    from ``list_tree``, else a new one from the URL (credentials from the environment)."""
    with _LOCK:
        found = _LOCATED.get(url)
    if found is not None:
        return found
    import fsspec

    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as exc:
        raise _missing_package(url, exc) from None
    except ValueError as exc:  # "Protocol not known", a malformed URL
        raise ConfigError(f"{redact(url)}: not a URL packcli can read ({exc})") from None


def _display(fs: Any, path: str) -> str:
    return str(fs.unstrip_protocol(path))


def _remember(fs: Any, path: str, info: dict[str, Any]) -> str:
    url = _display(fs, path)
    with _LOCK:
        _LOCATED[url] = (fs, path)
        _INFO[url] = info
    return url


def _fail(url: str, what: str, exc: BaseException) -> InputError:
    """A filesystem error as one line: the backend's own words (credentials, permissions),
    the URL redacted."""
    detail = redact_text(str(exc).strip().splitlines()[0]) if str(exc).strip() else ""
    return InputError(f"{redact(url)}: cannot {what}: {type(exc).__name__}: {detail}".rstrip(": "))


# --------------------------------------------------------------------------- inputs


def list_tree(url: str, depth: int | None = None) -> tuple[str, dict[str, str], list[str]]:
    """Every file under ``url`` (a file, or a folder searched recursively; ``depth``: only
    that many levels down), listed by its filesystem (one ``find``, whose sizes and versions
    are kept for ``info``): the display URL of ``url`` itself, each file's display URL by
    its path relative to it (``""``: ``url`` is a file; an empty dict: nothing there), and
    with ``depth`` the folders within it (relative). Which of them are inputs (names, globs,
    hidden files, saved datasets) is ``packcli/read/inputs.py``'s rule, the same for local
    folders."""
    fs, path = locate(url)
    path = path.rstrip("/") or path
    try:
        try:
            top = fs.info(path)
        except FileNotFoundError:
            return _display(fs, path), {}, []
        if top.get("type") != "directory":
            return _display(fs, path), {"": _remember(fs, path, top)}, []
        found = fs.find(path, maxdepth=depth, withdirs=depth is not None, detail=True)
    except (InputError, ConfigError):
        raise
    except Exception as exc:  # botocore, aiohttp, HfHub...: one line, never a traceback
        raise _fail(url, "list", exc) from exc
    root = path.rstrip("/") + "/"
    files: dict[str, str] = {}
    folders: list[str] = []
    for p, i in sorted(found.items()):
        if p.startswith(root) and i.get("type", "file") == "file":
            files[p[len(root) :]] = _remember(fs, p, i)
        elif p.startswith(root) and i.get("type") == "directory":
            folders.append(p[len(root) :].rstrip("/"))
    return _display(fs, path), files, folders


def read_text(url: str) -> str:
    """A small file's text (a ``state.json``), as UTF-8; errors are ``OSError``s."""
    with open_binary(url) as fh:
        data = fh.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise OSError(f"{redact(url)}: not UTF-8 ({exc})") from exc


def normalize(url: str) -> str:
    """``url`` in the form ``list_tree`` gives its files (for comparing prefixes)."""
    fs, path = locate(url)
    return _display(fs, path.rstrip("/"))


def info(url: str, *, fresh: bool = False) -> dict[str, Any]:
    """The filesystem's ``info`` of a file: from its listing, or asked now (``fresh``)."""
    with _LOCK:
        cached = None if fresh else _INFO.get(url)
    if cached is not None:
        return cached
    fs, path = locate(url)
    try:
        if fresh:
            fs.invalidate_cache(path)
        return fs.info(path)
    except FileNotFoundError:
        raise InputError(f"{redact(url)}: not found") from None
    except Exception as exc:
        raise _fail(url, "stat", exc) from exc


_VERSION_FIELDS = (
    ("ETag", "etag"),
    ("etag", "etag"),
    ("VersionId", "version_id"),
    ("generation", "generation"),
    ("blob_id", "blob_id"),
    ("LastModified", "mtime"),
    ("updated", "mtime"),
    ("mtime", "mtime"),
    ("last_modified", "mtime"),
    ("created", "mtime"),
)


def remote_version(file_info: dict[str, Any]) -> dict[str, str]:
    """What says which bytes a remote file holds, from its ``info``: the fields of
    ``_VERSION_FIELDS`` present (first of each name wins), as strings."""
    version: dict[str, str] = {}
    for key, name in _VERSION_FIELDS:
        value = file_info.get(key)
        if value is not None and value != "" and name not in version:
            if hasattr(value, "timestamp"):  # a datetime in one listing, a float in another
                value = value.timestamp()
            version[name] = str(value)
    return version


_CONTENT_FIELDS = ("etag", "version_id", "generation", "blob_id")


def content_version(file_info: dict[str, Any]) -> dict[str, str]:
    """What identifies the bytes of a file on a store, for reuse: ``remote_version``'s
    content fields (an S3 ETag changes whenever other bytes are put, multipart or not, even
    at the same size; a version id or GCS generation with every put), or its time when the
    store gives none. A time alone is the fallback only: a listing and a HEAD give it at
    different precisions. Empty: the store says nothing, and nothing can be trusted."""
    version = remote_version(file_info)
    content = {k: v for k, v in version.items() if k in _CONTENT_FIELDS}
    return content or version


def input_entry(path: Path | str, *, fresh: bool = False) -> dict[str, Any]:
    """An input file's identity for resume: local ``size`` + ``mtime_ns``; a URL's ``size`` +
    ``version`` (``remote_version``). Without ``path``, which the caller records its way."""
    if is_url(path):
        found = info(str(path), fresh=fresh)
        return {"size": int(found["size"]), "version": remote_version(found)}
    st = os.stat(path)
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def input_size(path: Path | str) -> int:
    return int(input_entry(path)["size"])


def as_input(path: str) -> Path | str:
    """A recorded input path as the readers take it: a URL stays a string."""
    return path if is_url(path) else Path(path)


# Bytes a remote file is read ahead by. fsspec stores default to 5-50 MiB (s3fs: 50), which
# a byte span, a probe of a file's first bytes or a small file pays whole: 1 MiB spans of a
# 27 MB file fetched 14x the file (scripts/bench_scale.py io). 4 MiB keeps the overshoot of
# a span small and a 1 GiB span at ~256 GETs.
REMOTE_BLOCK = 4 << 20


def open_binary(
    path: Path | str, buffering: int = -1, *, block_size: int = REMOTE_BLOCK
) -> BinaryIO:
    """Open an input for binary reading: a local file, or an fsspec file object (seekable;
    ``buffering`` > 0 puts a ``BufferedReader`` on top, so lines are split in C as for a
    local file; ``block_size``: bytes a remote read fetches ahead, for a byte span its
    length). Errors are ``OSError``s, as ``open``'s."""
    if not is_url(path):
        return open(path, "rb", buffering=buffering)
    fs, p = locate(str(path))
    try:
        fh = fs.open(p, "rb", block_size=max(1 << 16, min(block_size, REMOTE_BLOCK)))
    except OSError:
        raise
    except Exception as exc:  # a backend error that is not an OSError (credentials)
        raise OSError(f"{type(exc).__name__}: {redact_text(str(exc))}") from exc
    return io.BufferedReader(fh, buffering) if buffering > 0 else fh


def spool(path: str) -> Path:
    """A remote file copied once into a local temp file (the caller deletes it): a
    compressed input is decoded twice, once to verify its checksums and once to read it,
    which through the store would fetch every byte twice."""
    fs, p = locate(path)
    root = cache_root() / "spool"
    root.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=root, suffix="".join(Path(p).suffixes[-2:]))
    os.close(fd)
    try:
        fs.get_file(p, name)
    except BaseException as exc:
        Path(name).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise
        if isinstance(exc, Exception):  # a backend error that is not an OSError
            raise OSError(f"{type(exc).__name__}: {redact_text(str(exc))}") from exc
        raise
    return Path(name)


def opened_size(fh: Any) -> int:
    """The size of a file ``open_binary`` returned."""
    inner = getattr(fh, "raw", fh)
    size = getattr(inner, "size", None)
    return int(size) if isinstance(size, int) else os.fstat(fh.fileno()).st_size


class ReadFailed(OSError):
    """Reading a URL's bytes failed (the network, the store): nothing is known about the
    data. Its own type, because pyarrow passes a Python file's exception through as it is,
    and reports damaged data as a plain ``OSError``: a store's plain ``OSError`` (s3fs
    raises one for errors it does not map) would otherwise read as damage, skippable."""


class _Reads:
    """An fsspec file whose failed reads raise ``ReadFailed``; everything else as it is."""

    def __init__(self, fh: Any) -> None:
        self._fh = fh

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fh, name)

    def read(self, *args: Any) -> bytes:
        try:
            return self._fh.read(*args)
        except Exception as exc:  # re-raised: any backend error is a read error
            raise ReadFailed(f"{type(exc).__name__}: {redact_text(str(exc))}") from exc


def open_arrow(path: str) -> Any:
    """A URL as a pyarrow random-access file (Parquet footers, Arrow IPC batches); a read
    that fails raises ``ReadFailed``, never a skippable "damaged file"."""
    import pyarrow as pa

    return pa.PythonFile(_Reads(open_binary(path)), mode="r")


# --------------------------------------------------------------------------- outputs


def cache_root() -> Path:
    """packcli's local cache: ``PACKCLI_CACHE_DIR``, else ``$XDG_CACHE_HOME/packcli``, else
    ``~/.cache/packcli``."""
    if env := os.environ.get("PACKCLI_CACHE_DIR"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "packcli"


def staging_root(url: str, work_dir: str = "") -> Path:
    """The local folder a remote output is made in before it is uploaded (its work folder
    is ``.packcli`` inside it): ``work_dir`` when given, else a cache folder named after the
    URL (the same URL, the same folder: a rerun resumes there)."""
    if work_dir and not is_url(work_dir):
        return Path(local_path(work_dir))
    return url_folder("outputs", url)


def mirror_root(url: str) -> Path:
    """This process's local mirror of the work folder ``url`` (``stages/workstore.py``):
    under packcli's cache, named after the URL, then after the host and process (tasks of one
    node never share one)."""
    return url_folder("mirrors", url) / f"{socket.gethostname()}-{os.getpid()}"


def url_folder(kind: str, url: str) -> Path:
    """A cache folder for ``url``: readable (the redacted URL's tail) and unique (a digest of
    the whole URL), so the same URL always finds the same folder."""
    clean = redact(url)
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", clean.split("://", 1)[-1]).strip("-")[-60:]
    digest = hashlib.sha256(url.rstrip("/").encode("utf-8")).hexdigest()[:12]
    return cache_root() / kind / f"{slug}-{digest}"


def _join(prefix: str, rel: str) -> str:
    return f"{prefix.rstrip('/')}/{rel}"


def listing(fs: Any, prefix: str) -> dict[str, dict[str, Any]]:
    """Files under ``prefix``, by path relative to it (nothing there: empty)."""
    fs.invalidate_cache(prefix)
    try:
        found = fs.find(prefix, detail=True)
    except FileNotFoundError:
        return {}
    root = prefix.rstrip("/") + "/"
    return {p[len(root) :]: i for p, i in found.items() if p.startswith(root)}


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
        claimed = bool(meta.get("run")) or bool(work_mark.get("packcli_work"))
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


def refuse_foreign(where: str, foreign: list[str], claimed: bool = False) -> None:
    """One line naming the foreign files (the first few) and what to do; nothing when none.
    ``claimed``: the output is packcli's, so the files may be a killed run's whose work
    folder was deleted since (no record of packcli's names them any more)."""
    if not foreign:
        return
    shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
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
    probe = _join(prefix, f".packcli/probe-{uuid.uuid4().hex}")
    try:
        fs.pipe_file(probe, b"")
        fs.rm_file(probe)
    except Exception as exc:
        detail = redact_text(str(exc).strip().splitlines()[0]) if str(exc).strip() else ""
        raise ConfigError(
            f"{what} {redact(url)} is not writable: {type(exc).__name__}: {detail}".rstrip(": ")
            + "; nothing was read or written (check the bucket name and the credentials)"
        ) from None


class Uploaded(NamedTuple):
    """One upload log entry: what was put (size, sha256) and the store's version of it."""

    size: int
    sha256: str
    version: dict[str, str]


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
    for line in lines:
        try:
            rec = json.loads(line)
            if rec["url"] == redact(url):
                version = rec.get("version") or {}
                done[rec["file"]] = Uploaded(int(rec["size"]), str(rec["sha256"]), dict(version))
        except (ValueError, KeyError, TypeError):
            continue
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


def stored_version(fs: Any, path: str) -> dict[str, str]:
    """The store's version of a file just put (one HEAD): what reuse compares later."""
    return content_version(_remote_info(fs, path) or {})


def same_version(recorded: dict[str, str], there: dict[str, Any] | None) -> bool:
    """Whether the store still holds the bytes it held when ``recorded`` was taken: the
    fields both name agree (a listing may lack the version id a HEAD gives), and there is
    at least one. Nothing recorded (an older packcli's record): not the same, put again."""
    if not recorded or there is None:
        return False
    now = content_version(there)
    common = recorded.keys() & now.keys()
    return bool(common) and all(recorded[k] == now[k] for k in common)


def _remote_info(fs: Any, path: str) -> dict[str, Any] | None:
    """The store's info of one file (its size), or None when it is not there."""
    fs.invalidate_cache(path)
    try:
        return dict(fs.info(path))
    except FileNotFoundError:
        return None


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
        fs.pipe_file(
            _join(prefix, REMOTE_MARKER),
            json.dumps({"packcli_work": 1, "out": shown}).encode("utf-8"),
        )


def _log_upload(
    work: Path, shown: str, rel: str, size: int, sha256: str, version: dict[str, str]
) -> None:
    """One line of the upload log: this file, this size and content, is under ``shown``,
    and the store gave it ``version``."""
    line = json.dumps(
        {"url": shown, "file": rel, "size": size, "sha256": sha256, "version": version}
    )
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
    return same_version(logged.version, there) and logged.sha256 == digest(rel)


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


def reword(text: str, local: Path, url: str) -> str:
    """A message about a downloaded copy, naming the remote output instead."""
    return text.replace(str(local), redact(url).rstrip("/"))
