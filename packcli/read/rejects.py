"""The bad-line policy (``--on-bad-line``): stop at a bad line with ``file:line`` and why, or
count it by reason and quarantine its exact bytes in ``rejected.jsonl``.

Shared by the jsonl and the columnar reader, so both count and quarantine alike; why a line
is bad is decided apart (``packcli/read/bad_lines.py``).
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, Protocol

from packcli.atomic import temp_path
from packcli.errors import InputError
from packcli.names import BAD_LINE_POLICIES


class BadLineError(InputError):
    """A line (or compressed stream) refused under ``on_bad_line="error"``.

    An ``InputError`` like any other for the CLI; the fields let callers and tests tell the
    cases apart without parsing the message.
    """

    def __init__(self, file: str, line: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.file = file
        self.line = line
        self.reason = reason


_RAW_KEY = b', "raw_b64": "'


def _reject_record(file: str, line: int, reason: str, detail: str, raw_b64: bytes) -> bytes:
    # stdlib json with ensure_ascii: a file name that is not valid UTF-8 (surrogateescape) is
    # still written, as \udcXX escapes, where orjson would raise. The base64 is spliced in as
    # bytes: it needs no escaping, and json.dumps takes ~1 s per 40 MB to find that out.
    head = json.dumps({"file": file, "line": line, "reason": reason, "detail": detail})
    return b"".join((head[:-1].encode("ascii"), _RAW_KEY, raw_b64, b'"}\n'))


def shift_reject_lines(source: BinaryIO, sink: BinaryIO, offset: int) -> None:
    """Copy ``rejected.jsonl`` records adding ``offset`` to each ``line``: a span's records
    count lines from the span, and become file lines once the spans before it are counted."""
    for record in source:
        head, _, raw = record.partition(_RAW_KEY)
        meta = json.loads(head + b"}")
        meta["line"] += offset
        sink.write(_reject_record(**meta, raw_b64=raw.removesuffix(b'"}\n')))


class RejectSink:
    """Quarantine for rejected lines: one JSON object per line in ``path`` (``rejected.jsonl``).

    Each record is ``{"file", "line", "reason", "detail", "raw_b64"}``: ``raw_b64`` is the
    base64 of the line's exact bytes (terminator included, so a truncated last line shows as
    such; invalid UTF-8 survives, which no JSON string could carry). Records are streamed to
    a temp file as they come, so memory stays flat however many lines are bad. Closing
    without error renames the temp file to ``path``; leaving the ``with`` block on an
    exception discards it, so ``path`` only ever holds a complete quarantine. No file is
    created when nothing was rejected.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.count = 0
        # packcli.atomic's temp name and its flush, fsync, rename (in ``close``): its writers
        # are ``with`` blocks, and this one stays open across calls and may never be opened.
        self._tmp = temp_path(self.path)
        self._fh: BinaryIO | None = None
        self._closed = False

    def add(self, file: str, line: int, reason: str, raw: bytes, detail: str = "") -> None:
        """Quarantine one line: ``file:line`` as reported, a reason key, the raw bytes."""
        if self._closed:
            raise ValueError(f"RejectSink({self.path}) is closed")
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self._tmp, "wb")  # noqa: SIM115 (closed in close/abort)
        self._fh.write(_reject_record(file, line, reason, detail, base64.b64encode(raw)))
        self.count += 1

    def close(self) -> None:
        """Publish the quarantine (fsync, rename); a no-op if nothing was rejected."""
        if self._closed:
            return
        self._closed = True
        fh, self._fh = self._fh, None
        if fh is None:
            return
        fh.flush()
        os.fsync(fh.fileno())
        fh.close()
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        """Discard what was written so far; ``path`` is left untouched."""
        self._closed = True
        fh, self._fh = self._fh, None
        if fh is not None:
            fh.close()
            self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> RejectSink:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


class Quarantine(Protocol):
    """Where skipped lines go: a ``RejectSink``, or a ``RejectList`` to hand them on."""

    def add(self, file: str, line: int, reason: str, raw: bytes, detail: str = "") -> None: ...


class RejectList:
    """Rejected lines kept in memory, in order, for another process's ``RejectSink`` (a chat
    rendering worker reads a span of the file; the task's process owns the quarantine)."""

    def __init__(self) -> None:
        self.records: list[tuple[str, int, str, bytes, str]] = []

    def add(self, file: str, line: int, reason: str, raw: bytes, detail: str = "") -> None:
        self.records.append((file, line, reason, raw, detail))


class BadLines:
    """One read's bad-line policy: whether to skip, and where skipped lines are counted
    (``ReadStats.rejected``, by reason key) and quarantined (``rejects``, if given)."""

    def __init__(
        self, on_bad_line: str, rejected: dict[str, int], rejects: Quarantine | None
    ) -> None:
        if on_bad_line not in BAD_LINE_POLICIES:
            raise ValueError(f"on_bad_line must be one of {BAD_LINE_POLICIES}, got {on_bad_line!r}")
        self.skip = on_bad_line == "skip"
        self.rejected = rejected
        self.rejects = rejects

    def skipped(self, file: str, line: int, reason: str, message: str, raw: bytes) -> None:
        """Count a line dropped under ``skip`` and quarantine its bytes."""
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        if self.rejects is not None:
            self.rejects.add(file, line, reason, raw, message)
