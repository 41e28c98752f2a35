"""Byte spans of one large uncompressed jsonl file, so several tokenize tasks can share it,
and the line counting that turns a span's line numbers back into the file's own."""

from __future__ import annotations

from pathlib import Path

from packcli.fs import open_binary
from packcli.read.streams import READ_BUFFER


def split_spans(size: int, split_bytes: int) -> list[tuple[int, int]] | None:
    """Byte ranges of at most ``split_bytes`` covering a file of ``size`` bytes, or ``None``
    (read it whole) when it is not larger than that or splitting is off (``split_bytes`` 0)."""
    if split_bytes <= 0 or size <= split_bytes:
        return None
    return [(lo, min(lo + split_bytes, size)) for lo in range(0, size, split_bytes)]


def count_newlines(path: Path | str, end: int) -> int:
    """Newlines in the first ``end`` bytes of ``path``: the number of lines before byte ``end``
    when ``end`` starts a line. Used to turn span-relative line numbers into file lines, on
    the error path only (it reads everything before ``end``)."""
    count = 0
    with open_binary(path) as fh:
        while end > 0 and (block := fh.read(min(end, READ_BUFFER))):
            count += block.count(b"\n")
            end -= len(block)
    return count


class LineBase:
    """Lines before a span's first line, counted once and only when an error needs them."""

    def __init__(self, path: Path | str, first_line_byte: int) -> None:
        self.path = path
        self.first_line_byte = first_line_byte
        self._count: int | None = None if first_line_byte else 0

    def __call__(self) -> int:
        if self._count is None:
            self._count = count_newlines(self.path, self.first_line_byte)
        return self._count


def line_spans(path: Path | str, lo: int, hi: int, step: int) -> list[tuple[int, int]]:
    """Consecutive byte spans of about ``step`` bytes covering ``lo..hi`` of a plain file,
    each after the first starting at a line start: reading the lines that begin in each
    (``iter_batches(span=...)``) reads those that begin in ``lo..hi``, each once, and no
    reader of a later span has part of a line to skip. Found one seek and one line each,
    so a caller can cut a file it is about to hand out in pieces without reading it."""
    if step < 1:
        raise ValueError(f"step must be >= 1, got {step}")
    spans = []
    with open_binary(path) as fh:
        start = lo
        while start < hi:
            cut = start + step
            if cut < hi:
                fh.seek(cut - 1)
                if fh.read(1) != b"\n":
                    cut += len(fh.readline())
            cut = min(cut, hi)
            spans.append((start, cut))
            start = cut
    return spans
