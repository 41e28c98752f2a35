"""Reading inputs that may be URLs: ``open_binary`` streams a file through an fsspec file
object (seekable, ranged reads: byte spans and the damaged-stream check work as on disk),
``open_arrow`` hands one to pyarrow (a failed read is ``ReadFailed``, never "damaged data"),
``spool`` copies one to a temp file once, and ``input_entry`` is a file's identity for resume
(local size and mtime; a URL's size and version, ``urls.remote_version``). Listing a URL's
files is ``urls.list_tree``; which of them are inputs is ``packcli/read/inputs.py``'s rule."""

from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path
from typing import Any, BinaryIO

from packcli.fs.urls import cache_root, info, is_url, locate, redact, redact_text, remote_version


def read_text(url: str) -> str:
    """A small file's text (a ``state.json``), as UTF-8; errors are ``OSError``s."""
    with open_binary(url) as fh:
        data = fh.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise OSError(f"{redact(url)}: not UTF-8 ({exc})") from exc


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
            data: bytes = self._fh.read(*args)
            return data
        except Exception as exc:  # re-raised: any backend error is a read error
            raise ReadFailed(f"{type(exc).__name__}: {redact_text(str(exc))}") from exc


def open_arrow(path: str) -> Any:
    """A URL as a pyarrow random-access file (Parquet footers, Arrow IPC batches); a read
    that fails raises ``ReadFailed``, never a skippable "damaged file"."""
    import pyarrow as pa

    return pa.PythonFile(_Reads(open_binary(path)), mode="r")
