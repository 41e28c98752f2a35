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
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import chain

import numpy as np
import pyarrow as pa

from packcli.read import DocBatch
from packcli.shards import SHARD_SCHEMA
from packcli.tokenizer import BatchEncoder


def encode_texts(
    encoder: BatchEncoder, texts: list[str], *, bos: int | None, eos: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of ``texts`` back to back (int32) and each document's length (int64)."""
    return assemble(encoder(texts), bos=bos, eos=eos)


def assemble(
    id_lists: Sequence[Sequence[int]], *, bos: int | None, eos: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """Flatten per-document ids and add the separators, with numpy (no per-token Python)."""
    raw_lengths = np.fromiter((len(ids) for ids in id_lists), dtype=np.int64, count=len(id_lists))
    flat = np.fromiter(chain.from_iterable(id_lists), dtype=np.int32, count=int(raw_lengths.sum()))
    extra = (bos is not None) + (eos is not None)
    if extra == 0:
        return flat, raw_lengths
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
    out[body] = flat
    return out, lengths


def batch_to_record_batch(batch: DocBatch, ids: np.ndarray, lengths: np.ndarray) -> pa.RecordBatch:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    input_ids = pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids, type=pa.int32()))
    n = len(lengths)
    return pa.RecordBatch.from_arrays(
        [
            input_ids,
            pa.array(lengths.astype(np.int32)),
            pa.array(np.arange(batch.doc_id_start, batch.doc_id_start + n, dtype=np.int64)),
            pa.array(batch.file_index.astype(np.int32)),
            pa.array(batch.line.astype(np.int64)),
        ],
        schema=SHARD_SCHEMA,
    )


def prefetch(source: Iterator[DocBatch], depth: int = 4) -> Iterator[DocBatch]:
    """Run ``source`` in a background thread, ``depth`` batches ahead.

    Exceptions raised by the reader (e.g. a malformed line) are re-raised in the consumer at
    the point in the stream where they happened, so error order is the input order.
    """
    q: queue.Queue = queue.Queue(maxsize=depth)
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


def tokenize_batches(
    batches: Iterator[DocBatch],
    encoder: BatchEncoder,
    *,
    bos: int | None,
    eos: int | None,
) -> Iterator[tuple[DocBatch, pa.RecordBatch]]:
    """Tokenize batch i+1 in a worker thread while batch i is assembled and written.

    The tokenizer releases the GIL while it works, so the Python-side work of the previous
    batch (flattening ids, building Arrow arrays, writing shards) overlaps it instead of
    leaving the tokenizer's threads idle. Order is preserved.
    """
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="packcli-encode") as pool:
        pending: tuple[DocBatch, Future] | None = None
        for batch in batches:
            future = pool.submit(encoder, batch.texts)
            if pending is not None:
                yield _finish(pending, bos, eos)
            pending = (batch, future)
        if pending is not None:
            yield _finish(pending, bos, eos)


def _finish(
    pending: tuple[DocBatch, Future], bos: int | None, eos: int | None
) -> tuple[DocBatch, pa.RecordBatch]:
    batch, future = pending
    ids, lengths = assemble(future.result(), bos=bos, eos=eos)
    return batch, batch_to_record_batch(batch, ids, lengths)
