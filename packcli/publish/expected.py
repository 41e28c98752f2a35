"""What a packed output must hold, computed apart from the planner and the writer: a hash of
every segment's tokens and the pieces the overlong policy makes of a document.

``verify`` compares the output with these (against the tokenized shards), and ``recheck``
(against input documents encoded again); both import them from here, so neither imports the
other's module for them.
"""

from __future__ import annotations

import numpy as np

_P = 0x9E3779B97F4A7C15  # odd, so invertible modulo 2**64
_P_INV = pow(_P, -1, 2**64)
_HASH_CHUNK = 1 << 22  # tokens per hashing chunk (bounds temporary memory)


def _powers(base: int, n: int) -> np.ndarray:
    pw = np.full(n, base, dtype=np.uint64)
    if n:
        pw[0] = 1
    return np.cumprod(pw, dtype=np.uint64)  # wraps modulo 2**64 by design


def _hash_chunk(tokens: np.ndarray, lens: np.ndarray) -> np.ndarray:
    starts = np.cumsum(lens) - lens
    with np.errstate(over="ignore"):
        x = (tokens.astype(np.uint64) + np.uint64(1)) * _powers(_P, tokens.size)
        sums = np.add.reduceat(x, starts) if lens.size else np.zeros(0, np.uint64)
        # Re-base each segment's polynomial at its own start: multiply by P^-start.
        rebased: np.ndarray = sums * _powers(_P_INV, tokens.size)[starts]
        return rebased


def segment_hashes(tokens: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Order-sensitive 64-bit hash of each consecutive segment ``tokens`` is cut into.

    An empty segment hashes to 0 (the chat path keeps a dialogue with nothing to train as an
    empty document; ``reduceat`` cannot express an empty range, and one at the very end
    indexed past the tokens)."""
    lens = np.asarray(lens, dtype=np.int64)
    if lens.size and not lens.all():
        out = np.zeros(lens.size, dtype=np.uint64)
        nonempty = lens > 0
        out[nonempty] = segment_hashes(tokens, lens[nonempty])
        return out
    out = np.empty(lens.size, dtype=np.uint64)
    ends = np.cumsum(lens)
    i = 0
    while i < lens.size:
        base = ends[i] - lens[i]
        j = max(i + 1, int(np.searchsorted(ends, base + _HASH_CHUNK, side="right")))
        out[i:j] = _hash_chunk(tokens[base : ends[j - 1]], lens[i:j])
        i = j
    return out


def expected_pieces(ids: np.ndarray, long_len: int, policy: str) -> list[np.ndarray]:
    """The pieces of one document the long config must hold, by the overlong policy (the
    rule the planner applies, written again here so a planner bug cannot hide itself)."""
    n = ids.size
    if n == 0 or (n > long_len and policy == "drop"):
        return []
    if n <= long_len or policy == "truncate":
        return [ids[:long_len]]
    return [ids[c : c + long_len] for c in range(0, n, long_len)]
