"""URLs and their filesystems: which fsspec filesystem a URL is on (``locate``), what a
listing says of its files (sizes and versions), how a URL is shown (``redact``), and
packcli's local cache folders for remote outputs and work folders.

* **Identity.** A remote file's identity, for resume, is its URL, size and every version
  field the filesystem's ``info`` gives (``remote_version``): S3 ``ETag``, ``VersionId``
  (versioned buckets) and ``LastModified``; GCS ``generation``, ``etag`` and ``updated``; the
  Hub ``blob_id`` (the git blob / LFS object id); others their ``mtime``/``created``. A file
  rewritten with other bytes therefore never reuses old shards, and a file packcli put is
  trusted only while the store still has the version it gave (``same_version``).
* **Credentials** come only from each filesystem's usual environment and config files
  (``AWS_*`` and ``~/.aws``, ``GOOGLE_APPLICATION_CREDENTIALS`` / gcloud, ``HF_TOKEN``);
  packcli has no option for them. A URL can still carry a secret (``ftp://user:pw@host``,
  a signed ``?X-Amz-Signature=``); ``redact`` blanks those parts in everything packcli
  prints or records.
* **Extras stay optional.** A URL whose filesystem package is missing fails with one line
  naming the extra (``pip install 'packcli[s3]'``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import threading
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from packcli.errors import ConfigError, InputError, PackcliError

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"]+")
_SECRET_QUERY = re.compile(
    r"sig|signature|token|key|secret|password|credential|auth|^x-(amz|goog)-"
)

EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}
"""URL schemes whose filesystem is a packcli extra (``pip install 'packcli[EXTRA]'``)."""

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


T = TypeVar("T")


def store_call(
    fn: Callable[[], T], failed: str, then: str, error: type[PackcliError] = PackcliError
) -> T:
    """``fn()``, a call to object storage; any failure but packcli's own becomes one line,
    ``{failed}: {type}: {its first line, URLs redacted}; {then}``, never a traceback (botocore's
    and aiohttp's run to pages and may carry signed URLs)."""
    try:
        return fn()
    except PackcliError:
        raise
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise error(f"{failed}: {type(exc).__name__}: {redact_text(first)}; {then}") from exc


def _missing_package(url: str, exc: Exception) -> ConfigError:
    scheme = url.partition("://")[0].lower()  # ``locate`` is only asked for URLs
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
        located: tuple[Any, str] = fsspec.core.url_to_fs(url)
        return located
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
        found: dict[str, Any] = fs.info(path)
        return found
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


def json_object(fs: Any, path: str) -> dict[str, Any]:
    """A small JSON record on the store: {} when it is missing, not JSON or not an object;
    other errors go to the caller, which words them."""
    try:
        raw = fs.cat_file(path)
    except FileNotFoundError:
        return {}
    try:
        data = json.loads(raw or b"null")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}
