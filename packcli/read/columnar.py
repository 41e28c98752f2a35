"""Columnar inputs: Parquet and Arrow IPC files (what ``save_to_disk`` folders and Hub datasets
resolve to as well), read into the same ``DocBatch`` stream as jsonl (``packcli/read/jsonl.py``).

Why it looks the way it does:

* **Streamed, one column.** A Parquet file is read with ``ParquetFile.iter_batches`` over
  the text (or messages) column only, through a 1 MiB buffer without pre-buffering, so
  memory holds one page and one batch of documents, never a row group, let alone the file;
  an Arrow IPC file is memory-mapped, so its batches are zero-copy views and untouched
  columns are never paged in.
* **A unit of work is a row-group range.** A file larger than ``--split-bytes`` is cut into
  ranges of consecutive row groups (Arrow: record batches) of at most that many on-disk bytes
  (a single larger group is a range of its own), so one huge file spreads over tokenize tasks
  as byte spans of a jsonl file do. Parquet's footer gives the row counts and sizes for free;
  an IPC file has to be walked once for them (zero-copy when it is uncompressed, as
  ``datasets`` writes it), and only when it is large enough to be split.
* **Provenance is ``file:row``.** A document's ``line`` (in the shards, the report and
  ``rejected.jsonl``) is its row number in the file, counted from 0 as ``datasets``
  (``ds[row]``), pandas and pyarrow index rows; messages say ``row``. Where jsonl counts
  lines from 1, a row is an index, so a user can look it up as it is printed.
* **Bad input keeps jsonl's policy.** A file without the column is an ``InputError`` naming
  the file and the columns it has (checked for every file before anything is written); a
  null, empty or non-string value (chat: a malformed dialogue) is a bad record under
  ``--on-bad-line`` with the jsonl reason keys (``not_string``, ``empty_text``,
  ``bad_record``); ``rejected.jsonl`` then holds the row's value as JSON.
* **Nothing a file's own checks refuse becomes a document** (``columnar_integrity.py``):
  Parquet page CRCs are always verified where a writer stored them, and every array read
  is validated before ``to_pylist`` (a damaged offset in a memory-mapped Arrow file would
  otherwise read outside it). A Parquet row group is read on its own, so a page that fails
  (its CRC, its decoder, its header) loses only the rest of that row group: the rows
  before it came from verified pages, and reading goes on with the next row group. An
  Arrow record batch that fails loses its rows; one that cannot be read at all ends the
  file (its row count is unknown, so no later row could be numbered), as does a stream
  without its end-of-stream marker. ``error`` stops naming the file and the rows;
  ``skip`` records one ``corrupt_stream`` reject and one ``ReadStats.corrupt_streams``
  entry (``rows``: the file's ``[first, end)``, end ``None`` when unknown) per damaged
  range, as a damaged ``.gz`` is. Rows whose strings are not UTF-8 (a binary column is
  read as UTF-8 text) are bad records (``invalid_utf8``), row by row. A read error of the
  disk or the network is never skippable. A file whose footer or header is unreadable
  (cut short, damaged) is refused whole, whatever ``--on-bad-line``.
* **One place opens files** (``open_input``): a local file, or an fsspec URL
  (``packcli/fs/reading.py``).

Cost: the per-row checks are the jsonl reader's type checks, and ``to_pylist`` makes the
Python strings the tokenizer takes anyway. Measured on this project's 2-core box (CPU
seconds, best of 3): 40,000 documents, 106 MB of text, read as jsonl in 0.36 s and as
Parquet (40 MB, snappy, pyarrow's defaults) in 0.46 s (~230 MB/s), far above tokenizing
(~10 MB/s with the fast path). The integrity checks cost nothing measurable: the strict
decoding ``to_pylist`` does is the UTF-8 check, the structural validation is O(rows) on
offsets, and page CRCs are checked at GB/s (a 30 MB Parquet file of 95 MB of text, 40,000
rows: 0.49 s before and after; with page CRCs 0.53 -> 0.54 s; the same as an Arrow stream
0.30 -> 0.28 s; best of 3 runs of 3, noise ~5%).
"""

from __future__ import annotations

import itertools
import json
import logging
import operator
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa

from packcli.errors import InputError
from packcli.fs import is_url, open_arrow
from packcli.read.bad_lines import check_document
from packcli.read.batches import DocBatch, FileReader, ReadOptions, ReadStats
from packcli.read.columnar_integrity import (
    Broken,
    is_damage,
    one_line,
    rows,
    stream_end_problem,
    text_type,
)
from packcli.read.rejects import BadLineError

# The name log lines showed before the reader became a package (the CLI prints it).
logger = logging.getLogger("packcli.read")

_ARROW_FILE_MAGIC = b"ARROW1"
_PARQUET_BUFFER = 1 << 20  # bytes of a column chunk read at a time


def open_input(path: Path | str, *, memory_map: bool = False) -> pa.NativeFile:
    """The one place a columnar input is opened: a local file, or an fsspec URL.

    Arrow IPC is memory-mapped (batches become zero-copy views); Parquet is read with plain
    reads, so its pages do not stay mapped after they are decoded. A URL is an fsspec file
    object (seekable, ranged reads), so a Parquet footer and the one column read are all
    that is fetched.
    """
    try:
        if is_url(path):
            return open_arrow(str(path))
        return pa.memory_map(os.fspath(path), "r") if memory_map else pa.OSFile(os.fspath(path))
    except OSError as exc:
        raise InputError(f"{path}: cannot open: {exc}") from exc


# --------------------------------------------------------------------------- one file


class _Table:
    """A Parquet or Arrow IPC file as groups of rows (row groups; record batches)."""

    def __init__(self, path: Path | str, fmt: str) -> None:
        self.path = path
        self.fmt = fmt
        self._source = open_input(path, memory_map=fmt == "arrow")
        try:
            self.size = self._source.size()
            if fmt == "parquet":
                import pyarrow.parquet as pq

                # pyarrow's defaults read every requested column chunk whole, and with
                # pre_buffer all of them at once: 158 MB held for a 158 MB column, one row
                # group or forty. Streaming each chunk through a small buffer holds one
                # page and one batch (measured: 8 MB) at ~8% more CPU.
                # Page CRCs are checked when a page carries one (columnar_integrity.py).
                self._parquet = pq.ParquetFile(
                    self._source,
                    pre_buffer=False,
                    buffer_size=_PARQUET_BUFFER,
                    page_checksum_verification=True,
                )
                self.schema = self._parquet.schema_arrow
            else:
                self._head = self._source.read(8)
                self._is_file = self._head[:6] == _ARROW_FILE_MAGIC
                self._source.seek(0)
                self._ipc: Any = (
                    pa.ipc.open_file(self._source)
                    if self._is_file
                    else pa.ipc.open_stream(self._source)
                )
                self.schema = self._ipc.schema
        except (pa.ArrowException, OSError) as exc:
            self.close()
            kind = "Parquet" if fmt == "parquet" else "Arrow IPC"
            raise InputError(f"{path}: not a readable {kind} file: {one_line(exc)}") from exc

    def close(self) -> None:
        self._source.close()

    def __enter__(self) -> _Table:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def require(self, column: str, option: str) -> None:
        """The column must exist: else one line naming the file and the columns it has."""
        names = self.schema.names
        if column not in names:
            raise InputError(
                f"{self.path}: no column {column!r} (its columns: {', '.join(names) or 'none'}); "
                f"pass {option} COLUMN"
            )

    def groups(self) -> list[tuple[int, int]] | None:
        """(rows, on-disk bytes) of every row group (Arrow: record batch), in file order;
        None for an IPC file whose walk meets damage (read whole, the reader reports it)."""
        if self.fmt == "parquet":
            meta = self._parquet.metadata
            groups = []
            for i in range(meta.num_row_groups):
                rg = meta.row_group(i)
                nbytes = sum(rg.column(j).total_compressed_size for j in range(rg.num_columns))
                groups.append((rg.num_rows, nbytes))
            return groups
        # An IPC file keeps no per-batch sizes: share the file's bytes out by rows.
        try:
            rows = [batch.num_rows for batch in self._ipc_batches(0, None)]
            problem = None if self._is_file else self._stream_end()
        except (pa.ArrowException, OSError) as exc:
            if not is_damage(exc):
                raise InputError(f"{self.path}: read error: {one_line(exc)}") from exc
            problem = one_line(exc)
        if problem is not None:
            logger.debug("%s: not split into units: %s", self.path, problem)
            return None
        total = max(sum(rows), 1)
        ends = [self.size * done // total for done in itertools.accumulate(rows)]
        return list(zip(rows, map(operator.sub, ends, [0, *ends[:-1]]), strict=True))

    def _ipc_batches(self, start: int, stop: int | None) -> Iterator[pa.RecordBatch]:
        """Record batches ``start..stop-1`` (to the end when ``stop`` is None)."""
        if self._is_file:
            stop = self._ipc.num_record_batches if stop is None else stop
            for i in range(start, stop):
                yield self._ipc.get_batch(i)
            return
        # A stream can only be walked from its start: batches before ``start`` are read and
        # dropped (views of the mapped file: only their headers are touched, uncompressed).
        self._source.seek(0)
        for i, batch in enumerate(pa.ipc.open_stream(self._source)):
            if stop is not None and i >= stop:
                return
            if i >= start:
                yield batch

    def _stream_end(self) -> str | None:
        """Why a stream just read to its end is incomplete (``stream_end_problem``)."""
        return stream_end_problem(self._source, self.size, self._head)

    def extent(self, groups: tuple[int, int] | None) -> tuple[int, int] | None:
        """(rows, on-disk bytes) of a group range (None: the file) when known without reading
        it: from a Parquet footer; an IPC file only as a whole (for progress alone)."""
        if self.fmt == "parquet":
            meta = self._parquet.metadata
            if groups is None:
                return meta.num_rows, self.size
            picked = [meta.row_group(i) for i in range(*groups)]
            nbytes = sum(
                rg.column(j).total_compressed_size for rg in picked for j in range(rg.num_columns)
            )
            return sum(rg.num_rows for rg in picked), nbytes
        return None if groups is not None else (0, self.size)

    def read(
        self, column: str, groups: tuple[int, int] | None, rows: int
    ) -> tuple[int, Iterator[_Piece]]:
        """Rows before group range ``groups`` (all groups when None), and the column over
        that range: arrays (at most ``rows`` long) with where they come from, and ``_Damage``
        where the file's own checks failed (reading goes on after it where rows can still
        be numbered: the next Parquet row group)."""
        start, stop = groups if groups is not None else (0, None)
        if self.fmt == "parquet":
            meta = self._parquet.metadata
            stop = meta.num_row_groups if stop is None else stop
            before = sum(meta.row_group(i).num_rows for i in range(start))
            return before, self._parquet_pieces(column, range(start, stop), rows, before)
        if self._is_file:
            before = sum(self._ipc.get_batch(i).num_rows for i in range(start))
        else:
            before = sum(b.num_rows for b in self._ipc_batches(0, start))
        return before, self._ipc_pieces(column, start, stop, before)

    def _parquet_pieces(
        self, column: str, groups: range, rows: int, first: int
    ) -> Iterator[_Piece]:
        """One row group at a time, so a failed page (CRC, decoder) loses the rest of its
        row group only, and the rows read before it in that group, every page of them
        verified, are kept."""
        meta = self._parquet.metadata
        for group in groups:
            expected = meta.row_group(group).num_rows
            where = f"row group {group}"
            got = 0
            try:
                for batch in self._parquet.iter_batches(
                    batch_size=rows, row_groups=[group], columns=[column], use_threads=False
                ):
                    got += batch.num_rows
                    yield batch.column(0), where
            except (pa.ArrowException, OSError) as exc:
                if not is_damage(exc):
                    raise
                yield _Damage(first + got, first + expected, where, one_line(exc))
            else:
                if got < expected:
                    detail = f"holds {got} rows where the footer says {expected}"
                    yield _Damage(first + got, first + expected, where, detail)
            first += expected

    def _ipc_pieces(
        self, column: str, start: int, stop: int | None, first: int
    ) -> Iterator[_Piece]:
        """Record batch by record batch. A batch that cannot be read ends the file: how many
        rows it holds is unknown, so no later row could be numbered."""
        index = self.schema.get_field_index(column)
        batches = self._ipc_batches(start, stop)
        for i in itertools.count(start):
            try:
                batch = next(batches, None)
            except (pa.ArrowException, OSError) as exc:
                if not is_damage(exc):
                    raise
                yield _Damage(first, None, f"record batch {i}", one_line(exc))
                return
            if batch is None:
                break
            yield batch.column(index), f"record batch {i}"
            first += batch.num_rows
        if not self._is_file and stop is None and (problem := self._stream_end()):
            yield _Damage(first, None, "the end of the stream", problem)


@dataclass(frozen=True)
class _Damage:
    """Rows of a file that its own checks refuse: from the file's row ``start`` up to
    ``stop`` (None: to the end of the file, how many unknown), found in ``where``."""

    start: int
    stop: int | None
    where: str
    detail: str

    def rows(self) -> str:
        start, stop = self.start, self.stop
        if stop is None:
            return f"rows from {start} on"
        if stop <= start:
            return f"no rows (after row {start - 1})"
        return f"row {start}" if stop == start + 1 else f"rows {start}-{stop - 1}"


_Piece = tuple[pa.Array, str] | _Damage
"""What ``_Table.read`` yields: an array of the column and where it is from, or damage."""


def group_ranges(groups: Sequence[tuple[int, int]], split_bytes: int) -> list[tuple[int, int]]:
    """Consecutive row-group ranges ``[start, stop)`` of at most ``split_bytes`` on-disk bytes
    each (a larger group alone), covering every group once."""
    ranges: list[tuple[int, int]] = []
    start = size = 0
    for i, (_, nbytes) in enumerate(groups):
        if i > start and size + nbytes > split_bytes:
            ranges.append((start, i))
            start, size = i, 0
        size += nbytes
    if start < len(groups) or not groups:
        ranges.append((start, len(groups)))
    return ranges


def split_groups(
    path: Path | str, fmt: str, size: int, split_bytes: int
) -> list[tuple[tuple[int, int], int]] | None:
    """A file's units of work as ((first group, end group), on-disk bytes), or ``None``
    (read it whole) when it is not larger than ``split_bytes`` or splitting is off."""
    if split_bytes <= 0 or size <= split_bytes:
        return None
    with _Table(path, fmt) as table:
        groups = table.groups()
    if groups is None:
        return None
    ranges = group_ranges(groups, split_bytes)
    if len(ranges) < 2:
        return None
    sizes = [sum(nbytes for _, nbytes in groups[a:b]) for a, b in ranges]
    sizes[-1] += size - sum(sizes)  # headers and footer: the units' bytes add up to the file
    return list(zip(ranges, sizes, strict=True))


def check_columns(
    paths: Sequence[Path | str], formats: Sequence[str], column: str, option: str
) -> None:
    """Every columnar input must have ``column``: checked before anything is written, from
    each file's schema alone (a Parquet footer, an IPC header)."""
    for path, fmt in zip(paths, formats, strict=True):
        if fmt != "jsonl":
            with _Table(path, fmt) as table:
                table.require(column, option)


# --------------------------------------------------------------------------- reading


def _row_bytes(array: pa.Array) -> list[int]:
    """Bytes of each row's value, for ``batch_bytes``: exact for strings, the array's
    average otherwise (dialogues: only a bound on the batch's memory needs it)."""
    if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
        import pyarrow.compute as pc

        sizes: list[int] = pc.binary_length(array).fill_null(0).to_pylist()
        return sizes
    return [array.nbytes // max(len(array), 1)] * len(array)


def _raw(column: str, value: Any) -> bytes:
    """A rejected row's value as JSON (``rejected.jsonl``'s ``raw_b64``). A string that was
    not UTF-8 holds its bytes as surrogate escapes, which ``json`` writes as ``\\udcXX``
    (``.encode("utf-8", "surrogateescape")`` gives them back); orjson refuses them."""
    try:
        return orjson.dumps({column: value}, default=str)
    except TypeError:
        pass
    try:
        return json.dumps({column: value}, default=str).encode()
    except (TypeError, ValueError):
        return json.dumps({column: repr(value)}).encode()


def iter_columnar(
    paths: Sequence[Path | str],
    fmt: str,
    column: str,
    options: ReadOptions = ReadOptions(),
    stats: ReadStats | None = None,
    *,
    groups: tuple[int, int] | None = None,
    option: str = "--text-field",
) -> Iterator[DocBatch]:
    """Stream the documents of Parquet or Arrow IPC files, as ``read.iter_batches`` does for
    jsonl: same batches, same ``stats`` and the same bad-record policy, with a row (0-based)
    where jsonl has a line.

    A document is a row whose ``column`` holds a non-empty string; with ``options.validate``
    the row's value goes through it as ``{column: value}`` and a ``ValueError`` is a
    ``bad_record``. ``groups=(start, stop)`` reads only those row groups (Arrow: record
    batches) of a single file: rows in batches, ``stats`` and ``rejects`` then count from
    the range's first row (``stats.rows_before`` says how many come before it), and errors
    still name the file's own row.
    """
    if groups is not None and len(paths) != 1:
        raise ValueError("groups needs exactly one file")
    reader = _ColumnarRead(options, stats)
    reader.fmt, reader.column, reader.option = fmt, column, option
    reader.groups = groups
    yield from reader.read(paths)


class _ColumnarRead(FileReader):
    """One ``iter_columnar`` call."""

    fmt: str
    column: str
    option: str
    groups: tuple[int, int] | None

    def file(self, file_index: int, path: Path | str) -> Iterator[DocBatch]:
        """Read one file (or its group range) to the end, yielding the batches it fills."""
        batches, stats = self.batches, self.stats
        with _Table(path, self.fmt) as table:
            table.require(self.column, self.option)
            before = 0  # rows of the file before the range
            row = 0  # rows of this file (range) read so far, or left out as damaged
            counted = 0  # rows already added to stats.lines
            nbytes = 0  # value bytes not yet added to stats.bytes_read
            try:
                # Parquet is decoded batch_size rows at a time: memory holds one batch of
                # documents (and a page of this column), as the jsonl reader does.
                before, pieces = table.read(self.column, self.groups, batches.batch_size)
                stats.rows_before = before
                extent = table.extent(self.groups)
                batches.start_file(file_index)
                for piece in pieces:
                    if isinstance(piece, _Damage):
                        self._damaged(path, piece, before)
                        if piece.stop is None:
                            break
                        # Rows left out still count as the range's rows (stats.lines): a
                        # later unit's rows are numbered from this unit's count.
                        row = piece.stop - before
                        continue
                    array, where = piece
                    array = self._as_text(array)
                    try:
                        values, bad = rows(array)
                    except Broken as exc:  # its offsets: not one row can be trusted
                        end = before + row + len(array)
                        self._damaged(path, _Damage(before + row, end, where, str(exc)), before)
                        row += len(array)
                        continue
                    for i, (value, size) in enumerate(zip(values, _row_bytes(array), strict=True)):
                        here = row
                        row += 1
                        nbytes += size
                        if bad and i in bad:
                            message = f"field {self.column!r} holds {bad[i]}"
                            self._refuse(path, before + here, here, "invalid_utf8", message, value)
                            continue
                        text = self._document(path, value, before + here, here)
                        if text is None:
                            continue
                        if batches.full():
                            # Flushed once another document arrives, as the jsonl reader does.
                            batches.settle(row - counted, nbytes)
                            counted, nbytes = row, 0
                            progress = batches.done_bytes
                            if extent and extent[0]:
                                progress += extent[1] * row // extent[0]
                            yield batches.cut(progress, file_index)
                        batches.add(text, here, size)
            except (pa.ArrowException, OSError) as exc:
                at = before + row
                raise InputError(f"{path}: read error after row {at}: {one_line(exc)}") from exc
        yield from batches.end_file(row - counted, nbytes, extent[1] if extent else 0)

    def _as_text(self, array: pa.Array) -> pa.Array:
        """A text column typed binary (Parquet without the UTF8 annotation) as strings over
        the same bytes, validated like any string column; other columns as they are."""
        kind = text_type(array.type) if self.validate is None else None
        return array if kind is None else array.view(kind)

    def _damaged(self, path: Path | str, damage: _Damage, before: int) -> None:
        """Rows the file's own checks refuse: ``error`` stops naming the file and the rows;
        ``skip`` leaves them out, one ``corrupt_stream`` reject (``raw=b""``, at the first
        row left out) and one ``corrupt_streams`` entry, and reading goes on."""
        message = f"{path}: {damage.rows()} ({damage.where}) fail the file's own checks: "
        message += damage.detail
        if not self.bad.skip:
            raise BadLineError(
                str(path),
                damage.start,
                "corrupt_stream",
                f"{message}. Replace the file, or pass --on-bad-line skip to leave these rows out",
            )
        logger.warning("%s; left out", message)
        stats = self.stats
        stats.rejected["corrupt_stream"] = stats.rejected.get("corrupt_stream", 0) + 1
        lost = None if damage.stop is None else damage.stop - damage.start
        stats.corrupt_streams.append(
            {
                "file": str(path),
                "reason": f"{damage.where}: {damage.detail}",
                "rows": [damage.start, damage.stop],
                "discarded_lines": lost,
            }
        )
        if self.bad.rejects is not None:
            detail = message.removeprefix(f"{path}: ")
            self.bad.rejects.add(str(path), damage.start - before, "corrupt_stream", b"", detail)

    def _document(self, path: Path | str, value: Any, at: int, here: int) -> Any:
        """A row's document, or ``None`` for a bad one once the policy dealt with it
        (``error`` raises naming the file's row ``at``; ``here`` counts from the range)."""
        column = self.column
        verdict: tuple[str, str] | None = None  # (reason, message) of a bad record
        if self.validate is None:
            text = value
            if type(text) is not str or not text:
                checked = check_document({column: value}, column)  # a reason: text is none
                verdict = checked if isinstance(checked, tuple) else None
        else:
            try:
                text = self.validate({column: value})
            except ValueError as exc:  # the reason, e.g. a malformed dialogue
                verdict = ("bad_record", str(exc))
        if verdict is None:
            return text
        reason, message = verdict
        self._refuse(path, at, here, reason, message, value)
        return None

    def _refuse(
        self, path: Path | str, at: int, here: int, reason: str, message: str, value: Any
    ) -> None:
        """A bad row: ``error`` raises naming the file's row ``at``; ``skip`` counts it and
        quarantines its value as JSON (``here``: its row in the range)."""
        if not self.bad.skip:
            raise BadLineError(str(path), at, reason, f"{path}: row {at}: {message}")
        self.bad.skipped(str(path), here, reason, message, _raw(self.column, value))
