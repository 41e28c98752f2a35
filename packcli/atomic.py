"""Atomic file writes: a file appears under its final name only when complete.

Every writer of packcli that must not leave a torn file (records, manifests, shards, Parquet
files, the plan, quarantines, the card, plots) writes to a temp name beside the target, fsyncs
it and renames it into place (``os.replace``: atomic on POSIX within one folder). A kill
leaves at most a temp file, named ``.NAME.tmp-PID``: hidden, and matched by ``.*.tmp-*``,
which is what the clean-ups and ``packcli push`` look for (keep the pattern).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO


def temp_path(path: Path) -> Path:
    """The temp name a write of ``path`` goes to first (one per process)."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


@contextmanager
def _renamed(path: Path) -> Iterator[Path]:
    """Yield the temp path; rename it to ``path`` when the block ends, remove it on an
    exception (``path`` is then left as it was)."""
    tmp = temp_path(path)
    try:
        yield tmp
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """``with atomic_path(path) as tmp:`` for a writer that takes a file name (pyarrow,
    matplotlib, numpy): what it wrote to ``tmp`` is fsynced and renamed to ``path``."""
    with _renamed(path) as tmp:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())


@contextmanager
def atomic_writer(path: Path) -> Iterator[BinaryIO]:
    """``with atomic_writer(path) as fh:`` streams bytes to a temp file that becomes ``path``
    (flushed, fsynced, renamed) when the block ends without an exception."""
    with _renamed(path) as tmp, open(tmp, "wb") as fh:
        yield fh
        fh.flush()
        os.fsync(fh.fileno())


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_writer(path) as fh:
        fh.write(data)


def json_bytes(obj: Any) -> bytes:
    """How packcli writes its JSON records: sorted keys, 2-space indent, final newline."""
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode("utf-8")


def atomic_write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` to ``path`` atomically as a JSON record (``json_bytes``)."""
    atomic_write_bytes(path, json_bytes(obj))
