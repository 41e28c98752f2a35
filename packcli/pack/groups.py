"""Planning by groups of shards, so no process holds the whole corpus (issue 23's design).

A global plan needs every document's length in one process (~116 B per document: 12 GB at
100M documents) and makes every write task read most shards, because best fit scatters a
file's rows over the whole corpus. Here the corpus is cut into **groups** of tokenized
shards instead, and each group is planned, and later written, on its own:

1. **Groups stride over the shards** (shard ``s`` is in group ``s mod G``, ``G`` from the
   corpus's token count and ``group_tokens``, never from the task count), so every group
   samples the whole input and a group's rows are as mixed as global rows would be; output
   bytes do not depend on how many tasks run. A mixture's groups are cut finer
   (``source_slices``): runs of each source's documents, ``1/G`` of its tokens each, so
   every group holds the mix whatever the sources' shard counts.
2. **Each group is planned** by ``plan_two_tier`` over its own lengths (its own seed, drawn
   from ``seed`` and the group index). Then its least-filled rows are **released**: long
   rows in order of free room, most first, until the room left in the kept long rows is at
   most ``tail_share`` of the group's long-config tokens, and likewise for short packs
   (a released short pack takes the long row it sits in with it, so both views stay
   consistent: a kept short pack is always whole inside a kept long row), but at most
   ``MOST_RELEASED`` rows per config: more under-filled rows than best fit's last few is
   the corpus's shape, which no tail can fill. The other packs of a released long row are
   exchanged for kept packs of fewer pieces (``_fewest_pieces``), and whatever is released
   (every piece of the released long rows) goes to the **tail**. A mixture's group also
   gives the tail whole rows, so that what it gives holds its mix (``balance_tail``).
3. **The tail is planned once, globally** (``plan_tail``): the released pieces of every
   group, which are small (a few percent of the tokens at most, often 0.1%), packed
   two-tier as one corpus (rows given whole are taken as they are). Its under-filled last
   rows are the only ones the job leaves.

Cost in packing: each group leaves at most ``tail_share`` of its tokens as free room in the
rows it keeps (beyond its ``MOST_RELEASED`` roomiest rows, which a global plan would leave
under-filled too), and the tail adds the global plan's own rounding, so rows / lower bound
stay within about ``1 + tail_share`` of the bound per tier (``scripts/bench_scale.py``
measures it: docs/scale.md). Cost in memory: a group's plan, ~116 B per document of that
group; the tail's, ~120 B per released piece at its peak. Released pieces were once ~5% of
a group's pieces (best fit decreasing fills the last rows with the smallest documents:
~50k one- and two-token documents per group of 1M); after the exchange a group of 1M
real-shaped documents releases ~30 pieces (0 to 60), so the tail's planner holds a few
kilobytes per group. Everything here is pure and deterministic for given lengths, groups
and config.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from packcli.names import CONFIG_NAMES
from packcli.pack.exchange import first_window_rows
from packcli.pack.plan import Plan, RowLayout, layout_units, plan_two_tier
from packcli.pack.plan_config import PlanConfig

# Tokens per group: a group's plan then holds ~1M documents of real text (~116 MB) and its
# shards are ~1 GB of int32, one write task's worth.
GROUP_TOKENS = 1 << 28
# Free room the rows a group keeps may hold, as a share of the group's tokens (per config).
TAIL_SHARE = 1e-4
# Rows a group releases by their room at most, per config (most room first). Best fit
# leaves one or two under-filled rows per tier at a group's end; more rows than that with
# room is the corpus's own shape (documents of 2,049 tokens leave half of every short pack
# free wherever they are planned), which the tail cannot improve: releasing them all would
# move the whole group into the tail, one process for the corpus.
MOST_RELEASED = 4
# Packs of released rows exchanged at most per group, most pieces first: the default sizes
# release ~1 long row of 32 packs; a tiny short_len (1,024 packs a row) stays bounded.
EXCHANGES = 256
# Long rows a mixture's group gives the tail whole at most (``balance_tail``): in the
# benchmark groups gave 12-16 with 8 released; each holds up to ~4,000 pieces of 30 tokens.
MOST_BALLAST = 32
# ...holding at most this many times the tokens it released (what it takes to bring a
# source the released pieces lack back to its share), and at most half its long rows.
BALLAST_SHARE = 4
# Which rows a group releases, as a version: part of the plan's fingerprint, so a work
# folder planned by another rule is planned again (grouped output bytes depend on it).
RELEASE_RULE = 2
# Policy counts summed over groups (the tail never holds an overlong or empty document).
POLICY_KEYS = (
    "empty_docs",
    "split_docs",
    "split_tokens",
    "split_pieces",
    "truncated_docs",
    "truncated_tokens",
    "dropped_docs",
    "dropped_tokens",
    "documents",
    "input_tokens",
)


@dataclass(frozen=True)
class Pieces:
    """Slices of documents, by global doc id: ``doc[i][start[i] : start[i] + length[i]]``."""

    doc: npt.NDArray[np.int64]
    start: npt.NDArray[np.int64]
    length: npt.NDArray[np.int64]

    @property
    def size(self) -> int:
        return int(self.length.size)

    @classmethod
    def concat(cls, parts: Sequence[Pieces]) -> Pieces:
        """The parts one after another; one part is returned as it is (no copy: the plan
        stage hands the tail's planner all released pieces already in one)."""
        if not parts:
            empty = np.zeros(0, dtype=np.int64)
            return cls(empty, empty, empty)
        if len(parts) == 1:
            return parts[0]
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in _PIECE_FIELDS))

    @classmethod
    def gather(cls, sizes: Sequence[int], load: Callable[[int], Pieces]) -> Pieces:
        """``load(i)`` for every part, ``sizes[i]`` pieces each, copied into arrays made once
        for all of them (one part loaded at a time): each piece is held once, where a list of
        the parts plus their ``concat`` holds it twice."""
        out = cls(*(np.empty(int(sum(sizes)), dtype=np.int64) for _ in _PIECE_FIELDS))
        at = 0
        for i, size in enumerate(sizes):
            part = load(i)
            if part.size != size:
                raise ValueError(f"part {i} has {part.size} pieces, expected {size}")
            for f in _PIECE_FIELDS:
                getattr(out, f)[at : at + size] = getattr(part, f)
            at += size
        return out


_PIECE_FIELDS = ("doc", "start", "length")


@dataclass(frozen=True)
class Ballast:
    """Whole rows a group gives the tail as they are (a mixture's, ``balance_tail``): each
    config's rows, their ``row_pieces`` indices into the tail's pieces (in a group's
    ``GroupPlan.tail``, after the pieces it released; in the tail's planner, into every
    group's tail pieces one after another)."""

    short: RowLayout
    long: RowLayout

    @classmethod
    def empty(cls, short_len: int, long_len: int) -> Ballast:
        none = np.zeros(0, dtype=np.int64)
        start = np.zeros(1, dtype=np.int64)
        return cls(RowLayout(short_len, start, none, none), RowLayout(long_len, start, none, none))

    @property
    def pieces(self) -> int:
        """How many tail pieces these rows hold (every one is in one long row)."""
        return int(self.long.row_pieces.size)

    @classmethod
    def concat(cls, parts: Sequence[Ballast], firsts: Sequence[int]) -> Ballast:
        """The parts' rows one after another, part ``i``'s pieces shifted by ``firsts[i]``
        (where its group's tail pieces start among all groups')."""
        short = concat_layouts([p.short for p in parts], firsts)
        return cls(short, concat_layouts([p.long for p in parts], firsts))


def concat_layouts(layouts: Sequence[RowLayout], bases: Sequence[int]) -> RowLayout:
    """Layouts of one config one after another, layout ``i``'s pieces shifted by
    ``bases[i]``."""
    offsets = [np.zeros(1, dtype=np.int64)]
    end = 0
    for layout in layouts:
        offsets.append(layout.row_offsets[1:] + end)
        end += int(layout.row_offsets[-1])
    return RowLayout(
        layouts[0].capacity,
        np.concatenate(offsets),
        np.concatenate(
            [np.zeros(0, np.int64)]
            + [x.row_pieces + int(b) for x, b in zip(layouts, bases, strict=True)]
        ),
        np.concatenate([np.zeros(0, np.int64)] + [x.row_tokens for x in layouts]),
    )


@dataclass(frozen=True)
class GroupPlan:
    """One group's kept rows (``plan``: doc ids are global) and what it gives the tail: the
    pieces it released, then (``ballast``, a mixture's) those of rows it gives whole."""

    plan: Plan
    tail: Pieces
    ballast: Ballast | None = None


def group_count(total_tokens: int, group_tokens: int = GROUP_TOKENS) -> int:
    """How many groups a corpus of ``total_tokens`` is planned in (at least one)."""
    if group_tokens <= 0:
        raise ValueError(f"group_tokens must be positive, got {group_tokens}")
    return max(1, -(-int(total_tokens) // group_tokens))


def shard_groups(n_shards: int, n_groups: int) -> list[np.ndarray]:
    """The shards of each group: shard ``s`` belongs to group ``s mod n_groups``, so each
    group samples the whole input order (no group is "the last files")."""
    n_groups = max(1, min(n_groups, n_shards)) if n_shards else 1
    return [np.arange(g, n_shards, n_groups, dtype=np.int64) for g in range(n_groups)]


# A run of one shard's documents: (shard, first row, end row), rows as in the shard.
Slice = tuple[int, int, int]


def whole_shards(members: np.ndarray, shard_docs: Sequence[int]) -> list[Slice]:
    """Whole shards as slices."""
    return [(int(s), 0, int(shard_docs[int(s)])) for s in members]


def source_slices(
    shard_source: np.ndarray,
    shard_weights: np.ndarray,
    shard_docs: np.ndarray,
    n_groups: int,
    weights_of: Callable[[int], np.ndarray],
) -> list[list[Slice]]:
    """A mixture's groups: each holds ``1/n_groups`` of every source's tokens, as runs of
    the source's documents. A document's tokens are its weight (``weights_of(shard)``, per
    document; ``shard_weights``, per shard: their sums): the plan stage weighs by the
    tokens its copies put in the output (``packcli.stages.plan._copy_weights``).

    Why: a group's rows can only hold the mix its documents have, and the output's steps
    are the groups' one after another, so a group whose share of a source differs from the
    source's share puts that difference in every step it writes. Whole shards cannot cut a
    source finely enough (a small file is one shard), so each source is cut at its
    ``g / n_groups`` token points, inside shards where they fall: document ``i`` of a
    source of ``T`` tokens goes to group ``floor(n_groups * m_i / T)``, ``m_i`` the token
    position of its midpoint. Each group then holds ``T / n_groups`` of the source to
    within half a document at each end. Only the shards a cut falls in have their weights
    read (``weights_of(shard)``); the others go whole by their token range. A source of no
    tokens is cut by document count instead. Groups holding nothing are left out."""
    n_groups = max(1, int(n_groups))
    shard_source = np.asarray(shard_source, np.int64)
    groups: list[list[Slice]] = [[] for _ in range(n_groups)]
    for k in np.unique(shard_source):
        members = np.flatnonzero(shard_source == k)
        by_tokens = int(np.asarray(shard_weights)[members].sum()) > 0
        sizes = np.asarray(shard_weights if by_tokens else shard_docs, np.int64)[members]
        total2 = 2 * max(1, int(sizes.sum()))  # in half tokens: midpoints are whole

        def group(mid2: Any, total2: int = total2) -> Any:
            return np.minimum(n_groups * mid2 // total2, n_groups - 1)

        before = 0
        for s, size in zip(members.tolist(), sizes.tolist(), strict=True):
            rows = int(shard_docs[s])
            first, last = int(group(2 * before)), int(group(2 * (before + size)))
            if first == last or rows == 0:
                if rows:
                    groups[first].append((s, 0, rows))
            else:
                lens = np.asarray(weights_of(s), np.int64) if by_tokens else np.ones(rows, np.int64)
                ends = np.cumsum(lens)
                of = group(2 * before + ends + (ends - lens))  # 2 x (before + midpoint)
                cuts = np.flatnonzero(np.diff(of)) + 1
                for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), rows], strict=True):
                    groups[int(of[a])].append((s, a, b))
            before += size
    return [sorted(g) for g in groups if g]


def group_seed(seed: int, group: int) -> int:
    """The shuffle seed of a group: independent streams per group, fixed by ``seed``."""
    return int(np.random.SeedSequence([seed, group]).generate_state(2, np.uint64)[0] >> 1)


def plan_group(
    lengths: np.ndarray,
    doc_ids: np.ndarray,
    config: PlanConfig,
    group: int,
    *,
    tail_share: float = TAIL_SHARE,
    most_released: int = MOST_RELEASED,
    spread: bool = False,
) -> GroupPlan:
    """Plan one group's documents (``lengths[i]`` is document ``doc_ids[i]``) and release
    its least-filled rows to the tail. ``spread``: a mixture's (``plan_two_tier``)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    doc_ids = np.asarray(doc_ids, dtype=np.int64)
    if lengths.shape != doc_ids.shape:
        raise ValueError("lengths and doc_ids must have the same shape")
    cfg = dataclasses.replace(config, seed=group_seed(config.seed, group))
    local = plan_two_tier(lengths, cfg, spread=spread)
    plan = dataclasses.replace(local, piece_doc=doc_ids[local.piece_doc])
    plan, released = _release(plan, tail_share, most_released)
    return GroupPlan(_keep(plan, ~released), _pieces(plan, released))


def plan_tail(
    tails: Sequence[Pieces],
    config: PlanConfig,
    ballast: Ballast | None = None,
    *,
    spread: bool = False,
) -> Plan:
    """The pieces every group gave the tail (in group order): the released ones planned
    two-tier as one corpus (``spread``: a mixture's, as ``plan_two_tier``), then the
    ``ballast`` rows (a mixture's: whole rows, their pieces among the tails') as they are.

    Every piece is at most ``long_len`` already, so each stays one piece; the plan's pieces
    are mapped back to their documents and offsets, and ``piece_source`` says where each
    is in the tails (where the tail's writer reads it)."""
    tail = Pieces.concat(tails)
    placed = np.zeros(tail.size, dtype=bool)
    if ballast is not None:
        placed[ballast.long.row_pieces] = True
    free = np.flatnonzero(~placed)
    plan = plan_two_tier(tail.length[free], config, spread=spread)
    idx = free[plan.piece_doc]  # index into the tail: one piece per released piece
    stats = {k: v for k, v in plan.stats.items() if k not in POLICY_KEYS}
    stats |= {"tail_pieces": tail.size, "tail_tokens": int(tail.length.sum())}
    planned = dataclasses.replace(
        plan,
        piece_doc=tail.doc[idx],
        piece_start=tail.start[idx] + plan.piece_start,
        stats=stats,
        piece_source=idx,
    )
    if ballast is None or not ballast.pieces:
        return planned
    given = np.flatnonzero(placed)  # the ballast's pieces, in tail order

    def local(x: RowLayout) -> RowLayout:  # row pieces as indices into ``given``
        return RowLayout(
            x.capacity, x.row_offsets, np.searchsorted(given, x.row_pieces), x.row_tokens
        )

    rows = Plan(
        tail.doc[given],
        tail.start[given],
        tail.length[given],
        short=local(ballast.short),
        long=local(ballast.long),
        pad_multiple=planned.pad_multiple,
        piece_source=given,
    )
    merged = merge_plans([planned, rows])
    stats |= {"ballast_rows": ballast.long.num_rows, "ballast_pieces": ballast.pieces}
    return dataclasses.replace(merged, stats=stats)


def balance_tail(
    grouped: GroupPlan,
    piece_src: np.ndarray,
    tail_src: np.ndarray,
    n_sources: int,
    most: int = MOST_BALLAST,
    align: int = 1,
) -> GroupPlan:
    """A mixture's group after giving the tail whole long rows (with the short packs in
    them) besides what it released, chosen so that what it gives holds the group's mix.

    Why: a group releases its least-filled rows, and ``_fewest_pieces`` fills them with the
    packs of fewest pieces, so the released pieces hold few of a source of short documents
    (1.7% of fortunes against 50% in ``scripts/bench_mixture.py``). The tail, planned from
    them, then held a mix of its own: the output's steps holding it were 2-50 points off,
    and every group's share moved by what it released. Rows given whole need no planning
    (the tail's planner takes them as they are, so its rows stay as full) and keep the
    short config whole. Greedy: the kept long row that brings the given pieces' share
    closest to the group's (sum of squared differences; ties: the lowest row), while it
    gets closer: at most ``most`` rows, half the group's, and ``BALLAST_SHARE`` times the
    released tokens. ``piece_src`` / ``tail_src``: each piece's source index in
    ``grouped.plan`` / ``grouped.tail``. Deterministic; nothing given by the greedy when the
    group released nothing.

    ``align``: then more rows, the same way (whatever the error and the token cap), until
    the group keeps a multiple of ``align`` long rows, where that takes fewer than
    ``align`` more and leaves the group at least half its rows. With ``align`` the rows of
    the exchange's window (``part_rows_multiple``) for every group but the last, every
    group starts at a window of the output: no step straddles two groups (the last one's
    last step straddles the tail, whose rows it makes up for). Why: a group's side of a
    step it shares with the next group can be one row, and one long row of a mixture is
    mostly one source (a book piece, or packs of fortunes), so that step was 1.6 points
    off for fortunes at 4M tokens a step where every other step held 0.3 (two groups at
    scale 1.0 in ``scripts/bench_mixture.py``); neither group knows the other's rows.

    Cost: the tail holds the given rows' pieces too (12-16 rows a group in the benchmark
    before aligning, 40k-70k pieces of 30-token documents; at most ``most + align - 1``
    rows a group), in the one process that plans it."""
    plan, tail = grouped.plan, grouped.tail
    long, short = plan.long, plan.short
    assert long is not None and short is not None
    n = plan.piece_len.size
    if not long.num_rows or n_sources < 2 or (not tail.size and align <= 1):
        return grouped
    long_row = _row_of_piece(long, n)
    flat = long_row * n_sources + np.asarray(piece_src, np.int64)
    rows = np.bincount(flat, weights=plan.piece_len, minlength=long.num_rows * n_sources)
    rows = rows.reshape(long.num_rows, n_sources)
    given = np.bincount(np.asarray(tail_src, np.int64), weights=tail.length, minlength=n_sources)
    given = given.astype(np.float64)  # an empty tail's count comes back as integers
    target = (rows.sum(axis=0) + given) / max(float(rows.sum() + given.sum()), 1.0)

    def error(v: np.ndarray) -> np.ndarray:
        tot = v.sum(axis=-1, keepdims=True)
        share = np.divide(v, tot, out=np.zeros_like(v), where=tot > 0)
        out: np.ndarray = ((share - target) ** 2).sum(axis=-1)
        return out

    chosen = np.zeros(long.num_rows, dtype=bool)
    best = float(error(given))
    room = BALLAST_SHARE * float(tail.length.sum())  # tokens the given rows may yet hold
    row_tokens = rows.sum(axis=1)
    for _ in range(min(most, long.num_rows // 2)):
        errs = error(given + rows)
        errs[chosen | (row_tokens > room)] = np.inf
        r = int(np.argmin(errs))
        if not errs[r] < best * (1 - 1e-6):
            break
        chosen[r], best, given = True, float(errs[r]), given + rows[r]
        room -= float(row_tokens[r])
    more = (long.num_rows - int(chosen.sum())) % max(1, align)
    if more and int(chosen.sum()) + more <= long.num_rows // 2:
        for _ in range(more):
            errs = error(given + rows)
            errs[chosen] = np.inf
            r = int(np.argmin(errs))
            chosen[r], given = True, given + rows[r]
    if not chosen.any():
        return grouped
    mask = chosen[long_row]
    rows_plan = _keep(plan, mask)
    assert rows_plan.short is not None and rows_plan.long is not None
    shift = tail.size  # the ballast's pieces follow the released ones in the group's tail
    ballast = Ballast(
        dataclasses.replace(rows_plan.short, row_pieces=rows_plan.short.row_pieces + shift),
        dataclasses.replace(rows_plan.long, row_pieces=rows_plan.long.row_pieces + shift),
    )
    return GroupPlan(_keep(plan, ~mask), Pieces.concat([tail, _pieces(plan, mask)]), ballast)


def part_rows_multiple(long_len: int, tokens_per_step: int) -> int:
    """Long rows of the exchange's first window at steps of ``tokens_per_step``: the
    multiple a mixture's group keeps (``balance_tail(align=...)``)."""
    return first_window_rows(tokens_per_step // long_len)


def policy_counts(stats: Sequence[dict[str, Any]]) -> dict[str, int]:
    """The overlong policy's counts of several groups' plans, summed (each document is in
    exactly one group, and the tail adds none)."""
    return {k: sum(int(s.get(k, 0)) for s in stats) for k in POLICY_KEYS}


def merge_plans(plans: Sequence[Plan]) -> Plan:
    """The plans' rows one after another as one plan (what the output holds, file after
    file): for checking invariants and counting rows, and the tail's ballast rows after its
    planned ones. ``piece_source`` is kept when every plan has it."""
    if not plans:
        raise ValueError("no plans to merge")
    base = np.cumsum([0] + [p.piece_len.size for p in plans])[:-1].tolist()
    layouts = {n: concat_layouts([getattr(p, n) for p in plans], base) for n in CONFIG_NAMES}
    stats: dict[str, Any] = policy_counts([p.stats for p in plans])
    sources = [p.piece_source for p in plans if p.piece_source is not None]
    return Plan(
        np.concatenate([p.piece_doc for p in plans]),
        np.concatenate([p.piece_start for p in plans]),
        np.concatenate([p.piece_len for p in plans]),
        stats=stats,
        pad_multiple=plans[0].pad_multiple,
        short=layouts["short"],
        long=layouts["long"],
        piece_source=np.concatenate(sources) if len(sources) == len(plans) else None,
    )


def _keep_least_room(room: np.ndarray, budget: float, most: int) -> np.ndarray:
    """Rows kept: the fullest ones, as many as keep their total free room within ``budget``,
    and every row but the ``most`` roomiest whatever the budget (ties by row index, so the
    choice is deterministic)."""
    order = np.argsort(room, kind="stable")
    keep = np.zeros(room.size, dtype=bool)
    keep[order[np.cumsum(room[order]) <= budget]] = True
    keep[order[: max(0, room.size - most)]] = True
    return keep


def _row_of_piece(layout: RowLayout, n_pieces: int) -> np.ndarray:
    row = np.full(n_pieces, -1, dtype=np.int64)
    row[layout.row_pieces] = np.repeat(np.arange(layout.num_rows), np.diff(layout.row_offsets))
    return row


def _release(plan: Plan, tail_share: float, most: int) -> tuple[Plan, np.ndarray]:
    """The plan with its released long rows holding as few pieces as equal-size swaps allow,
    and which of its pieces go to the tail.

    Long rows are released by free room (``_keep_least_room``), and so is every long row
    holding a short pack released by its own room. The other packs in those rows are then
    exchanged for packs of kept rows with fewer pieces (``_fewest_pieces``)."""
    long, short = plan.long, plan.short
    assert long is not None and short is not None
    n = plan.piece_len.size
    long_row = _row_of_piece(long, n)
    budget = tail_share * float(long.row_tokens.sum())
    keep_row = _keep_least_room(long.capacity - long.row_tokens, budget, most)
    keep_pack = _keep_least_room(
        short.capacity - short.row_tokens, tail_share * float(short.row_tokens.sum()), most
    )
    counts = np.diff(short.row_offsets)
    filled = counts > 0
    pack_row = _pack_rows(short, long_row)
    keep_row[pack_row[~keep_pack & filled]] = False
    if not keep_row.all():
        slack = budget - float((long.capacity - long.row_tokens)[keep_row].sum())
        movable = keep_pack & filled
        new_row = _fewest_pieces(pack_row, short.row_tokens, counts, movable, keep_row, slack)
        if not np.array_equal(new_row, pack_row):
            moved = _moved_packs(plan, long_row, new_row)
            plan = dataclasses.replace(plan, long=moved)
            long_row = _row_of_piece(moved, n)
    return plan, ~keep_row[long_row]


def _pack_rows(short: RowLayout, long_row: np.ndarray) -> np.ndarray:
    """The long row of each short pack (its first piece's), -1 for an empty pack."""
    filled = np.diff(short.row_offsets) > 0
    pack_row = np.full(short.num_rows, -1, dtype=np.int64)
    pack_row[filled] = long_row[short.row_pieces[short.row_offsets[:-1][filled]]]
    return pack_row


def _fewest_pieces(
    pack_row: np.ndarray,
    pack_tokens: np.ndarray,
    pack_pieces: np.ndarray,
    movable: np.ndarray,
    keep_row: np.ndarray,
    slack: float,
) -> np.ndarray:
    """Each pack's long row after exchanging packs between released and kept rows, so the
    released rows hold as few pieces as exchanges allow.

    Why: the rows a group releases are its least filled, which best fit decreasing fills
    last, with packs of the smallest documents; on real-shaped text one released row held
    ~50k one- and two-token documents, and the tail's planner (one process for the whole
    corpus) held every one. First packs of equal size change places, all at once
    (``_equal_exchanges``); then a released pack A still holding more pieces changes
    places with the kept pack B of fewest pieces (fewer than A's) that is at least as large,
    the smallest such, when the room B's row gains (B - A tokens) still fits the group's
    ``slack`` (the free room its kept rows may yet take): every pack stays whole, the short
    config is as it was, and a kept row keeps its fill or loses a little within the budget.
    On that row ~25 pieces were left (docs/scale.md). Movable packs are those kept by their
    own room (a pack released by its room goes to the tail whatever its row); released
    packs are taken most pieces first, at most ``EXCHANGES`` of them (each exchange scans
    the group's packs once), candidates by (pieces, tokens, index): deterministic."""
    new_row = _equal_exchanges(pack_row, pack_tokens, pack_pieces, movable, keep_row)
    out = np.flatnonzero(movable & ~keep_row[np.maximum(new_row, 0)])
    cand = np.flatnonzero(movable & keep_row[np.maximum(new_row, 0)])
    if not out.size or not cand.size:
        return new_row
    cand = cand[np.lexsort((cand, pack_tokens[cand], pack_pieces[cand]))]
    c_tokens, c_pieces = pack_tokens[cand], pack_pieces[cand]
    free = np.ones(cand.size, dtype=bool)
    moved = new_row.copy()
    for a in out[np.lexsort((out, -pack_pieces[out]))][:EXCHANGES]:
        size = int(pack_tokens[a])
        fits = free & (c_pieces < pack_pieces[a]) & (c_tokens >= size)
        fits &= c_tokens <= size + max(0.0, slack)
        if not fits.any():
            continue
        k = int(np.argmax(fits))
        b = cand[k]
        free[k] = False
        slack -= int(c_tokens[k]) - size
        moved[a], moved[b] = new_row[b], new_row[a]
    return moved


def _equal_exchanges(
    pack_row: np.ndarray,
    pack_tokens: np.ndarray,
    pack_pieces: np.ndarray,
    movable: np.ndarray,
    keep_row: np.ndarray,
) -> np.ndarray:
    """The exchanges between packs of equal size, all at once: of each size, the released
    rows get the movable packs with the fewest pieces (among equals one already released,
    then by index), so most of the released packs need no one-by-one search."""
    out = movable & ~keep_row[np.maximum(pack_row, 0)]
    if not out.any():
        return pack_row
    idx = np.flatnonzero(movable)
    order = idx[np.lexsort((idx, ~out[idx], pack_pieces[idx], pack_tokens[idx]))]
    sizes = pack_tokens[order]
    starts = np.flatnonzero(np.r_[True, sizes[1:] != sizes[:-1]])
    counts = np.diff(np.r_[starts, order.size])
    rank = np.arange(order.size) - np.repeat(starts, counts)
    wanted = np.bincount(np.searchsorted(sizes[starts], pack_tokens[out]), minlength=starts.size)
    chosen = np.zeros(pack_row.size, dtype=bool)
    chosen[order[rank < np.repeat(wanted, counts)]] = True
    leaving = np.flatnonzero(out & ~chosen)  # to kept rows, size by size with those entering
    entering = np.flatnonzero(chosen & ~out)
    leaving = leaving[np.lexsort((leaving, pack_tokens[leaving]))]
    entering = entering[np.lexsort((entering, pack_tokens[entering]))]
    new_row = pack_row.copy()
    new_row[leaving], new_row[entering] = pack_row[entering], pack_row[leaving]
    return new_row


def _moved_packs(plan: Plan, long_row: np.ndarray, pack_row: np.ndarray) -> RowLayout:
    """The long layout with each short pack in row ``pack_row`` (its pieces whole, in pack
    order), long pieces where they were, and within each row units by their first (doc,
    start): the order the planner gives a row, so a row no pack moved into or out of comes
    out as it was."""
    long, short = plan.long, plan.short
    assert long is not None and short is not None
    in_pack = np.zeros(plan.piece_len.size, dtype=bool)
    in_pack[short.row_pieces] = True
    singles = np.flatnonzero(~in_pack)
    counts = np.diff(short.row_offsets)
    members = np.concatenate([singles, short.row_pieces])
    sizes = np.concatenate([np.ones(singles.size, dtype=np.int64), counts])
    offsets = np.zeros(sizes.size + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    unit_row = np.concatenate([long_row[singles], pack_row])
    unit_tokens = np.concatenate([plan.piece_size[singles], short.row_tokens])
    units = np.flatnonzero(sizes > 0)
    first = members[offsets[units]]
    order = units[np.lexsort((plan.piece_start[first], plan.piece_doc[first], unit_row[units]))]
    unit_row[sizes == 0] = 0  # an empty pack: in no row, and it adds nothing to row 0
    return layout_units(
        long.capacity, order, members, offsets, unit_row, long.num_rows, unit_tokens
    )


def _pieces(plan: Plan, mask: np.ndarray) -> Pieces:
    return Pieces(plan.piece_doc[mask], plan.piece_start[mask], plan.piece_len[mask])


def _keep(plan: Plan, keep: np.ndarray) -> Plan:
    """The plan restricted to the pieces in ``keep`` (whole rows of both configs)."""
    new_index = np.cumsum(keep) - 1
    layouts: dict[str, RowLayout] = {}
    for name in CONFIG_NAMES:
        layout: RowLayout = getattr(plan, name)
        counts = np.diff(layout.row_offsets)
        row_kept = np.repeat(True, layout.num_rows)
        if layout.row_pieces.size:
            # rows are kept or released whole: a row's first piece says which
            row_kept = keep[layout.row_pieces[layout.row_offsets[:-1]]]
        piece_kept = np.repeat(row_kept, counts)
        offsets = np.zeros(int(row_kept.sum()) + 1, dtype=np.int64)
        np.cumsum(counts[row_kept], out=offsets[1:])
        layouts[name] = RowLayout(
            layout.capacity,
            offsets,
            new_index[layout.row_pieces[piece_kept]],
            layout.row_tokens[row_kept],
        )
    return Plan(
        plan.piece_doc[keep],
        plan.piece_start[keep],
        plan.piece_len[keep],
        stats=dict(plan.stats),
        pad_multiple=plan.pad_multiple,
        short=layouts["short"],
        long=layouts["long"],
    )
