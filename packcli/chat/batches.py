"""Chat records (dialogues or preference pairs) through their encoder, batch by batch, with
the work overlapped: the template renders batch i+1 (Python) while the fast backend tokenizes
batch i on a thread, or batches render on worker processes a few ahead
(``packcli.chat.render_pool``) while this thread tokenizes and masks those before them.
Imported on every run, text runs included: the template modules load only when used.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from packcli.chat.encoder import ChatEncoder, Counts
from packcli.read import DocBatch
from packcli.tokenize.encode import StageTimes

if TYPE_CHECKING:
    from packcli.chat.preference import PreferenceEncoder
    from packcli.chat.render_pool import RenderPool


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
        t1 = time.perf_counter()
        for index, reason in encoded.failures:
            on_failure(batch, index, reason)
        stats.add(encoded.stats)
        record_batch = encoded.record_batch(batch)
        times.encode += t1 - t0
        times.write += time.perf_counter() - t1  # Arrow arrays for the shard writer
        return batch, record_batch

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
