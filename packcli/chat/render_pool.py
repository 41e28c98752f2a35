"""Chat templates rendered on worker processes.

Why: rendering a dialogue in the sandbox is Python and holds the GIL; with a fast backend it
is most of the chat path's time, so one process renders at a fraction of what the tokenizer
takes. Workers render batches of
dialogues while this process tokenizes, masks and writes the batches before them.

The workers run the same ``render_batch`` as the in-process path with the same template,
variables, limits and date, so the rendered texts and spans are the same; results come back
in submission order. Workers are spawned (not forked: the parent runs Rust thread pools
that a fork would copy mid-flight) and only render: they never load a tokenizer.

``submit_span`` goes further for a plain jsonl file: the worker reads, parses and validates
a byte span of it itself (the same reader, ``iter_batches(span=...)``, with the same
bad-line policy) and hands back its batches' renderings as columns (``ReadSpan``), so no
dialogue crosses the process boundary as Python objects. Measured per 1,000 dialogues of
the 150 MB chat bench, this process's CPU outside the fast backend went from ~55 ms (jsonl
parse and ``validate_messages`` ~19, pickling the dialogues out ~2, unpickling ``Rendered``
objects back ~16, the per-dialogue finish ~17) to ~7 ms (unpickling columns ~2,
``ChatEncoder.finish_columns`` ~5); the fast backend's ~40 ms runs without the GIL.
"""

from __future__ import annotations

import functools
import multiprocessing
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import numpy.typing as npt

from packcli.errors import ConfigError, InputError, PackcliError
from packcli.read.batches import ReadOptions, ReadStats
from packcli.read.rejects import BadLineError, RejectList

if TYPE_CHECKING:  # the pool's module stays light: a worker imports the renderer itself
    from packcli.chat.columns import RenderedColumns
    from packcli.chat.renderer import Rendered

    # (rendered, failures, error): error is (kind, message) of a packcli error, else None
    _Result: TypeAlias = tuple[
        list[tuple[int, Rendered]], list[tuple[int, str]], tuple[str, str] | None
    ]

# Inputs below this size render in the task's own process: spawning workers costs ~0.5 s of
# imports each, which rendering a few MB on one core does not repay.
MIN_POOL_BYTES = 16 << 20

# Bytes of a plain jsonl file a worker reads at a time (``submit_span``): ~700 dialogues of
# real-text chat, a batch or so; small enough that the workers' last spans end together.
SPAN_BYTES = 1 << 20
# Spans read ahead while the fast backend is built (``read_ahead``): their renderings wait
# in this process, ~1.5 MB each.
READ_AHEAD = 32

_state: dict[str, Any] = {}


# A worker's collector: young collections every this many allocations (Python's default is
# 700). Rendering allocates and drops many small objects (jinja contexts, frames) that are
# cycles only rarely: rendering 20,000 dialogues of the chat bench took 0.60-0.63 s of CPU
# with the default, 0.56-0.57 s with this. What a render holds is one batch.
_WORKER_GC_THRESHOLD = (100_000, 50, 100)


def _init(template: Any, variables: dict[str, str], controls: tuple[str, ...], now: Any) -> None:
    import gc

    import packcli.chat.renderer  # noqa: F401 - its modules (jinja) among the frozen objects

    _state.update(template=template, variables=variables, controls=controls, now=now)
    gc.freeze()  # what the worker loaded stays: no collection walks it again
    gc.set_threshold(*_WORKER_GC_THRESHOLD)


def _render(dialogues: Sequence[Any]) -> _Result:
    """``(rendered, failures, error)``: a template failure of one dialogue is a failure (the
    caller's bad-line policy); any other packcli error travels back as (kind, message), since
    exceptions with their own constructors do not always survive pickling."""
    from packcli.chat.renderer import render_batch

    failures: list[tuple[int, str]] = []
    try:
        rendered = render_batch(
            _state["template"],
            dialogues,
            _state["variables"],
            _state["controls"],
            now=_state["now"],
            on_error=lambda index, exc: failures.append((index, str(exc))),
        )
    except PackcliError as exc:
        kind = "config" if isinstance(exc, ConfigError) else "input"
        return [], [], (kind, str(exc))
    return rendered, failures, None


@dataclass(frozen=True)
class SpanRead:
    """How a worker reads its span: the reader's settings for the run (``ReadOptions``)."""

    messages_field: str
    on_bad_line: str
    batch_size: int
    batch_bytes: int


@dataclass(frozen=True, eq=False)
class SpanBatch:
    """One reader batch of a span, rendered: per document its line (counted from the span's
    first) and whether its last message is the assistant's; the renderings as columns; and
    the dialogues the template refused, by index in the batch, for the quarantine."""

    lines: npt.NDArray[np.int64]
    ends_with_answer: npt.NDArray[np.bool_]
    columns: RenderedColumns
    refused: dict[int, Any]


@dataclass(frozen=True, eq=False)
class ReadSpan:
    """What a worker gives back for a byte span: its batches, what the reader counted, the
    lines it quarantined (lines counted from the span's first, as ``RejectSink.add`` takes
    them), the error that stopped it (None: read to the end; else a ``BadLineError``'s
    ``("bad_line", file, line, reason, message)`` or ``(kind, message)``, raised by
    the caller once the batches before it are used), and its busy seconds reading (parse and
    validate included)."""

    batches: list[SpanBatch]
    stats: ReadStats
    rejects: list[tuple[str, int, str, bytes, str]]
    error: tuple[Any, ...] | None
    read_seconds: float

    def raise_error(self) -> None:
        if self.error is None:
            return
        if self.error[0] == "bad_line":
            raise BadLineError(*self.error[1:])
        kind, message = self.error
        raise (ConfigError if kind == "config" else InputError)(message)


def _error_of(exc: PackcliError) -> tuple[Any, ...]:
    if isinstance(exc, BadLineError):
        return ("bad_line", exc.file, exc.line, exc.reason, str(exc))
    return ("config" if isinstance(exc, ConfigError) else "input", str(exc))


def _read_span(path: str, span: tuple[int, int], read: SpanRead) -> ReadSpan:
    """Read, validate and render the lines that begin in ``span`` of ``path``."""
    from packcli.chat.columns import RenderedColumns
    from packcli.chat.validate import validate_messages
    from packcli.read.jsonl import iter_batches

    stats, rejects = ReadStats(), RejectList()
    options = ReadOptions(
        batch_size=read.batch_size,
        batch_bytes=read.batch_bytes,
        on_bad_line=read.on_bad_line,
        rejects=rejects,
        validate=functools.partial(validate_messages, field=read.messages_field),
    )
    batches: list[SpanBatch] = []
    error: tuple[Any, ...] | None = None
    read_s = 0.0
    t0 = time.perf_counter()
    try:
        for batch in iter_batches([path], read.messages_field, options, stats, span=span):
            read_s += time.perf_counter() - t0
            dialogues = batch.texts
            rendered, failures, error = _render(dialogues)
            if error is not None:  # the template's: the run stops after the batches before
                break
            ends = [bool(m) and m[-1].get("role") == "assistant" for m in dialogues]
            batches.append(
                SpanBatch(
                    lines=batch.position,
                    ends_with_answer=np.array(ends, dtype=np.bool_),
                    columns=RenderedColumns.of(rendered, failures),
                    refused={i: dialogues[i] for i, _ in failures},
                )
            )
            t0 = time.perf_counter()
    except PackcliError as exc:  # the batches before it are kept: used, then this raised
        error = _error_of(exc)
    read_s += time.perf_counter() - t0
    return ReadSpan(batches, stats, rejects.records, error, read_s)


class RenderPool:
    """``submit(dialogues)`` renders on a worker; ``result(future)`` gives ``(rendered,
    failures)`` as ``ChatEncoder.render`` does, or raises the worker's error."""

    def __init__(
        self,
        template: Any,
        variables: Mapping[str, str],
        controls: tuple[str, ...],
        now: datetime | None,
        workers: int,
    ) -> None:
        self.workers = workers
        self._ahead: dict[tuple[str, tuple[int, int], SpanRead], Future[ReadSpan]] = {}
        self._pool = ProcessPoolExecutor(
            workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init,
            initargs=(template, dict(variables), controls, now),
        )

    def submit(self, dialogues: Sequence[Any]) -> Future[_Result]:
        return self._pool.submit(_render, list(dialogues))

    def submit_span(self, path: str, span: tuple[int, int], read: SpanRead) -> Future[ReadSpan]:
        """Read and render the lines that begin in ``span`` of the plain jsonl ``path`` (the
        future ``read_ahead`` started for it, if any)."""
        ahead = self._ahead.pop((path, span, read), None)
        return ahead if ahead is not None else self._pool.submit(_read_span, path, span, read)

    def read_ahead(self, path: str, spans: Sequence[tuple[int, int]], read: SpanRead) -> None:
        """Start reading ``spans`` now, for ``submit_span`` to hand back later."""
        for span in spans:
            self._ahead[(path, span, read)] = self._pool.submit(_read_span, path, span, read)

    @staticmethod
    def result(future: Future[_Result]) -> tuple[list[tuple[int, Rendered]], list[tuple[int, str]]]:
        rendered, failures, error = future.result()
        if error is not None:
            kind, message = error
            raise (ConfigError if kind == "config" else InputError)(message)
        return rendered, failures

    def close(self) -> None:
        self._ahead.clear()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> RenderPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
