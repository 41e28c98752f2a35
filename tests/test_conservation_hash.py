"""The conservation hash: order-sensitive, chunking-independent, equal to its definition."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packcli.publish import expected

MOD = 2**64


def naive_hash(tokens: list[int]) -> int:
    return sum((t + 1) * pow(expected._P, i, MOD) for i, t in enumerate(tokens)) % MOD


@settings(max_examples=100, deadline=None)
@given(
    segs=st.lists(st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=40), max_size=30),
    chunk=st.sampled_from([1, 7, 64, 1 << 22]),
)
def test_segment_hashes_match_definition(segs: list[list[int]], chunk: int) -> None:
    flat = np.array([t for s in segs for t in s], dtype=np.int32)
    lens = np.array([len(s) for s in segs], dtype=np.int64)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(expected, "_HASH_CHUNK", chunk)
        got = expected.segment_hashes(flat, lens)
    assert got.tolist() == [naive_hash(s) for s in segs]


def test_hash_sees_order_and_values() -> None:
    h = expected.segment_hashes(np.array([1, 2, 2, 1, 1, 3], dtype=np.int32), np.array([2, 2, 2]))
    assert len(set(h.tolist())) == 3
