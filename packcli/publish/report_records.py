"""The report's sections that have a schema of their own (``packcli.json``'s ``report``):
what was read, the largest document, and a mixture source's share of a config.

Why a module apart from ``report.py``: finalize builds ``InputFiles`` from the tokenize
stage's index and the report's readers (the terminal's lines, the warnings) read these back,
so the schema lives here once, beside neither of them. Fields are in the order
``packcli.json`` lists them: their bytes are the output's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from packcli.pack.mixture import WindowSpread
from packcli.records import Fields


@dataclass(frozen=True)
class InputFiles(Fields):
    """``report.input`` as reading gave it: files, blank lines, bytes, lines rejected (by
    reason) and compressed files cut short."""

    files: int
    blank_lines: int
    bytes: int
    rejected_lines: int
    rejected: dict[str, int]
    # Only when a file failed, so other reports (and their bytes) stay as they were.
    corrupt_streams: list[dict[str, Any]] | None = field(default=None, metadata={"omit": True})


@dataclass(frozen=True, kw_only=True)
class InputReport(InputFiles):
    """``report.input``: the files' figures, then the documents and their tokens as
    encoded (before any length limit: what the encoders removed counts here too)."""

    documents: int
    tokens: int

    @classmethod
    def of(cls, files: InputFiles, documents: int, tokens: int) -> InputReport:
        read = {f.name: getattr(files, f.name) for f in dataclasses.fields(InputFiles)}
        return cls(**read, documents=documents, tokens=tokens)


@dataclass(frozen=True)
class Provenance(Fields):
    """Where a document was read: its file and its line (1-based) of a jsonl file or its
    row (0-based) of a Parquet/Arrow file."""

    file: str
    line: int | None = field(default=None, metadata={"omit": True})
    row: int | None = field(default=None, metadata={"omit": True})


@dataclass(frozen=True)
class LargestDocument(Fields):
    """``report.largest_document``: its doc id (-1: no document), tokens and, where known,
    where it was read (``Provenance``'s fields)."""

    doc_id: int
    tokens: int
    file: str | None = field(default=None, metadata={"omit": True})
    line: int | None = field(default=None, metadata={"omit": True})
    row: int | None = field(default=None, metadata={"omit": True})

    @classmethod
    def at(cls, doc_id: int, tokens: int, where: Provenance | None) -> LargestDocument:
        if where is None:
            return cls(doc_id, tokens)
        return cls(doc_id, tokens, where.file, where.line, where.row)


@dataclass(frozen=True)
class SourceShare(Fields):
    """``report.mixture.sources[i].<config>``: a source's tokens in a config, its realised
    share of them, and that share's deviation over the windows of one step (``WindowSpread``:
    the row order's largest and 99th percentile, the shuffled order's largest, and for a
    grouped plan the largest over steps that straddle two groups)."""

    tokens: int
    share: float
    window_max_deviation: float
    window_p99_deviation: float
    shuffled_window_max_deviation: float
    straddling_window_max_deviation: float | None = field(default=None, metadata={"omit": True})
    # The long config: the least largest deviation any order of its rows can reach at this
    # step (``packcli.pack.exchange.piece_bound``: a step holding the source's largest unit).
    piece_bound: float | None = field(default=None, metadata={"omit": True})

    @classmethod
    def of(cls, w: WindowSpread, source: int) -> SourceShare:
        """Source ``source``'s share of the config whose windows ``w`` measured."""
        total = sum(w.tokens)
        straddling = w.straddling_max_deviation
        return cls(
            piece_bound=None if w.piece_bound is None else w.piece_bound[source],
            tokens=int(w.tokens[source]),
            share=round(w.tokens[source] / total, 6) if total else 0.0,
            window_max_deviation=w.max_deviation[source],
            window_p99_deviation=w.p99_deviation[source],
            shuffled_window_max_deviation=w.shuffled_max_deviation[source],
            straddling_window_max_deviation=None if straddling is None else straddling[source],
        )
