"""Two-tier packing plan over document lengths only (no token data in memory).

1. **Pieces.** Every document becomes pieces by the overlong policy: up to ``long_len`` it is
   one piece; longer ones are ``split`` into consecutive pieces of ``long_len`` plus a
   remainder (each piece keeps its doc id and is then placed by its own length),
   ``truncate``d to ``long_len``, or ``drop``ped. Documents with zero tokens are dropped and
   counted (they cannot be placed and carry nothing to train on).
2. **Long documents first** (``bfd``). Long pieces are placed by best fit modulo
   ``short_len`` (after grouping them to totals near a multiple of ``short_len`` when that
   needs fewer rows), so each long row's free room ends close to a whole number of short
   packs. Where the room's residue modulo ``short_len`` is large, a *fitted* short pack of
   exactly that size is formed for it (it is a valid short row, just not a full one).
   The placement is then refined (``refine.refine_rooms``): pieces move or swap between
   rows whose residues are complements, so rooms end at whole packs and few fitted packs
   are needed; kept only where it costs neither tier more.
3. **Short tier.** Pieces of at most ``short_len`` are bin-packed into short packs of
   capacity ``short_len``, with the fitted packs open from the start; where best fit
   strands gaps, the smallest documents refill them exactly (``refine.pack_refilled``),
   and the least-filled packs trade their small pieces for large ones of full packs
   (``refine.sparse_partial_packs``: what a group releases to the tail stays sparse).
4. **Long tier.** Each fitted pack joins its row; the other short packs, as *indivisible*
   units, fill the rooms by best fit and open new rows as needed. A short pack is never
   broken up, so a short document never straddles a short-pack boundary in either view.
   (``ffd`` and ``wrapped`` pack the short tier first, then long pieces and packs together.)

Both tiers are global over the corpus and use ``binpack`` (best-fit decreasing: O(C + N
log_64 C), ~0.15 s per million documents). The fitted packs trade between the tiers: a
residue ``r`` is either wasted in the long row or costs ``short_len - r`` in the short tier,
and each row pays where that is cheaper relative to the tier's tokens; none is formed when
the whole-pack estimate of long rows says fitting saves no row. On the pretraining mix
of ``scripts/bench_plan.py`` at 10M documents this took the long tier from 1.000122x to
1.000075x its lower bound (the short tier from 1.000016x to 1.000040x), and the plan got
faster, not slower: 5.9 s against 6.6 s, interleaved on a loaded 2-core machine
(docs/benchmarks.md). Rows of each config are then shuffled with the seed, because
best-fit decreasing emits rows grouped by document size and training should not see all
long documents first. Everything here is deterministic for given lengths and config.

Context-parallel padding (``cp_size`` > 1) changes only what a piece takes of its row: its
length rounded up to a multiple of ``2 * cp_size`` (``Plan.piece_size``); pieces, their
lengths and the attention costs stay real, and the writer adds the padding.

Memory is ~40 bytes per piece for the plan itself, so 100M documents plan in ~4 GB.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from packcli.jit import kernel, pick
from packcli.names import CONFIG_NAMES
from packcli.pack.balance import balance_attention, balance_ratio
from packcli.pack.binpack import (
    counting_sort,
    group_by_residue,
    pack_granular,
    pack_into_open_bins,
    pack_lengths,
)
from packcli.pack.padding import padded_sizes
from packcli.pack.plan_config import PlanConfig
from packcli.pack.refine import pack_refilled, refine_rooms, sparse_partial_packs
from packcli.records import Fields


@dataclass(frozen=True)
class RowLayout:
    """Rows of one config as CSR over piece indices: row r holds
    ``pieces[row_pieces[row_offsets[r]:row_offsets[r+1]]]`` in that order."""

    capacity: int
    row_offsets: np.ndarray  # int64, n_rows + 1
    row_pieces: np.ndarray  # int64 indices into the piece arrays
    row_tokens: np.ndarray  # int64 tokens per row

    @property
    def num_rows(self) -> int:
        return len(self.row_offsets) - 1


CONFIGS = CONFIG_NAMES  # the configs a plan makes, the default first


@dataclass(frozen=True)
class Plan:
    """Pieces and the row layout of each config; a config that was not asked for
    (``plan_two_tier(..., configs=...)``) is ``None``."""

    piece_doc: np.ndarray  # int64 doc id of each piece
    piece_start: np.ndarray  # int64 token offset of the piece within its document
    piece_len: np.ndarray  # int64 piece length in tokens
    short: RowLayout | None
    long: RowLayout | None
    stats: dict[str, Any] = field(default_factory=dict)
    # Where each piece's tokens are read, when not at (doc, start) in the tokenized shards:
    # the tail's pieces are read whole from the tail shards the group writes made, by their
    # index there (``packcli.pack.groups.plan_tail``). None: read by doc id and start.
    piece_source: np.ndarray | None = None
    # Context-parallel padding (``PlanConfig.pad_multiple``): each piece takes
    # ``piece_size`` tokens of its row, its length rounded up to a multiple of this; the
    # writer fills the rest with padding. 1: a piece takes its length.
    pad_multiple: int = 1

    @property
    def piece_size(self) -> np.ndarray:
        """Tokens each piece takes in a row: its length plus its padding."""
        return padded_sizes(self.piece_len, self.pad_multiple)


def make_pieces(
    lengths: np.ndarray, long_len: int, overlong: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
    """Apply the overlong policy; returns piece (doc, start, len) arrays and policy counts."""
    lengths = np.asarray(lengths, dtype=np.int64)
    over = lengths > long_len
    empty = lengths == 0
    stats: dict[str, Any] = {
        "empty_docs": int(empty.sum()),
        "split_docs": 0,
        "split_tokens": 0,
        "split_pieces": 0,
        "truncated_docs": 0,
        "truncated_tokens": 0,
        "dropped_docs": 0,
        "dropped_tokens": 0,
    }
    n_over = int(over.sum())
    over_tokens = int(lengths[over].sum())
    # Pieces per document: 0 (empty or dropped), 1, or ceil(len / long_len) when split.
    if not n_over and not stats["empty_docs"]:  # the common case: a piece per document
        return np.arange(lengths.size, dtype=np.int64), np.zeros_like(lengths), lengths, stats
    n_pieces = (~empty).astype(np.int64)
    if n_over and overlong == "split":
        n_pieces[over] = -(-lengths[over] // long_len)
        stats.update(
            split_docs=n_over, split_tokens=over_tokens, split_pieces=int(n_pieces[over].sum())
        )
    elif n_over and overlong == "truncate":
        stats.update(truncated_docs=n_over, truncated_tokens=over_tokens - n_over * long_len)
    elif n_over:
        n_pieces[over] = 0
        stats.update(dropped_docs=n_over, dropped_tokens=over_tokens)
    # Built directly in canonical (doc, start) order: no sort needed.
    piece_doc = np.repeat(np.arange(lengths.size, dtype=np.int64), n_pieces)
    first = np.repeat(np.cumsum(n_pieces) - n_pieces, n_pieces)
    piece_start = (np.arange(piece_doc.size, dtype=np.int64) - first) * long_len
    piece_len = np.minimum(lengths[piece_doc] - piece_start, long_len)
    return piece_doc, piece_start, piece_len, stats


def piece_numbers(
    starts: np.ndarray,
    lens: np.ndarray,
    doc_lens: np.ndarray,
    long_len: int,
    truncated: np.ndarray | bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Of each piece ``doc[start:start + len]`` (``doc_lens``: its document's tokens), as
    ``make_pieces`` cuts documents: its 0-based index within its document (the pieces of a
    split document are consecutive slices of ``long_len``) and whether it is the last piece
    of its document in the output: it reaches the document's end, or its document was
    ``truncated`` to it (the rest is not in the output). Int32 and int8 (0/1) arrays."""
    starts = np.asarray(starts, dtype=np.int64)
    index = (starts // long_len).astype(np.int32)
    last = (starts + np.asarray(lens, dtype=np.int64) >= np.asarray(doc_lens)) | truncated
    return index, np.asarray(last, dtype=np.int8)


def _group_by(keys: np.ndarray, n_keys: int) -> tuple[np.ndarray, np.ndarray]:
    """Stable counting sort: ``order`` lists indices grouped by key (input order kept within
    a key) and ``offsets[k]:offsets[k+1]`` is key k's slice of it. O(N + K)."""
    return pick(counting_sort, keys.shape[0] // 8)(keys, n_keys)  # ~1/8 of a best-fit item


@kernel
def _concat_groups(group_order: np.ndarray, members: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Members of the groups in ``group_order``, group after group."""
    out = np.empty(members.shape[0], dtype=np.int64)
    n = 0
    for g in group_order:
        for j in range(offsets[g], offsets[g + 1]):
            out[n] = members[j]
            n += 1
    return out[:n]


def layout_units(
    capacity: int,
    group_order: np.ndarray,
    members: np.ndarray,
    offsets: np.ndarray,
    row_of_group: np.ndarray,
    n_rows: int,
    group_tokens: np.ndarray,
) -> RowLayout:
    """CSR rows from groups (short packs or long-tier units) listed in row order;
    ``group_tokens`` is the size of each group in tokens."""
    work = (members.shape[0] + group_order.shape[0]) // 8  # ~1/8 of a best-fit item each
    row_pieces = pick(_concat_groups, work)(group_order, members, offsets)
    sizes = np.diff(offsets)
    row_offsets = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(row_of_group, weights=sizes, minlength=n_rows), out=row_offsets[1:])
    row_tokens = np.bincount(row_of_group, weights=group_tokens, minlength=n_rows).astype(np.int64)
    return RowLayout(capacity, row_offsets, row_pieces, row_tokens)


def _fitted(room: np.ndarray, short_len: int, short_tokens: int, total_tokens: int) -> np.ndarray:
    """Which long rows get a *fitted* short pack: one formed to the size of the row's room
    modulo ``short_len`` (its residue ``r``), so whole short packs fill the room exactly.

    Without it the residue is wasted in the long config (full packs do not fit in it); with
    it the fitted pack is a short row of ``r`` tokens, ``short_len - r`` under a full one.
    Either tier pays, so the cheaper one does, relative to its tokens: fit when
    ``(short_len - r) / short_tokens < r / total_tokens``. Fitting only helps when the short
    packs outgrow the long rows' whole-pack room (otherwise no row is saved).
    """
    res = room % short_len
    if short_tokens <= int((room - res).sum()):
        return np.zeros(room.size, dtype=bool)
    return (short_len - res) * total_tokens < res * short_tokens


def _estimate_rows(
    room: np.ndarray,
    short_len: int,
    long_len: int,
    short_tokens: int,
    total_tokens: int,
    fit: bool = True,
) -> int:
    """Long rows when short packs of ``short_len`` (plus fitted packs, with ``fit``) fill
    ``room``."""
    res = room % short_len
    if fit:
        res = res[~_fitted(room, short_len, short_tokens, total_tokens)]
    lost = int(res.sum())
    spill = short_tokens - (int(room.sum()) - lost)
    return int(room.size) + (-(-spill // long_len) if spill > 0 else 0)


# The placement's rule, as a version (part of the plan's fingerprint, so a work folder
# planned by an older rule is planned again): 2, long pieces moved between rows to steer
# their rooms to whole packs (``refine_rooms``) and the short tier refilled where best fit
# strands gaps (``pack_refilled``).
PLACEMENT_RULE = 2

# A mixture's long pieces of more than ``long_len / SPREAD_ABOVE`` tokens go one to a row
# (``_spread_long_pieces``).
SPREAD_ABOVE = 4


def _place_long_pieces(
    long_sizes: np.ndarray,
    config: PlanConfig,
    short_tokens: int,
    total_tokens: int,
    spread: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Row of every long piece and each row's free room, by the better of two variants.

    A: long pieces directly by best fit modulo short_len (dense rows; best when short packs
    are scarce). B: long pieces first grouped to totals near a multiple of short_len, groups
    placed the same way (best when packs are plentiful). The variant with fewer estimated
    rows wins (ties: A); the estimate counts whole short packs into each row's room. With
    ``spread``, the large pieces then go one to a row where that costs no row
    (``_spread_long_pieces``).
    """
    S, L = config.short_len, config.long_len
    row_of_long, room = pack_granular(long_sizes, L, S)
    est = _estimate_rows(room, S, L, short_tokens, total_tokens)
    group = group_by_residue(long_sizes, L, S)
    if group.size:
        group_sizes = np.bincount(group, weights=long_sizes).astype(np.int64)
        row_of_group, room_b = pack_granular(group_sizes, L, S)
        est_b = _estimate_rows(room_b, S, L, short_tokens, total_tokens)
        if est_b < est:
            row_of_long, room, est = row_of_group[group], room_b, est_b
    if spread:
        spread_out = _spread_long_pieces(long_sizes, group, config, est, short_tokens, total_tokens)
        if spread_out is not None:
            row_of_long, room = spread_out
    return _refined(long_sizes, row_of_long, room, config, short_tokens, total_tokens, spread)


def _refined(
    long_sizes: np.ndarray,
    row_of_long: np.ndarray,
    room: np.ndarray,
    config: PlanConfig,
    short_tokens: int,
    total_tokens: int,
    spread: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """The placement after ``refine_rooms`` (rooms' residues steered to whole packs) where
    that costs less in one tier and no more in the other (``_placement_cost``), else as it
    is; not tried where the placement already costs nothing beyond the bound. ``spread``:
    large pieces stay one to a row."""
    S, L = config.short_len, config.long_len
    cost = _placement_cost(room, S, L, short_tokens, total_tokens)
    if cost <= (-(-total_tokens // L), 0):
        return row_of_long, room
    large = long_sizes > L // SPREAD_ABOVE if spread else None
    row2, room2, moves = refine_rooms(
        long_sizes, row_of_long, room, S, short_tokens, total_tokens, large
    )
    new = _placement_cost(room2, S, L, short_tokens, total_tokens)
    # Taken only if it costs neither tier more: an estimated row saved at the price of new
    # fitted packs can be a row the real packs do not save (the estimate fills rooms to the
    # token), and then the fitted packs only cost short rows.
    if moves and new != cost and new[0] <= cost[0] and new[1] <= cost[1]:
        return row2, room2
    return row_of_long, room


def _fit_rows(
    room: np.ndarray, short_len: int, long_len: int, short_tokens: int, total_tokens: int
) -> np.ndarray:
    """The rows that get a fitted pack (``_fitted``); none where fitting saves no long row
    (fitted packs would only add short rows)."""
    fit = _fitted(room, short_len, short_tokens, total_tokens)
    if fit.any() and _estimate_rows(
        room, short_len, long_len, short_tokens, total_tokens, fit=False
    ) <= _estimate_rows(room, short_len, long_len, short_tokens, total_tokens):
        fit[:] = False
    return fit


def _placement_cost(
    room: np.ndarray, short_len: int, long_len: int, short_tokens: int, total_tokens: int
) -> tuple[int, int]:
    """What a placement of the long pieces costs, as ``_pack_two_tier_bfd`` packs it:
    (estimated long rows, tokens its fitted packs lack of full short packs)."""
    fit = _fit_rows(room, short_len, long_len, short_tokens, total_tokens)
    rows = _estimate_rows(
        room, short_len, long_len, short_tokens, total_tokens, fit=bool(fit.any())
    )
    return rows, int((short_len - room[fit] % short_len).sum())


def _spread_long_pieces(
    long_sizes: np.ndarray,
    group: np.ndarray,
    config: PlanConfig,
    rows: int,
    short_tokens: int,
    total_tokens: int,
) -> tuple[np.ndarray, np.ndarray] | None:
    """Each long piece of more than ``long_len / SPREAD_ABOVE`` tokens in a row of its own
    (largest first), the other long pieces by best fit modulo short_len into their rooms and
    new rows, or (where that leaves fewer rows) residue groups each led by one large piece;
    None when either would take more than ``rows`` rows (the dense placement's estimate) or
    there is nothing to spread. ``group``: the long pieces' residue groups
    (``group_by_residue``, which the dense placement made).

    Why, for a mixture: dense placement fills a row with two or three such pieces (book
    pieces of 40k-100k made rows of 103k-131k books), so a source of large documents sits in
    few rows, and the exchange, which moves whole units and rows between step windows, cannot
    give each window its share: at 4M tokens a step, books were 0.70-1.33 points off
    (docs/benchmarks.md). One to a row, their rooms filled with short packs, the same tokens
    spread over 2-3x the rows.
    """
    S, L = config.short_len, config.long_len
    large = long_sizes > L // SPREAD_ABOVE
    big = np.flatnonzero(large)
    if big.size == 0 or big.size > rows:
        return None
    # The placement taken and its estimated rows: one needing at most ``rows``, the fewest.
    best: tuple[np.ndarray, np.ndarray] | None = None
    best_rows = rows + 1
    # A: the large pieces alone in their rows (largest first), the others by best fit
    # modulo short_len into the rooms they leave and new rows.
    big = big[np.argsort(-long_sizes[big], kind="stable")]
    small = np.flatnonzero(~large)
    row_of_long = np.empty(long_sizes.size, dtype=np.int64)
    row_of_long[big] = np.arange(big.size)
    row_of_long[small], room = pack_granular(
        long_sizes[small], L, S, open_remaining=L - long_sizes[big]
    )
    est = _estimate_rows(room, S, L, short_tokens, total_tokens)
    if est < best_rows:
        best, best_rows = (row_of_long, room), est
    # B: ``group``, the pieces grouped to totals near multiples of short_len
    # (``group_by_residue``, which starts a group at each large piece, largest first), each
    # group holding a large piece in a row of its own, the other groups as in A: the rooms
    # then end near whole packs.
    group = _one_large_each(group, large)
    group_sizes = np.bincount(group, weights=long_sizes).astype(np.int64)
    large_in = np.bincount(group, weights=large, minlength=group_sizes.size)
    lead = np.flatnonzero(large_in == 1)
    lead = lead[np.argsort(-group_sizes[lead], kind="stable")]
    rest = np.flatnonzero(large_in == 0)
    row_of_group = np.empty(group_sizes.size, dtype=np.int64)
    row_of_group[lead] = np.arange(lead.size)
    row_of_group[rest], room_b = pack_granular(
        group_sizes[rest], L, S, open_remaining=L - group_sizes[lead]
    )
    if _estimate_rows(room_b, S, L, short_tokens, total_tokens) < best_rows:  # ties: A
        best = row_of_group[group], room_b
    return best


def _one_large_each(group: np.ndarray, large: np.ndarray) -> np.ndarray:
    """``group`` with every large piece after a group's first in a group of its own (a
    residue group may take a large piece as a member; two would share a row)."""
    members = np.flatnonzero(large)
    order = members[np.argsort(group[members], kind="stable")]
    first = np.ones(order.size, dtype=bool)
    first[1:] = group[order[1:]] != group[order[:-1]]
    extra = order[~first]
    if extra.size == 0:
        return group
    out = group.copy()
    out[extra] = int(group.max()) + 1 + np.arange(extra.size)
    return out


def _pack_two_tier_bfd(
    short_sizes: np.ndarray,
    long_sizes: np.ndarray,
    config: PlanConfig,
    stats: dict[str, Any],
    fill_rows: bool = True,
    spread: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int]:
    """``bfd`` for both tiers: (pack of each short piece, pack sizes, long row of each unit
    -- long pieces then packs --, number of long rows); with ``fill_rows`` False the long
    rows are not filled (``None``, 0): the short packs do not depend on that step.
    ``spread``: large long pieces one to a row (``_place_long_pieces``).

    Long pieces are placed first, so that each row's free room ends close to a multiple of a
    short pack (plain best fit over all units leaves on average half a short pack of waste in
    every row holding long documents: 1.0104x the lower bound on the demo corpus, 1.0028x on
    a pretraining mix). Then the short tier is packed by best fit with the fitted packs (see
    ``_fitted``) open from the start, so they are formed first among equals and filled
    exactly by small documents; each fitted pack goes to its row, and the other packs fill
    the rooms by best fit, opening new rows as needed.
    """
    S, L = config.short_len, config.long_len
    short_tokens = int(short_sizes.sum())
    total_tokens = short_tokens + int(long_sizes.sum())
    row_of_long, room = _place_long_pieces(long_sizes, config, short_tokens, total_tokens, spread)
    fit_rows = np.flatnonzero(_fit_rows(room, S, L, short_tokens, total_tokens))
    pack_of_short, n_packs = pack_refilled(short_sizes, S, room[fit_rows] % S)
    pack_sizes = np.bincount(pack_of_short, weights=short_sizes, minlength=n_packs)
    pack_sizes = pack_sizes.astype(np.int64)
    k = fit_rows.size
    if k and not pack_sizes[:k].all():  # a fitted pack nothing went into is no row
        keep = pack_sizes > 0
        new_id = np.cumsum(keep) - 1
        pack_of_short = new_id[pack_of_short]
        fit_rows = fit_rows[keep[:k]]
        pack_sizes = pack_sizes[keep]
        k = fit_rows.size
    stats["fitted_packs"] = int(k)
    pack_of_short = sparse_partial_packs(pack_of_short, short_sizes, pack_sizes, S)
    if not fill_rows:
        return pack_of_short, pack_sizes, None, 0
    room = room.copy()
    room[fit_rows] -= pack_sizes[:k]
    row_of_rest, n_rows = pack_into_open_bins(pack_sizes[k:], L, room)
    row_of_unit = np.concatenate([row_of_long, fit_rows, row_of_rest])
    return pack_of_short, pack_sizes, row_of_unit, int(n_rows)


def _pack_long_tier(
    unit_sizes: np.ndarray, unit_first_doc: np.ndarray, config: PlanConfig
) -> tuple[np.ndarray, int]:
    """Row of every unit (long pieces, then short packs) for ``ffd`` and ``wrapped``:
    ``ffd`` packs all units at once; ``wrapped`` fills rows with the units in input order
    (plain concatenation, without cutting documents) as a baseline."""
    L = config.long_len
    if config.algorithm == "wrapped":
        order = np.argsort(unit_first_doc, kind="stable")
        rows = np.empty(unit_sizes.size, dtype=np.int64)
        rows[order] = pack_lengths(unit_sizes[order], L, algorithm="wrapped")
    else:
        rows = pack_lengths(unit_sizes, L, algorithm=config.algorithm)
    return rows, int(rows.max()) + 1 if rows.size else 0


def plan_two_tier(
    lengths: np.ndarray,
    config: PlanConfig,
    *,
    configs: tuple[str, ...] = CONFIGS,
    spread: bool = False,
) -> Plan:
    """Plan the configs named in ``configs`` (both by default) from document lengths
    (index = doc id). ``spread``: a mixture's plan, its large long pieces one to a long row
    (``_spread_long_pieces``; ``bfd`` only).

    A config left out is ``None`` in the plan and costs only what the other one needs: a
    short-only plan still places the long pieces (the fitted short packs depend on them) but
    does not fill, lay out or cost the long rows. The layout of a config is the same with or
    without the other one.
    """
    if not configs or set(configs) - set(CONFIGS):
        raise ValueError(f"configs must name one or both of {CONFIGS}, got {configs!r}")
    want_long, want_short = "long" in configs, "short" in configs
    S, L = config.short_len, config.long_len
    piece_doc, piece_start, piece_len, stats = make_pieces(lengths, L, config.overlong)
    # With context-parallel padding every piece is placed by its padded size (tiers are
    # multiples of the padding, so a piece is short exactly when its padded size is).
    piece_size = padded_sizes(piece_len, config.pad_multiple)
    is_short = piece_len <= S
    short_idx = np.flatnonzero(is_short)
    long_idx = np.flatnonzero(~is_short)

    short_sizes, long_sizes = piece_size[short_idx], piece_size[long_idx]
    if config.algorithm == "bfd":
        pack_of_short, pack_sizes, row_of_unit, n_rows = _pack_two_tier_bfd(
            short_sizes, long_sizes, config, stats, fill_rows=want_long, spread=spread
        )
    else:  # short tier first, then packs and long pieces together
        pack_of_short = pack_lengths(short_sizes, S, algorithm=config.algorithm)
        n_packs = int(pack_of_short.max()) + 1 if pack_of_short.size else 0
        pack_sizes = np.bincount(pack_of_short, weights=short_sizes, minlength=n_packs)
        pack_sizes = pack_sizes.astype(np.int64)
        row_of_unit, n_rows = None, 0  # placed with the long layout
    n_packs = pack_sizes.size
    # The short config's shuffle is drawn first, so it is the same with or without long rows.
    rng = np.random.default_rng(config.seed)
    pack_rank = rng.permutation(n_packs).astype(np.int64)
    short = long = None
    if want_short:
        # Packs in shuffled order, each pack's pieces in (doc, start) order: one stable
        # counting sort of the pieces by their pack's rank.
        by_rank, row_offsets = _group_by(pack_rank[pack_of_short], n_packs)
        row_tokens = np.empty(n_packs, dtype=np.int64)
        row_tokens[pack_rank] = pack_sizes
        short = RowLayout(S, row_offsets, short_idx[by_rank], row_tokens)
    if want_long:
        long = _long_layout(
            config,
            piece_doc,
            piece_len,
            piece_size,
            long_idx,
            short_idx,
            pack_of_short,
            pack_sizes,
            row_of_unit,
            n_rows,
            rng,
            stats,
        )
    stats.update(
        documents=int(np.asarray(lengths).size),
        input_tokens=int(np.asarray(lengths, dtype=np.int64).sum()),
        short_pieces=int(short_idx.size),
        long_pieces=int(long_idx.size),
    )
    return Plan(
        piece_doc, piece_start, piece_len, short, long, stats, pad_multiple=config.pad_multiple
    )


def _long_layout(
    config: PlanConfig,
    piece_doc: np.ndarray,
    piece_len: np.ndarray,
    piece_size: np.ndarray,
    long_idx: np.ndarray,
    short_idx: np.ndarray,
    pack_of_short: np.ndarray,
    pack_sizes: np.ndarray,
    row_of_unit: np.ndarray | None,
    n_rows: int,
    rng: np.random.Generator,
    stats: dict[str, Any],
) -> RowLayout:
    """The long config: units (long pieces 0..nl-1, then packs) in rows (placed here unless
    ``row_of_unit`` is given), attention balance, rows in shuffled order, and within a row
    units by first document. Units take their pieces' padded sizes (``piece_size``); the
    attention cost counts real tokens, as the report and ``verify`` do."""
    L = config.long_len
    unit_sizes = np.concatenate([piece_size[long_idx], pack_sizes])
    n_units = unit_sizes.size
    unit_of_piece = np.empty(piece_len.size, dtype=np.int64)
    unit_of_piece[long_idx] = np.arange(long_idx.size)
    unit_of_piece[short_idx] = long_idx.size + pack_of_short
    # Pieces are in (doc, start) order, so grouping is stable and each unit's first member
    # is its first document; a unit sorts by that, so rows read roughly in corpus order.
    unit_members, unit_offsets = _group_by(unit_of_piece, n_units)
    unit_first_doc = piece_doc[unit_members[unit_offsets[:-1]]]
    if row_of_unit is None:
        row_of_unit, n_rows = _pack_long_tier(unit_sizes, unit_first_doc, config)
    # Attention cost of each unit: a long piece's length squared, a pack's sum of squares.
    piece_sq = piece_len.astype(np.float64) ** 2
    unit_cost = np.bincount(unit_of_piece, weights=piece_sq, minlength=n_units)
    is_long = np.arange(n_units) < long_idx.size
    if config.balance == "attention" and n_rows:
        row_of_unit, balance = balance_attention(row_of_unit, unit_sizes, unit_cost, is_long, L)
    else:
        row_cost = np.bincount(row_of_unit, weights=unit_cost, minlength=n_rows)
        balance = {"ratio": balance_ratio(row_cost)}
    stats["long_attention_balance"] = balance
    row_rank = rng.permutation(n_rows).astype(np.int64)
    unit_row = row_rank[row_of_unit]
    # Units by first document: a stable counting sort (pieces are in doc order, so the
    # last piece has the largest doc id); the same order as a stable argsort, 5x faster.
    n_docs = int(piece_doc[-1]) + 1 if piece_doc.size else 0
    by_doc, _ = _group_by(unit_first_doc, n_docs)
    by_row, _ = _group_by(unit_row[by_doc], n_rows)
    return layout_units(L, by_doc[by_row], unit_members, unit_offsets, unit_row, n_rows, unit_sizes)


@dataclass(frozen=True)
class TierFigures(Fields):
    """A config's entry in the report's ``tiers`` (``RowTotals.summary``): its rows against
    the lower bound ``ceil(tokens / capacity)``, in the order ``packcli.json`` lists them."""

    capacity: int
    rows: int
    tokens: int
    segments: int
    efficiency: float
    lower_bound_rows: int
    rows_over_bound: float
    max_row_tokens: int


@dataclass(frozen=True)
class RowTotals:
    """What the report says of one config's rows, summed so that parts (and files) add up
    without keeping a value per row: rows, units (pieces; a preference pair is one), tokens,
    the largest row, and the attention cost (sum over rows of their units' squared lengths,
    the largest row's, and the largest single long unit's)."""

    capacity: int
    rows: int = 0
    units: int = 0
    tokens: int = 0
    max_row_tokens: int = 0
    cost: int = 0
    max_cost: int = 0
    max_unit_cost: int = 0

    @classmethod
    def of_rows(
        cls,
        capacity: int,
        unit_len: np.ndarray,
        unit_row: np.ndarray,
        n_rows: int,
        short_len: int = 0,
    ) -> RowTotals:
        """From each unit's length and 0-based row; ``max_unit_cost`` over units longer
        than ``short_len``."""
        unit_len = np.asarray(unit_len, dtype=np.int64)
        sq = unit_len * unit_len
        row_tokens = np.bincount(unit_row, weights=unit_len, minlength=n_rows)
        row_cost = np.bincount(unit_row, weights=sq, minlength=n_rows)
        longs = sq[unit_len > short_len]
        return cls(
            capacity=capacity,
            rows=n_rows,
            units=int(unit_len.size),
            tokens=int(unit_len.sum()),
            max_row_tokens=int(row_tokens.max()) if n_rows else 0,
            cost=int(sq.sum()),
            max_cost=int(row_cost.max()) if n_rows else 0,
            max_unit_cost=int(longs.max()) if longs.size else 0,
        )

    @classmethod
    def of(cls, layout: RowLayout, piece_len: np.ndarray, short_len: int = 0) -> RowTotals:
        counts = np.diff(layout.row_offsets)
        rows = np.repeat(np.arange(layout.num_rows), counts)
        return cls.of_rows(
            layout.capacity, piece_len[layout.row_pieces], rows, layout.num_rows, short_len
        )

    def __add__(self, other: RowTotals) -> RowTotals:
        return RowTotals(
            capacity=self.capacity,
            rows=self.rows + other.rows,
            units=self.units + other.units,
            tokens=self.tokens + other.tokens,
            max_row_tokens=max(self.max_row_tokens, other.max_row_tokens),
            cost=self.cost + other.cost,
            max_cost=max(self.max_cost, other.max_cost),
            max_unit_cost=max(self.max_unit_cost, other.max_unit_cost),
        )

    @property
    def balance(self) -> float:
        """max / mean over rows of their attention cost (1.0 = perfectly balanced)."""
        return self.max_cost * self.rows / self.cost if self.cost else 1.0

    def summary(self) -> TierFigures:
        """Rows, tokens, efficiency and distance from the lower bound ceil(tokens / capacity)."""
        bound = -(-self.tokens // self.capacity)
        return TierFigures(
            capacity=self.capacity,
            rows=self.rows,
            tokens=self.tokens,
            segments=self.units,
            efficiency=self.tokens / (self.rows * self.capacity) if self.rows else 1.0,
            lower_bound_rows=bound,
            rows_over_bound=self.rows / bound if bound else 1.0,
            max_row_tokens=self.max_row_tokens,
        )


def tier_summary(layout: RowLayout) -> dict[str, Any]:
    """Rows, tokens, efficiency and distance from the lower bound ceil(tokens / capacity)."""
    return (
        RowTotals(
            capacity=layout.capacity,
            rows=layout.num_rows,
            units=int(layout.row_offsets[-1]),  # = row_pieces.size (CSR)
            tokens=int(layout.row_tokens.sum()),
            max_row_tokens=int(layout.row_tokens.max()) if layout.num_rows else 0,
        )
        .summary()
        .to_json()
    )
