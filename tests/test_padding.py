"""``packcli.pack.padding``: the one rule for where context-parallel padding sits, which the
writer, ``verify`` and the collator share. The oracle walks the segments one by one."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from packcli.pack.padding import pad_mask, pad_positions, padded_length, padded_sizes


@given(st.lists(st.tuples(st.integers(1, 40), st.integers(0, 39)), max_size=30))
def test_padding_is_the_last_pad_tokens_of_each_segment(segs: list[tuple[int, int]]) -> None:
    sizes = np.array([n for n, _ in segs], dtype=np.int64)
    pad = np.array([min(p, n - 1) for n, p in segs], dtype=np.int64)
    expected, at = [], 0
    for n, p in zip(sizes.tolist(), pad.tolist(), strict=True):
        expected += list(range(at + n - p, at + n))
        at += n
    assert pad_positions(sizes, pad).tolist() == expected
    mask = pad_mask(sizes, pad)
    assert mask.size == at and np.flatnonzero(mask).tolist() == expected


@given(st.lists(st.integers(0, 1000), max_size=20), st.integers(1, 64))
def test_padded_sizes_round_up_to_the_multiple(lengths: list[int], m: int) -> None:
    got = padded_sizes(np.array(lengths, dtype=np.int64), m).tolist()
    assert got == [n + (-n) % m for n in lengths]
    assert [padded_length(n, m) for n in lengths] == got
    assert [padded_length(n, None) for n in lengths] == lengths
