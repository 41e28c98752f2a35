"""Documents into batches: ``DocBatch`` (what the readers yield), ``ReadStats`` (what they
count), ``ReadOptions`` (what they are told), ``Batches`` (the batch being filled) and
``FileReader``, what the jsonl and columnar readers share, so both cut batches, number
documents, count, refuse records and report progress alike."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from packcli.read.rejects import BadLines, Quarantine


@dataclass
class DocBatch:
    """A batch of documents in global input order.

    ``texts[i]`` has global id ``doc_id_start + i`` and comes from ``position[i]`` of
    ``paths[file_index[i]]``: its line (1-based) in a jsonl file, its row (0-based) in a
    Parquet/Arrow file, as error messages and ``inspect --doc`` name them. A batch may span
    several files.
    """

    # str (text data), or the record's dialogue or pair (chat, preference); None for a
    # dialogue that stayed on the rendering worker which read it (chat.batches.SpanReading)
    texts: list[Any]
    doc_id_start: int
    file_index: npt.NDArray[np.int32]  # per doc: index into the resolved path list
    position: npt.NDArray[np.int64]  # per doc: its line (1-based) or row (0-based) in its file
    progress_bytes: int  # cumulative on-disk bytes of all inputs consumed so far


@dataclass
class ReadStats:
    """Counters filled in by ``iter_batches`` (up to date at every yielded batch and at the end)."""

    files: int = 0  # files done: read to the end, or abandoned at a corrupt stream under skip
    documents: int = 0
    blank_lines: int = 0
    bytes_read: int = 0  # uncompressed bytes
    # Lines read: documents + blank + rejected; Parquet/Arrow: rows, those left out as
    # damaged included (a later unit of the file numbers its rows from this count).
    lines: int = 0
    rejected: dict[str, int] = field(default_factory=dict)  # reason key -> lines (``skip``)
    # Under ``skip``, one entry per compressed file that failed verification: ``file``,
    # ``reason``, ``kept_lines``, ``discarded_lines`` (decoded after them; fewer than were
    # lost when decoding stopped early) and ``byte`` (compressed offset of the failed member).
    # A Parquet/Arrow file: one entry per damaged range, ``file``, ``reason``, ``rows`` (the
    # file's ``[first, end)``, end None when unknown) and ``discarded_lines`` (rows left out,
    # None when unknown).
    corrupt_streams: list[dict[str, Any]] = field(default_factory=list)
    # With ``span``: the byte offset of the span's first line (the start of the first line
    # that begins inside the span); ``count_newlines(path, first_line_byte)`` lines precede it.
    first_line_byte: int = 0
    # Columnar inputs with a row-group range: the rows of the file before it.
    rows_before: int = 0

    def count(self, lines: int, nbytes: int, blank: int = 0) -> None:
        """Add lines (rows) read, their uncompressed bytes and the blank ones among them."""
        self.lines += lines
        self.blank_lines += blank
        self.bytes_read += nbytes


class Batches:
    """The batch being filled, in global document order.

    A batch holds ``batch_size`` documents, or fewer once its lines reach ``batch_bytes``
    (> 0), so a run of huge documents cannot make one batch of gigabytes (the tokenizer
    turns a batch into Python lists of ~40 bytes a token). The readers ask ``full`` only
    when another document arrives (or a file ends), so a batch that ends a file is yielded
    after the file is done, with exact progress.
    """

    def __init__(self, batch_size: int, batch_bytes: int, stats: ReadStats) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        self.batch_bytes = batch_bytes
        self.stats = stats
        self.texts: list[Any] = []
        self.lines: list[int] = []  # per document: its line (columnar: row) in its file
        self.segments: list[tuple[int, int]] = []  # (offset in batch, file index): file starts
        self.text_bytes = 0  # bytes of the lines in ``texts``
        self.next_id = 0  # global id of texts[0]
        # On-disk bytes of the inputs read to the end (files, spans, row-group ranges; an
        # Arrow IPC range counts 0: the caller counts the whole unit once it is done).
        self.done_bytes = 0

    def full(self) -> bool:
        return len(self.texts) == self.batch_size or bool(
            self.batch_bytes and self.text_bytes >= self.batch_bytes
        )

    def start_file(self, file_index: int) -> None:
        self.segments.append((len(self.texts), file_index))

    def add(self, text: Any, line: int, nbytes: int) -> None:
        self.texts.append(text)
        self.lines.append(line)
        self.text_bytes += nbytes

    def settle(self, lines: int, nbytes: int, blank: int = 0) -> None:
        """Bring ``stats`` up to date: documents so far, and lines (rows) read since the last
        call, with their bytes and blank lines."""
        self.stats.documents = self.next_id + len(self.texts)
        self.stats.count(lines, nbytes, blank)

    def end_file(
        self, lines: int, nbytes: int, file_bytes: int, blank: int = 0
    ) -> Iterator[DocBatch]:
        """A file (or its span or range) of ``file_bytes`` on disk is done: count it, and
        yield the batch if it is full."""
        self.done_bytes += file_bytes
        self.stats.files += 1
        self.settle(lines, nbytes, blank)
        if self.full():
            yield self.cut(self.done_bytes)

    def rest(self) -> Iterator[DocBatch]:
        """The last batch, once every file is done (none if it is empty)."""
        if self.texts:
            yield self.cut(self.done_bytes)

    def cut(self, progress_bytes: int, file_index: int | None = None) -> DocBatch:
        """The batch so far, and a new empty one that goes on in file ``file_index`` (None:
        the next document starts a file)."""
        n = len(self.texts)
        file_indices = np.empty(n, dtype=np.int32)
        segments = self.segments
        for i, (start, idx) in enumerate(segments):
            end = segments[i + 1][0] if i + 1 < len(segments) else n
            file_indices[start:end] = idx
        batch = DocBatch(
            texts=self.texts,
            doc_id_start=self.next_id,
            file_index=file_indices,
            position=np.array(self.lines, dtype=np.int64),
            progress_bytes=progress_bytes,
        )
        self.next_id += n
        self.texts, self.lines, self.text_bytes = [], [], 0
        self.segments = [] if file_index is None else [(0, file_index)]
        return batch


@dataclass(frozen=True)
class ReadOptions:
    """What both readers (jsonl: ``iter_batches``; Parquet/Arrow: ``iter_columnar``) are told.

    ``batch_size``: documents a batch; every batch but a file list's last holds exactly this
    many, unless ``batch_bytes`` (> 0) ends it early: a batch closes once its records reach
    that many bytes, so a run of huge documents cannot make one batch of gigabytes (the
    tokenizer turns a batch into Python lists of ~40 bytes a token).

    ``on_bad_line``: a bad record ``"error"`` raises ``BadLineError`` (an ``InputError``)
    ``"file:line: reason"``; ``"skip"`` counts it by reason in ``ReadStats.rejected``, passes it
    to ``rejects`` (if given) and reading goes on.

    ``validate`` replaces the text-field rule for other record kinds (chat, preference): it
    gets the parsed record and returns the value to put in ``DocBatch.texts``, or raises
    ``ValueError`` whose message is the reason (reason key ``bad_record``).
    """

    batch_size: int = 1024
    batch_bytes: int = 0
    on_bad_line: str = "error"
    rejects: Quarantine | None = None
    validate: Callable[[Any], Any] | None = None


class FileReader:
    """One read over a list of files: the batches, the counters and the bad-line policy
    shared by every file; a subclass reads one file (``file``)."""

    def __init__(self, options: ReadOptions, stats: ReadStats | None) -> None:
        self.stats = stats if stats is not None else ReadStats()
        self.batches = Batches(options.batch_size, options.batch_bytes, self.stats)
        self.bad = BadLines(options.on_bad_line, self.stats.rejected, options.rejects)
        self.validate = options.validate

    def read(self, paths: Sequence[Path | str]) -> Iterator[DocBatch]:
        """Every file in order, then the last, partial batch."""
        for file_index, path in enumerate(paths):
            yield from self.file(file_index, path)
        yield from self.batches.rest()

    def file(self, file_index: int, path: Path | str) -> Iterator[DocBatch]:
        raise NotImplementedError
