"""Megatron-LM / megatron-core ``IndexedDataset`` files (``PREFIX.bin`` + ``PREFIX.idx``),
written here byte for byte as megatron-core 0.16's ``IndexedDatasetBuilder`` writes them
(no Megatron import; its reader checks them in ``tests/test_export_frameworks.py``).

One sequence per document, each its own document (``end_document`` after every sequence),
tokens as tokenized, EOS included: ``GPTDataset`` finds boundaries only through EOD tokens
(``reset_position_ids``, ``reset_attention_mask``, ``eod_mask_loss``), so documents must end
with the tokenizer's EOS. Documents come whole from the tokenized shards, so a document the
pack ``split`` across rows is one sequence here, and never merges with its neighbour.

``.idx`` layout: ``MMIDIDX\\0\\0``, u64 version 1, u8 dtype code, u64 sequence count, u64
document count (sequences + 1), then int32 lengths, int64 byte pointers, int64 document
indices (0, 1, ..., n). Token dtype as Megatron's builder picks it from the vocabulary
(``DType.optimal_dtype``): uint16 below 65,500 ids, else int32.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from packcli.atomic import atomic_writer

INDEX_HEADER = b"MMIDIDX\x00\x00"
_DTYPE_CODES: dict[np.dtype, int] = {np.dtype(np.uint16): 8, np.dtype(np.int32): 4}


def megatron_dtype(vocab_size: int) -> np.dtype:
    """Megatron's own choice (``optimal_dtype(cardinality)``: ``< 65500`` -> uint16)."""
    return np.dtype(np.uint16 if vocab_size < 65500 else np.int32)


def write_indexed(prefix: Path, tokens: np.ndarray, lengths: np.ndarray, dtype: np.dtype) -> None:
    """``prefix.bin`` and ``prefix.idx`` for documents ``lengths`` of ``tokens`` (atomic:
    the .bin first, the .idx, which makes the pair readable, last)."""
    with atomic_writer(prefix.with_suffix(".bin")) as fh:
        fh.write(tokens.astype(dtype, copy=False).tobytes())
    n = int(lengths.size)
    pointers = np.zeros(n, dtype=np.int64)
    np.cumsum(lengths[:-1].astype(np.int64) * dtype.itemsize, out=pointers[1:])
    with atomic_writer(prefix.with_suffix(".idx")) as fh:
        fh.write(INDEX_HEADER)
        fh.write(struct.pack("<Q", 1))
        fh.write(struct.pack("<B", _DTYPE_CODES[dtype]))
        fh.write(struct.pack("<Q", n))
        fh.write(struct.pack("<Q", n + 1))
        fh.write(lengths.astype(np.int32).tobytes())
        fh.write(pointers.tobytes())
        fh.write(np.arange(n + 1, dtype=np.int64).tobytes())


def read_indexed(prefix: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(tokens, lengths, document_indices)`` of a pair, parsed from the bytes (the export's
    own read-back check; the tests read it with megatron-core too)."""
    raw = prefix.with_suffix(".idx").read_bytes()
    if raw[:9] != INDEX_HEADER:
        raise ValueError(f"{prefix}.idx: not a Megatron index")
    (code,) = struct.unpack_from("<B", raw, 17)
    n, docs = struct.unpack_from("<QQ", raw, 18)
    dtype = {v: k for k, v in _DTYPE_CODES.items()}[code]
    at = 34
    lengths = np.frombuffer(raw, np.int32, n, at)
    at += 4 * n
    pointers = np.frombuffer(raw, np.int64, n, at)
    at += 8 * n
    doc_index = np.frombuffer(raw, np.int64, docs, at)
    tokens = np.fromfile(prefix.with_suffix(".bin"), dtype=dtype)
    if n and int(pointers[-1]) // dtype.itemsize + int(lengths[-1]) != tokens.size:
        raise ValueError(f"{prefix}.bin: size does not match its index")
    return tokens, lengths.astype(np.int64), doc_index
