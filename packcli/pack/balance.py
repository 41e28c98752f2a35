"""Attention-cost balance of the long tier: move long documents out of the costliest rows.

A row's attention cost is sum(segment length^2) (what block-diagonal attention computes), and
in data-parallel training the slowest row of a step sets its pace. Bin packing ignores this:
it may put a 60k-token document and a 58k one in one row, while another row holds only
short packs. ``balance_attention`` repeatedly takes the costliest row and swaps one of its
long documents (never its largest) into one of the 64 cheapest rows, taking back short packs
or smaller long documents of about the same size, when that lowers the larger of the two
rows' costs. Row count and fill do not change (0% extra rows), and short packs stay whole.
The sum of all rows' costs is fixed by the documents, so only the maximum can move, and a
row's cost never drops below its largest segment's square: ``floor`` is reported with the
ratio.

Measured (``python scripts/bench_balance.py``, docs/benchmarks.md): on a pretraining mix with
documents capped at 64k, 100k documents, max/mean 4.94 -> 4.24 (floor 2.47) at zero extra
rows. It stops when the costliest row has no swap whose sizes match: two full rows can only
trade equal totals, and short packs come in ~4096-token steps.

Pure and deterministic: unit sizes and costs in, a new row per unit out. Each move costs
O(units in the rows involved + 64 log rows) after an O(U log U) setup.
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np


def balance_ratio(row_cost: np.ndarray) -> float:
    """max / mean of per-row attention cost (1.0 = perfectly balanced)."""
    return float(row_cost.max() / row_cost.mean()) if row_cost.size and row_cost.any() else 1.0


def balance_attention(
    row_of_unit: np.ndarray,
    unit_size: np.ndarray,
    unit_cost: np.ndarray,
    is_long: np.ndarray,
    capacity: int,
    max_iterations: int = 100_000,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Returns the new row of every unit and a summary (ratio before/after, floor, moves)."""
    rows = row_of_unit.copy()
    n_rows = int(rows.max()) + 1 if rows.size else 0
    cost = np.bincount(rows, weights=unit_cost, minlength=n_rows).astype(np.float64)
    load = np.bincount(rows, weights=unit_size, minlength=n_rows).astype(np.int64)
    before = balance_ratio(cost)
    members: list[list[int]] = [[] for _ in range(n_rows)]
    for u in np.argsort(rows, kind="stable"):
        members[int(rows[u])].append(int(u))
    heap = [(-cost[r], r) for r in range(n_rows)]
    heapq.heapify(heap)
    cheap = [(cost[r], r) for r in range(n_rows)]  # min-heap of rows, stale entries skipped
    heapq.heapify(cheap)
    moves = 0
    for _ in range(max_iterations):
        if not heap:
            break
        neg, r = heapq.heappop(heap)
        if -neg != cost[r]:
            continue  # stale entry
        candidates = _cheapest(cheap, cost, 64)
        longs = sorted((u for u in members[r] if is_long[u]), key=lambda u: -unit_size[u])
        moved = False
        for u in longs[1:]:  # the largest one stays: it sets the row's floor
            target = _swap_target(
                r, u, members, cost, load, candidates, unit_size, unit_cost, capacity
            )
            if target is None:
                continue
            r2, back = target
            for p in back:
                members[r2].remove(p)
                members[r].append(p)
                rows[p] = r
            members[r].remove(u)
            members[r2].append(u)
            rows[u] = r2
            delta_size = int(unit_size[back].sum()) - int(unit_size[u])
            delta_cost = float(unit_cost[back].sum()) - float(unit_cost[u])
            load[r] += delta_size
            load[r2] -= delta_size
            cost[r] += delta_cost
            cost[r2] -= delta_cost
            heapq.heappush(heap, (-cost[r], r))
            heapq.heappush(heap, (-cost[r2], r2))
            heapq.heappush(cheap, (cost[r], r))
            heapq.heappush(cheap, (cost[r2], r2))
            moves += 1
            moved = True
            break
        if not moved:
            break  # the costliest row cannot improve: nothing else bounds the maximum
    floor = float(np.max(np.where(is_long, unit_cost, 0.0))) if unit_cost.size else 0.0
    return rows, {
        "before": before,
        "after": balance_ratio(cost),
        "floor": float(floor / cost.mean()) if cost.size and cost.mean() else 1.0,
        "moves": moves,
    }


def _cheapest(cheap: list[tuple[float, int]], cost: np.ndarray, k: int) -> list[int]:
    """The ``k`` cheapest rows (skipping stale heap entries, keeping the heap intact)."""
    out: list[int] = []
    seen: set[int] = set()
    taken = []
    while cheap and len(out) < k:
        c, r = heapq.heappop(cheap)
        if c != cost[r] or r in seen:
            continue  # stale: a fresher entry for r is in the heap
        seen.add(r)
        out.append(r)
        taken.append((c, r))
    for item in taken:
        heapq.heappush(cheap, item)
    return out


def _swap_target(
    r: int,
    u: int,
    members: list[list[int]],
    cost: np.ndarray,
    load: np.ndarray,
    candidates: list[int],
    unit_size: np.ndarray,
    unit_cost: np.ndarray,
    capacity: int,
) -> tuple[int, list[int]] | None:
    """A cheap row that takes ``u`` and gives back units (short packs or smaller long
    documents) of about the same size, lowering the larger of the two rows' costs."""
    s = int(unit_size[u])
    room_r = capacity - int(load[r])
    for r2 in candidates:
        if r2 == r:
            continue
        need = s - (capacity - int(load[r2]))  # what r2 must give back at least
        back, total = [], 0
        for p in sorted(members[r2], key=lambda p: -unit_size[p]):
            if total >= need:
                break
            if unit_size[p] < s and total + int(unit_size[p]) <= s + room_r:
                back.append(p)
                total += int(unit_size[p])
        if total < need or not back:
            continue
        gained = float(unit_cost[back].sum()) - float(unit_cost[u])
        new_r, new_2 = cost[r] + gained, cost[r2] - gained
        if max(new_r, new_2) < cost[r]:
            return r2, back
    return None
