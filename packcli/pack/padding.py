"""Context-parallel padding arithmetic, shared by the planner, the writer, ``verify`` and the
collator (one rule, so the four cannot drift apart).

A padded segment is its real tokens then its padding: ``sizes[i]`` tokens in all, the last
``pad[i]`` of them padding (``seq_lengths`` and ``seq_pad`` of a row). Everything here is
pure numpy over those two arrays, O(tokens) at most.
"""

from __future__ import annotations

import numpy as np


def padded_sizes(lengths: np.ndarray, multiple: int) -> np.ndarray:
    """``lengths`` rounded up to a multiple of ``multiple`` (as they are for 1)."""
    if multiple == 1:
        return lengths
    return -(-np.asarray(lengths, dtype=np.int64) // multiple) * multiple


def padded_length(n: int, multiple: int | None) -> int:
    """One length rounded up to a multiple of ``multiple`` (``None``: as it is)."""
    return n if multiple is None else -(-n // multiple) * multiple


def pad_positions(sizes: np.ndarray, pad: np.ndarray) -> np.ndarray:
    """Token offsets (into the segments laid end to end) of the padding: the last ``pad[i]``
    tokens of each segment of ``sizes[i]`` tokens, in order."""
    sizes = np.asarray(sizes, dtype=np.int64)
    pad = np.asarray(pad, dtype=np.int64)
    n = int(pad.sum())
    if not n:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(sizes)
    first = np.repeat(ends - pad, pad)  # each pad token's segment's first pad offset
    offsets: np.ndarray = (
        first + np.arange(n, dtype=np.int64) - np.repeat(np.cumsum(pad) - pad, pad)
    )
    return offsets


def pad_mask(sizes: np.ndarray, pad: np.ndarray) -> np.ndarray:
    """True at the padding tokens of segments of ``sizes`` with ``pad`` padding each."""
    mask = np.zeros(int(np.asarray(sizes, dtype=np.int64).sum()), dtype=bool)
    mask[pad_positions(sizes, pad)] = True
    return mask
