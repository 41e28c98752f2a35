"""numpy <-> Arrow for flat numeric columns, without pyarrow importing pandas.

pyarrow imports pandas (0.6-1.1 s of CPU on the 2-core dev machine, a fifth of a small
``packcli pack``) the first time ``pa.array(...)``, ``pa.scalar(...)`` or
``Array.to_numpy()`` runs in a process, even for plain integers, because its
numpy<->Arrow conversions look for pandas' missing-value types. Arrays built from buffers and
numpy views of buffers take another route that never does. These helpers cover what
packcli converts: numeric arrays without nulls (token ids, offsets, lengths). Anything else
(nulls, booleans, non-numeric types) falls back to pyarrow's own conversion.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def to_arrow(values: np.ndarray, type: pa.DataType | None = None) -> pa.Array:
    """A 1-D numeric numpy array as an Arrow array of ``type`` (default: its own dtype),
    cast with numpy first when the dtypes differ; zero-copy when they do not."""
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"expected a 1-D array, got shape {arr.shape}")
    type = type if type is not None else pa.from_numpy_dtype(arr.dtype)
    if not (pa.types.is_integer(type) or pa.types.is_floating(type)):
        return pa.array(arr, type=type)  # not a fixed-width number: pyarrow's conversion
    arr = np.ascontiguousarray(arr, dtype=type.to_pandas_dtype())
    return pa.Array.from_buffers(type, arr.shape[0], [None, pa.py_buffer(arr)])


def list_array(offsets: np.ndarray, values: np.ndarray, value_type: pa.DataType) -> pa.Array:
    """``list<value_type>`` from int32 offsets (n + 1) and flat values, without nulls."""
    return pa.ListArray.from_arrays(to_arrow(offsets, pa.int32()), to_arrow(values, value_type))


def to_numpy(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A numeric Arrow array without nulls as numpy: a read-only view of its buffer (chunks
    are concatenated). Arrays with nulls or other types go through ``to_numpy``."""
    if isinstance(array, pa.ChunkedArray):
        parts = [to_numpy(chunk) for chunk in array.chunks]
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return np.zeros(0, dtype=_dtype(array.type))
        return np.concatenate(parts)
    dtype = _dtype(array.type)
    if dtype is None or array.null_count:
        copied: np.ndarray = array.to_numpy(zero_copy_only=False)
        return copied
    data = array.buffers()[1]
    if data is None:  # an empty array may have no data buffer
        return np.zeros(0, dtype=dtype)
    view = np.frombuffer(data, dtype=dtype, count=len(array), offset=array.offset * dtype.itemsize)
    view.flags.writeable = False  # as pyarrow's own views: Arrow data is immutable
    return view


def _dtype(type: pa.DataType) -> np.dtype | None:
    if pa.types.is_integer(type) or pa.types.is_floating(type):
        found: np.dtype = np.dtype(type.to_pandas_dtype())  # pyarrow's own mapping
        return found
    return None
