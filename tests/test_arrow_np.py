"""numpy <-> Arrow helpers: the same arrays as pyarrow's conversions, and pandas stays unloaded."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packcli.arrow_np import list_array, to_arrow, to_numpy

NUMERIC = [pa.int8(), pa.int32(), pa.int64(), pa.uint16(), pa.uint32(), pa.float32(), pa.float64()]


@settings(max_examples=100, deadline=None)
@given(
    values=st.lists(st.integers(-100, 100), max_size=50),
    type=st.sampled_from(NUMERIC),
    source=st.sampled_from(["int64", "int32", "float64"]),
    lo=st.integers(0, 10),
    hi=st.integers(0, 10),
)
def test_to_arrow_and_back_match_pyarrow(
    values: list[int], type: pa.DataType, source: str, lo: int, hi: int
) -> None:
    if pa.types.is_unsigned_integer(type):
        values = [abs(v) for v in values]
    arr = np.array(values, dtype=source)
    ours = to_arrow(arr, type)
    assert ours.equals(pa.array(arr, type=type))
    assert to_arrow(arr).equals(pa.array(arr))
    # Slices keep an offset into the buffer: the view must start there.
    sliced = ours.slice(lo, max(0, len(values) - lo - hi))
    back = to_numpy(sliced)
    expected = sliced.to_numpy(zero_copy_only=False)
    assert back.dtype == expected.dtype
    np.testing.assert_array_equal(back, expected)
    chunked = pa.chunked_array([ours, sliced], type=type)
    np.testing.assert_array_equal(to_numpy(chunked), chunked.to_numpy())


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2**31 - 1), max_size=5), max_size=20))
def test_list_array_matches_pyarrow(rows: list[list[int]]) -> None:
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    flat = np.array([v for r in rows for v in r], dtype=np.int64)
    ours = list_array(offsets, flat, pa.int32())
    assert ours.equals(pa.array(rows, type=pa.list_(pa.int32())))
    np.testing.assert_array_equal(to_numpy(ours.offsets), offsets)


def test_nulls_and_other_types_fall_back_to_pyarrow() -> None:
    with_null = pa.array([1, None, 3])
    np.testing.assert_array_equal(to_numpy(with_null), with_null.to_numpy(zero_copy_only=False))
    flags = pa.array([True, False])
    np.testing.assert_array_equal(to_numpy(flags), [True, False])
    assert to_arrow(np.array(["a"]), pa.string()).equals(pa.array(["a"]))
    assert to_numpy(pa.chunked_array([], type=pa.int32())).dtype == np.int32
    with pytest.raises(ValueError, match="1-D"):
        to_arrow(np.zeros((2, 2)))


def test_views_are_read_only_and_zero_copy() -> None:
    arr = pa.array(np.arange(10, dtype=np.int32))
    view = to_numpy(arr.slice(2, 5))
    assert not view.flags.writeable
    assert view.ctypes.data == arr.buffers()[1].address + 2 * 4
