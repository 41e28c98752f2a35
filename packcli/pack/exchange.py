"""Exchanging whole units between long rows of different optimizer steps, so that each
step's source mix holds its target finer than a row order can (issue 26).

Why: a long row (128k) is whole long pieces plus short packs (4k packs repacked whole), so
ordering rows (``mixture.mix_order``) moves a step's mix in steps of rows, and leaves the
long config 0.6-2.5 points off at 4M-8M tokens a step. A row's *units* (a long piece, or a
short pack with all its pieces) can move between rows: swapping unit ``a`` of row ``p``
with unit ``b`` of row ``q`` keeps both rows within capacity when ``tokens(p) - a + b`` and
``tokens(q) - b + a`` fit (always for two full 4,096-token packs, 80% of packs), keeps
every pack whole and contiguous (so the short config and verify's nesting check are
untouched) and keeps the row count, so packing efficiency does not move at all.

**Algorithm** (``balance_steps``). Windows are ``window_rows`` consecutive rows (the last,
shorter one too); a window's error is its per-source share minus the target share. A part
of the output after others (a group of a grouped plan, the tail) is balanced on the
output's windows (``Windows``: cut at the output's multiples of ``window_rows`` from its
first output row), and a window it shares with the part before or after it is held to
its share of the step: its error is its tokens' excess over the target share of them per
full window's tokens, what it adds to the step's share, so that each side near zero makes
the straddling step near target too. Where the next part's rows are known before (the
tail's, for the last group: ``Windows.carried``), they are counted in the shared window,
whose error is then the step's: this part makes up for the other side.

1. *Deal* (``deal_windows``): rows, coarsest first (by their largest long piece, e.g. a
   book), each to the window with a free place whose squared error it leaves least; an
   LPT-like start that spreads the coarse rows evenly, which no pairwise swap finds later.
2. *Exchange* (``exchange_kernel``): passes over the windows, worst first; a window above
   ``STOP`` looks at partner windows (the most opposite in its worst source, plus drawn
   ones) and takes the single best of a swap of two whole rows (moves long pieces) or of
   two units (``_best_swap``, one kind at a time), among the ``N_CAND`` rows or units of
   each side that best carry the error
   across (largest projection on the error difference) plus as many drawn. A move is taken
   only if it lowers the two windows' sum of squared errors and does not raise the larger
   of their largest errors, so the largest error over all windows never rises and every
   move lowers the sum (so it ends); a window that found no move waits until a partner's
   move changes it. If the run from the deal ends worse than the given order's largest
   error, it runs again from the given order, so the result is never worse than the input.
3. ``order_plan`` balances windows of ``exchange_window`` rows (up to 4 steps, or more where a
   piece forbids), then the steps inside each one, with partners only in the same window
   (``group``), which leaves every coarse window's sums exactly as they were; for a
   grouped plan ``exchange_plan`` does the same at each part's first output row, once
   every group's row count is known (the plan stage's second pass).

Cost: per move attempt ~``2 * N_PARTNERS * 2 * (2 N_CAND)**2`` pair scores of O(K), plus
the deal's O(rows * windows * K) in blocks of ``DEAL_WINDOWS`` windows; measured ~300-600 s
of compiled CPU per million long rows (``scripts/bench_mixture.py``), i.e. ~1 s per group
of 2**28 tokens, in that group's plan task (a grouped plan: its second-pass task).
Deterministic for given inputs: the only draws are from an array drawn from the seed.

**Bounds.** No layout gets a step closer than its largest indivisible piece allows: a step
of ``T`` tokens holding a piece of ``p`` tokens of a source of share ``t`` is at least
``p / T - t`` off (a 128k book piece in a 1M step of a 9.7% source: 12.5% - 9.7% = 2.8
points); ``piece_bound`` gives it. Rows are coarser still where the planner put two pieces
of a source in one row (books: rows of 103k-131k), and only whole rows move such a row's
share between windows: if ``n`` such rows must share ``W`` windows whose target holds
``c`` of them, ``n > c * W`` leaves some window over (the benchmark's 4M step at scale 0.5;
docs/benchmarks.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packcli.jit import kernel, pick
from packcli.pack.plan import RowLayout

TOLERANCE = 0.005  # the goal: half a point of a step's share, for sources >= MIN_SHARE
MIN_SHARE = 0.05
STOP = 0.003  # a window this close in every source looks for no further move
MAX_PASSES = 6
N_CAND = 12  # units per side by projection; as many again drawn
N_PARTNERS = 2  # most opposite windows; as many again drawn
MAX_MOVES = 32  # moves per window per pass
# Windows of up to this many steps are balanced first, as few as make ``EXCHANGE_ROWS``
# long rows (``window_steps``): a step of 8 rows (1M tokens of 128k rows) is too coarse
# to deal whole rows into, one of 32 rows (4M) is not, and larger windows only let the
# steps inside them drift apart (4M steps in windows of 4 steps: 0.30-0.46 points off in
# one group, up to 3.5 grouped; of one step: 0.15-0.45, as planned for 1M steps).
EXCHANGE_STEPS = 4
EXCHANGE_ROWS = 32
DEAL_WINDOWS = 1024  # windows one deal chooses among


@dataclass(frozen=True)
class Units:
    """A long layout's rows as units: unit ``u`` is ``row_pieces[start[u]:end[u]]`` of the
    layout (a long piece, or one short pack's pieces, contiguous), in row ``row[u]``."""

    start: np.ndarray
    end: np.ndarray
    row: np.ndarray
    size: np.ndarray  # tokens the unit takes of its row
    vec: np.ndarray  # (U, K) tokens of each source
    long: np.ndarray  # bool: a long piece (not a short pack)


def units_of(
    layout: RowLayout,
    pack_of_piece: np.ndarray,
    piece_src: np.ndarray,
    piece_size: np.ndarray,
    n_sources: int,
) -> Units:
    """The units of a long layout: runs of consecutive pieces of one row in one short pack
    (``pack_of_piece``: the short row of each piece, -1 for a long piece, each its own)."""
    offsets = layout.row_offsets
    pieces = layout.row_pieces
    n = pieces.size
    pack = pack_of_piece[pieces]
    starts = np.zeros(n, dtype=bool)
    if n:
        starts[0] = True
        starts[1:] = (pack[1:] != pack[:-1]) | (pack[1:] < 0)
        starts[offsets[1:-1][offsets[1:-1] < n]] = True  # a row starts a unit
        starts[pack < 0] = True
    start = np.flatnonzero(starts).astype(np.int64)
    end = np.append(start[1:], n).astype(np.int64)
    row = (np.searchsorted(offsets, start, "right") - 1).astype(np.int64)
    unit_of = np.cumsum(starts) - 1
    size = np.bincount(unit_of, weights=piece_size[pieces], minlength=start.size)
    flat = unit_of * n_sources + piece_src[pieces]
    vec = np.bincount(flat, weights=piece_size[pieces], minlength=start.size * n_sources)
    long = pack[start] < 0 if n else np.zeros(0, dtype=bool)
    return Units(start, end, row, size.astype(np.int64), vec.reshape(-1, n_sources), long)


def piece_bound(max_piece: np.ndarray, target: np.ndarray, window_tokens: int) -> np.ndarray:
    """Per source, the least largest deviation any layout can reach at windows of
    ``window_tokens``: a window holding the source's largest piece is that far over."""
    bound: np.ndarray = np.maximum(np.asarray(max_piece, np.float64) / window_tokens - target, 0.0)
    return bound


def window_steps(step_rows: int) -> int:
    """Steps in the exchange's first windows: ``EXCHANGE_STEPS``, fewer where fewer make
    ``EXCHANGE_ROWS`` rows (one, for steps of 32 rows or more)."""
    return min(EXCHANGE_STEPS, -(-EXCHANGE_ROWS // max(1, step_rows)))


def first_window_rows(step_rows: int) -> int:
    """Rows of the exchange's first windows before any doubling: ``window_steps`` steps of
    ``step_rows`` rows (what a mixture's group keeps a multiple of: ``part_rows_multiple``)."""
    step_rows = max(1, step_rows)
    return step_rows * window_steps(step_rows)


def exchange_window(
    step_rows: int, n_rows: int, capacity: int, max_piece: np.ndarray, target: np.ndarray
) -> int:
    """Rows of the windows the exchange balances: ``window_steps`` steps, doubled until
    every source of at least ``MIN_SHARE`` can hold ``TOLERANCE`` (``piece_bound``), at most
    ``n_rows``. Why not one step: a long row holds 103k-131k of a book (pieces grouped to
    fill it), and rows only trade whole between windows (no pack set weighs exactly a book
    piece), so windows of a few rows cannot hold a 10% source to half a point, and balancing
    them first left books 2.0 and 0.67 points off at 4M and 8M (docs/benchmarks.md); the
    steps inside each window are balanced after, within it (``balance_steps(group=...)``)."""
    w = first_window_rows(step_rows)
    big = np.asarray(target) >= MIN_SHARE
    while w < n_rows and (piece_bound(max_piece, target, w * capacity)[big] > TOLERANCE).any():
        w *= 2
    return min(w, max(1, n_rows))


@kernel
def _err(v: float, tot: float, norm: float, target: float) -> float:
    """A window's error in one source: its share less the target, or (``norm`` > 0: a window
    the part shares with its neighbour) its tokens' excess over the target share of them, per
    ``norm`` tokens (a full window's), which is what it adds to the step it is part of."""
    if norm > 0:
        return (v - target * tot) / norm
    return (v / tot if tot > 0 else 0.0) - target


@kernel
def _score(vec: np.ndarray, tot: float, norm: float, target: np.ndarray) -> tuple[float, float]:
    """A window's largest absolute error (``_err``) and its sum of squared errors."""
    worst, ss = 0.0, 0.0
    for k in range(target.shape[0]):
        e = _err(vec[k], tot, norm, target[k])
        ss += e * e
        if abs(e) > worst:
            worst = abs(e)
    return worst, ss


@kernel
def _try(
    vi: np.ndarray,
    ti: float,
    ni: float,
    vj: np.ndarray,
    tj: float,
    nj: float,
    a: np.ndarray,
    sa: float,
    b: np.ndarray,
    sb: float,
    target: np.ndarray,
    tmp: np.ndarray,
) -> tuple[float, float]:
    """(largest error, sum of squares) of windows i and j after ``a`` (of i) and ``b`` (of
    j) trade places."""
    k = target.shape[0]
    for x in range(k):
        tmp[x] = vi[x] - a[x] + b[x]
    mi, si = _score(tmp, ti - sa + sb, ni, target)
    for x in range(k):
        tmp[x] = vj[x] + a[x] - b[x]
    mj, sj = _score(tmp, tj + sa - sb, nj, target)
    return max(mi, mj), si + sj


@kernel
def _top(score: np.ndarray, n: int, rand: np.ndarray, draw: int, out: np.ndarray) -> int:
    """Indices of the ``n`` largest ``score`` (ties: lower index; by selection, as ``n`` is
    small) then up to ``n`` drawn others, into ``out``; returns how many. Scores of the
    chosen are overwritten."""
    m = score.shape[0]
    c = 0
    for _ in range(min(n, m)):
        best = 0
        for y in range(1, m):
            if score[y] > score[best]:
                best = y
        out[c] = best
        c += 1
        score[best] = -np.inf
    if m > n:
        for x in range(n):
            y = rand[(draw + x) % rand.shape[0]] % m
            if score[y] != -np.inf:
                out[c] = y
                c += 1
                score[y] = -np.inf
    return c


@kernel
def deal_windows(
    rows: np.ndarray,
    row_vec: np.ndarray,
    row_tok: np.ndarray,
    bounds: np.ndarray,
    target: np.ndarray,
) -> np.ndarray:
    """``rows`` (coarsest first) dealt to the windows of positions ``bounds[v]`` to
    ``bounds[v + 1]``: each to the window with a free position whose error (tokens per source
    minus target share of its tokens) it leaves least in squared sum (ties: the first
    window). Returns the rows in position order: window after window, each window's in the
    order dealt."""
    n = rows.shape[0]
    k = target.shape[0]
    n_win = bounds.shape[0] - 1
    err = np.zeros((n_win, k))
    fill = np.zeros(n_win, dtype=np.int64)
    out = np.empty(n, dtype=np.int64)
    e = np.zeros(k)
    for r in rows:
        for x in range(k):
            e[x] = row_vec[r, x] - target[x] * row_tok[r]
        best, best_cost = -1, 0.0
        for v in range(n_win):
            if fill[v] >= bounds[v + 1] - bounds[v]:
                continue
            cost = 0.0
            for x in range(k):
                cost += 2.0 * err[v, x] * e[x]  # the change of the squared sum, less |e|^2
            if best < 0 or cost < best_cost:
                best, best_cost = v, cost
        for x in range(k):
            err[best, x] += e[x]
        out[bounds[best] + fill[best]] = r
        fill[best] += 1
    return out


@kernel
def _candidates(
    kind: int,
    lo: int,
    hi: int,
    sign: float,
    g: np.ndarray,
    pos_row: np.ndarray,
    slot_offsets: np.ndarray,
    slot_unit: np.ndarray,
    row_vec: np.ndarray,
    unit_vec: np.ndarray,
    slots: np.ndarray,
    score: np.ndarray,
) -> int:
    """The rows (``kind`` 1: their positions) or units (2: their slots) at positions
    ``lo..hi-1``, into ``slots``, each scored by its projection on ``sign * g`` (how much of
    the error it carries across); returns how many."""
    k = g.shape[0]
    n = 0
    for p in range(lo, hi):
        r = pos_row[p]
        if kind == 1:
            v = 0.0
            for x in range(k):
                v += sign * g[x] * row_vec[r, x]
            slots[n] = p
            score[n] = v
            n += 1
        else:
            for s in range(slot_offsets[r], slot_offsets[r + 1]):
                v = 0.0
                for x in range(k):
                    v += sign * g[x] * unit_vec[slot_unit[s], x]
                slots[n] = s
                score[n] = v
                n += 1
    return n


@kernel
def _best_swap(
    kind: int,
    i: int,
    j: int,
    bounds: np.ndarray,
    pos_row: np.ndarray,
    slot_offsets: np.ndarray,
    slot_unit: np.ndarray,
    row_vec: np.ndarray,
    row_tok: np.ndarray,
    unit_vec: np.ndarray,
    unit_size: np.ndarray,
    capacity: int,
    win_vec: np.ndarray,
    win_tot: np.ndarray,
    norm: np.ndarray,
    g: np.ndarray,
    target: np.ndarray,
    rand: np.ndarray,
    draw: int,
    n_cand: int,
    bufs: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    tmp: np.ndarray,
    old_max: float,
    old_ss: float,
    best_gain: float,
) -> tuple[float, int, int, int]:
    """The best swap of one ``kind`` between windows i and j (1: two rows trade positions;
    2: two units trade rows, both rows staying within ``capacity``) among each side's
    candidates (``_candidates``, then ``_top``), if it gains more than ``best_gain`` without
    raising ``old_max``: (its gain, its position or slot in i and in j (-1: none), the
    draw counter after)."""
    slots_i, slots_j, score_i, score_j, cand_i, cand_j = bufs
    ni = _candidates(
        kind, bounds[i], bounds[i + 1], 1.0, g, pos_row, slot_offsets, slot_unit, row_vec,
        unit_vec, slots_i, score_i,
    )  # fmt: skip
    nj = _candidates(
        kind, bounds[j], bounds[j + 1], -1.0, g, pos_row, slot_offsets, slot_unit, row_vec,
        unit_vec, slots_j, score_j,
    )  # fmt: skip
    ci = _top(score_i[:ni], n_cand, rand, draw, cand_i)
    draw += n_cand
    cj = _top(score_j[:nj], n_cand, rand, draw, cand_j)
    draw += n_cand
    best_a, best_b = -1, -1
    for a in range(ci):
        sa = slots_i[cand_i[a]]
        if kind == 1:
            ra = pos_row[sa]
            ua = ra
        else:
            ua = slot_unit[sa]
            ra = _row_of_slot(slot_offsets, sa)
        for b in range(cj):
            sb = slots_j[cand_j[b]]
            if kind == 1:
                rb = pos_row[sb]
                nm, ns = _try(
                    win_vec[i], win_tot[i], norm[i], win_vec[j], win_tot[j], norm[j],
                    row_vec[ra], row_tok[ra], row_vec[rb], row_tok[rb], target, tmp,
                )  # fmt: skip
            else:
                ub = slot_unit[sb]
                rb = _row_of_slot(slot_offsets, sb)
                d = unit_size[ub] - unit_size[ua]
                if row_tok[ra] + d > capacity or row_tok[rb] - d > capacity:
                    continue
                nm, ns = _try(
                    win_vec[i], win_tot[i], norm[i], win_vec[j], win_tot[j], norm[j],
                    unit_vec[ua], unit_size[ua], unit_vec[ub], unit_size[ub], target, tmp,
                )  # fmt: skip
            if nm <= old_max and old_ss - ns > best_gain:
                best_gain, best_a, best_b = old_ss - ns, sa, sb
    return best_gain, best_a, best_b, draw


@kernel
def exchange_kernel(
    pos_row: np.ndarray,
    slot_offsets: np.ndarray,
    slot_unit: np.ndarray,
    unit_size: np.ndarray,
    unit_vec: np.ndarray,
    row_tok: np.ndarray,
    capacity: int,
    bounds: np.ndarray,
    norm: np.ndarray,
    fixed: np.ndarray,
    target: np.ndarray,
    rand: np.ndarray,
    max_passes: int,
    stop: float,
    n_cand: int,
    peer_lo: np.ndarray,
    peer_hi: np.ndarray,
) -> int:
    """The exchange (module docstring), in place: ``pos_row[p]`` is the row at position p,
    ``slot_unit[slot_offsets[r]:slot_offsets[r+1]]`` the units of row r, ``row_tok`` each
    row's tokens; window i holds positions ``bounds[i]..bounds[i+1]-1`` plus ``fixed[i]``
    (tokens per source of another part's rows in it, which no move changes), its error per
    ``_err`` with ``norm[i]``; with ``peer_lo`` (not empty) window i trades only with
    windows ``peer_lo[i]..peer_hi[i]-1``. Returns the number of moves."""
    n_rows = pos_row.shape[0]
    k = target.shape[0]
    n_win = bounds.shape[0] - 1
    row_vec = np.zeros((n_rows, k))
    for r in range(n_rows):
        for s in range(slot_offsets[r], slot_offsets[r + 1]):
            for x in range(k):
                row_vec[r, x] += unit_vec[slot_unit[s], x]
    win_vec = np.zeros((n_win, k))
    win_tot = np.zeros(n_win)
    widest, most_peers = 1, 2 * N_PARTNERS
    for i in range(n_win):
        for x in range(k):
            win_vec[i, x] = fixed[i, x]
            win_tot[i] += fixed[i, x]
        widest = max(widest, bounds[i + 1] - bounds[i])
        if peer_lo.shape[0] > 0:
            most_peers = max(most_peers, peer_hi[i] - peer_lo[i])
        for p in range(bounds[i], bounds[i + 1]):
            r = pos_row[p]
            win_tot[i] += row_tok[r]
            for x in range(k):
                win_vec[i, x] += row_vec[r, x]
    worst = np.zeros(n_win)
    ss = np.zeros(n_win)
    dev = np.zeros((n_win, k))
    tmp = np.zeros(k)
    g = np.zeros(k)
    max_slots = 1
    for r in range(n_rows):
        max_slots = max(max_slots, slot_offsets[r + 1] - slot_offsets[r])
    cap_slots = max_slots * widest
    bufs = (
        np.empty(cap_slots, dtype=np.int64),
        np.empty(cap_slots, dtype=np.int64),
        np.empty(cap_slots),
        np.empty(cap_slots),
        np.empty(2 * n_cand, dtype=np.int64),
        np.empty(2 * n_cand, dtype=np.int64),
    )
    partners = np.empty(most_peers, dtype=np.int64)
    draw = 0
    moves = 0
    stuck = np.zeros(n_win, dtype=np.bool_)  # found no move, and unchanged since
    for _ in range(max_passes):
        moved = 0
        for i in range(n_win):
            worst[i], ss[i] = _score(win_vec[i], win_tot[i], norm[i], target)
            for x in range(k):
                dev[i, x] = _err(win_vec[i, x], win_tot[i], norm[i], target[x])
        by_source = np.empty((k, n_win), dtype=np.int64)
        for x in range(k):
            by_source[x] = np.argsort(dev[:, x], kind="mergesort")
        for i in np.argsort(-worst, kind="mergesort"):
            for _m in range(MAX_MOVES):
                if worst[i] <= stop or n_win < 2 or stuck[i]:
                    break
                kw = 0
                for x in range(k):
                    if abs(dev[i, x]) > abs(dev[i, kw]):
                        kw = x
                n_p = 0
                if peer_lo.shape[0] > 0:  # partners only among i's peers: their sums stay put
                    for j in range(peer_lo[i], peer_hi[i]):
                        if j != i:
                            partners[n_p] = j
                            n_p += 1
                else:
                    for y in range(n_win):  # the most opposite windows in the worst source
                        j = by_source[kw, y] if dev[i, kw] > 0 else by_source[kw, n_win - 1 - y]
                        if j != i:
                            partners[n_p] = j
                            n_p += 1
                        if n_p == N_PARTNERS:
                            break
                    for _d in range(N_PARTNERS):
                        j = rand[draw % rand.shape[0]] % n_win
                        draw += 1
                        if j != i:
                            partners[n_p] = j
                            n_p += 1
                best_gain, best_kind, best_a, best_b, best_j = 0.0, 0, -1, -1, -1
                for q in range(n_p):
                    j = partners[q]
                    old_max = max(worst[i], worst[j])
                    old_ss = ss[i] + ss[j]
                    # The error's gradient: tokens per unit of each window's error.
                    ti = norm[i] if norm[i] > 0 else (win_tot[i] if win_tot[i] > 0 else 1.0)
                    tj = norm[j] if norm[j] > 0 else (win_tot[j] if win_tot[j] > 0 else 1.0)
                    for x in range(k):
                        g[x] = dev[i, x] / ti - dev[j, x] / tj
                    for kind in (1, 2):  # whole rows trade positions, then units trade rows
                        best_gain, a, b, draw = _best_swap(
                            kind, i, j, bounds, pos_row, slot_offsets, slot_unit, row_vec,
                            row_tok, unit_vec, unit_size, capacity, win_vec, win_tot, norm, g,
                            target, rand, draw, n_cand, bufs, tmp, old_max, old_ss, best_gain,
                        )  # fmt: skip
                        if a >= 0:
                            best_kind, best_a, best_b, best_j = kind, a, b, j
                if best_kind == 0 or best_gain <= 1e-15:
                    stuck[i] = True
                    break
                j = best_j
                if best_kind == 1:  # two rows trade positions
                    ri, rj = pos_row[best_a], pos_row[best_b]
                    pos_row[best_a], pos_row[best_b] = rj, ri
                    win_tot[i] += row_tok[rj] - row_tok[ri]
                    win_tot[j] += row_tok[ri] - row_tok[rj]
                    for x in range(k):
                        win_vec[i, x] += row_vec[rj, x] - row_vec[ri, x]
                        win_vec[j, x] += row_vec[ri, x] - row_vec[rj, x]
                else:  # two units trade rows
                    ua, ub = slot_unit[best_a], slot_unit[best_b]
                    ra = _row_of_slot(slot_offsets, best_a)
                    rb = _row_of_slot(slot_offsets, best_b)
                    slot_unit[best_a], slot_unit[best_b] = ub, ua
                    d = unit_size[ub] - unit_size[ua]
                    row_tok[ra] += d
                    row_tok[rb] -= d
                    win_tot[i] += d
                    win_tot[j] -= d
                    for x in range(k):
                        e = unit_vec[ub, x] - unit_vec[ua, x]
                        row_vec[ra, x] += e
                        row_vec[rb, x] -= e
                        win_vec[i, x] += e
                        win_vec[j, x] -= e
                stuck[j] = False
                for y in (i, j):
                    worst[y], ss[y] = _score(win_vec[y], win_tot[y], norm[y], target)
                    for x in range(k):
                        dev[y, x] = _err(win_vec[y, x], win_tot[y], norm[y], target[x])
                moved += 1
        moves += moved
        if moved == 0:
            break
    return moves


@kernel
def _row_of_slot(slot_offsets: np.ndarray, slot: int) -> int:
    """The row whose slots hold ``slot`` (binary search over the row offsets)."""
    lo, hi = 0, slot_offsets.shape[0] - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if slot_offsets[mid] <= slot:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True)
class Windows:
    """The output's windows of ``rows`` rows (from output row 0) over a part of the output
    whose first row is output row ``offset``: window i holds the part's positions
    ``bounds[i]..bounds[i+1]-1``, and ``norm[i]`` > 0 marks a window the part shares with
    the part before it (its first, unless the part starts a window) or after it (its last,
    with ``open_end``, unless the part ends one), whose error is its tokens' excess over
    their target share per ``norm`` tokens (a full window's): each side then holds its
    share of the step, so the step is near target too. Every other window, the output's
    shorter last one too, is held to its share (``_err``). ``fixed[i]``: tokens per source
    of the next part's rows in window i (its last), when they are known before this part
    is exchanged (the tail's, for the last group), so the window's error is the step's,
    and this part makes up for what the next part's side of it lacks."""

    bounds: np.ndarray
    norm: np.ndarray
    fixed: np.ndarray | None = None

    def carried(
        self, following: np.ndarray | None, n_sources: int, rows: int, end: int
    ) -> np.ndarray:
        """``fixed`` for a part ending at output row ``end`` (exclusive) followed by rows of
        ``following`` ((R, K) tokens per source, in the next part's order): those up to the
        output's next window cut, in the part's last window; zeros when none."""
        fixed = np.zeros((self.count, n_sources))
        if following is not None and self.count and self.norm[-1] > 0:
            fixed[-1] = np.asarray(following, np.float64)[: -end % rows].sum(axis=0)
        return fixed

    @classmethod
    def of(
        cls, n_rows: int, rows: int, capacity: int, offset: int = 0, open_end: bool = False
    ) -> Windows:
        first = -offset % rows or rows  # the part's first cut
        cuts = np.arange(first, n_rows, rows, dtype=np.int64)
        bounds = np.concatenate([[0], cuts, [n_rows]]).astype(np.int64)
        norm = np.zeros(bounds.size - 1)
        if offset % rows:
            norm[0] = rows * capacity
        if open_end and (offset + n_rows) % rows:
            norm[-1] = rows * capacity
        return cls(bounds, norm)

    @property
    def count(self) -> int:
        return int(self.bounds.size - 1)

    def peers(self, group: int, rows: int, offset: int) -> tuple[np.ndarray, np.ndarray]:
        """Per window, the windows ``lo..hi-1`` of its coarse window of ``group * rows``
        output rows (aligned to output row 0 too): those it may trade with."""
        coarse = (self.bounds[:-1] + offset) // (group * rows)
        lo = np.searchsorted(coarse, coarse, "left").astype(np.int64)
        hi = np.searchsorted(coarse, coarse, "right").astype(np.int64)
        return lo, hi


def balance_steps(
    layout: RowLayout,
    pack_of_piece: np.ndarray,
    piece_src: np.ndarray,
    piece_size: np.ndarray,
    n_sources: int,
    window_rows: int,
    seed: int,
    target: np.ndarray | None = None,
    group: int = 0,
    offset: int = 0,
    open_end: bool = False,
    following: np.ndarray | None = None,
) -> tuple[RowLayout, int]:
    """The long layout after the exchange at windows of ``window_rows`` rows (rows trade
    positions, units trade rows), and the number of moves. ``group`` > 0: windows trade
    only within their group of ``group`` windows, from the given order (so every group's
    sums, hence any coarser balance, stay as they are); else from the deal
    (``deal_windows``), or the given order where that ends worse. ``offset``: the layout's
    first row is the output's row ``offset`` (a part after others), and windows and groups
    are the output's (``Windows``); ``open_end``: rows of another part follow it, and
    ``following`` (their tokens per source per row, (R, K), when known: ``Windows.carried``)
    are counted in the window it shares with them. Within a
    row, units keep the order of their old positions in the layout, so a row nothing moved
    in reads as before."""
    n_rows = layout.num_rows
    windows = Windows.of(n_rows, window_rows, int(layout.capacity), offset, open_end)
    if windows.count < 2 or n_sources < 2:  # one window: nothing to trade with
        return layout, 0
    fixed = windows.carried(following, n_sources, window_rows, offset + n_rows)
    windows = Windows(windows.bounds, windows.norm, fixed)
    units = units_of(layout, pack_of_piece, piece_src, piece_size, n_sources)
    n_units = units.start.size
    vec = np.ascontiguousarray(units.vec, dtype=np.float64)
    if target is None:
        sums = vec.sum(axis=0)
        target = sums / max(sums.sum(), 1.0)
    target = np.asarray(target, np.float64)
    slot_offsets = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(units.row, minlength=n_rows), out=slot_offsets[1:])
    rand = np.random.default_rng([seed, 26, 2]).integers(0, 1 << 62, 4099, dtype=np.int64)
    work = n_units * 64 + n_rows * window_rows * 8
    given = np.arange(n_rows, dtype=np.int64)
    limit = _largest_error(units, given, np.arange(n_units), slot_offsets, windows, target)
    none = np.zeros(0, dtype=np.int64)
    peer_lo, peer_hi = windows.peers(group, window_rows, offset) if group > 0 else (none, none)
    starts = [given] if group > 0 else [_dealt(units, n_rows, windows.bounds, target), given]
    for start in starts:
        pos_row, slot_unit = start.copy(), np.arange(n_units, dtype=np.int64)
        row_tok = np.asarray(layout.row_tokens, np.int64).copy()
        moves = pick(exchange_kernel, work)(
            pos_row,
            slot_offsets,
            slot_unit,
            units.size,
            vec,
            row_tok,
            int(layout.capacity),
            windows.bounds,
            windows.norm,
            fixed,
            target,
            rand,
            MAX_PASSES,
            STOP,
            N_CAND,
            peer_lo,
            peer_hi,
        )
        err = _largest_error(units, pos_row, slot_unit, slot_offsets, windows, target)
        if err <= limit:  # the deal is only a start: never one that ends worse
            break
    row_pos = np.empty(n_rows, dtype=np.int64)
    row_pos[pos_row] = np.arange(n_rows, dtype=np.int64)
    unit_pos = np.empty(n_units, dtype=np.int64)
    unit_pos[slot_unit] = row_pos[np.repeat(np.arange(n_rows), np.diff(slot_offsets))]
    order = np.lexsort((units.start, unit_pos))
    lens = (units.end - units.start)[order]
    offsets = np.zeros(n_rows + 1, dtype=np.int64)
    per_row = np.bincount(unit_pos, weights=units.end - units.start, minlength=n_rows)
    np.cumsum(per_row.astype(np.int64), out=offsets[1:])
    first = np.cumsum(lens) - lens
    take = np.repeat(units.start[order] - first, lens) + np.arange(int(lens.sum()))
    pieces = layout.row_pieces[take]
    return RowLayout(layout.capacity, offsets, pieces, row_tok[pos_row]), int(moves)


def _dealt(units: Units, n_rows: int, bounds: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Rows in position order after ``deal_windows``, coarsest first (by their largest long
    piece: a row of packs only last), rows of a size in their given order; in blocks of
    ``DEAL_WINDOWS`` windows of consecutive rows (the row order keeps blocks on target),
    so the deal costs O(rows * DEAL_WINDOWS * K)."""
    k = target.size
    coarse = np.zeros(n_rows, dtype=np.int64)
    np.maximum.at(coarse, units.row, np.where(units.long, units.size, 0))
    row_vec = np.zeros((n_rows, k))
    np.add.at(row_vec, units.row, units.vec)
    row_tok = row_vec.sum(axis=1)
    n_win = bounds.size - 1
    out = np.empty(n_rows, dtype=np.int64)
    for v in range(0, n_win, DEAL_WINDOWS):
        end = min(n_win, v + DEAL_WINDOWS)
        a, b = int(bounds[v]), int(bounds[end])
        rows = np.arange(a, b, dtype=np.int64)
        rows = rows[np.argsort(-coarse[rows], kind="stable")]
        work = rows.size * (end - v) * k // 4
        out[a:b] = pick(deal_windows, work)(rows, row_vec, row_tok, bounds[v : end + 1] - a, target)
    return out


def _largest_error(
    units: Units,
    pos_row: np.ndarray,
    slot_unit: np.ndarray,
    slot_offsets: np.ndarray,
    windows: Windows,
    target: np.ndarray,
) -> float:
    """The largest window error (``_err``: |share - target|, or a shared window's excess
    per ``norm``) over the windows when row ``pos_row[p]`` is at position p and row r holds
    units ``slot_unit[slot_offsets[r]:...]``."""
    n_rows = pos_row.size
    row_pos = np.empty(n_rows, dtype=np.int64)
    row_pos[pos_row] = np.arange(n_rows)
    unit_row = np.empty(slot_unit.size, dtype=np.int64)
    unit_row[slot_unit] = np.repeat(np.arange(n_rows), np.diff(slot_offsets))
    win = np.searchsorted(windows.bounds, row_pos[unit_row], "right") - 1
    n_win = windows.count
    per = np.zeros((n_win, target.size))
    np.add.at(per, win, units.vec)
    if windows.fixed is not None:
        per += windows.fixed
    tot = per.sum(axis=1, keepdims=True)
    err = np.abs(np.divide(per, tot, out=np.zeros_like(per), where=tot > 0) - target)
    shared = windows.norm > 0
    err[shared] = np.abs(per[shared] - target * tot[shared]) / windows.norm[shared, None]
    return float(err.max()) if n_win else 0.0
