"""Bin packing: exact packs for tiny inputs, and equality with naive reference algorithms."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packcli import jit
from packcli.pack import binpack
from packcli.pack.binpack import (
    group_by_residue,
    pack_granular,
    pack_into_open_bins,
    pack_lengths,
)


def bin_loads(assignment: np.ndarray, lengths: np.ndarray, n_bins: int | None = None) -> np.ndarray:
    """Total length per bin."""
    a = np.asarray(assignment, dtype=np.int64)
    n = int(a.max()) + 1 if n_bins is None and a.size else (n_bins or 0)
    return np.bincount(a, weights=np.asarray(lengths, dtype=np.int64), minlength=n).astype(np.int64)


def naive_best_fit(
    lengths: list[int],
    capacity: int,
    rank: Callable[[int, int, int], tuple[int, ...]],
    open_rem: list[int] | None = None,
) -> tuple[list[int], list[int]]:
    """O(N*B) textbook best fit, decreasing (stable order): each item to the bin with the
    least ``rank(room, size, last touched)`` among those it fits, a new bin only when none
    does; bins numbered in opening order. The bins and each bin's room left."""
    rem = list(open_rem or [])
    touched = [i - len(rem) for i in range(len(rem))]  # later initial bins count as newer
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    out = [0] * len(lengths)
    for step, i in enumerate(order):
        s = lengths[i]
        cands = [b for b in range(len(rem)) if rem[b] >= s]
        if cands:
            b = min(cands, key=lambda b: rank(rem[b], s, touched[b]))
        else:
            rem.append(capacity)
            touched.append(step)
            b = len(rem) - 1
        rem[b] -= s
        touched[b] = step
        out[i] = b
    return out, rem


def naive_bfd(lengths: list[int], capacity: int, open_rem: list[int] | None = None) -> list[int]:
    """Best-fit decreasing with the same tie rules as the fast version: among bins with
    equal remaining room the most recently changed one wins."""
    return naive_best_fit(lengths, capacity, lambda room, s, t: (room, -t), open_rem)[0]


def naive_ffd(lengths: list[int], capacity: int) -> list[int]:
    rem: list[int] = []
    out = [0] * len(lengths)
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        b = next((b for b in range(len(rem)) if rem[b] >= lengths[i]), None)
        if b is None:
            rem.append(capacity)
            b = len(rem) - 1
        rem[b] -= lengths[i]
        out[i] = b
    return out


def test_exact_small_bfd() -> None:
    # Sorted: 6,5,4,3,2 -> 6 opens bin0 (4 left), 5 opens bin1 (5 left), 4 best fits bin0 (0),
    # 3 fits bin1 (2 left), 2 fits bin1 exactly.
    assert pack_lengths(np.array([3, 6, 2, 5, 4]), 10).tolist() == [1, 0, 1, 1, 0]


def test_exact_small_best_vs_first_fit() -> None:
    # 7,7 open bins 0 and 1 with 5 free each. The 4 goes to the most recently touched bin
    # under best fit (bin 1), to the leftmost bin under first fit (bin 0).
    lengths = np.array([7, 7, 4])
    assert pack_lengths(lengths, 12, algorithm="bfd").tolist() == [0, 1, 1]
    assert pack_lengths(lengths, 12, algorithm="ffd").tolist() == [0, 1, 0]
    # 7 opens bin 0 (3 free), 5 opens bin 1 (5 free); the 3 fills bin 0 exactly.
    lengths = np.array([5, 7, 3])
    assert pack_lengths(lengths, 10, algorithm="bfd").tolist() == [1, 0, 0]


def test_wrapped_is_next_fit_in_input_order() -> None:
    assert pack_lengths(np.array([4, 4, 4, 1, 9]), 10, algorithm="wrapped").tolist() == [
        0,
        0,
        1,
        1,
        2,
    ]


@pytest.mark.parametrize("bad", [[1, 0, 2], [1, 11], [-3]])
def test_out_of_range_names_first_bad_index(bad: list[int]) -> None:
    first = next(i for i, x in enumerate(bad) if x <= 0 or x > 10)
    with pytest.raises(ValueError, match=rf"lengths\[{first}\]"):
        pack_lengths(np.array(bad), 10)


def test_rejects_unknown_algorithm_and_bad_shapes() -> None:
    with pytest.raises(ValueError, match="unknown algorithm"):
        pack_lengths(np.array([1]), 10, algorithm="magic")
    with pytest.raises(ValueError, match="1-D"):
        pack_lengths(np.ones((2, 2), dtype=int), 10)
    assert pack_lengths(np.array([], dtype=np.int64), 10).size == 0


lengths_st = st.lists(st.integers(1, 50), min_size=0, max_size=120)


@settings(max_examples=150, deadline=None)
@given(lengths=lengths_st, capacity=st.integers(50, 80))
def test_bfd_matches_naive_reference(lengths: list[int], capacity: int) -> None:
    assert pack_lengths(np.array(lengths, dtype=np.int64), capacity).tolist() == naive_bfd(
        lengths, capacity
    )


@settings(max_examples=150, deadline=None)
@given(lengths=lengths_st, capacity=st.integers(50, 80))
def test_ffd_matches_naive_reference(lengths: list[int], capacity: int) -> None:
    got = pack_lengths(np.array(lengths, dtype=np.int64), capacity, algorithm="ffd")
    assert got.tolist() == naive_ffd(lengths, capacity)


@settings(max_examples=100, deadline=None)
@given(
    lengths=lengths_st,
    capacity=st.integers(50, 80),
    algorithm=st.sampled_from(["bfd", "ffd", "wrapped"]),
)
def test_every_item_once_no_overflow_dense_bins(
    lengths: list[int], capacity: int, algorithm: str
) -> None:
    arr = np.array(lengths, dtype=np.int64)
    assign = pack_lengths(arr, capacity, algorithm=algorithm)
    assert assign.shape == arr.shape
    if arr.size:
        n_bins = int(assign.max()) + 1
        assert set(assign.tolist()) == set(range(n_bins))  # bins numbered 0..B-1
        loads = bin_loads(assign, arr, n_bins)
        assert loads.max() <= capacity
        assert loads.sum() == arr.sum()
        # Any fit-decreasing packing leaves at most one bin half empty or less.
        if algorithm != "wrapped":
            assert (loads <= capacity // 2).sum() <= 1


@settings(max_examples=100, deadline=None)
@given(
    lengths=lengths_st,
    capacity=st.integers(50, 80),
    open_rem=st.lists(st.integers(0, 50), max_size=10),
)
def test_open_bins_match_naive_reference(
    lengths: list[int], capacity: int, open_rem: list[int]
) -> None:
    assign, n_bins = pack_into_open_bins(np.array(lengths, dtype=np.int64), capacity, open_rem)
    assert assign.tolist() == naive_bfd(lengths, capacity, open_rem)
    loads = bin_loads(assign, np.array(lengths, dtype=np.int64), n_bins)
    assert (loads[: len(open_rem)] <= np.array(open_rem, dtype=np.int64)).all()
    assert (loads <= capacity).all()


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("median", [60, 350, 1500])
def test_large_input_quality_and_determinism(seed: int, median: int) -> None:
    """Best-fit decreasing on many lognormal items lands within 0.05% of the volume bound,
    for several seeds and shapes (not one tuned draw)."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(median), 1.0, 200_000).astype(np.int64), 1, 4096)
    a = pack_lengths(lengths, 4096)
    assert np.array_equal(a, pack_lengths(lengths.copy(), 4096))
    bound = -(-int(lengths.sum()) // 4096)
    assert int(a.max()) + 1 <= bound * 1.0005
    assert bin_loads(a, lengths).max() <= 4096


def naive_granular(lengths: list[int], capacity: int, granule: int) -> tuple[list[int], list[int]]:
    """Reference for pack_granular: each item (decreasing, stable) goes to the bin whose
    room after placing it is closest to a multiple of ``granule`` (ties: least room, then
    most recently touched); a new bin only when nothing fits."""
    return naive_best_fit(lengths, capacity, lambda room, s, t: ((room - s) % granule, room, -t))


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 60), max_size=80),
    granule=st.integers(1, 16),
    capacity=st.integers(60, 90),
)
def test_granular_matches_naive_reference(lengths: list[int], granule: int, capacity: int) -> None:
    assign, remaining = pack_granular(np.array(lengths, dtype=np.int64), capacity, granule)
    ref_assign, ref_rem = naive_granular(lengths, capacity, granule)
    assert assign.tolist() == ref_assign
    assert remaining.tolist() == ref_rem


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 60), max_size=60),
    open_rem=st.lists(st.integers(0, 60), max_size=8),
    granule=st.integers(1, 16),
)
def test_granular_into_open_bins_matches_naive_reference(
    lengths: list[int], open_rem: list[int], granule: int
) -> None:
    """Bins 0..K-1 partly full (a mixture's rows holding one large piece each): the same
    rule over them first, new bins numbered after them; every open bin's room reported."""
    assign, remaining = pack_granular(
        np.array(lengths, dtype=np.int64), 60, granule, open_remaining=np.array(open_rem)
    )
    rank = lambda room, s, t: ((room - s) % granule, room, -t)  # noqa: E731
    ref_assign, ref_rem = naive_best_fit(lengths, 60, rank, open_rem)
    assert assign.tolist() == ref_assign
    assert remaining.tolist() == ref_rem
    with pytest.raises(ValueError, match="remaining capacity"):
        pack_granular(np.array([1]), 60, granule, open_remaining=np.array([61]))


def test_granular_leaves_room_in_whole_granules() -> None:
    # 100 and 90 open bins with 28 and 38 free. Plain best fit would put the 20 in the
    # tighter first bin (8 left); modulo 16 the second bin wins: 18 left is 2 over a granule.
    assign, remaining = pack_granular(np.array([100, 90, 20]), 128, 16)
    assert assign.tolist() == [0, 1, 1]
    assert remaining.tolist() == [28, 18]
    assert pack_lengths(np.array([100, 90, 20]), 128).tolist() == [0, 1, 0]


def test_group_by_residue_example() -> None:
    # Granule 10: 33 needs 7 more to reach a multiple -> takes 17 (residue 7); 24 needs 6 -> 6.
    groups = group_by_residue(np.array([33, 17, 24, 6]), 100, 10)
    assert groups.tolist() == [0, 0, 1, 1]


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 90), max_size=80),
    granule=st.integers(1, 20),
    capacity=st.integers(90, 200),
)
def test_group_by_residue_invariants(lengths: list[int], granule: int, capacity: int) -> None:
    arr = np.array(lengths, dtype=np.int64)
    groups = group_by_residue(arr, capacity, granule)
    assert groups.shape == arr.shape
    if arr.size:
        n = int(groups.max()) + 1
        assert set(groups.tolist()) == set(range(n))
        totals = np.bincount(groups, weights=arr, minlength=n)
        assert totals.max() <= capacity and totals.sum() == arr.sum()
        # A group only grows while it gets closer to a multiple of the granule, so its
        # shortfall never exceeds its first (largest) item's.
        for g in range(n):
            members = arr[groups == g]
            first = (granule - members.max() % granule) % granule
            assert (granule - int(members.sum()) % granule) % granule <= first


def optimal_bins(lengths: list[int], capacity: int) -> int:
    """Exact minimum number of bins by backtracking (fine for a dozen items)."""
    items = sorted(lengths, reverse=True)
    best = len(items)

    def place(i: int, loads: list[int]) -> None:
        nonlocal best
        if len(loads) >= best:
            return
        if i == len(items):
            best = len(loads)
            return
        seen = set()
        for b in range(len(loads)):
            if loads[b] + items[i] <= capacity and loads[b] not in seen:
                seen.add(loads[b])
                loads[b] += items[i]
                place(i + 1, loads)
                loads[b] -= items[i]
        loads.append(items[i])
        place(i + 1, loads)
        loads.pop()

    place(0, [])
    return best


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 100), min_size=1, max_size=12), capacity=st.integers(100, 130)
)
def test_bfd_within_the_known_bound_of_the_optimum(lengths: list[int], capacity: int) -> None:
    bins = int(pack_lengths(np.array(lengths), capacity).max()) + 1
    opt = optimal_bins(lengths, capacity)
    assert opt <= bins <= 11 / 9 * opt + 6 / 9


def test_bfd_can_lose_one_bin_to_ffd_on_a_small_input() -> None:
    """Neither rule dominates the other on every input (both have the 11/9 OPT + 6/9
    bound): here textbook best fit strands 92 tokens of room in four bins and needs a
    fifth, which first fit does not. So "at most 1% over FFD" holds as a property of inputs
    with enough bins for 1% to be a bin, tested below, not of every tiny input."""
    lengths = np.array([92, 92, 92, 189, 302, 302, 486, 538, 751, 1289, 2178, 2808, 3422, 3611])
    bfd = pack_lengths(lengths, 4096)
    assert bin_loads(bfd, lengths).tolist() == [4005, 4005, 4045, 4005, 92]
    assert bin_loads(pack_lengths(lengths, 4096, algorithm="ffd"), lengths).max() <= 4096
    assert int(pack_lengths(lengths, 4096, algorithm="ffd").max()) + 1 == 4


@settings(max_examples=100, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 4096), min_size=1, max_size=400),
    seed=st.integers(0, 2**32 - 1),
)
def test_bfd_never_needs_more_than_one_percent_over_ffd(lengths: list[int], seed: int) -> None:
    """At most 1% more bins than FFD, rounded up to whole bins (on a 4-bin input 1% of a bin
    cannot be spent, so one bin is the least a violation can be); plus a realistic SFT-like
    mix of a few thousand documents, where 1% is tens of bins. (Compiled: 5x faster here
    than plain Python, which gives the same bins, tests/test_jit.py.)"""
    for arr in (
        np.array(lengths),
        np.clip(np.random.default_rng(seed).lognormal(np.log(350), 1.0, 3000), 1, 4096).astype(
            np.int64
        ),
    ):
        with jit.forced("numba"):
            bfd = int(pack_lengths(arr, 4096).max()) + 1
            ffd = int(pack_lengths(arr, 4096, algorithm="ffd").max()) + 1
        assert bfd <= math.ceil(ffd * 1.01)


@pytest.mark.parametrize("n_leaves", [1, 63, 64, 65, 4097, 131073, 262144, 300000])
def test_bitmap_finds_the_next_set_leaf(n_leaves: int) -> None:
    rng = np.random.default_rng(n_leaves)
    bits, offs, nw = binpack._bitmap_new(n_leaves)
    present = np.zeros(n_leaves, dtype=bool)
    for leaf in rng.integers(0, n_leaves, 200):
        if present[leaf]:
            binpack._bitmap_clear(bits, offs, int(leaf))
        else:
            binpack._bitmap_set(bits, offs, int(leaf))
        present[leaf] = not present[leaf]
        for x in {0, int(leaf), n_leaves - 1, int(rng.integers(0, n_leaves))}:
            after = np.flatnonzero(present[x:])
            expected = x + int(after[0]) if after.size else -1
            assert binpack._bitmap_next(bits, offs, nw, x) == expected
