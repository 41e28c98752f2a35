"""Tokenized shards: size-bounded, uncompressed Arrow IPC files plus a JSON manifest each.

Why uncompressed IPC: the writer gathers documents in *plan* order, which is unrelated to
input order, so it needs random access to every document's tokens. Memory-mapped IPC files
give that with zero copies and let the OS page cache do the work; a compressed format would
force decompressing whole shards per access. The planner reads only the ``length`` column,
which the IPC reader can load alone.

Every shard is written under a temporary name and renamed into place, and its manifest
(counts, document range, sha256) is written the same way *after* the shard, so a shard with
a manifest is complete. Each input file gets its own series of shards (so tokenize tasks can
split the files); the index ``_SUCCESS.json`` lists every shard in input order with its
global first document id, and marks the whole stage complete for one fingerprint.
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, overload

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from packcli.arrow_np import list_array, to_arrow, to_numpy
from packcli.atomic import atomic_path, atomic_write_json
from packcli.records import RecordError
from packcli.tokenize.records import (
    SUCCESS,
    IndexedShard,
    ShardError,
    ShardIndex,
    ShardManifest,
    damaged,
)

SHARD_SCHEMA = pa.schema(
    [
        pa.field("input_ids", pa.list_(pa.int32())),
        pa.field("length", pa.int32()),
        pa.field("doc_index", pa.int64()),  # position in its input file (global ids come later)
        pa.field("file_index", pa.int32()),  # when tokenized; the index's entry is current
        pa.field("line", pa.int64()),
    ]
)
# Chat shards add per-token labels (-100 = no loss), gathered exactly like the tokens.
CHAT_SHARD_SCHEMA = SHARD_SCHEMA.append(pa.field("labels", pa.list_(pa.int32())))
# Preference shards hold each pair as one document (prompt+chosen, then prompt+rejected) and
# the length of its first sequence (0: not a pair, e.g. a dropped one); see packcli.chat.preference.
PREFERENCE_SHARD_SCHEMA = CHAT_SHARD_SCHEMA.append(pa.field("chosen_len", pa.int32()))


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.arrow"


def manifest_name(index: int) -> str:
    return f"shard-{index:05d}.json"


class _Growing:
    """A numpy array appended to batch by batch, doubling when full.

    A shard's columns are built this way as batches arrive, in the seconds the caller waits
    for the tokenizer, instead of all at once when the shard is written (pyarrow's
    ``combine_chunks`` of the held batches: a second copy of the shard, ~0.5 s of fresh
    pages at the end of the stage for 48M tokens). numpy asks for transparent huge pages on
    large arrays, and a reserved capacity costs no memory until it is written.
    """

    def __init__(self, dtype: np.dtype, capacity: int) -> None:
        self.data = np.empty(max(1, capacity), dtype=dtype)
        self.size = 0

    def extend(self, values: np.ndarray) -> None:
        end = self.size + values.size
        if end > self.data.size:
            grown = np.empty(max(end, 2 * self.data.size), dtype=self.data.dtype)
            grown[: self.size] = self.data[: self.size]
            self.data = grown
        self.data[self.size : end] = values
        self.size = end

    def view(self) -> np.ndarray:
        return self.data[: self.size]

    def clear(self) -> None:
        """Empty again, keeping the array (and its pages) for the next shard."""
        self.size = 0


class _Column:
    """One shard column being collected: a flat numeric column, or a list column as its
    values and each row's list length."""

    def __init__(self, field: pa.Field, tokens: int) -> None:
        self.field = field
        self.is_list = pa.types.is_list(field.type)
        if self.is_list:
            # A shard is flushed once it holds ``tokens``: its last batch goes past them.
            # Reserved, not touched, room for it: outgrowing the array would copy the
            # whole shard into fresh pages at its very end.
            room = tokens + tokens // 4
            self.values = _Growing(np.dtype(field.type.value_type.to_pandas_dtype()), room)
            self.lengths = _Growing(np.dtype(np.int64), 1 << 16)
        else:
            self.values = _Growing(np.dtype(field.type.to_pandas_dtype()), 1 << 16)

    def extend(self, array: pa.Array) -> None:
        if array.null_count:
            raise ValueError(f"shard column {self.field.name} has nulls")
        if not self.is_list:
            self.values.extend(to_numpy(array))
            return
        offsets = to_numpy(array.offsets)  # of the slice: they index the unsliced values
        self.values.extend(to_numpy(array.values)[offsets[0] : offsets[-1]])
        self.lengths.extend(np.diff(offsets))

    def clear(self) -> None:
        self.values.clear()
        if self.is_list:
            self.lengths.clear()

    def array(self) -> pa.Array:
        if not self.is_list:
            return to_arrow(self.values.view(), self.field.type)
        lengths = self.lengths.view()
        offsets = np.zeros(lengths.size + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        if offsets[-1] >= 2**31:
            raise ValueError("a tokenized shard exceeds 2**31 tokens; lower tokenize.shard_tokens")
        return list_array(offsets, self.values.view(), self.field.type.value_type)


class _HashingFile:
    """A binary file that hashes what is written to it (for ``pa.PythonFile``): the shard's
    sha256 without reading the file back (Arrow writes its buffers whole: ~20 calls)."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw = raw
        self.digest = hashlib.sha256()
        self.closed = False

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        return self.raw.write(data)

    def flush(self) -> None:
        self.raw.flush()

    def close(self) -> None:
        self.closed = True


class ShardWriter:
    """Collects tokenized record batches and rolls over to a new shard every ``shard_tokens``.

    Use as a context manager; ``close`` flushes the last partial shard. A shard is visible
    under its final name only once complete (temp file + rename).
    """

    def __init__(
        self,
        folder: Path,
        shard_tokens: int,
        done: list[ShardManifest] | None = None,
        schema: pa.Schema = SHARD_SCHEMA,
        *,
        behind: bool = False,
    ) -> None:
        """``done``: manifests of shards a previous, interrupted run completed; new shards
        continue the numbering after them. ``behind``: a full shard is written on a thread
        while the next one fills (at most one being written: two shards' columns in memory),
        so only the last shard's write is left when the input ends; ``manifests`` then
        lists a shard once it is on disk, in order, and ``close`` waits for them all."""
        self.schema = schema
        self.folder = folder
        self.shard_tokens = shard_tokens
        self.folder.mkdir(parents=True, exist_ok=True)
        self.manifests: list[ShardManifest] = list(done or [])
        # A written shard's columns, emptied for the next shard to fill (``_recycle``).
        self._spare: list[_Column] | None = None
        self._columns = self._empty_columns()
        self._pending_rows = 0
        self._pending_tokens = 0
        self.flush_seconds = 0.0  # time spent writing shards, for the stage breakdown
        self._behind = ThreadPoolExecutor(1, "packcli-shards") if behind else None
        self._writing: Future[None] | None = None

    def _empty_columns(self) -> list[_Column]:
        spare, self._spare = self._spare, None
        return spare if spare is not None else [_Column(f, self.shard_tokens) for f in self.schema]

    def _recycle(self, columns: list[_Column]) -> None:
        """Keep a written shard's arrays for a later shard.

        Why: a shard's columns are ~8 bytes a token of fresh memory, and first touching
        fresh pages costs more than filling them (the kernel zeroes each page, and on a VM
        the host backs it too): a 150 MB chat pack's main thread spent ~0.6 s of its CPU
        there. The arrays are only reused once nothing but the writer holds them (the
        written batch, and any view of it, is gone), and only by ``_empty_columns`` after
        ``_wait``: never while the shard is being written. Written in line, a shard's
        arrays fill the next shard (one set, as before); written behind, the set written
        before fills the next while this one is written (two, as before)."""
        arrays = [a for c in columns for a in ((c.values, c.lengths) if c.is_list else (c.values,))]
        # Held by the _Growing only (getrefcount counts its own argument): no view escaped.
        if all(sys.getrefcount(a.data) == 2 for a in arrays):
            for column in columns:
                column.clear()
            self._spare = columns

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
        elif self._behind is not None:  # the shard being written finishes (or fails) alone
            self._behind.shutdown(wait=True)

    def add(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        if not batch.schema.equals(self.schema):
            raise ValueError(f"batch schema {batch.schema} is not the shards' {self.schema}")
        for column, array in zip(self._columns, batch.columns, strict=True):
            column.extend(array)
        self._pending_rows += batch.num_rows
        self._pending_tokens += int(to_numpy(batch.column("length")).sum(dtype=np.int64))
        if self._pending_tokens >= self.shard_tokens:
            self._flush()

    def close(self) -> None:
        try:
            if self._pending_rows:
                self._flush(last=True)
            self._wait()
        finally:
            # No shard follows: a written shard's arrays (resident) go with the writer's use.
            self._spare = None
            self._columns = []
            if self._behind is not None:
                self._behind.shutdown(wait=True)

    def _wait(self) -> None:
        """Until the shard being written is on disk (its error, if any, raised here)."""
        if self._writing is not None:
            writing, self._writing = self._writing, None
            writing.result()

    def _flush(self, last: bool = False) -> None:
        columns, tokens = self._columns, self._pending_tokens
        self._pending_rows = 0
        self._pending_tokens = 0
        self._wait()  # one shard written at a time, in order (its columns then spare)
        if self._behind is None or last:
            self._write_shard(columns, tokens)
            self._columns = self._empty_columns()  # in line: its own arrays again (one set)
        else:
            self._columns = self._empty_columns()  # the shard written behind before it's
            self._writing = self._behind.submit(self._write_shard, columns, tokens)

    def _write_shard(self, columns: list[_Column], tokens: int) -> None:
        t0 = time.perf_counter()
        index = len(self.manifests)
        final = self.folder / shard_name(index)
        # One record batch per file, so readers get zero-copy contiguous columns.
        batch = pa.RecordBatch.from_arrays([c.array() for c in columns], schema=self.schema)
        with atomic_path(final) as tmp, open(tmp, "wb") as raw:
            hashing = _HashingFile(raw)
            with (
                pa.PythonFile(hashing, mode="w") as sink,
                pa.ipc.new_file(sink, self.schema) as writer,
            ):
                writer.write_batch(batch)
        doc_index = columns[self.schema.get_field_index("doc_index")].values.view()
        manifest = ShardManifest(
            file=final.name,
            num_docs=batch.num_rows,
            num_tokens=tokens,
            first_doc_index=int(doc_index[0]),
            last_doc_index=int(doc_index[-1]),
            sha256=hashing.digest.hexdigest(),
            bytes=final.stat().st_size,  # a cheap check that the shard is still whole
        )
        atomic_write_json(self.folder / manifest_name(index), manifest.to_json())
        self.manifests.append(manifest)
        del batch, doc_index
        self._recycle(columns)
        self.flush_seconds += time.perf_counter() - t0


def distinct_shards(shard_of: np.ndarray) -> np.ndarray:
    """The distinct shard indexes (non-negative) in ``shard_of``, ascending, as ``np.unique``
    gives them; without ``np.unique``, whose first call imports ``numpy.ma`` (10-30 ms of a
    small pack, measured)."""
    return np.flatnonzero(np.bincount(shard_of))


def shard_intact(folder: Path, manifest: ShardManifest) -> bool:
    """Whether the shard a manifest describes is still there and whole, for reuse: its size,
    its Arrow footer, and its content against the sha256 taken
    as it was written (a shard edited in place, same size and still valid Arrow, was reused
    and vouched for; re-hashing costs one read of the shard, a small part of tokenizing it).
    A truncated shard made ``verify`` and ``pack`` fail with pyarrow's traceback; ``pack``
    now rebuilds either."""
    path = folder / manifest.file
    try:
        if path.stat().st_size != manifest.bytes:
            return False
        with pa.memory_map(str(path), "r") as source:
            reader = pa.ipc.open_file(source)
            if reader.num_record_batches != 1:
                return False
        return sha256_file(path) == manifest.sha256
    except (OSError, pa.ArrowException):
        return False


@dataclass
class ShardTokens:
    """One memory-mapped shard: flat token values plus per-document offsets into them."""

    values: npt.NDArray[np.int32]  # all tokens of the shard back to back
    offsets: npt.NDArray[np.int64]  # len num_docs + 1
    first_doc_id: int
    labels: npt.NDArray[np.int32] | None = None  # aligned with values (chat shards only)
    chosen_len: npt.NDArray[np.int32] | None = None  # per document (preference shards only)
    # Tail shards only, per entry: the length of the document the entry is a piece of (its
    # tokens are then a piece, not the whole document). None: each entry is a document.
    doc_len: npt.NDArray[np.int64] | None = None


def shard_tokens(batch: pa.RecordBatch, first_doc_id: int, name: str) -> ShardTokens:
    """A shard's record batch as arrays (memory-mapped, no copy): tokens, per-document
    offsets, and the labels (chat) and pair lengths (preference) when the batch has them;
    the token shards and the tail shards of the write stage share this layout."""
    ids = batch.column("input_ids")
    # Offsets index into the (unsliced) child array, so values and offsets stay consistent.
    offsets = to_numpy(ids.offsets).astype(np.int64)
    labels = None
    if "labels" in batch.schema.names:
        lab = batch.column("labels")
        if not np.array_equal(to_numpy(lab.offsets), to_numpy(ids.offsets)):
            raise ValueError(f"shard {name}: labels misaligned")
        labels = to_numpy(lab.values)
    chosen_len = None
    if "chosen_len" in batch.schema.names:
        chosen_len = to_numpy(batch.column("chosen_len"))
    doc_len = None
    if "doc_len" in batch.schema.names:
        doc_len = to_numpy(batch.column("doc_len"))
    return ShardTokens(
        values=to_numpy(ids.values),
        offsets=offsets,
        first_doc_id=first_doc_id,
        labels=labels,
        chosen_len=chosen_len,
        doc_len=doc_len,
    )


class TokenShards:
    """Read access to a completed tokenize stage, through its index.

    ``store``: the work folder on object storage (``packcli.stages.workstore``) when ``folder``
    is its local mirror: a shard not in the mirror is then read from the store, only the
    columns asked for by ranged reads, or whole (fetched once) when its tokens are wanted."""

    def __init__(self, folder: Path, store: Any = None) -> None:
        self.folder = folder
        self.store = store if store is not None and store.remote else None
        success = folder / SUCCESS
        if not success.is_file():
            raise FileNotFoundError(f"no completed tokenize stage in {folder}")
        try:
            # A damaged or older index is the stage's damage (``ShardError``), as its shards'.
            self.success = ShardIndex.from_json(json.loads(success.read_bytes()), success)
        except RecordError as exc:
            raise ShardError(str(exc)) from exc
        except ValueError as exc:  # not JSON
            raise damaged(success, exc) from exc
        self.manifests: list[IndexedShard] = self.success.shards
        self.first_doc_ids = np.array([m.first_doc_id for m in self.manifests], dtype=np.int64)

    @property
    def num_docs(self) -> int:
        return sum(m.num_docs for m in self.manifests)

    def __len__(self) -> int:
        return len(self.manifests)

    def _source(self, index: int, ranged: bool) -> Any:
        """One shard's bytes: memory-mapped from the folder, or from the store (ranged reads,
        or the whole shard fetched into the mirror first)."""
        rel = self.manifests[index].file
        path = self.folder / rel
        if self.store is None or path.is_file():
            return pa.memory_map(str(path), "r")
        remote = f"{self.folder.name}/{rel}"
        if ranged:
            return pa.PythonFile(self.store.open(remote), mode="r")
        fetched = self.store.fetch(remote, self.manifests[index].bytes)
        return pa.memory_map(str(fetched), "r")

    def column_names(self) -> list[str]:
        """The shards' columns (the stage's schema), from the first shard's footer."""
        if not self.manifests:
            return []
        try:
            return list(pa.ipc.open_file(self._source(0, ranged=True)).schema.names)
        except (OSError, pa.ArrowException) as exc:
            raise damaged(self.folder / self.manifests[0].file, exc) from exc

    def _reader(self, index: int, fields: list[str] | None = None) -> pa.ipc.RecordBatchFileReader:
        """Memory-mapped reader of one shard; ``fields`` limits what is read to those columns."""
        path = self.folder / self.manifests[index].file
        try:
            source = self._source(index, ranged=fields is not None)
            if fields is None:
                return pa.ipc.open_file(source)
            opts = pa.ipc.IpcReadOptions(
                # Every shard schema extends the one before it, so indexes agree.
                included_fields=[PREFERENCE_SHARD_SCHEMA.get_field_index(f) for f in fields]
            )
            return pa.ipc.open_file(source, options=opts)
        except (OSError, pa.ArrowException) as exc:
            raise damaged(path, exc) from exc

    def _read_column(self, index: int, name: str) -> pa.ChunkedArray:
        try:
            return self._reader(index, [name]).read_all().column(0)
        except pa.ArrowException as exc:
            raise damaged(self.folder / self.manifests[index].file, exc) from exc

    def shard_column(self, index: int, name: str) -> np.ndarray:
        """One scalar column of one shard (reads only that column)."""
        return to_numpy(self._read_column(index, name))

    def column(self, name: str) -> np.ndarray:
        """One scalar column over all shards, in doc-id order (reads only that column)."""
        parts = [self.shard_column(i, name) for i in range(len(self))]
        if not parts:
            return np.zeros(0, dtype=PREFERENCE_SHARD_SCHEMA.field(name).type.to_pandas_dtype())
        return np.concatenate(parts)

    def value(self, name: str, doc_id: int) -> Any:
        """One scalar column's value for one document (reads only its shard's column)."""
        index = int(np.searchsorted(self.first_doc_ids, doc_id, side="right")) - 1
        manifest = self.manifests[index]
        column = self._read_column(index, name)
        value = column[doc_id - manifest.first_doc_id].as_py()
        if name == "file_index":
            # The index knows the unit's place in *this* run's inputs; a reused shard's column
            # holds its place when it was tokenized (files may have been added since).
            value += manifest.file_index - manifest.tokenized_file_index
        if name == "line":  # a shard of a byte span counts lines from the span's first line
            value += manifest.first_line
        return value

    def check_content(self, index: int) -> None:
        """Raise ``ShardError`` naming the shard when its bytes are not those the index
        recorded as written (``sha256``): an edited shard can still be valid Arrow of the same
        size, and its tokens would then be what the output is checked against. A shard on
        the store is fetched whole first (``verify`` reads all of it anyway)."""
        manifest = self.manifests[index]
        rel = manifest.file
        path = self.folder / rel
        if self.store is not None and not path.is_file():
            path = self.store.fetch(f"{self.folder.name}/{rel}", manifest.bytes)
        try:
            size = path.stat().st_size
            if size != manifest.bytes:
                raise damaged(path, f"{size} bytes, written as {manifest.bytes}")
            same = sha256_file(path) == manifest.sha256
        except OSError as exc:
            raise damaged(path, exc) from exc
        if not same:
            raise ShardError(
                f"{path}: tokenized shard changed since it was written (its sha256 differs "
                "from the one its manifest and the index record): rerun the same packcli pack "
                "or tokenize command to tokenize its unit again (`packcli verify --no-shards` "
                "checks the output without the work folder)"
            )

    def shard(self, index: int) -> ShardTokens:
        reader = self._reader(index)
        name = self.manifests[index].file
        if reader.num_record_batches != 1:
            raise ValueError(f"shard {name} is not a single record batch")
        first = self.manifests[index].first_doc_id
        return shard_tokens(reader.get_batch(0), first, name)

    def column_at(self, name: str, docs: np.ndarray) -> np.ndarray:
        """One scalar column's values for ``docs`` (global doc ids, any order), reading that
        column of only the shards they are in, one shard at a time."""
        out = np.zeros(docs.size, dtype=np.int64)
        shard_of = np.searchsorted(self.first_doc_ids, docs, "right") - 1
        for s in distinct_shards(shard_of):
            m = shard_of == s
            out[m] = self.shard_column(int(s), name)[docs[m] - self.first_doc_ids[s]]
        return out

    def iter_shards(self, *, check: bool = False) -> Iterator[ShardTokens]:
        """Every shard in order; ``check``: each one's content against its sha256 first."""
        for i in range(len(self)):
            if check:
                self.check_content(i)
            yield self.shard(i)


class LazyShards(Sequence[ShardTokens]):
    """The shards of a stage, each loaded when first indexed and kept (thread-safe): a write
    task whose work folder is on a store fetches only the shards its rows use."""

    def __init__(self, shards: TokenShards) -> None:
        self._shards = shards
        self._loaded: dict[int, ShardTokens] = {}
        self._locks = [threading.Lock() for _ in range(len(shards))]

    def __len__(self) -> int:
        return len(self._shards)

    @overload
    def __getitem__(self, index: int) -> ShardTokens: ...

    @overload
    def __getitem__(self, index: slice) -> list[ShardTokens]: ...

    def __getitem__(self, index: int | slice) -> ShardTokens | list[ShardTokens]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        with self._locks[index]:
            if index not in self._loaded:
                self._loaded[index] = self._shards.shard(index)
            return self._loaded[index]
