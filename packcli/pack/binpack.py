"""Bin packing over integer lengths: best-fit decreasing in O(C + N log_64 C).

Lengths are bounded integers (1..capacity), which is what makes an exact, fast best fit
possible: items are counting-sorted by length (O(N + C)), and open bins are kept in LIFO
lists keyed by their *remaining capacity*, with a 64-ary bitmap tree over the rooms that have
a bin (3 levels of 64-bit words cover 262,144 rooms). For each item of size ``s`` the bitmap
finds the smallest room ``r >= s`` that has an open bin with a few word operations (best
fit), the bin moves to list ``r - s``, and full bins leave the structure. Items are taken in
sorted order from a sorted copy of the lengths, so the loop reads memory sequentially, and
the bins are scattered back to item order at the end. Memory is O(C) plus ~24 bytes per
item (sort order, sorted sizes, assignment) and 8 per bin.

The kernels are ``packcli.jit`` kernels: compiled with numba (cached on disk) for large
inputs, run as the same Python statements for small ones (where loading numba would cost
more than the whole plan), with identical results. Measured on the
2-core dev machine (docs/benchmarks.md, ``python scripts/bench_plan.py --sizes 1000000
10000000 --repeats 3``, medians, load ~1.9 from other jobs): 1M SFT-like lengths in 0.16 s,
10M in 1.4 s (a binary count tree indexed through the sort order took 0.28 s and 3.2 s),
within 0.004% of the lower bound; the plan is over 100x faster than TRL's ``pack_dataset``
(bfd) on 1M documents in the same run (``scripts/bench_pack.py``), which also ends 0.42%
over the bound because it packs per batch of 1000.

Best-fit decreasing is deterministic here: ties in length keep input order, ties in remaining
capacity go to the most recently touched bin (a LIFO list), and bins are numbered in the
order they are opened, so the same lengths always give the same assignment.

``pack_lengths`` is the public entry point (other tools call it). The two-tier planner also
uses ``pack_granular`` (best fit *modulo* a granule, so a long row's free room suits whole
short packs), ``group_by_residue`` (groups of long documents whose totals are near multiples
of the short-pack size) and ``pack_into_open_bins`` (best fit into partly filled bins: short
packs into long rows' free room, and short documents into fitted packs of a given size).
"""

from __future__ import annotations

import numpy as np

from packcli.jit import kernel, pick, trailing_zeros
from packcli.names import PLAN_ALGORITHMS as ALGORITHMS
from packcli.names import PlanAlgorithm as Algorithm


def _validate(lengths: np.ndarray, capacity: int) -> np.ndarray:
    arr = np.asarray(lengths)
    if arr.ndim != 1:
        raise ValueError(f"lengths must be a 1-D array, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"lengths must be integers, got dtype {arr.dtype}")
    if capacity <= 0:
        raise ValueError(f"capacity must be positive, got {capacity}")
    arr = arr.astype(np.int64, copy=False)
    bad = np.flatnonzero((arr <= 0) | (arr > capacity))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"lengths[{i}] = {int(arr[i])} is outside 1..{capacity} (capacity); "
            f"{bad.size} item(s) out of range"
        )
    return arr


@kernel
def counting_sort(keys: np.ndarray, n_keys: int) -> tuple[np.ndarray, np.ndarray]:
    """Stable counting sort, O(N + K), of ``keys`` in ``0..n_keys-1``: ``order`` lists the
    indices by increasing key (input order kept within a key) and ``offsets[k]:offsets[k+1]``
    is key k's slice of it. The one counting sort of the planner (binpack and plan)."""
    offsets = np.zeros(n_keys + 1, dtype=np.int64)
    for k in keys:
        offsets[k + 1] += 1
    offsets = np.cumsum(offsets)  # O(K): vectorized, so cheap as plain Python too
    fill = offsets[:-1].copy()
    order = np.empty(keys.shape[0], dtype=np.int64)
    for i in range(keys.shape[0]):
        k = keys[i]
        order[fill[k]] = i
        fill[k] += 1
    return order, offsets


@kernel
def _order_decreasing(lengths: np.ndarray, capacity: int) -> np.ndarray:
    """Item indices by decreasing length, ties in input order (stable)."""
    return counting_sort(capacity - lengths, capacity + 1)[0]


@kernel
def _tree_add(cnt: np.ndarray, size: int, leaf: int, delta: int) -> None:
    node = size + leaf
    while node >= 1:
        cnt[node] += delta
        node >>= 1


@kernel
def _bitmap_new(n_leaves: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A 64-ary bitmap tree over leaves 0..n_leaves-1: bit r of level 0 is set when leaf r is
    non-empty, and a bit of level k+1 is set when its 64-bit word of level k is non-zero.
    Returns (flat words, level offsets, words per level); 3 levels cover 262,144 leaves."""
    n_words = [max(1, (n_leaves + 63) // 64)]
    while n_words[-1] > 1:
        n_words.append((n_words[-1] + 63) // 64)
    nw = np.array(n_words, dtype=np.int64)
    offs = np.zeros(nw.size + 1, dtype=np.int64)
    offs[1:] = np.cumsum(nw)
    return np.zeros(offs[-1], dtype=np.uint64), offs, nw


@kernel
def _bitmap_set(bits: np.ndarray, offs: np.ndarray, leaf: int) -> None:
    pos = leaf
    for level in range(offs.shape[0] - 1):
        i = offs[level] + (pos >> 6)
        was = bits[i]
        bits[i] = was | (np.uint64(1) << np.uint64(pos & 63))
        if was != 0:
            return  # the levels above already say this word is non-empty
        pos >>= 6


@kernel
def _bitmap_clear(bits: np.ndarray, offs: np.ndarray, leaf: int) -> None:
    pos = leaf
    for level in range(offs.shape[0] - 1):
        i = offs[level] + (pos >> 6)
        bits[i] &= ~(np.uint64(1) << np.uint64(pos & 63))
        if bits[i] != 0:
            return
        pos >>= 6


@kernel
def _bitmap_next(bits: np.ndarray, offs: np.ndarray, nw: np.ndarray, x: int) -> int:
    """Smallest set leaf >= x, or -1: up until a word has a set bit at or after the
    position, then down by lowest set bits. O(levels) word operations."""
    n_levels = nw.shape[0]
    pos = x
    level = 0
    while level < n_levels:
        w = pos >> 6
        if w < nw[level]:
            m = bits[offs[level] + w] & (np.uint64(0xFFFFFFFFFFFFFFFF) << np.uint64(pos & 63))
            if m != 0:
                pos = (w << 6) + trailing_zeros(m)
                break
        pos = w + 1
        level += 1
    if level == n_levels:
        return -1
    while level > 0:
        level -= 1
        pos = (pos << 6) + trailing_zeros(bits[offs[level] + pos])
    return pos


@kernel
def _take(head: np.ndarray, nxt: np.ndarray, bits: np.ndarray, offs: np.ndarray, room: int) -> int:
    """Pop the most recently stored bin with exactly ``room`` free."""
    b: int = head[room]
    head[room] = nxt[b]
    if head[room] < 0:
        _bitmap_clear(bits, offs, room)
    return b


@kernel
def _put(
    head: np.ndarray, nxt: np.ndarray, bits: np.ndarray, offs: np.ndarray, b: int, room: int
) -> None:
    """Store bin ``b`` under its free room (full bins are not stored: nothing fits)."""
    if room > 0:
        if head[room] < 0:
            _bitmap_set(bits, offs, room)
        nxt[b] = head[room]
        head[room] = b


@kernel
def _into(
    head: np.ndarray,
    nxt: np.ndarray,
    bits: np.ndarray,
    offs: np.ndarray,
    found: int,
    s: int,
    n_bins: int,
    capacity: int,
) -> tuple[int, int, int]:
    """An item of size ``s`` into the open bin with room ``found`` (taken off its list), or
    into a new bin when none was found (-1): its bin, the room left, the number of bins."""
    if found >= 0:
        return _take(head, nxt, bits, offs, found), found - s, n_bins
    return n_bins, capacity - s, n_bins + 1


@kernel
def _best_fit(
    sizes: np.ndarray, capacity: int, open_remaining: np.ndarray
) -> tuple[np.ndarray, int]:
    """Best fit of ``sizes`` in the given (decreasing) order; bins 0..K-1 start with
    ``open_remaining`` free. Returns the bin of each position of ``sizes``.

    Open bins sit in per-room LIFO lists (``head``/``nxt``) with a bitmap tree over the
    rooms that have a bin. Taking sizes in sorted order (instead of indexing through the
    sort order) keeps the loop's memory access sequential: 2.7x faster at 1M items.
    """
    n = sizes.shape[0]
    k = open_remaining.shape[0]
    bits, offs, nw = _bitmap_new(capacity + 1)
    head = np.full(capacity + 1, -1, dtype=np.int64)
    nxt = np.empty(k + n, dtype=np.int64)
    out = np.empty(n, dtype=np.int64)
    for b in range(k):
        _put(head, nxt, bits, offs, b, open_remaining[b])
    n_bins = k
    for j in range(n):
        s = sizes[j]
        found = _bitmap_next(bits, offs, nw, s)  # tightest bin with room for s
        b, rem, n_bins = _into(head, nxt, bits, offs, found, s, n_bins, capacity)
        out[j] = b
        _put(head, nxt, bits, offs, b, rem)
    return out, n_bins


def _scatter(order: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Back from sorted positions to item order: ``out[order[j]] = values[j]``."""
    out = np.empty_like(values)
    out[order] = values
    return out


@kernel
def _first_fit(lengths: np.ndarray, order: np.ndarray, capacity: int) -> tuple[np.ndarray, int]:
    """First fit: a max-tree over bins (in opening order) finds the leftmost bin with room."""
    n = lengths.shape[0]
    size = 1
    while size < max(n, 1):
        size *= 2
    best = np.zeros(2 * size, dtype=np.int64)  # max remaining capacity in each subtree
    assign = np.empty(n, dtype=np.int64)
    n_bins = 0
    for j in range(n):
        i = order[j]
        s = lengths[i]
        if best[1] >= s:
            node = 1
            while node < size:
                node *= 2
                if best[node] < s:
                    node += 1
            b = node - size
        else:
            b = n_bins
            n_bins += 1
            node = size + b
            best[node] = capacity
        assign[i] = b
        node = size + b
        best[node] -= s
        node >>= 1
        while node >= 1:
            left = best[2 * node]
            right = best[2 * node + 1]
            best[node] = left if left > right else right
            node >>= 1
    return assign, n_bins


@kernel
def _next_fit(lengths: np.ndarray, capacity: int) -> np.ndarray:
    n = lengths.shape[0]
    assign = np.empty(n, dtype=np.int64)
    b = -1
    rem = 0
    for i in range(n):
        s = lengths[i]
        if s > rem:
            b += 1
            rem = capacity
        assign[i] = b
        rem -= s
    return assign


@kernel
def _granular_fit(
    sizes: np.ndarray, capacity: int, granule: int, open_remaining: np.ndarray
) -> tuple[np.ndarray, int, np.ndarray]:
    """Best fit *modulo granule* of ``sizes`` in the given order: put each item where the
    room left over is closest to a multiple of ``granule`` (ties: least room). For each k the
    bitmap finds the smallest room >= s + k*granule, so one item costs O(capacity / granule)
    bitmap look-ups. Bins 0..K-1 start with ``open_remaining`` free (as in ``_best_fit``)."""
    n = sizes.shape[0]
    k = open_remaining.shape[0]
    bits, offs, nw = _bitmap_new(capacity + 1)
    head = np.full(capacity + 1, -1, dtype=np.int64)
    nxt = np.empty(max(k + n, 1), dtype=np.int64)
    remaining = np.empty(max(k + n, 1), dtype=np.int64)
    for b in range(k):
        remaining[b] = open_remaining[b]
        _put(head, nxt, bits, offs, b, open_remaining[b])
    out = np.empty(n, dtype=np.int64)
    n_bins = k
    for j in range(n):
        s = sizes[j]
        best = -1
        best_res = granule
        x = s
        while x <= capacity:
            found = _bitmap_next(bits, offs, nw, x)
            if found < 0:
                break
            res = (found - s) % granule
            if res < best_res:
                best_res = res
                best = found
                if res == 0:
                    break
            x = found - res + granule  # first room of the next residue window
        b, rem, n_bins = _into(head, nxt, bits, offs, best, s, n_bins, capacity)
        out[j] = b
        remaining[b] = rem
        _put(head, nxt, bits, offs, b, rem)
    return out, n_bins, remaining[:n_bins].copy()


@kernel
def _largest_at_most(cnt: np.ndarray, size: int, x: int) -> int:
    """Largest leaf index <= x with a non-zero count, or -1."""
    node = size + x
    if cnt[node] > 0:
        return x
    while node > 1:
        if (node & 1) == 1 and cnt[node - 1] > 0:
            node -= 1
            while node < size:
                node = 2 * node + 1
                if cnt[node] == 0:
                    node -= 1
            return node - size
        node >>= 1
    return -1


@kernel
def _residue_groups(
    sizes: np.ndarray, granule: int, capacity: int, max_tries: int
) -> tuple[np.ndarray, int]:
    """Greedy grouping so that each group's total is (nearly) a multiple of ``granule``.

    Starters are taken largest first; a group then adds the item whose residue (size mod
    granule) is the largest one not above what the group still needs to reach a multiple,
    so the need shrinks at every step, until it is zero or no item fits under ``capacity``.
    Items live in per-residue lists (smallest first) with a bit tree over residues, so each
    step is O(log granule).
    """
    n = sizes.shape[0]
    res = sizes % granule
    # By (residue, size, index), as two stable counting sorts (numba's argsort is
    # O(N log N) with a large constant: 1 s of the 10M-document plan).
    by_size = counting_sort(sizes, capacity + 1)[0]
    order = by_size[counting_sort(res[by_size], granule)[0]]
    head = np.zeros(granule + 1, dtype=np.int64)
    for i in range(n):
        head[res[i] + 1] += 1
    head = np.cumsum(head)
    size = 1
    while size < granule:
        size *= 2
    cnt = np.zeros(2 * size, dtype=np.int64)
    for i in range(n):
        _tree_add(cnt, size, res[i], 1)
    used = np.zeros(n, dtype=np.bool_)
    group = np.empty(n, dtype=np.int64)
    n_groups = 0
    for a in _order_decreasing(sizes, capacity):
        if used[a]:
            continue
        used[a] = True
        _tree_add(cnt, size, res[a], -1)
        group[a] = n_groups
        total = sizes[a]
        need = (granule - res[a]) % granule
        while need > 0:
            chosen = -1
            t = need
            for _ in range(max_tries):
                r = _largest_at_most(cnt, size, t)
                if r < 1:
                    break
                while used[order[head[r]]]:
                    head[r] += 1
                b = order[head[r]]  # smallest unused item with residue r
                if total + sizes[b] <= capacity:
                    chosen = b
                    break
                t = r - 1
            if chosen < 0:
                break
            used[chosen] = True
            _tree_add(cnt, size, res[chosen], -1)
            group[chosen] = n_groups
            total += sizes[chosen]
            need -= res[chosen]
        n_groups += 1
    return group, n_groups


def pack_lengths(
    lengths: np.ndarray, capacity: int, *, algorithm: Algorithm | str = "bfd"
) -> np.ndarray:
    """Assign each item to a bin of ``capacity``; returns the bin index of every item.

    Bins are numbered 0..B-1 in the order they are opened. ``wrapped`` is next-fit in input
    order (what plain concatenation does, without cutting documents) and exists as a
    baseline; ``ffd`` is first-fit decreasing; ``bfd`` (default) is best-fit decreasing.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {', '.join(ALGORITHMS)}")
    arr = _validate(lengths, capacity)
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    n = arr.size
    if algorithm == "wrapped":
        return pick(_next_fit, n // 8)(arr, capacity)
    order = pick(_order_decreasing, n // 8)(arr, capacity)
    if algorithm == "ffd":
        return pick(_first_fit, n)(arr, order, capacity)[0]
    assign = pick(_best_fit, n)(arr[order], capacity, np.zeros(0, dtype=np.int64))[0]
    return _scatter(order, assign)


def pack_into_open_bins(
    lengths: np.ndarray, capacity: int, open_remaining: np.ndarray
) -> tuple[np.ndarray, int]:
    """Best-fit decreasing into bins that are already partly full, opening new ones as needed.

    Bins ``0..K-1`` are the given open bins with ``open_remaining`` free space each; new bins
    (capacity ``capacity``) are numbered from K on. Returns ``(assignment, total_bins)``.
    """
    arr = _validate(lengths, capacity)
    rem = np.asarray(open_remaining, dtype=np.int64)
    if rem.size and (rem.min() < 0 or rem.max() > capacity):
        raise ValueError(f"open bins' remaining capacity must lie in 0..{capacity}")
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64), int(rem.size)
    order = pick(_order_decreasing, arr.size // 8)(arr, capacity)
    assign, n_bins = pick(_best_fit, arr.size + rem.size)(arr[order], capacity, rem)
    return _scatter(order, assign), int(n_bins)


def pack_granular(
    lengths: np.ndarray,
    capacity: int,
    granule: int,
    open_remaining: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Decreasing fit that leaves each bin's free room close to a multiple of ``granule``.

    The two-tier planner places long documents this way: the free room of a long row is
    later filled with whole short packs of about ``granule`` tokens, so room that is not a
    multiple of ``granule`` is what ends up wasted. ``open_remaining``: bins ``0..K-1`` are
    already partly full with that much free each (new bins are numbered from K on). Returns
    ``(assignment, remaining)`` with the free room of each bin.
    """
    if granule <= 0:
        raise ValueError(f"granule must be positive, got {granule}")
    arr = _validate(lengths, capacity)
    rem = np.zeros(0, np.int64) if open_remaining is None else np.asarray(open_remaining, np.int64)
    if rem.size and (rem.min() < 0 or rem.max() > capacity):
        raise ValueError(f"open bins' remaining capacity must lie in 0..{capacity}")
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64), rem.copy()
    order = pick(_order_decreasing, arr.size // 8)(arr, capacity)
    # An item looks at rooms in several residue windows: ~2-5x a best-fit item in Python.
    fit = pick(_granular_fit, 4 * arr.size + rem.size)
    assign, _, remaining = fit(arr[order], capacity, granule, rem)
    return _scatter(order, assign), remaining


def group_by_residue(
    lengths: np.ndarray, capacity: int, granule: int, *, max_tries: int = 16
) -> np.ndarray:
    """Group items so each group's total is close to a multiple of ``granule`` (and at most
    ``capacity``); returns the group of every item, groups numbered 0..G-1.

    Used for long documents in the two-tier plan: a group whose total is a multiple of the
    short-pack size leaves room that whole short packs fill exactly, where dense best fit
    strands a partial pack's worth of room in every row (0.28% extra rows on a pretraining
    mix where long documents hold most tokens; 0.007% with the groups).
    """
    if granule <= 0:
        raise ValueError(f"granule must be positive, got {granule}")
    arr = _validate(lengths, capacity)
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    # ~2-5x a best-fit item per item in Python (a few tree look-ups per group member).
    return pick(_residue_groups, 4 * arr.size)(arr, granule, capacity, max_tries)[0]
