"""Local improvements on the two-tier plan's greedy placements, each kept only where it
does better than the greedy one.

* ``refine_rooms``: long pieces moved, or swapped, between long rows so that each row's free
  room ends near a whole number of short packs (or just under one: room for a *fitted*
  pack). The granular fit places pieces one at a time, largest first, and with few pieces
  a row (a mixture's rows of one book piece and a few man pages) it cannot steer every
  row's residue: on the mixture benchmark 40-60% of the rows held residues of 200-3,900
  tokens, and each such row cost either its residue in the long config or a fitted short
  pack that much under full in the short config (0.02-0.05% short rows over the bound).
* ``pack_refilled``: the short tier's best fit, then, where that is above the lower bound,
  a second try: best fit of the larger documents that leaves no gap a small one cannot
  fill, then the smallest documents fill every gap exactly. Best fit decreasing strands
  gaps of 1-4 tokens in a fifth of the packs when the smallest documents run out (rows of
  fortune-like ~30-token documents); the refill leaves almost none.
* ``sparse_partial_packs``: the least-filled short packs (what a group releases to the
  tail) trade their small pieces for single large ones, pack sizes unchanged.

Both are deterministic (fixed orders, ties to the lower index), and the plan keeps the
greedy result unless the improvement is strictly better by its own measure, so inputs the
greedy placement already packs to the bound are planned exactly as before.
"""

from __future__ import annotations

import numpy as np

from packcli.jit import kernel, pick
from packcli.pack.binpack import (
    _bitmap_new,
    _bitmap_next,
    _into,
    _largest_at_most,
    _order_decreasing,
    _put,
    _scatter,
    _tree_add,
    _validate,
    counting_sort,
    pack_into_open_bins,
)

# Passes over the rows at most (each applies at most one move per row, then rebuilds the
# rows' members; a pass that changes nothing ends it): the mixture benchmark's one-group
# plans need 10-20, 8 left a fitted pack more than needed.
MAX_PASSES = 32
# Each costly row tries this many partner rows on either side of its complement residue.
PARTNERS = 32
# The refill's reserve (documents of at most ``q`` tokens) must hold this many times ``q``
# tokens a bin: best fit of the larger documents leaves gaps of up to about ``q`` (half
# that on average), and a reserve that runs dry leaves gaps again.
RESERVE = 8


@kernel
def _row_cost(room: int, granule: int, w_leave: int, w_fit: int) -> int:
    """What a row's free room costs: its residue ``r`` (room mod granule) left empty in the
    long config, weighted ``w_leave``, or a fitted pack ``granule - r`` under full in the
    short config, weighted ``w_fit``, whichever is less (the planner's ``_fitted`` rule)."""
    r = room % granule
    leave = r * w_leave
    fit = (granule - r) * w_fit
    return leave if leave < fit else fit


@kernel
def _pair_gain(
    sizes: np.ndarray,
    members: np.ndarray,
    offsets: np.ndarray,
    room: np.ndarray,
    large: np.ndarray,
    n_large: np.ndarray,
    i: int,
    j: int,
    granule: int,
    w_leave: int,
    w_fit: int,
) -> tuple[int, int, int]:
    """The best move or swap between rows ``i`` and ``j``: (gain in the pair's cost, the
    piece going from i to j or -1, the piece going from j to i or -1); gain 0: none. A
    large piece only goes to a row holding none, or trades for a large one."""
    base = _row_cost(room[i], granule, w_leave, w_fit) + _row_cost(room[j], granule, w_leave, w_fit)
    best, best_a, best_b = 0, -1, -1
    for p in range(offsets[i], offsets[i + 1]):
        a = members[p]
        sa = sizes[a]
        if room[j] >= sa and (not large[a] or n_large[j] == 0):
            gain = (
                base
                - _row_cost(room[i] + sa, granule, w_leave, w_fit)
                - _row_cost(room[j] - sa, granule, w_leave, w_fit)
            )
            if gain > best:
                best, best_a, best_b = gain, a, -1
        for t in range(offsets[j], offsets[j + 1]):
            b = members[t]
            d = sizes[b] - sa
            if room[i] < d or room[j] < -d:
                continue
            if (large[a] and not large[b] and n_large[j] > 0) or (
                large[b] and not large[a] and n_large[i] > 0
            ):
                continue
            gain = (
                base
                - _row_cost(room[i] - d, granule, w_leave, w_fit)
                - _row_cost(room[j] + d, granule, w_leave, w_fit)
            )
            if gain > best:
                best, best_a, best_b = gain, a, b
    for t in range(offsets[j], offsets[j + 1]):
        b = members[t]
        sb = sizes[b]
        if room[i] >= sb and (not large[b] or n_large[i] == 0):
            gain = (
                base
                - _row_cost(room[i] - sb, granule, w_leave, w_fit)
                - _row_cost(room[j] + sb, granule, w_leave, w_fit)
            )
            if gain > best:
                best, best_a, best_b = gain, -1, b
    return best, best_a, best_b


@kernel
def _refine_rooms(
    sizes: np.ndarray,
    row: np.ndarray,
    room: np.ndarray,
    large: np.ndarray,
    granule: int,
    w_leave: int,
    w_fit: int,
    max_passes: int,
    partners: int,
) -> int:
    """Hill climbing on the rows' summed ``_row_cost``, in place on ``row`` and ``room``:
    for each costly row (in row order) the best move or swap (``_pair_gain``) with one of
    the ``2 * partners`` costly rows whose residues are nearest its complement (a transfer
    that brings both rooms to whole packs needs residues summing to one), applied if it
    lowers the pair's cost; rows touched wait for the next pass, which tries only pairs
    holding a row the last pass changed. Returns the number of moves and swaps applied."""
    n = sizes.shape[0]
    n_rows = room.shape[0]
    n_large = np.zeros(n_rows, dtype=np.int64)
    for a in range(n):
        if large[a]:
            n_large[row[a]] += 1
    applied = 0
    # Rows changed by the last pass: a pair of rows neither of which changed is not tried
    # again (its gain is what it was, and was not taken).
    fresh = np.ones(n_rows, dtype=np.bool_)
    for _ in range(max_passes):
        members, offsets = counting_sort(row, n_rows)
        costly = np.empty(n_rows, dtype=np.int64)
        n_costly = 0
        for i in range(n_rows):
            if _row_cost(room[i], granule, w_leave, w_fit) > 0:
                costly[n_costly] = i
                n_costly += 1
        costly = costly[:n_costly]
        residue = np.empty(n_costly, dtype=np.int64)
        for x in range(n_costly):
            residue[x] = room[costly[x]] % granule
        by_residue = costly[counting_sort(residue, granule)[0]]
        sorted_residue = np.empty(n_costly, dtype=np.int64)
        for x in range(n_costly):
            sorted_residue[x] = room[by_residue[x]] % granule
        scan = min(n_costly, 2 * partners)
        touched = np.zeros(n_rows, dtype=np.bool_)
        changed = 0
        for x in range(n_costly):
            i = costly[x]
            if touched[i]:
                continue
            target = (granule - room[i] % granule) % granule
            start = np.searchsorted(sorted_residue, target) - scan // 2
            best, best_j, best_a, best_b = 0, -1, -1, -1
            for y in range(scan):
                j = by_residue[(start + y) % n_costly]
                if j == i or touched[j] or not (fresh[i] or fresh[j]):
                    continue
                gain, a, b = _pair_gain(
                    sizes, members, offsets, room, large, n_large, i, j, granule, w_leave, w_fit
                )
                if gain > best:
                    best, best_j, best_a, best_b = gain, j, a, b
            if best_j < 0:
                continue
            j = best_j
            if best_a >= 0:
                room[i] += sizes[best_a]
                room[j] -= sizes[best_a]
                row[best_a] = j
                if large[best_a]:
                    n_large[i] -= 1
                    n_large[j] += 1
            if best_b >= 0:
                room[j] += sizes[best_b]
                room[i] -= sizes[best_b]
                row[best_b] = i
                if large[best_b]:
                    n_large[j] -= 1
                    n_large[i] += 1
            touched[i] = True
            touched[j] = True
            changed += 1
        applied += changed
        if changed == 0:
            break
        fresh = touched
    return applied


def refine_rooms(
    sizes: np.ndarray,
    row: np.ndarray,
    room: np.ndarray,
    granule: int,
    short_tokens: int,
    total_tokens: int,
    large: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, int]:
    """``(row, room, moves)``: long pieces of ``sizes`` in rows ``row`` with free ``room``
    each, after moves and swaps between rows that lower the rooms' residue cost
    (``_row_cost``; a residue left empty weighs ``short_tokens``, a fitted pack's shortfall
    ``total_tokens``, as in the planner's choice of fitted packs). ``large``: pieces that
    must stay one to a row. The inputs are not modified; room totals stay the same."""
    row = np.array(row, dtype=np.int64)
    room = np.array(room, dtype=np.int64)
    sizes = np.asarray(sizes, dtype=np.int64)
    if large is None:
        large = np.zeros(sizes.size, dtype=np.bool_)
    if sizes.size == 0 or room.size < 2:
        return row, room, 0
    # Weights as the planner's ratio, scaled so cost sums stay far from int64's range.
    shift = max(0, max(int(short_tokens), int(total_tokens)).bit_length() - 30)
    w_leave = max(1, int(short_tokens) >> shift)
    w_fit = max(1, int(total_tokens) >> shift)
    # A pass tries 2 * PARTNERS partners a row, each a few pieces by a few: ~the cost of
    # that many best-fit items per piece in Python.
    work = 2 * PARTNERS * sizes.size
    refine = pick(_refine_rooms, work)
    moves = refine(
        sizes, row, room, large.astype(np.bool_), granule, w_leave, w_fit, MAX_PASSES, PARTNERS
    )
    return row, room, int(moves)


@kernel
def _smallest(count: np.ndarray, size: int) -> int:
    """Smallest leaf with a non-zero count (the tree must hold one)."""
    node = 1
    while node < size:
        node = 2 * node if count[2 * node] > 0 else 2 * node + 1
    return node - size


@kernel
def _refill(
    sizes: np.ndarray, capacity: int, open_remaining: np.ndarray, q: int, m: int
) -> tuple[np.ndarray, int, np.ndarray]:
    """Best fit of ``sizes`` (decreasing) above ``q`` tokens, never leaving a gap of less
    than ``m`` (it looks for room of at least ``s + m`` instead, or opens a bin); then the
    items of at most ``q`` fill each bin's gap in bin order, each gap exactly where the
    reserve allows: the item of the gap's size, else the largest that leaves at least
    ``m``. Leftover items fill new bins the same way. Returns (bin of each position, number
    of bins, each bin's remaining room)."""
    n = sizes.shape[0]
    k = open_remaining.shape[0]
    bits, offs, nw = _bitmap_new(capacity + 1)
    head = np.full(capacity + 1, -1, dtype=np.int64)
    nxt = np.empty(k + n, dtype=np.int64)
    remaining = np.empty(k + n, dtype=np.int64)
    out = np.empty(n, dtype=np.int64)
    for b in range(k):
        remaining[b] = open_remaining[b]
        _put(head, nxt, bits, offs, b, open_remaining[b])
    n_bins = k
    first_small = n
    for j in range(n):
        if sizes[j] <= q:
            first_small = j
            break
    for j in range(first_small):
        s = sizes[j]
        found = _bitmap_next(bits, offs, nw, s)
        if found > s and found - s < m:
            found = _bitmap_next(bits, offs, nw, s + m)
        b, rem, n_bins = _into(head, nxt, bits, offs, found, s, n_bins, capacity)
        out[j] = b
        remaining[b] = rem
        _put(head, nxt, bits, offs, b, rem)
    # The reserve: counts by size in a binary count tree, the next item of each size.
    size = 1
    while size < q + 1:
        size *= 2
    count = np.zeros(2 * size, dtype=np.int64)
    next_of = np.zeros(q + 1, dtype=np.int64)
    for j in range(n - 1, first_small - 1, -1):
        next_of[sizes[j]] = j  # sizes decrease: the last write is each size's first item
    for j in range(first_small, n):
        _tree_add(count, size, sizes[j], 1)
    left = n - first_small
    n_open = n_bins  # bins with a gap before the reserve: filled smallest item first
    b = 0
    while left > 0:
        if b < n_bins:
            gap = remaining[b]
        else:
            n_bins += 1
            gap = capacity
        while gap > 0 and left > 0:
            s = -1
            if gap <= q and count[size + gap] > 0:
                s = gap
            elif b < n_open:
                least = _smallest(count, size)
                if least <= gap - m:
                    s = least
            else:
                t = min(gap - m, q)
                if t >= 1:
                    s = _largest_at_most(count, size, t)
            if s < 0:
                s = _largest_at_most(count, size, min(gap, q))
            if s < 0:
                break
            j = next_of[s]
            next_of[s] += 1
            out[j] = b
            _tree_add(count, size, s, -1)
            left -= 1
            gap -= s
        remaining[b] = gap
        b += 1
    return out, n_bins, remaining[:n_bins].copy()


def _reserve(sizes: np.ndarray, capacity: int, n_bins: int) -> tuple[int, int] | None:
    """``(q, m)`` for ``_refill``: ``q`` the smallest size whose documents of at most ``q``
    tokens hold ``RESERVE * q`` tokens a bin; ``m`` the 10th percentile of their sizes
    (gaps end at ``m`` or more, where documents are plentiful). None: no such reserve."""
    counts = np.bincount(sizes, minlength=capacity + 1)
    tokens = np.cumsum(counts * np.arange(capacity + 1, dtype=np.int64))
    need = RESERVE * np.arange(capacity + 1, dtype=np.int64) * max(n_bins, 1)
    ok = np.flatnonzero(tokens >= need)
    ok = ok[ok > 0]
    if ok.size == 0:
        return None
    q = int(ok[0])
    cum = np.cumsum(counts[: q + 1])
    m = max(1, int(np.searchsorted(cum, cum[-1] / 10)))
    return q, m


def pack_refilled(
    lengths: np.ndarray, capacity: int, open_remaining: np.ndarray
) -> tuple[np.ndarray, int]:
    """The refill (``_refill``) where it is at least as good as best fit decreasing into
    the partly full bins (``pack_into_open_bins``) in both bins holding something and room
    left in the open bins; best fit otherwise, and where the documents hold no reserve
    (``_reserve``). Best fit is not run when the refill fills every open bin and holds the
    rest in ``ceil((total - open room) / capacity)`` new bins (nothing can beat it): on the
    mixture benchmark's 11.6M short documents each costs ~1 s. Returns ``(assignment,
    total_bins)`` as ``pack_into_open_bins`` does (open bins 0..K-1 may stay empty)."""
    arr = _validate(lengths, capacity)
    rem = np.asarray(open_remaining, dtype=np.int64)
    k = rem.size
    lower = -(-int(arr.sum()) // capacity)  # bins, were every bin full
    reserve = _reserve(arr, capacity, lower + k) if arr.size else None
    if reserve is None:
        return pack_into_open_bins(arr, capacity, rem)
    order = pick(_order_decreasing, arr.size // 8)(arr, capacity)
    refill = pick(_refill, arr.size + k)
    out, n_refill, remaining = refill(arr[order], capacity, rem, *reserve)
    used_refill = int(np.count_nonzero(np.bincount(out, minlength=n_refill)))
    open_refill = int(remaining[:k].sum())
    # With every open bin full, no packing holds the rest in fewer than ``new`` new bins.
    new = -(-max(0, int(arr.sum()) - int(rem.sum())) // capacity)
    if open_refill > 0 or used_refill > k + new:
        assign, n_bins = pack_into_open_bins(arr, capacity, rem)
        used = int(np.count_nonzero(np.bincount(assign, minlength=n_bins)))
        held = np.bincount(assign[assign < k], weights=arr[assign < k], minlength=k)
        if used_refill > used or open_refill > int(rem.sum()) - int(held.sum()):
            return assign, n_bins
    return _scatter(order, out), int(n_refill)


# The least-filled short packs made sparse (``sparse_partial_packs``): as many as a group
# releases by their own room (``groups.MOST_RELEASED``).
SPARSE_PACKS = 4
# Donors a pack tries without an exact trade before it stops (each try scans its pieces).
SPARSE_MISSES = 64


def sparse_partial_packs(
    pack_of: np.ndarray, sizes: np.ndarray, pack_sizes: np.ndarray, capacity: int
) -> np.ndarray:
    """``pack_of`` (the pack of each short piece) with the ``SPARSE_PACKS`` least-filled
    packs holding few pieces: each trades sets of its pieces for single larger pieces of
    other packs, of exactly the same tokens, so every pack keeps its size.

    Why: best fit decreasing (and the refill's leftovers) fills its last packs with the
    corpus's smallest documents (a pack of 201 one-token documents in a test group), and
    the least-filled packs are what a group releases to the tail, which one process plans
    for the whole corpus. Before ``refine_rooms`` the fitted packs were usually the least
    filled and hid this; with rooms at whole packs there are few fitted packs left.

    Greedy and exact: a pack's donors are the other packs' pieces larger than its largest
    piece and at most its tokens, largest first (ties by index); a donor of ``s`` tokens is
    taken when the pack's pieces, largest first, sum to exactly ``s`` (two or more go, one
    comes); ``SPARSE_MISSES`` donors in a row without that end the pack's turn."""
    n_packs = pack_sizes.size
    if n_packs < 2 or sizes.size == 0:
        return pack_of
    order = np.argsort(pack_sizes, kind="stable")[:SPARSE_PACKS]
    partial = order[pack_sizes[order] < capacity]
    is_partial = np.zeros(n_packs, dtype=bool)
    is_partial[partial] = True
    in_partial = np.flatnonzero(is_partial[pack_of])
    counts = np.bincount(pack_of[in_partial], minlength=n_packs)
    partial = partial[counts[partial] > 1]
    if partial.size == 0:
        return pack_of
    out = pack_of.copy()
    smallest = int(sizes[in_partial].min())
    cand = np.flatnonzero(
        ~is_partial[pack_of] & (sizes > smallest) & (sizes <= int(pack_sizes[partial].max()))
    )
    cand_sizes = sizes[cand]
    used: set[int] = set()
    for p in partial:
        members = in_partial[pack_of[in_partial] == p]
        members = members[np.argsort(-sizes[members], kind="stable")]
        pool = [int(x) for x in members]  # the pack's own pieces, largest first
        want = len(pool) + SPARSE_MISSES + len(used) + 1  # donors it can look at, at most
        mine = _largest_first(
            np.flatnonzero((cand_sizes > sizes[pool[0]]) & (cand_sizes <= pack_sizes[p])),
            cand_sizes,
            want,
        )
        misses = 0
        for d in mine:
            donor = int(cand[d])
            if len(pool) < 2 or sizes[donor] <= sizes[pool[0]] or misses > SPARSE_MISSES:
                break
            if donor in used:
                continue
            need, take = int(sizes[donor]), []
            for x in pool:
                if sizes[x] <= need:
                    take.append(x)
                    need -= int(sizes[x])
                    if need == 0:
                        break
            if need:
                misses += 1
                continue
            misses = 0
            used.add(donor)
            out[np.array(take, dtype=np.int64)] = pack_of[donor]
            out[donor] = p
            taken = set(take)
            pool = [x for x in pool if x not in taken]
    return out


def _largest_first(sel: np.ndarray, sizes: np.ndarray, want: int) -> np.ndarray:
    """The ``want`` entries of ``sel`` of largest ``sizes[sel]``, largest first, ties in
    ``sel`` order, without sorting all of ``sel`` (it can be most of a group's pieces)."""
    if sel.size > want:
        h = np.bincount(sizes[sel])
        at_least = np.cumsum(h[::-1])[::-1]  # entries of at least each size
        t = int(np.flatnonzero(at_least >= want).max())
        s = sizes[sel]
        above, at = sel[s > t], sel[s == t]
        sel = np.concatenate([above, at[: want - above.size]])
    return sel[np.argsort(-sizes[sel], kind="stable")]
