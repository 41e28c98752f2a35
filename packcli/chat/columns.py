"""A batch's renderings as columns, and a batch finished from them by array operations.

Why: the rendering workers (``packcli.chat.render_pool``) used to hand back one ``Rendered``
object per dialogue, which cost this process ~15 ms of GIL per 1,000 dialogues to unpickle,
and masking them one by one ~10 ms more. As columns (the texts, one span array, a few index
arrays) a batch unpickles in about a millisecond. With a fast backend, one compiled pass
over the batch (``label_tokens``, on the tokenizing thread without the GIL) checks that
each text's ids spell it, finds its tokens' character ranges and its assistant spans'
tokens, and writes its labels, so this process only cuts the arrays (``kept_columns``):
the same arrays as ``encoder._kept_flat`` over per-dialogue objects, which the tests
compare on random batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from packcli import jit
from packcli.chat.offsets import (
    ByteOffsets,
    Spelling,
    goes_forward,
    span_range,
    spelling_room,
    text_bytes,
    text_chars,
)
from packcli.chat.renderer import Rendered
from packcli.names import IGNORE_INDEX


@dataclass(frozen=True, eq=False)
class RenderedColumns:
    """The dialogues of one batch the template rendered, and those it refused.

    Rendered dialogue ``d`` is the batch's dialogue ``index[d]`` (increasing), its text
    ``texts[d]`` and its assistant spans rows ``span_bounds[d]:span_bounds[d + 1]`` of
    ``spans``. ``{% generation %}`` blocks are not kept: masks use the assistant spans only.
    """

    index: npt.NDArray[np.int64]
    texts: list[str]
    span_bounds: npt.NDArray[np.int64]
    spans: npt.NDArray[np.int64]  # (k, 2) character ranges
    failures: list[tuple[int, str]]  # (index in the batch, reason)

    @classmethod
    def of(
        cls, rendered: list[tuple[int, Rendered]], failures: list[tuple[int, str]]
    ) -> RenderedColumns:
        counts = np.fromiter((len(r.assistant_spans) for _, r in rendered), np.int64)
        span_bounds = np.zeros(len(rendered) + 1, dtype=np.int64)
        np.cumsum(counts, out=span_bounds[1:])
        flat = [bound for _, r in rendered for span in r.assistant_spans for bound in span]
        return cls(
            index=np.fromiter((i for i, _ in rendered), np.int64, count=len(rendered)),
            texts=[r.text for _, r in rendered],
            span_bounds=span_bounds,
            spans=np.array(flat, dtype=np.int64).reshape(-1, 2),
            failures=failures,
        )

    def rendered(self) -> list[tuple[int, Rendered]]:
        """``(index, Rendered)`` again, for the per-dialogue finish."""
        cuts = self.span_bounds.tolist()
        spans = [(a, b) for a, b in self.spans.tolist()]
        return [
            (i, Rendered(text, spans[a:b], None))
            for i, text, a, b in zip(
                self.index.tolist(), self.texts, cuts[:-1], cuts[1:], strict=True
            )
        ]


@dataclass(frozen=True, eq=False)
class LabelledTokens:
    """A batch's fast-backend tokens with their labels (``label_tokens``), every text
    spelled by its ids: text ``i``'s ids are ``ids[bounds[i]:bounds[i + 1]]``, their labels
    the same slice of ``labels``; ``kept[i]``: some token of it is trained."""

    ids: npt.NDArray[np.int32]
    bounds: npt.NDArray[np.int64]  # len(texts) + 1
    labels: npt.NDArray[np.int32]
    kept: npt.NDArray[np.bool_]


TRAIN_ON_CODES = {"assistant": 0, "last": 1, "all": 2}


def label_tokens(
    table: ByteOffsets,
    columns: RenderedColumns,
    ids: np.ndarray,
    bounds: np.ndarray,
    train_on: str,
) -> LabelledTokens | None:
    """The labels of a batch's rendered texts from their fast-backend ids (text ``i``'s are
    ``ids[bounds[i]:bounds[i + 1]]``): a token is trained where it shares a character with a
    chosen assistant span (HF's ``assistant_masks`` rule; ``train_on``: every span, each
    dialogue's last one some token touches, or every token). None when some text's ids do
    not spell it (the caller then takes the per-dialogue way, HF encoding that text)."""
    text, text_start = text_bytes(columns.texts)
    ids32 = np.asarray(ids).astype(np.int32, copy=False)
    bounds = np.asarray(bounds, dtype=np.int64)
    n = len(columns.texts)
    labels = np.empty(len(ids32), dtype=np.int32)
    kept = np.zeros(n, dtype=np.bool_)
    longest = int(np.diff(bounds).max()) if n else 0
    scratch = np.empty((longest, 2), dtype=np.int64)  # one text's offsets at a time
    spelled = np.zeros(n, dtype=np.bool_)
    run = jit.pick(_label_tokens, len(text) // 20 + len(ids32))
    run(
        ids32, bounds, text, text_start, spelling_room(text), table.spelling,
        np.ascontiguousarray(columns.spans), columns.span_bounds, TRAIN_ON_CODES[train_on],
        scratch, labels, kept, spelled,
    )  # fmt: skip
    if not spelled.all():
        return None
    return LabelledTokens(ids32, bounds, labels, kept)


@jit.kernel(nogil=True)
def _label_tokens(
    ids: np.ndarray,
    bounds: np.ndarray,
    text: np.ndarray,
    text_start: np.ndarray,
    room: np.ndarray,
    table: Spelling,
    spans: np.ndarray,
    span_bounds: np.ndarray,
    train_on: int,
    scratch: np.ndarray,
    labels: np.ndarray,
    kept: np.ndarray,
    spelled: np.ndarray,
) -> None:
    """Per text: ``text_chars`` into ``scratch``, then ``span_range`` of its spans there and
    its labels (``train_on``: 0 every span, 1 the last one touched, 2 every token); stops at
    the first text its ids do not spell (``spelled`` False from there)."""
    for d in range(len(bounds) - 1):
        k0 = bounds[d]
        k1 = bounds[d + 1]
        ok = text_chars(
            ids, k0, k1, text, text_start[d], text_start[d + 1], room, table, scratch, k0
        )
        if not ok:
            return
        spelled[d] = True
        kept[d] = _text_labels(
            ids, k0, k1, spans, span_bounds[d], span_bounds[d + 1], train_on, scratch, labels
        )


@jit.kernel(nogil=True)
def _text_labels(
    ids: np.ndarray,
    k0: int,
    k1: int,
    spans: np.ndarray,
    s0: int,
    s1: int,
    train_on: int,
    offsets: np.ndarray,
    labels: np.ndarray,
) -> bool:
    """One text's labels (tokens ``k0:k1``, their offsets from row 0 of ``offsets``, its
    spans rows ``s0:s1`` of ``spans``): whether any token is trained. (A kernel of its own:
    inside ``_label_tokens``' loop, the compiled loop ran ~1.5x slower.)"""
    n = k1 - k0
    if train_on == 2:
        for k in range(k0, k1):
            labels[k] = ids[k]
        return n > 0
    for k in range(k0, k1):
        labels[k] = IGNORE_INDEX
    if n == 0:
        return False
    monotone = goes_forward(offsets, 0, n)
    trained = False
    last_f = 0
    last_e = 0
    for s in range(s0, s1):
        f, e = span_range(offsets, 0, n, monotone, spans[s, 0], spans[s, 1])
        if e <= f:
            continue
        trained = True
        if train_on == 1:
            last_f = f
            last_e = e
            continue
        for k in range(k0 + f, k0 + e):
            labels[k] = ids[k]
    if train_on == 1:
        for k in range(k0 + last_f, k0 + last_e):
            labels[k] = ids[k]
    return trained


def kept_columns(
    n: int, columns: RenderedColumns, tokens: LabelledTokens
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.int64], int, int]:
    """``(ids, labels, lengths, dropped, dropped_tokens)`` of a batch of ``n`` dialogues from
    its labelled tokens: each dialogue's ids and labels, or nothing, and length 0, when it
    has no trained token (those are counted); refused dialogues length 0. No separators, no
    truncation (the caller's conditions)."""
    rendered = np.diff(tokens.bounds)
    kept = tokens.kept
    ids, labels = tokens.ids, tokens.labels
    if not kept.all():  # the usual batch keeps every dialogue: no copy then
        keep = np.repeat(kept, rendered)
        ids, labels = ids[keep], labels[keep]
    lengths = np.zeros(n, dtype=np.int64)
    lengths[columns.index] = np.where(kept, rendered, 0)
    dropped = int(len(kept) - kept.sum())
    return ids, labels, lengths, dropped, int(rendered[~kept].sum())
