"""Tokenize stage: document batches in, Arrow record batches of token ids out.

Tokenization is the physical limit of the whole job (~100x the cost of everything else), so
this stage does as little as possible besides calling the tokenizer: one
``encode_batch_fast`` per batch (parallel in Rust across the batch, and it skips computing
character offsets, ~2x faster than ``encode_batch``), then numpy to add separators and build
Arrow list arrays without per-token Python. Three things overlap, since the tokenizer releases
the GIL: reading/parsing the next batches (a reader thread), tokenizing one batch (a worker
thread driving the tokenizer's own Rust threads), and assembling/writing the previous batch
(the caller's thread).
"""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter, deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import pyarrow as pa

from packcli.arrow_np import list_array, to_arrow  # pa.array would import pandas
from packcli.read import DocBatch
from packcli.tokenize.backends import Encoder, Flat
from packcli.tokenize.shards import SHARD_SCHEMA
from packcli.tokenize.tokenizer import SpecialStringCounter


def assemble(flat: Flat, *, bos: int | None, eos: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Add the separators to a backend's flat output, with numpy (no per-token Python)."""
    ids, offsets = flat
    raw_lengths = np.diff(offsets)
    extra = (bos is not None) + (eos is not None)
    if extra == 0:
        return ids.astype(np.int32, copy=False), raw_lengths
    lengths = raw_lengths + extra
    ends = np.cumsum(lengths)
    starts = ends - lengths
    out = np.empty(int(ends[-1]) if len(ends) else 0, dtype=np.int32)
    body = np.ones(out.size, dtype=bool)  # real tokens keep their order, so a mask places them
    if bos is not None:
        out[starts] = bos
        body[starts] = False
    if eos is not None:
        out[ends - 1] = eos
        body[ends - 1] = False
    out[body] = ids[offsets[0] : offsets[-1]]
    return out, lengths


def batch_to_record_batch(batch: DocBatch, ids: np.ndarray, lengths: np.ndarray) -> pa.RecordBatch:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    input_ids = list_array(offsets, ids, pa.int32())
    n = len(lengths)
    return pa.RecordBatch.from_arrays(
        [
            input_ids,
            to_arrow(lengths, pa.int32()),
            to_arrow(np.arange(batch.doc_id_start, batch.doc_id_start + n, dtype=np.int64)),
            to_arrow(batch.file_index, pa.int32()),
            to_arrow(batch.position, pa.int64()),
        ],
        schema=SHARD_SCHEMA,
    )


@dataclass
class StageTimes:
    """Seconds each part of the tokenize stage was busy, to show what limits it.

    The parts run in different threads at once, so they add up to more than the wall time;
    each field is written by one thread only. When the tokenizer is the limit, ``encode`` is
    close to the wall time and ``wait`` (the caller idle, waiting for the tokenizer) is large.
    """

    read: float = 0.0  # reader thread: reading, decompressing, parsing lines
    encode: float = 0.0  # tokenizer calls (their own threads inside)
    assemble: float = 0.0  # flattening ids into numpy, adding separators
    write: float = 0.0  # Arrow record batches and shard files
    wait: float = 0.0  # the caller waiting for the tokenizer

    @staticmethod
    def ordered(values: dict[str, float]) -> dict[str, float]:
        """``values`` in the stage's own order (JSON records sort their keys)."""
        return {f.name: values[f.name] for f in fields(StageTimes) if f.name in values}

    def add(self, values: dict[str, float]) -> None:
        """Add a unit's recorded times (its completion record's ``times``)."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + values.get(f.name, 0.0))


def _timed_source(source: Iterator[DocBatch], times: StageTimes) -> Iterator[DocBatch]:
    while True:
        t0 = time.perf_counter()
        item = next(source, None)
        times.read += time.perf_counter() - t0
        if item is None:
            return
        yield item


def prefetch(
    source: Iterator[DocBatch], depth: int = 4, times: StageTimes | None = None
) -> Iterator[DocBatch]:
    """Run ``source`` in a background thread, ``depth`` batches ahead.

    Exceptions raised by the reader (e.g. a malformed line) are re-raised in the consumer at
    the point in the stream where they happened, so error order is the input order.
    """
    if times is not None:
        source = _timed_source(source, times)
    q: queue.Queue[Any] = queue.Queue(maxsize=depth)  # batches, an error, then ``done``
    done = object()
    stop = threading.Event()

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for item in source:
                if not put(item):
                    return
            put(done)
        except BaseException as exc:  # handed to the consumer, never swallowed
            put(exc)

    thread = threading.Thread(target=run, name="packcli-reader", daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join(timeout=5)


# Batches queued for the tokenizer worker ahead of the writer.
ENCODE_AHEAD = 3


def tokenize_batches(
    batches: Iterator[DocBatch],
    encoder: Encoder,
    *,
    bos: int | None,
    eos: int | None,
    times: StageTimes | None = None,
    count_specials: tuple[SpecialStringCounter, Counter[str]] | None = None,
) -> Iterator[tuple[DocBatch, pa.RecordBatch]]:
    """Tokenize the next batches in a worker thread while batch i is written.

    The tokenizer releases the GIL while it works, so the Python-side work of the previous
    batch (building Arrow arrays, writing shards) overlaps it instead of leaving the
    tokenizer's threads idle. The worker also flattens the ids it got back: the per-document
    lists are made and consumed in one thread, without a GIL hand-off between (measured ~5%
    less CPU than flattening in the caller). Order is preserved. ``count_specials``: a
    counter and the ``Counter`` it adds the special-token strings of the documents to (in
    the worker thread; read it after the iterator is exhausted).
    """
    times = times if times is not None else StageTimes()

    def encode(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        t0 = time.perf_counter()
        encoded = encoder(texts)
        if count_specials is not None:
            count_specials[0](texts, count_specials[1])
        t1 = time.perf_counter()
        flat = assemble(encoded, bos=bos, eos=eos)
        times.encode += t1 - t0
        times.assemble += time.perf_counter() - t1
        return flat

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="packcli-encode") as pool:
        # Up to ENCODE_AHEAD batches queued for the worker: a shard flush in the caller (a
        # second or more at the end of a shard) then does not leave the tokenizer idle.
        pending: deque[tuple[DocBatch, Future[tuple[np.ndarray, np.ndarray]]]] = deque()
        for batch in batches:
            pending.append((batch, pool.submit(encode, batch.texts)))
            if len(pending) > ENCODE_AHEAD:
                yield _finish(pending.popleft(), times)
        while pending:
            yield _finish(pending.popleft(), times)


def _finish(
    pending: tuple[DocBatch, Future[tuple[np.ndarray, np.ndarray]]], times: StageTimes
) -> tuple[DocBatch, pa.RecordBatch]:
    batch, future = pending
    t0 = time.perf_counter()
    ids, lengths = future.result()
    t1 = time.perf_counter()
    record_batch = batch_to_record_batch(batch, ids, lengths)
    times.wait += t1 - t0
    times.write += time.perf_counter() - t1  # Arrow arrays for the shard writer
    return batch, record_batch
