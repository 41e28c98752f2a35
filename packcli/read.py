"""Streaming jsonl reader: the first stage of the packing pipeline.

The reader turns a list of input specs (files, directories, glob patterns) into a stable,
sorted list of files, then streams their documents in batches of ``DocBatch``.

Why it looks the way it does:

* **Streaming, bounded memory.** Corpora can be terabytes, so files are read line by line in
  binary mode (plain, gzip or zstd) and only one batch of texts is held at a time. A single
  line can still be arbitrarily long; nothing else grows with the input size.
* **Stable document ids.** Inputs are deduplicated and sorted by path, and every non-blank
  line gets the next global id in that order. The same inputs therefore always give the same
  ids, which later stages use to refer back to documents (and ``file_index``/``line`` let any
  id be traced to ``file:line``).
* **Fail loudly.** A malformed line or a corrupt/truncated compressed stream stops the run with
  an ``InputError`` naming ``file:line``, instead of silently dropping data. Truncated zstd
  streams are detected too (the library's ``stream_reader`` ends them silently, so frames are
  decoded with ``decompressobj`` and a frame left unfinished at end of file is an error).
* **Cheap progress.** ``DocBatch.progress_bytes`` counts on-disk (compressed) bytes consumed,
  read from the raw file position once per batch, so a progress bar over the sum of the file
  sizes stays accurate for compressed inputs without any per-line cost.
"""

from __future__ import annotations

import glob
import gzip
import io
import logging
import os
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import orjson
import zstandard

from packcli.errors import InputError

logger = logging.getLogger(__name__)

SUPPORTED_SUFFIXES: tuple[str, ...] = (".jsonl", ".jsonl.gz", ".jsonl.zst")
"""Input file name endings the reader accepts (matched case-insensitively)."""

_BOM = b"\xef\xbb\xbf"
_READ_BUFFER = 1 << 20  # buffered line reader size
_ZSTD_INPUT_CHUNK = 1 << 17  # compressed bytes fed to the zstd decoder at a time
_GLOB_MAGIC = frozenset("*?[")
_JSON_TYPE_NAMES = {
    type(None): "null",
    bool: "bool",
    int: "int",
    float: "float",
    list: "array",
    dict: "object",
}


@dataclass
class DocBatch:
    """A batch of documents in global input order.

    ``texts[i]`` has global id ``doc_id_start + i`` and comes from line ``line[i]`` (1-based) of
    ``paths[file_index[i]]``. A batch may span several files.
    """

    texts: list[str]
    doc_id_start: int
    file_index: np.ndarray  # int32, per doc: index into the resolved path list
    line: np.ndarray  # int64, per doc: 1-based line number in its file
    progress_bytes: int  # cumulative on-disk bytes of all inputs consumed so far


@dataclass
class ReadStats:
    """Counters filled in by ``iter_batches`` (up to date at every yielded batch and at the end)."""

    files: int = 0  # files read to the end
    documents: int = 0
    blank_lines: int = 0
    bytes_read: int = 0  # uncompressed bytes


# --------------------------------------------------------------------------- input resolution


def _compression(path: Path | str) -> str | None:
    """``"plain"``, ``"gzip"`` or ``"zstd"`` from the file name, or ``None`` if unsupported."""
    name = os.fspath(path).lower()
    if name.endswith(".jsonl"):
        return "plain"
    if name.endswith(".jsonl.gz"):
        return "gzip"
    if name.endswith(".jsonl.zst"):
        return "zstd"
    return None


def _suffix_list() -> str:
    return ", ".join(SUPPORTED_SUFFIXES)


def _files_under(directory: Path) -> list[Path]:
    return [p for p in directory.rglob("*") if _compression(p) is not None and p.is_file()]


def resolve_inputs(specs: Sequence[str]) -> list[Path]:
    """Expand input specs into a deduplicated list of files sorted by path string.

    Each spec is a file (which must end in one of ``SUPPORTED_SUFFIXES``), a directory (searched
    recursively for supported files) or a glob pattern (``**`` allowed; matched directories are
    searched recursively, matched files with other suffixes are ignored). Files reached through
    several specs are kept once (compared by resolved path). Raises ``InputError`` for a spec
    that matches nothing usable, or when no input files are left.
    """
    found: dict[Path, Path] = {}  # resolved path -> absolute path shown to the user

    def add(path: Path) -> None:
        shown = Path(os.path.abspath(path))
        key = path.resolve()
        if key not in found or str(shown) < str(found[key]):
            found[key] = shown

    for spec in specs:
        path = Path(spec)
        if path.is_file():
            if _compression(path) is None:
                raise InputError(
                    f"unsupported input file {spec!r}: supported suffixes are {_suffix_list()}"
                )
            add(path)
        elif path.is_dir():
            files = _files_under(path)
            if not files:
                raise InputError(f"no {_suffix_list()} files found under directory {spec!r}")
            for p in files:
                add(p)
        elif _GLOB_MAGIC.intersection(spec):
            files = []
            for match in glob.glob(spec, recursive=True):
                mpath = Path(match)
                if mpath.is_dir():
                    files.extend(_files_under(mpath))
                elif _compression(mpath) is not None and mpath.is_file():
                    files.append(mpath)
            if not files:
                raise InputError(f"glob pattern {spec!r} matched no {_suffix_list()} files")
            for p in files:
                add(p)
        elif path.exists():
            raise InputError(f"input {spec!r} is not a regular file or directory")
        else:
            raise InputError(f"input not found: {spec!r}")

    if not found:
        raise InputError("no input files given")
    result = sorted(found.values(), key=str)
    logger.debug("resolved %d input spec(s) to %d file(s)", len(specs), len(result))
    return result


# --------------------------------------------------------------------------- opening files


class _ZstdFrameReader(io.RawIOBase):
    """Raw reader decoding a (possibly multi-frame) zstd stream that errors on truncation.

    ``ZstdDecompressor.stream_reader`` silently returns a short stream when the input ends in
    the middle of a frame; here each frame gets its own ``decompressobj`` and input that ends
    while a frame is unfinished raises ``EOFError``.
    """

    def __init__(self, source: BinaryIO) -> None:
        super().__init__()
        self._source = source
        self._dctx = zstandard.ZstdDecompressor()
        self._dobj = self._dctx.decompressobj()
        self._in_frame = False  # bytes of the current frame have been fed
        self._out = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        while not self._out:
            chunk = self._source.read(_ZSTD_INPUT_CHUNK)
            if not chunk:
                if self._in_frame:
                    raise EOFError("zstd stream ends in the middle of a frame (file truncated?)")
                return 0
            parts = []
            while chunk:
                self._in_frame = True
                parts.append(self._dobj.decompress(chunk))
                if self._dobj.eof:  # frame complete; the rest of the chunk starts a new one
                    chunk = self._dobj.unused_data
                    self._dobj = self._dctx.decompressobj()
                    self._in_frame = False
                else:
                    chunk = b""
            self._out = memoryview(parts[0] if len(parts) == 1 else b"".join(parts))
        n = min(len(buffer), len(self._out))
        buffer[:n] = self._out[:n]
        self._out = self._out[n:]
        return n


class _Read1Adapter(io.RawIOBase):
    """Raw view of a buffered stream whose reads return whatever is decoded next (``readinto1``).

    Wrapping ``GzipFile`` directly in a ``BufferedReader`` would make each fill read the whole
    buffer, so a corrupt stream would raise before the complete lines decoded ahead of the damage
    are delivered, and errors would name a too-early "last good line".
    """

    def __init__(self, stream: gzip.GzipFile) -> None:
        super().__init__()
        self._stream = stream

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        return self._stream.readinto1(buffer)

    def close(self) -> None:
        self._stream.close()
        super().close()


def _open_lines(path: Path, raw: BinaryIO) -> tuple[BinaryIO, tuple[type[BaseException], ...]]:
    """A binary line stream over ``raw`` and the exception types that mean a corrupt stream."""
    kind = _compression(path)
    if kind == "plain":
        return raw, (OSError,)
    if kind == "gzip":
        # GzipFile's own line reading uses small buffers; a large outer buffer is ~10% faster.
        gz = gzip.GzipFile(fileobj=raw, mode="rb")
        stream = io.BufferedReader(_Read1Adapter(gz), _READ_BUFFER)
        return stream, (OSError, EOFError, zlib.error)  # type: ignore[return-value]
    if kind == "zstd":
        stream = io.BufferedReader(_ZstdFrameReader(raw), buffer_size=_READ_BUFFER)
        return stream, (zstandard.ZstdError, EOFError, OSError)  # type: ignore[return-value]
    raise InputError(f"{path}: unsupported input suffix; supported suffixes are {_suffix_list()}")


# --------------------------------------------------------------------------- reading


def _make_batch(
    texts: list[str],
    lines: list[int],
    segments: list[tuple[int, int]],
    doc_id_start: int,
    progress_bytes: int,
) -> DocBatch:
    n = len(texts)
    file_index = np.empty(n, dtype=np.int32)
    for i, (start, idx) in enumerate(segments):
        end = segments[i + 1][0] if i + 1 < len(segments) else n
        file_index[start:end] = idx
    return DocBatch(
        texts=texts,
        doc_id_start=doc_id_start,
        file_index=file_index,
        line=np.array(lines, dtype=np.int64),
        progress_bytes=progress_bytes,
    )


def _type_name(value: object) -> str:
    return _JSON_TYPE_NAMES.get(type(value), type(value).__name__)


def iter_batches(
    paths: Sequence[Path],
    text_field: str = "text",
    batch_size: int = 1024,
    stats: ReadStats | None = None,
) -> Iterator[DocBatch]:
    """Stream the documents of ``paths`` (in the given order) in batches of ``batch_size``.

    Every non-blank line must be a JSON object whose top-level ``text_field`` is a non-empty
    string; anything else raises ``InputError("file:line: reason")``. Blank lines are skipped
    (they keep their line number but get no document id). Every batch except the last holds
    exactly ``batch_size`` documents. ``stats``, if given, is updated as reading proceeds.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if stats is None:
        stats = ReadStats()

    loads = orjson.loads
    decode_error = orjson.JSONDecodeError
    field = text_field

    texts: list[str] = []
    lines: list[int] = []
    segments: list[tuple[int, int]] = []  # (offset in batch, file index) where a file starts
    next_id = 0  # global id of texts[0]
    done_bytes = 0  # on-disk size of the files read to the end

    for file_index, path in enumerate(paths):
        try:
            raw = open(path, "rb", buffering=_READ_BUFFER)  # noqa: SIM115 (closed below)
        except OSError as exc:
            raise InputError(f"{path}: cannot open: {exc.strerror or exc}") from exc
        lineno = 0
        blank = 0
        nbytes = 0
        try:
            size = os.fstat(raw.fileno()).st_size
            stream, corrupt_errors = _open_lines(path, raw)
            logger.debug("reading %s (%d bytes on disk)", path, size)
            segments.append((len(texts), file_index))
            texts_append = texts.append
            lines_append = lines.append
            try:
                if stream.peek(3)[:3] == _BOM:  # type: ignore[attr-defined]
                    stream.read(3)
                    nbytes += 3
                for line in stream:
                    lineno += 1
                    nbytes += len(line)
                    try:
                        doc = loads(line)
                    except decode_error as exc:
                        if line.isspace():
                            blank += 1
                            continue
                        raise InputError(
                            f"{path}:{lineno}: invalid JSON: {exc.msg} (column {exc.colno})"
                        ) from None
                    try:
                        text = doc[field]
                    except KeyError:
                        raise InputError(f"{path}:{lineno}: missing field {field!r}") from None
                    except (TypeError, IndexError):
                        raise InputError(f"{path}:{lineno}: line is not a JSON object") from None
                    if type(text) is not str:
                        raise InputError(
                            f"{path}:{lineno}: field {field!r} is not a string "
                            f"(got {_type_name(text)})"
                        )
                    if not text:
                        raise InputError(f"{path}:{lineno}: field {field!r} is empty")
                    if len(texts) == batch_size:
                        # Flush lazily (only once another document arrives) so that a batch
                        # ending a file is yielded after the file is done, with exact progress.
                        stats.documents = next_id + batch_size
                        stats.blank_lines += blank
                        stats.bytes_read += nbytes
                        blank = nbytes = 0
                        yield _make_batch(
                            texts, lines, segments, next_id, done_bytes + min(raw.tell(), size)
                        )
                        next_id += batch_size
                        texts = []
                        lines = []
                        segments = [(0, file_index)]
                        texts_append = texts.append
                        lines_append = lines.append
                    texts_append(text)
                    lines_append(lineno)
            except corrupt_errors as exc:
                what = (
                    "read error" if _compression(path) == "plain" else "corrupt compressed stream"
                )
                raise InputError(f"{path}: {what} after line {lineno}: {exc}") from exc
            stream.close()
        finally:
            raw.close()
        done_bytes += size
        stats.files += 1
        stats.blank_lines += blank
        stats.bytes_read += nbytes
        stats.documents = next_id + len(texts)
        if len(texts) == batch_size:
            yield _make_batch(texts, lines, segments, next_id, done_bytes)
            next_id += batch_size
            texts = []
            lines = []
            segments = []

    if texts:
        yield _make_batch(texts, lines, segments, next_id, done_bytes)
