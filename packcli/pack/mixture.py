"""Pretraining mixtures: how source weights become document copies, and a row order that
keeps every optimizer step's mix on target (issue 26).

**Weights are epoch multipliers.** A source of weight ``w`` contributes every one of its
documents ``floor(w)`` times, plus once more for a deterministic subset of fraction
``w - floor(w)`` of them: document ``i`` of the source (its index in the source's input
order) is in the subset when ``(offset + i * PHI) mod 2**64 < frac * 2**64``, a Weyl
sequence with the golden-ratio step and an offset drawn from the seed and the source. The
decision needs only the document's own index (no pass over the source, so groups plan
alone) and, being low-discrepancy, picks ``frac * n`` documents give or take a few (not a
binomial ``sqrt(n)``), spread evenly over the source. ``w < 1`` is a plain downsample.
Copies keep their ``doc_id`` and are numbered by ``repeat`` (0, 1, ...; the subset's copy
is ``floor(w)``). **Shares** (``share:`` instead of ``weight:``) are target shares of the
output tokens; they become multipliers ``share * T / T_k`` from each source's tokenized
tokens ``T_k`` (``T`` = all of them), so the output has about as many tokens as the input.

**Copies are documents to the planner.** A copy's key is ``doc_id + repeat * 2**40``
(``copy_key``): the plan, its groups, the tail and the verifier carry keys where they carried
doc ids, and with no repeats a key is its doc id, so nothing changes without a mixture.
Doc ids stay below 2**40 and repeats below 2**11 (weights up to ``MAX_WEIGHT``).

**Ratios that hold locally** (``mix_order``). A mix's target is met on average by any
order; it holds in every step only if rows are ordered for it. Rows are dealt greedily: each
next row is the one, among the first unused row of each source's queue (rows queued by their
largest source, in their shuffled order), that brings the running per-source token counts
closest (squared error) to ``target share * tokens so far``. The running error stays within
about a row's tokens, so a window of ``W`` rows is off by at most ~2 rows' tokens in a
source, i.e. ``2 / W`` of the window; rows are only reordered, never changed, so packing
efficiency is untouched. O(R * K^2) for R rows and K sources (compiled above ~10k rows):
~0.1 s per million rows at K = 4.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from packcli.jit import kernel, pick
from packcli.records import Fields

REPEAT_SHIFT = 40  # a copy's key: doc_id + repeat << REPEAT_SHIFT
DOC_MASK = (1 << REPEAT_SHIFT) - 1
MAX_WEIGHT = 1024.0  # repeats stay below 2**11, so keys times (short_len + 1) fit in int64
_PHI = np.uint64(0x9E3779B97F4A7C15)  # 2**64 / golden ratio, odd


@dataclass(frozen=True)
class WindowSpread(Fields):
    """A config's realised mix over windows of one step (the plan's ``mixture_windows``):
    per source its tokens and its share's largest and 99th-percentile deviation from the
    target, after the row order and in the shuffled order; the long config's piece bound
    and, where the exchange ran, its window, moves and deviation at that window."""

    window_rows: int
    windows: int
    tokens: list[int]
    max_deviation: list[float]
    p99_deviation: list[float]
    shuffled_max_deviation: list[float]
    piece_bound: list[float] | None = field(default=None, metadata={"omit": True})
    exchange_window_rows: int | None = field(default=None, metadata={"omit": True})
    exchange_moves: int | None = field(default=None, metadata={"omit": True})
    exchange_max_deviation: list[float] | None = field(default=None, metadata={"omit": True})
    # A grouped mixture's long config: the steps that straddle two parts (plan stage).
    straddling_max_deviation: list[float] | None = field(default=None, metadata={"omit": True})
    # A grouped mixture (plan.json): the largest of each group's own deviation, against its
    # share; ``max_deviation`` is then the output's, over its windows from row 0.
    group_max_deviation: list[float] | None = field(default=None, metadata={"omit": True})

    def over_output(self, figures: StepFigures) -> WindowSpread:
        """A grouped mixture's spread with the output's step figures (``figures``, against
        the output's share) in place of the groups' own, kept as ``group_max_deviation``."""
        return dataclasses.replace(
            self,
            group_max_deviation=self.max_deviation,
            max_deviation=figures.max_deviation,
            p99_deviation=figures.p99_deviation,
            windows=figures.windows,
            tokens=figures.tokens,
        )

    def merged(self, other: WindowSpread) -> WindowSpread:
        """This group's and ``other``'s (the next group's rows, consecutive in the output):
        tokens and windows summed, per source the larger deviation and bound; what only one
        of them has is this one's."""

        def larger(a: list[float] | None, b: list[float] | None) -> list[float] | None:
            return [max(x, y) for x, y in zip(a, b, strict=True)] if a and b else a

        return dataclasses.replace(
            self,
            windows=self.windows + other.windows,
            tokens=[a + b for a, b in zip(self.tokens, other.tokens, strict=True)],
            max_deviation=larger(self.max_deviation, other.max_deviation) or [],
            p99_deviation=larger(self.p99_deviation, other.p99_deviation) or [],
            shuffled_max_deviation=(
                larger(self.shuffled_max_deviation, other.shuffled_max_deviation) or []
            ),
            piece_bound=larger(self.piece_bound, other.piece_bound),
            exchange_max_deviation=larger(
                self.exchange_max_deviation, other.exchange_max_deviation
            ),
            exchange_moves=(
                self.exchange_moves + other.exchange_moves
                if self.exchange_moves is not None and other.exchange_moves is not None
                else self.exchange_moves
            ),
        )


@dataclass(frozen=True)
class MixSpec:
    """What the planner needs of a mixture: per source its name, epoch multiplier and
    overlong policy, and the seed of the subsets. Multipliers are resolved (``share``
    mode converted with ``multipliers_from_shares``) before the plan."""

    names: tuple[str, ...]
    multipliers: tuple[float, ...]
    overlong: tuple[str, ...]
    seed: int = 0

    def __post_init__(self) -> None:
        if not (len(self.names) == len(self.multipliers) == len(self.overlong)):
            raise ValueError("a mixture needs a name, multiplier and policy per source")
        for name, m in zip(self.names, self.multipliers, strict=True):
            if not 0 <= m <= MAX_WEIGHT or math.isnan(m):
                raise ValueError(f"source {name}: multiplier must be in 0..{MAX_WEIGHT}, got {m}")

    @property
    def size(self) -> int:
        return len(self.names)

    def as_record(self) -> dict[str, Any]:
        return {
            "names": list(self.names),
            "multipliers": list(self.multipliers),
            "overlong": list(self.overlong),
            "seed": self.seed,
        }

    @classmethod
    def from_record(cls, r: dict[str, Any]) -> MixSpec:
        return cls(
            tuple(r["names"]),
            tuple(float(m) for m in r["multipliers"]),
            tuple(r["overlong"]),
            int(r["seed"]),
        )


def multipliers_from_shares(shares: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Epoch multipliers giving each source ``shares[k]`` of the output tokens, the output
    having as many tokens as the input (``tokens``: each source's tokenized tokens)."""
    shares = np.asarray(shares, np.float64)
    tokens = np.asarray(tokens, np.float64)
    if (tokens <= 0).any():
        raise ValueError("a source with a share has no tokens")
    multipliers: np.ndarray = shares / shares.sum() * tokens.sum() / tokens
    return multipliers


def _offset(seed: int, source: int) -> np.uint64:
    state = np.random.SeedSequence([seed, source, 26]).generate_state(1, np.uint64)
    return np.uint64(state[0])


def copies(index_in_source: np.ndarray, source: np.ndarray, mix: MixSpec) -> np.ndarray:
    """How many times each document is in the output: ``floor(w)`` plus one for the
    source's seeded low-discrepancy subset of fraction ``w - floor(w)`` (module docstring)."""
    index = np.asarray(index_in_source).astype(np.uint64)
    source = np.asarray(source, np.int64)
    out = np.zeros(index.size, np.int64)
    for k, m in enumerate(mix.multipliers):
        sel = source == k
        whole = math.floor(m)
        frac = m - whole
        out[sel] = whole
        if frac > 0:
            threshold = np.uint64(min(int(frac * 2.0**64), 2**64 - 1))
            with np.errstate(over="ignore"):
                u = _offset(mix.seed, k) + index[sel] * _PHI  # wraps modulo 2**64
            out[sel] += u < threshold
    return out


def copy_key(doc: np.ndarray, repeat: np.ndarray) -> np.ndarray:
    return np.asarray(doc, np.int64) + (np.asarray(repeat, np.int64) << REPEAT_SHIFT)


def key_doc(key: np.ndarray) -> np.ndarray:
    return np.asarray(key, np.int64) & DOC_MASK


def key_repeat(key: np.ndarray) -> np.ndarray:
    return np.asarray(key, np.int64) >> REPEAT_SHIFT


def source_of(doc: np.ndarray, first_doc: np.ndarray) -> np.ndarray:
    """Source of each doc id, sources holding consecutive doc ids from ``first_doc[k]``."""
    return (np.searchsorted(first_doc, key_doc(doc), "right") - 1).astype(np.int64)


@dataclass(frozen=True)
class SourceCounts(Fields):
    """What a mixture's weight and overlong policy did to one source's documents (the plan's
    ``stats.mixture.NAME``). The policy's counts are per document, whatever its copies, as
    without sources; ``repeat_tokens`` and ``subsampled_tokens`` are what the weight added
    and removed, so tokens are accounted for:
    output = input - truncated - dropped + repeat_tokens - subsampled_tokens."""

    documents: int
    tokens: int
    copies: int
    copy_tokens: int
    repeats: int  # copies beyond each document's first
    weight_dropped_docs: int
    policy_dropped_docs: int
    policy_dropped_tokens: int
    split_docs: int
    split_pieces: int
    split_tokens: int
    truncated_docs: int
    truncated_tokens: int
    repeat_tokens: int
    subsampled_tokens: int

    def __add__(self, other: SourceCounts) -> SourceCounts:
        """Two groups' counts of the source, summed."""
        return SourceCounts(
            **{
                f.name: getattr(self, f.name) + getattr(other, f.name)
                for f in dataclasses.fields(self)
            }
        )


@dataclass(frozen=True)
class Expanded:
    """A group's documents as the planner sees them under a mixture: one entry per copy
    (``lengths``, ``keys``), in doc order, and what the weights and policies did per source."""

    lengths: np.ndarray
    keys: np.ndarray
    stats: dict[str, SourceCounts]


def expand(
    lengths: np.ndarray,
    doc_ids: np.ndarray,
    first_doc: np.ndarray,
    mix: MixSpec,
    long_len: int,
) -> Expanded:
    """The copies of a group's documents (``lengths[i]`` is document ``doc_ids[i]``) under
    the mixture, with each source's overlong policy applied first: ``truncate`` cuts to
    ``long_len``, ``drop`` removes the document (every copy), ``split`` is left to the
    planner (run with ``overlong: split``). Empty documents get no copy (the planner would
    drop them). Per source: documents, tokens, copies, copy tokens, repeats (copies beyond
    the first), and the policy's and the weight's drops."""
    lengths = np.asarray(lengths, np.int64)
    doc_ids = np.asarray(doc_ids, np.int64)
    src = source_of(doc_ids, first_doc)
    n = copies(doc_ids - first_doc[src], src, mix)
    over = lengths > long_len
    policy = np.asarray(mix.overlong)[src] if src.size else np.zeros(0, dtype="<U8")
    dropped = over & (policy == "drop")
    truncated = over & (policy == "truncate")
    split = over & (policy == "split")
    planned = np.where(truncated, long_len, lengths)
    n = np.where(dropped | (lengths == 0), 0, n)
    stats: dict[str, SourceCounts] = {}
    for k, name in enumerate(mix.names):
        s = src == k
        stats[name] = SourceCounts(
            documents=int(s.sum()),
            tokens=int(lengths[s].sum()),
            copies=int(n[s].sum()),
            copy_tokens=int((n[s] * planned[s]).sum()),
            repeats=int(np.maximum(n[s] - 1, 0).sum()),
            weight_dropped_docs=int((s & (n == 0) & ~dropped & (lengths > 0)).sum()),
            policy_dropped_docs=int((s & dropped).sum()),
            policy_dropped_tokens=int(lengths[s & dropped].sum()),
            split_docs=int((s & split).sum()),
            split_pieces=int((-(-lengths[s & split] // long_len)).sum()),
            split_tokens=int(lengths[s & split].sum()),
            truncated_docs=int((s & truncated).sum()),
            truncated_tokens=int((lengths - planned)[s & truncated].sum()),
            repeat_tokens=int((np.maximum(n[s] - 1, 0) * planned[s]).sum()),
            subsampled_tokens=int(planned[s & (n == 0) & ~dropped].sum()),
        )
    first = np.repeat(np.cumsum(n) - n, n)
    repeat = np.arange(int(n.sum()), dtype=np.int64) - first
    keys = copy_key(np.repeat(doc_ids, n), repeat)
    return Expanded(np.repeat(planned, n), keys, stats)


def add_stats(a: dict[str, SourceCounts], b: dict[str, SourceCounts]) -> dict[str, SourceCounts]:
    """Per-source counts of two groups, summed (a source in one of them as it is)."""
    out = dict(a)
    for name, counts in b.items():
        out[name] = out[name] + counts if name in out else counts
    return out


def row_source_tokens(
    row_offsets: np.ndarray,
    row_pieces: np.ndarray,
    piece_src: np.ndarray,
    piece_len: np.ndarray,
    n_sources: int,
) -> np.ndarray:
    """Tokens of each source in each row: an (R, K) int64 matrix."""
    n_rows = row_offsets.size - 1
    row = np.repeat(np.arange(n_rows, dtype=np.int64), np.diff(row_offsets))
    flat = row * n_sources + piece_src[row_pieces]
    counts = np.bincount(flat, weights=piece_len[row_pieces], minlength=n_rows * n_sources)
    return counts.astype(np.int64).reshape(n_rows, n_sources)


@kernel
def _deal(
    matrix: np.ndarray, queue_rows: np.ndarray, queue_offsets: np.ndarray, target: np.ndarray
) -> np.ndarray:
    """The greedy deal of ``mix_order``: rows from K queues, each next the queue head that
    minimizes the squared error of the running per-source counts against the target."""
    n_rows, k = matrix.shape
    order = np.empty(n_rows, dtype=np.int64)
    heads = queue_offsets[:-1].copy()
    err = np.zeros(k, dtype=np.float64)
    for t in range(n_rows):
        best, best_cost = -1, 0.0
        for q in range(k):
            if heads[q] >= queue_offsets[q + 1]:
                continue
            r = queue_rows[heads[q]]
            total = 0.0
            for j in range(k):
                total += matrix[r, j]
            cost = 0.0
            for j in range(k):
                e = err[j] + matrix[r, j] - target[j] * total
                cost += e * e
            if best < 0 or cost < best_cost:
                best, best_cost = q, cost
        r = queue_rows[heads[best]]
        heads[best] += 1
        total = 0.0
        for j in range(k):
            total += matrix[r, j]
        for j in range(k):
            err[j] += matrix[r, j] - target[j] * total
        order[t] = r
    return order


def mix_order(matrix: np.ndarray, target: np.ndarray | None = None) -> np.ndarray:
    """A permutation of the rows (``matrix[r, k]``: tokens of source k in row r) such that
    every window of consecutive rows holds each source near its ``target`` share (default:
    its share over all rows). Rows keep their given (shuffled) order within their queue."""
    matrix = np.ascontiguousarray(matrix, dtype=np.float64)
    n_rows, k = matrix.shape
    if n_rows == 0 or k < 2:
        return np.arange(n_rows, dtype=np.int64)
    if target is None:
        sums = matrix.sum(axis=0)
        target = sums / max(sums.sum(), 1.0)
    target = np.asarray(target, np.float64)
    dominant = np.argmax(matrix, axis=1)
    queue_rows = np.argsort(dominant, kind="stable").astype(np.int64)
    queue_offsets = np.zeros(k + 1, dtype=np.int64)
    np.cumsum(np.bincount(dominant, minlength=k), out=queue_offsets[1:])
    return pick(_deal, n_rows * k * k // 8)(matrix, queue_rows, queue_offsets, target)


def window_deviation(
    matrix: np.ndarray, window_rows: int, target: np.ndarray | None = None, offset: int = 0
) -> dict[str, np.ndarray]:
    """Per source, over windows of ``window_rows`` consecutive rows (full windows, aligned to
    row ``-offset``: the output's, for a part whose first row is the output's ``offset``; a
    shorter one counts when there is no full one): the largest and the 99th percentile
    absolute deviation of the window's token share from ``target`` (default: the share over
    all rows), in share units (0.005 = half a percentage point)."""
    matrix = np.asarray(matrix, np.float64)
    k = matrix.shape[1]
    if target is None:
        sums = matrix.sum(axis=0)
        target = sums / max(sums.sum(), 1.0)
    skip = -offset % max(1, window_rows)
    if matrix.shape[0] - skip >= window_rows:  # the part's own full windows
        matrix = matrix[skip:]
    n_rows = matrix.shape[0]
    n_win = max(1, n_rows // max(1, window_rows))
    w = matrix[: n_win * window_rows] if n_rows >= window_rows else matrix
    worst, p99 = _share_deviation(w.reshape(n_win, -1, k).sum(axis=1), target)
    return {"max": worst, "p99": p99, "windows": n_win}


def _share_deviation(per: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per source, the largest and the 99th-percentile |share - target| over windows
    (``per[j, k]``: tokens of source k in window j): the one definition the plan's figures
    and verify's share."""
    share = per / np.maximum(per.sum(axis=1, keepdims=True), 1.0)
    dev = np.abs(share - np.asarray(target)[None, :])
    return dev.max(axis=0), np.percentile(dev, 99, axis=0)


@dataclass(frozen=True)
class WindowEdges(Fields):
    """A part's rows in the output's step windows it shares with its neighbours: tokens per
    source before the first window cut inside it (``head``) and after the last (``tail``;
    None when no cut falls inside: the part is within one window), and where the plan
    stage adds them, the part's long tokens per source (``tokens``)."""

    head: list[int]
    tail: list[int] | None
    tokens: list[int] | None = field(default=None, metadata={"omit": True})


def window_edges(matrix: np.ndarray, window_rows: int, offset: int = 0) -> WindowEdges:
    """Of a part whose first row is the output's row ``offset``: the tokens per source of
    its rows before the first of the output's window cuts inside it (``head``), and after
    the last (``tail``; None when no cut falls inside: the part is within one window), the
    parts of the windows it shares with its neighbours (``straddling_deviation``)."""
    matrix = np.asarray(matrix, np.float64)
    w = max(1, window_rows)
    first = -offset % w
    n = matrix.shape[0]
    if first > n:
        return WindowEdges(matrix.sum(axis=0).astype(np.int64).tolist(), None)
    last = first + (n - first) // w * w
    return WindowEdges(
        matrix[:first].sum(axis=0).astype(np.int64).tolist(),
        matrix[last:].sum(axis=0).astype(np.int64).tolist(),
    )


def straddling_deviation(edges: Sequence[WindowEdges], target: np.ndarray) -> np.ndarray:
    """Per source, the largest |share - target| over the output's windows that straddle two
    or more parts, from each part's ``window_edges`` in output order (the output's shorter
    last window is not counted, as in ``window_deviation``)."""
    target = np.asarray(target, np.float64)
    worst = np.zeros(target.size)
    begun: np.ndarray | None = None  # a window some earlier part began
    for e in edges:
        head = np.asarray(e.head, np.float64)
        if begun is not None:
            head = begun + head
        if e.tail is None:  # the part ends inside the window
            begun = head
            continue
        if begun is not None and head.sum() > 0:
            worst = np.maximum(worst, np.abs(head / head.sum() - target))
        begun = np.asarray(e.tail, np.float64)
    return worst


def permute_rows(layout: Any, order: np.ndarray) -> Any:
    """The layout with its rows in ``order`` (new row j is old row ``order[j]``)."""
    counts = np.diff(layout.row_offsets)[order]
    offsets = np.zeros(order.size + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    within = np.arange(int(offsets[-1]), dtype=np.int64) - np.repeat(offsets[:-1], counts)
    pieces = layout.row_pieces[np.repeat(layout.row_offsets[:-1][order], counts) + within]
    return type(layout)(layout.capacity, offsets, pieces, layout.row_tokens[order])


def _pack_of_piece(plan: Any) -> np.ndarray:
    """The short row (pack) of each piece, -1 for a piece in no short row (a long one)."""
    out = np.full(plan.piece_len.size, -1, np.int64)
    short = plan.short
    out[short.row_pieces] = np.repeat(
        np.arange(short.num_rows, dtype=np.int64), np.diff(short.row_offsets)
    )
    return out


def _rounded(values: np.ndarray) -> list[float]:
    return [round(float(x), 6) for x in values]


def order_plan(
    plan: Any, first_doc: np.ndarray, window_tokens: int, seed: int = 0, exchange: bool = True
) -> tuple[Any, dict[str, WindowSpread]]:
    """The plan with each config's rows in ``mix_order`` (pieces' keys give their source),
    with ``exchange`` the long config's then balanced per window (``exchange_plan``), and
    per config the per-window deviation (``window_deviation``) at ``window_tokens`` tokens
    per window, before (the shuffled order) and after, and the long config's piece bound.

    The exchange balances windows aligned to the plan's first row, so it is for a plan whose
    rows start the output (one group); a group of several is exchanged once every group's
    row count, hence its first output row, is known (``exchange_plan``'s ``offset``)."""
    import dataclasses

    from packcli.pack import exchange as xc

    src = source_of(plan.piece_doc, first_doc)
    k = first_doc.size
    sizes = plan.piece_size
    layouts: dict[str, Any] = {}
    spread: dict[str, WindowSpread] = {}
    for name in ("short", "long"):
        layout = getattr(plan, name)
        m = row_source_tokens(layout.row_offsets, layout.row_pieces, src, sizes, k)
        order = mix_order(m)
        layouts[name] = permute_rows(layout, order)
        window = max(1, window_tokens // layout.capacity)
        before, after = window_deviation(m, window), window_deviation(m[order], window)
        spread[name] = WindowSpread(
            window_rows=window,
            windows=int(after["windows"]),
            tokens=m.sum(axis=0).astype(np.int64).tolist(),
            max_deviation=_rounded(after["max"]),
            p99_deviation=_rounded(after["p99"]),
            shuffled_max_deviation=_rounded(before["max"]),
        )
        if name == "long" and plan.short is not None and k >= 2:
            units = xc.units_of(layouts[name], _pack_of_piece(plan), src, sizes, k)
            target = m.sum(axis=0) / max(m.sum(), 1)
            max_piece = units.vec.max(axis=0) if units.vec.size else np.zeros(k)
            bound = xc.piece_bound(max_piece, target, window * layout.capacity)
            spread[name] = dataclasses.replace(spread[name], piece_bound=_rounded(bound))
    ordered = dataclasses.replace(plan, **layouts)
    if exchange:
        ordered, spread["long"] = exchange_plan(ordered, first_doc, spread["long"], seed)
    return ordered, spread


def exchange_plan(
    plan: Any,
    first_doc: np.ndarray,
    spread: WindowSpread,
    seed: int = 0,
    offset: int = 0,
    open_end: bool = False,
    following: np.ndarray | None = None,
) -> tuple[Any, WindowSpread]:
    """The plan with its long config's units exchanged between the output's windows
    (``packcli.pack.exchange``: windows of up to 4 steps, or more where a piece forbids, then the
    steps inside each), and its long config's ``spread`` (``order_plan``'s) updated.
    ``offset``: the plan's first long row is the output's row ``offset``, whose windows
    start at the output's row 0; ``open_end``: another part's rows follow (the windows the
    plan shares with its neighbours then hold their share of a step: ``exchange.Windows``);
    ``following``: the next part's first long rows' tokens per source (R, K; by
    ``piece_size``), when known, counted in the window shared with them.
    A plan ``order_plan`` gave no piece bound (no short config, one source) is as it was."""
    import dataclasses

    from packcli.pack import exchange as xc

    layout = plan.long
    if spread.piece_bound is None or layout.num_rows <= 1:
        return plan, spread
    src = source_of(plan.piece_doc, first_doc)
    k = first_doc.size
    sizes = plan.piece_size
    pack_of_piece = _pack_of_piece(plan)
    m = row_source_tokens(layout.row_offsets, layout.row_pieces, src, sizes, k)
    units = xc.units_of(layout, pack_of_piece, src, sizes, k)
    target = m.sum(axis=0) / max(m.sum(), 1)
    max_piece = units.vec.max(axis=0) if units.vec.size else np.zeros(k)
    window = spread.window_rows
    w_ex = xc.exchange_window(window, layout.num_rows, layout.capacity, max_piece, target)

    def balance(layout: Any, rows: int, group: int = 0) -> tuple[Any, int]:
        return xc.balance_steps(
            layout, pack_of_piece, src, sizes, k, rows, seed, target, group, offset, open_end,
            following,
        )  # fmt: skip

    new, moves = balance(layout, w_ex)
    if w_ex > window:  # then the steps inside each window, trading within it only
        new, fine = balance(new, window, w_ex // window)
        moves += fine
    after_m = row_source_tokens(new.row_offsets, new.row_pieces, src, sizes, k)
    after = window_deviation(after_m, window, offset=offset)
    at_ex = window_deviation(after_m, w_ex, offset=offset)
    spread = dataclasses.replace(
        spread,
        windows=int(after["windows"]),
        max_deviation=_rounded(after["max"]),
        p99_deviation=_rounded(after["p99"]),
        exchange_window_rows=int(w_ex),
        exchange_moves=moves,
        exchange_max_deviation=_rounded(at_ex["max"]),
    )
    return dataclasses.replace(plan, long=new), spread


@dataclass(frozen=True)
class StepFigures:
    """An output's realised mix over its step windows (``StepSums.deviation``): per source
    the largest and 99th-percentile share deviation, its tokens, and how many windows."""

    max_deviation: list[float]
    p99_deviation: list[float]
    windows: int
    tokens: list[int]


@dataclass(frozen=True)
class StepSums:
    """Tokens of each source in the output's step windows (window ``j`` is output rows
    ``j * window_rows`` up to ``(j + 1) * window_rows``), for windows ``start`` onwards: what
    the realised mix per step is measured from, made part by part in any order (a part
    needs only its own rows and its first output row) and ``combined`` once, so neither the
    plan stage nor verify holds more than one part's rows and one vector per window."""

    window_rows: int
    start: int
    sums: np.ndarray  # (windows, sources) int64

    @classmethod
    def of_rows(cls, matrix: np.ndarray, window_rows: int, first_row: int) -> StepSums:
        """Of a part whose rows (``matrix[r, k]``: tokens of source k in row r) start at
        the output's row ``first_row``."""
        matrix = np.asarray(matrix, np.int64)
        w = max(1, int(window_rows))
        if matrix.shape[0] == 0:
            return cls(w, 0, np.zeros((0, matrix.shape[1]), np.int64))
        win = (np.arange(matrix.shape[0], dtype=np.int64) + first_row) // w
        cuts = np.flatnonzero(np.r_[True, win[1:] != win[:-1]])
        return cls(w, int(win[0]), np.add.reduceat(matrix, cuts, axis=0))

    @classmethod
    def combined(cls, parts: Sequence[StepSums]) -> StepSums:
        """The sums of ``parts`` (at least one, of one window size, in any order; neighbours
        may share a window), into one array made once: summing them pairwise would copy
        the windows so far once per part."""
        if not parts:
            raise ValueError("no step sums to combine")
        w, k = parts[0].window_rows, parts[0].sums.shape[1]
        if any(p.window_rows != w for p in parts):
            raise ValueError("step sums of different windows")
        held = [p for p in parts if p.sums.shape[0]]
        if not held:
            return cls(w, 0, np.zeros((0, k), np.int64))
        start = min(p.start for p in held)
        sums = np.zeros((max(p.start + p.sums.shape[0] for p in held) - start, k), np.int64)
        for p in held:
            sums[p.start - start : p.start - start + p.sums.shape[0]] += p.sums
        return cls(w, start, sums)

    def deviation(self, n_rows: int) -> StepFigures:
        """Per source, the largest and the 99th percentile |share - target| over the full
        windows of an output of ``n_rows`` rows (its shorter last window is not counted,
        unless there is no full one), the target being the source's share of all rows: the
        definition of ``window_deviation`` at offset 0, over the whole output; and each
        source's tokens."""
        if self.start != 0 and self.sums.shape[0]:
            raise ValueError("step sums do not start at the output's first window")
        full = int(n_rows) // self.window_rows
        per = self.sums[: max(1, full)].astype(np.float64)
        total = self.sums.sum(axis=0).astype(np.float64)
        target = total / max(total.sum(), 1.0)
        if not per.shape[0]:
            per = np.zeros((1, target.size))
        worst, p99 = _share_deviation(per, target)
        return StepFigures(
            max_deviation=_rounded(worst),
            p99_deviation=_rounded(p99),
            windows=int(per.shape[0]),
            tokens=[int(x) for x in self.sums.sum(axis=0)],
        )
