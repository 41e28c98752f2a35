"""OLMo-core (ai2-olmo-core 3.0) numpy sources: ``NAME.npy``, a raw token memmap (no numpy
header, as the Dolma toolkit writes it), ``NAME.csv.gz`` with one ``start,end`` line per
document (the file ``iter_document_indices`` reads: the ``.npy`` name with ``.csv.gz``), and
for chat ``NAME.label_mask.npy``, a raw bool memmap aligned with the tokens (the
``label_mask_paths`` of ``NumpyFSLDataset``/``NumpyPackedFSLDataset``).

Boundaries come from packcli's document table, never from searching EOS: chat output has no
EOS by default, and OLMo-core's EOS scan would then merge every dialogue of a file into one.
So point the dataset at the metadata (``use_array_if_local=False``, ``generate_doc_lengths``
for intra-document masking). ``label_mask[t]`` is True where token ``t`` is a trained target
(OLMo's ``get_labels`` masks the unshifted ids, then shifts): the assistant tokens, never a
document's first token. Token dtype: the smallest unsigned type holding ``vocab_size - 1``,
OLMo-core's own rule when its config names no dtype.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np

from packcli.atomic import atomic_writer
from packcli.records import Record

TOKENS = "tokens"  # the export's folder of token memmaps and document boundaries
PATH_LISTS = "paths.json"  # the export's path lists, for the dataset's config


@dataclass(frozen=True)
class PathLists(Record):
    """``paths.json``: the path lists of OLMo-core's dataset config, each file where the
    export is (local paths, or URLs): ``paths``, and for chat ``label_mask_paths``. Written
    for the config, not read back: no version field, keys in this order (not sorted)."""

    VERSION: ClassVar[int | None] = None

    paths: list[str]
    label_mask_paths: list[str] | None = field(default=None, metadata={"omit": True})

    def to_bytes(self) -> bytes:
        return (json.dumps(self.to_json(), indent=2) + "\n").encode()


def olmo_dtype(vocab_size: int) -> np.dtype:
    """``NumpyDatasetConfig.get_dtype`` without a dtype: smallest uint holding the ids."""
    for dt in (np.uint8, np.uint16, np.uint32, np.uint64):
        if vocab_size - 1 <= np.iinfo(dt).max:
            return np.dtype(dt)
    raise ValueError(f"vocab_size {vocab_size} does not fit 64 bits")


def write_tokens(path: Path, tokens: np.ndarray, dtype: np.dtype) -> None:
    with atomic_writer(path) as fh:
        fh.write(tokens.astype(dtype, copy=False).tobytes())


def write_boundaries(path: Path, lengths: np.ndarray) -> None:
    """``start,end`` per document, gzip with no name or time in its header, so the same
    documents give the same bytes (and sha256) on every run."""
    ends = np.cumsum(lengths.astype(np.int64))
    starts = ends - lengths
    text = "".join(f"{s},{e}\n" for s, e in zip(starts.tolist(), ends.tolist(), strict=True))
    with (
        atomic_writer(path) as fh,
        gzip.GzipFile(filename="", mode="wb", fileobj=fh, mtime=0) as gz,
    ):
        gz.write(text.encode("ascii"))


def write_label_mask(path: Path, mask: np.ndarray) -> None:
    with atomic_writer(path) as fh:
        fh.write(mask.astype(np.bool_, copy=False).tobytes())


def read_boundaries(path: Path) -> np.ndarray:
    """``(n, 2)`` int64 ``start,end`` pairs (the export's read-back check)."""
    with gzip.open(path, "rt", encoding="ascii") as fh:
        rows = [line.split(",")[:2] for line in fh if line.strip()]
    return np.array(rows, dtype=np.int64).reshape(-1, 2)
