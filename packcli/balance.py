"""Attention-cost balance of the long tier: move long documents out of the costliest rows.

A row's attention cost is sum(segment length^2) (what block-diagonal attention computes), and
in data-parallel training the slowest row of a step sets its pace. Bin packing ignores this:
it may put a 100k-token document and a 25k-token one in one row, while another row holds only
short packs. ``balance_attention`` repeatedly takes the costliest row and swaps one of its
long documents (never its largest) for short packs of about the same size from the cheapest
row that can take the document, when that lowers the larger of the two rows' costs. Row
count and fill do not change (0% extra rows), and short packs stay whole. The cost of a row
can never drop below its largest segment's square, so ``floor`` is reported with the ratio.

Pure and deterministic: unit sizes and costs in, a new row per unit out. O(iterations x
units in the two rows) after an O(U log U) setup.
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
    by_cost = np.argsort(cost, kind="stable")  # cheapest rows first, refreshed lazily
    moves = 0
    for _ in range(max_iterations):
        if not heap:
            break
        neg, r = heapq.heappop(heap)
        if -neg != cost[r]:
            continue  # stale entry
        longs = sorted((u for u in members[r] if is_long[u]), key=lambda u: -unit_size[u])
        moved = False
        for u in longs[1:]:  # the largest one stays: it sets the row's floor
            target = _swap_target(
                r, u, members, cost, load, by_cost, unit_size, unit_cost, is_long, capacity
            )
            if target is None:
                continue
            r2, packs = target
            for p in packs:
                members[r2].remove(p)
                members[r].append(p)
                rows[p] = r
            members[r].remove(u)
            members[r2].append(u)
            rows[u] = r2
            delta_size = int(unit_size[packs].sum()) - int(unit_size[u])
            delta_cost = float(unit_cost[packs].sum()) - float(unit_cost[u])
            load[r] += delta_size
            load[r2] -= delta_size
            cost[r] += delta_cost
            cost[r2] -= delta_cost
            heapq.heappush(heap, (-cost[r], r))
            heapq.heappush(heap, (-cost[r2], r2))
            by_cost = np.argsort(cost, kind="stable")
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


def _swap_target(
    r: int,
    u: int,
    members: list[list[int]],
    cost: np.ndarray,
    load: np.ndarray,
    by_cost: np.ndarray,
    unit_size: np.ndarray,
    unit_cost: np.ndarray,
    is_long: np.ndarray,
    capacity: int,
) -> tuple[int, list[int]] | None:
    """The cheapest row that can trade short packs for ``u`` and lower the maximum."""
    s = int(unit_size[u])
    room_r = capacity - int(load[r])
    for r2 in by_cost[:64]:  # a few of the cheapest rows are enough in practice
        r2 = int(r2)
        if r2 == r:
            continue
        room_2 = capacity - int(load[r2])
        packs, total = [], 0
        for p in sorted((p for p in members[r2] if not is_long[p]), key=lambda p: -unit_size[p]):
            if total >= s - room_2:
                break
            if total + int(unit_size[p]) <= s + room_r:
                packs.append(p)
                total += int(unit_size[p])
        if not (s - room_2 <= total <= s + room_r) or not packs:
            continue
        gained = float(unit_cost[packs].sum()) - float(unit_cost[u])
        new_r, new_2 = cost[r] + gained, cost[r2] - gained
        if max(new_r, new_2) < cost[r]:
            return r2, packs
    return None
