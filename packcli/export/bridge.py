"""Megatron-Bridge packed Parquet (``GPTSFTPackedParquetDataset``), from packcli's packed
rows, one ``*.idx.parquet`` file per packcli Parquet file, plus ``metadata.jsonl`` per config.

Columns, as the reader requires them (``REQUIRED_COLUMNS``): ``input_ids`` list<int32> (the
row's tokens, unchanged), ``seq_start_id`` list<int32> (each segment's first offset in the
row, starting at 0) and ``loss_mask`` list<int8>, shifted by one: the reader's collate keeps
``input_ids[s:e-1]`` as inputs, ``input_ids[s+1:e]`` as labels and ``loss_mask[s:e-1]`` as
their mask, so ``loss_mask[t]`` says whether token ``t + 1`` of the same segment is trained.
A segment's last position therefore predicts nothing (0). For chat a token is trained where
packcli's ``labels`` is set; for text every token after a segment's first (with
``answer_only_loss=True``, the reader's default, which uses this mask as is).

``metadata.jsonl`` (a JSON list of one object, Bridge's ``packed_metadata_path``): only read
with ``pad_cu_seqlens``, to pad ``cu_seqlens`` to a constant shape. Values are bounds taken
from the rows: ``max_samples_per_bin`` the most segments in a row, ``dataset_max_seqlen`` the
longest segment, ``min_packed_seqlen`` the fewest tokens the collate keeps of a row (its
tokens minus one per segment), which makes the reader's ``padding_gap`` the largest pad a
batch can hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from packcli.arrow_np import list_array
from packcli.atomic import atomic_path
from packcli.export.source import RowBatch, iter_rows
from packcli.names import IGNORE_INDEX
from packcli.records import Fields

BRIDGE_SCHEMA = pa.schema(
    [
        pa.field("input_ids", pa.list_(pa.int32())),
        pa.field("seq_start_id", pa.list_(pa.int32())),
        pa.field("loss_mask", pa.list_(pa.int8())),
    ]
)


def bridge_name(packcli_file: str) -> str:
    """``train-00000-of-00002.parquet`` -> ``train-00000-of-00002.idx.parquet``."""
    return packcli_file.removesuffix(".parquet") + ".idx.parquet"


def shifted_loss_mask(batch: RowBatch) -> np.ndarray:
    """Per token, whether the next token of its segment is trained (int8)."""
    seg_starts = np.cumsum(batch.seg_lengths) - batch.seg_lengths
    if batch.labels is not None:
        target = batch.labels != IGNORE_INDEX
    else:
        target = np.ones(batch.tokens.size, dtype=bool)
    target[seg_starts] = False  # packcli never trains a segment's first token
    mask = np.zeros(batch.tokens.size, dtype=np.int8)
    mask[:-1] = target[1:]
    mask[seg_starts + batch.seg_lengths - 1] = 0  # a segment's last input predicts nothing
    return mask


@dataclass
class BridgeStats:
    """Sums over a config's rows, for ``metadata.jsonl`` and the records."""

    rows: int = 0
    tokens: int = 0
    segments: int = 0
    trained: int = 0
    max_segments: int = 0
    max_seqlen: int = 0
    min_packed: int = -1
    extra: dict[str, int] = field(default_factory=dict)

    def add(self, batch: RowBatch, mask: np.ndarray) -> None:
        rows = batch.row_offsets.size - 1
        per_row_segs = np.diff(batch.seg_offsets)
        per_row_tokens = np.diff(batch.row_offsets)
        self.rows += rows
        self.tokens += int(batch.tokens.size)
        self.segments += int(batch.seg_lengths.size)
        self.trained += int(mask.sum(dtype=np.int64))
        if rows:
            self.max_segments = max(self.max_segments, int(per_row_segs.max()))
            self.max_seqlen = max(self.max_seqlen, int(batch.seg_lengths.max(initial=0)))
            kept = int((per_row_tokens - per_row_segs).min())
            self.min_packed = kept if self.min_packed < 0 else min(self.min_packed, kept)

    @classmethod
    def of_record(cls, stats: dict[str, int]) -> BridgeStats:
        """From a part record's ``stats`` (``as_dict``)."""
        counts = BridgeCounts.from_json(stats, "an export part record", "stats.")
        return cls(**{f.name: getattr(counts, f.name) for f in fields(BridgeCounts)})

    def as_dict(self) -> dict[str, int]:
        """As a part record's ``stats`` holds them (``BridgeCounts``)."""
        values = {f.name: getattr(self, f.name) for f in fields(BridgeCounts)}
        return BridgeCounts(**{**values, "min_packed": max(self.min_packed, 0)}).to_json()


@dataclass(frozen=True)
class BridgeCounts(Fields):
    """A Bridge file's sums, as its part record's ``stats`` holds them (a file of no rows:
    ``min_packed`` 0)."""

    rows: int
    tokens: int
    segments: int
    trained: int
    max_segments: int
    max_seqlen: int
    min_packed: int


def write_bridge_file(src: Path, final: Path) -> BridgeStats:
    """One packcli Parquet file -> one Bridge file, a row group each (streamed; atomic)."""
    stats = BridgeStats()
    with (
        atomic_path(final) as tmp,
        pq.ParquetWriter(str(tmp), BRIDGE_SCHEMA, compression="zstd") as writer,
    ):
        wrote = False
        for batch in iter_rows(src):
            mask = shifted_loss_mask(batch)
            seg_starts = np.cumsum(batch.seg_lengths) - batch.seg_lengths
            row_start = np.repeat(batch.row_offsets[:-1], np.diff(batch.seg_offsets))
            starts_in_row = (seg_starts - row_start).astype(np.int32)
            table = pa.Table.from_arrays(
                [
                    list_array(batch.row_offsets, batch.tokens, pa.int32()),
                    list_array(batch.seg_offsets, starts_in_row, pa.int32()),
                    list_array(batch.row_offsets, mask, pa.int8()),
                ],
                schema=BRIDGE_SCHEMA,
            )
            writer.write_table(table)
            stats.add(batch, mask)
            wrote = True
        if not wrote:
            writer.write_table(BRIDGE_SCHEMA.empty_table())
    return stats


@dataclass(frozen=True)
class BridgeMetadata(Fields):
    """A row of ``metadata.jsonl``: the keys Bridge's reader reads, in the order written."""

    max_samples_per_bin: int
    dataset_max_seqlen: int
    min_packed_seqlen: int
    pack_size: int
    packing_factor: float
    packing_efficiency: float


def metadata(stats: BridgeStats, pack_size: int) -> list[BridgeMetadata]:
    """Bridge's packing metadata for one config (the list its reader takes max/min over)."""
    rows = max(stats.rows, 1)
    return [
        BridgeMetadata(
            max_samples_per_bin=stats.max_segments,
            dataset_max_seqlen=stats.max_seqlen,
            min_packed_seqlen=max(stats.min_packed, 0),
            pack_size=pack_size,
            packing_factor=round(stats.segments / rows, 2),
            packing_efficiency=round(stats.tokens / rows / pack_size * 100, 2),
        )
    ]
