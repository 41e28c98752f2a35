"""A batch's renderings as columns, and a batch finished from them by array operations.

Why: the rendering workers (``packcli.chat.render_pool``) used to hand back one ``Rendered``
object per dialogue, which cost this process ~15 ms of GIL per 1,000 dialogues to unpickle,
and masking them one by one ~10 ms more. As columns (the texts, one span array, a few index
arrays) a batch unpickles in about a millisecond, and with a fast backend's whole-batch
arrays (``FlatTokens``) its ids, labels and lengths come from a dozen numpy calls
(``kept_columns``): the same arrays as ``encoder._kept_flat`` over per-dialogue objects,
which the tests compare on random batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from packcli.chat.offsets import FlatTokens, span_tokens
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


def kept_columns(
    n: int, columns: RenderedColumns, tokens: FlatTokens, train_on: str
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.int64], int, int]:
    """``(ids, labels, lengths, dropped, dropped_tokens)`` of a batch of ``n`` dialogues whose
    rendered texts ``tokens`` all spell: each dialogue's ids and labels (trained where a
    token touches a chosen assistant span, HF's ``assistant_masks`` rule), or nothing, and
    length 0, when it has no trained token (those are counted); refused dialogues length 0.
    No separators, no truncation (the caller's conditions)."""
    bounds = np.asarray(tokens.bounds, dtype=np.int64)
    rendered = np.diff(bounds)
    total = int(bounds[-1])
    if train_on == "all":
        mask = np.ones(total, dtype=np.bool_)
    else:
        first, last = span_tokens(tokens.offsets, bounds, columns.spans, columns.span_bounds)
        owner = np.repeat(np.arange(len(rendered)), np.diff(columns.span_bounds))
        chosen = np.flatnonzero(last > first)  # spans some token touches
        if train_on == "last" and len(chosen):  # each dialogue's last such span
            who = owner[chosen]
            chosen = chosen[np.append(who[1:] != who[:-1], True)]
        base = bounds[owner[chosen]]
        # Turns open and close: a token is trained while any is open (bincount, not the
        # ~20x slower np.add.at).
        opened = np.bincount(first[chosen] + base, minlength=total + 1)[:-1]
        closed = np.bincount(last[chosen] + base, minlength=total + 1)[:-1]
        mask = np.cumsum(opened - closed) > 0
    running = np.zeros(total + 1, dtype=np.int64)
    np.cumsum(mask, out=running[1:])
    kept = running[bounds[1:]] - running[bounds[:-1]] > 0
    ids = tokens.ids.astype(np.int32, copy=False)
    labels = np.where(mask, ids, IGNORE_INDEX).astype(np.int32)
    if not kept.all():  # the usual batch keeps every dialogue: no copy then
        keep = np.repeat(kept, rendered)
        ids, labels = ids[keep], labels[keep]
    lengths = np.zeros(n, dtype=np.int64)
    lengths[columns.index] = np.where(kept, rendered, 0)
    dropped = int(len(kept) - kept.sum())
    return ids, labels, lengths, dropped, int(rendered[~kept].sum())
