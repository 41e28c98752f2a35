"""Chat records (dialogues or preference pairs) through their encoder, batch by batch, with
the work overlapped: the template renders batch i+1 (Python) while the fast backend tokenizes
batch i on a thread, or batches render on worker processes a few ahead
(``packcli.chat.render_pool``) while this thread tokenizes and masks those before them, or,
for a plain jsonl file (``tokenize_chat_spans``), the workers also read and parse byte
spans of it and hand back columns. Imported on every run, text runs included: the template
modules load only when used.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from packcli.chat.encoder import ChatEncoder, Counts, EncodedRecords
from packcli.errors import PackcliError
from packcli.read import DocBatch, ReadStats
from packcli.read.rejects import Quarantine
from packcli.tokenize.encode import StageTimes

if TYPE_CHECKING:
    from packcli.chat.preference import PreferenceEncoder
    from packcli.chat.render_pool import ReadSpan, RenderPool, SpanBatch, SpanRead


def _shard_rows(
    batch: DocBatch,
    encoded: EncodedRecords,
    t0: float,
    on_failure: Callable[[DocBatch, int, str], None],
    stats: Counts,
    times: StageTimes,
) -> tuple[DocBatch, pa.RecordBatch]:
    """An encoded batch handed on, the same way whichever path encoded it (rendered here or
    on a worker): the template's refusals through the bad-line policy, its counts added,
    its shard rows built; ``encode`` timed from ``t0``, the Arrow arrays as ``write``."""
    t1 = time.perf_counter()
    for index, reason in encoded.failures:
        on_failure(batch, index, reason)
    stats.add(encoded.stats)
    record_batch = encoded.record_batch(batch)
    times.encode += t1 - t0
    times.write += time.perf_counter() - t1  # Arrow arrays for the shard writer
    return batch, record_batch


def tokenize_chat_batches(
    batches: Iterator[DocBatch],
    encoder: ChatEncoder | PreferenceEncoder,
    stats: Counts,
    on_failure: Callable[[DocBatch, int, str], None],
    times: StageTimes | None = None,
    renderers: RenderPool | None = None,
) -> Iterator[tuple[DocBatch, pa.RecordBatch]]:
    """Chat records (dialogues, or preference pairs) into shard rows, in order.

    ``on_failure(batch, index, reason)`` applies the bad-line policy to a record the
    template refused (raise, or quarantine and count); the record stays an empty document.
    Rendering and tokenizing run in the caller's thread (``encode`` in ``times``), the fast
    backend's tokens of a batch on a thread while the next batch renders (``tokens_ahead``),
    or, given ``renderers`` (dialogues), batches render on its worker processes, a few
    ahead, while this thread masks the batches before them, the fast backend tokenizing the
    next one on the thread meanwhile (same results, same order)."""
    times = times if times is not None else StageTimes()
    pool = None
    if encoder.tokens_ahead:
        pool = ThreadPoolExecutor(1, "packcli-chat")
    # Every worker busy while this thread finishes one batch.
    ahead = 2 * renderers.workers if renderers is not None else 1
    pending: deque[list[Any]] = deque()  # batch, rendering, tokens, rendering back

    def start(batch: DocBatch) -> None:
        if renderers is not None:  # tokenized when its rendering comes back
            pending.append([batch, renderers.submit(batch.texts), None, False])
            return
        t0 = time.perf_counter()
        # (rendering, failures): each encoder's own rendering, only handed back to it
        rendering: tuple[Any, list[tuple[int, str]]] = encoder.render(batch.texts)
        tokens = pool.submit(encoder.tokens, rendering[0]) if pool is not None else None
        pending.append([batch, rendering, tokens, True])
        times.encode += time.perf_counter() - t0

    def arrived(entry: list[Any]) -> list[Any]:
        """``entry`` (batch, rendering, tokens, back) with its rendering back from the
        workers and, with a fast backend, its tokens started on the thread."""
        if renderers is not None and not entry[3]:
            entry[1] = renderers.result(entry[1])
            entry[3] = True
            if pool is not None:
                entry[2] = pool.submit(encoder.tokens, entry[1][0])
        return entry

    def finish() -> tuple[DocBatch, pa.RecordBatch]:
        t0 = time.perf_counter()
        batch, rendering, tokens, _ = arrived(pending.popleft())
        if pending:  # the next batch's tokens on the thread while this one is masked here
            arrived(pending[0])
        rendered, failures = rendering
        tokens = tokens.result() if tokens is not None else encoder.tokens(rendered)
        encoded = encoder.finish(batch.texts, rendered, tokens, failures)
        return _shard_rows(batch, encoded, t0, on_failure, stats, times)

    try:
        for batch in batches:
            start(batch)
            if len(pending) > ahead:
                yield finish()
        while pending:
            yield finish()
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def tokenize_chat_spans(
    path: str,
    spans: list[tuple[int, int]],
    read: SpanRead,
    encoder: ChatEncoder,
    renderers: RenderPool,
    stats: Counts,
    on_failure: Callable[[DocBatch, int, str], None],
    reading: SpanReading,
    times: StageTimes,
) -> Iterator[tuple[DocBatch, pa.RecordBatch]]:
    """``tokenize_chat_batches`` of one plain jsonl unit whose byte ``spans``
    (``packcli.read.spans.line_spans``) the workers read, validate and render themselves:
    the same shard rows (same ids, labels, lengths, document ids and lines), read counts and
    quarantine (``reading``), in order. The fast backend tokenizes the next batch on a thread
    while this one is masked. Errors keep input order: a span's batches are finished (their
    template failures raised or quarantined) before the error that stopped its reader."""
    pool = ThreadPoolExecutor(1, "packcli-chat") if encoder.tokens_ahead else None
    pending: deque[tuple[DocBatch, SpanBatch, Future[Any] | None]] = deque()

    def finish() -> tuple[DocBatch, pa.RecordBatch]:
        batch, rendered, tokens = pending.popleft()
        t0 = time.perf_counter()
        columns = rendered.columns
        done = tokens.result() if tokens is not None else encoder.tokens_columns(columns)
        encoded = encoder.finish_columns(
            len(batch.position), columns, done, rendered.ends_with_answer
        )
        return _shard_rows(batch, encoded, t0, on_failure, stats, times)

    source = reading.batches(path, spans, read, renderers, times)
    try:
        while True:
            try:
                item = next(source, None)
            except PackcliError:  # the batches before it first, as the input orders them
                while pending:
                    yield finish()
                raise
            if item is None:
                break
            batch, rendered = item
            columns = rendered.columns
            tokens = pool.submit(encoder.tokens_columns, columns) if pool is not None else None
            pending.append((batch, rendered, tokens))
            if len(pending) > 1:
                yield finish()
        while pending:
            yield finish()
    finally:
        source.close()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


class SpanReading:
    """A unit's spans as the workers read them, in order, turned into what the task's own
    reader would have given: ``DocBatch``es numbered from the unit's first document and
    line, the unit's ``ReadStats`` and its quarantined lines (``rejects``)."""

    def __init__(
        self, stats: ReadStats, rejects: Quarantine | None, file_index: int, lo: int
    ) -> None:
        self.stats = stats
        self.rejects = rejects
        self.file_index = file_index
        self.lo = lo  # the unit's first byte (progress counts from it)

    def batches(
        self,
        path: str,
        spans: list[tuple[int, int]],
        read: SpanRead,
        renderers: RenderPool,
        times: StageTimes,
    ) -> Generator[tuple[DocBatch, SpanBatch], None, None]:
        """Each span's batches, its workers kept busy ``2 * workers`` spans ahead."""
        todo = iter(spans)
        futures: deque[tuple[tuple[int, int], Future[ReadSpan]]] = deque(
            (span, renderers.submit_span(path, span, read))
            for span in itertools.islice(todo, 2 * renderers.workers)
        )
        doc_id = lines = 0
        try:
            while futures:
                span, future = futures.popleft()
                t0 = time.perf_counter()
                result = future.result()
                times.wait += time.perf_counter() - t0
                following = next(todo, None)
                if following is not None:
                    futures.append((following, renderers.submit_span(path, following, read)))
                times.read += result.read_seconds
                self._count(result, first=span[0] == self.lo, lines=lines)
                for rendered in result.batches:
                    n = len(rendered.lines)
                    texts: list[Any] = [None] * n  # the dialogues stayed on the worker
                    for index, dialogue in rendered.refused.items():
                        texts[index] = dialogue  # for the quarantine
                    last = rendered is result.batches[-1]
                    yield (
                        DocBatch(
                            texts=texts,
                            doc_id_start=doc_id,
                            file_index=np.full(n, self.file_index, dtype=np.int32),
                            position=rendered.lines + lines,
                            progress_bytes=(span[1] if last else span[0]) - self.lo,
                        ),
                        rendered,
                    )
                    doc_id += n
                result.raise_error()
                lines += result.stats.lines
            self.stats.files += 1
        finally:
            for _, future in futures:
                future.cancel()

    def _count(self, result: ReadSpan, *, first: bool, lines: int) -> None:
        """Add a span's counts to the unit's, and quarantine its rejected lines (their lines
        counted from the unit's first, as the task's reader does)."""
        got, stats = result.stats, self.stats
        stats.documents += got.documents
        stats.count(got.lines, got.bytes_read, got.blank_lines)
        for reason, count in got.rejected.items():
            stats.rejected[reason] = stats.rejected.get(reason, 0) + count
        stats.corrupt_streams.extend(got.corrupt_streams)
        if first:
            stats.first_line_byte = got.first_line_byte
        if self.rejects is not None:
            for file, line, reason, raw, detail in result.rejects:
                self.rejects.add(file, line + lines, reason, raw, detail)
