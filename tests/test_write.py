"""In-memory pack stage: every document's tokens land in the rows, in the public schema."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packcli import write
from packcli.config import PlanConfig, WriteConfig
from packcli.pack.plan import plan_two_tier
from packcli.tokenize.shards import ShardTokens
from packcli.write import (
    ROW_SCHEMA,
    Scratch,
    TokenSource,
    pack_table,
    rows_to_table,
    write_config_file,
)


def test_pack_table_holds_every_token_and_can_build_one_config() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 300, 400)
    lengths[:3] = [700, 1500, 90]  # long and overlong documents
    docs = [rng.integers(0, 70_000, n).astype(np.int32) for n in lengths]
    table = pa.table({"input_ids": pa.array(docs, type=pa.list_(pa.int32()))})
    cfg = PlanConfig(short_len=64, long_len=1024)
    long, short, _ = pack_table(table, cfg)
    assert long.schema == ROW_SCHEMA and short.schema == ROW_SCHEMA
    pieces: dict[int, list[list[int]]] = {}
    for row in long.to_pylist():
        assert row["segment_ids"] == [
            k + 1 for k, n in enumerate(row["seq_lengths"]) for _ in range(n)
        ]
        start = 0
        for doc, n in zip(row["doc_ids"], row["seq_lengths"], strict=True):
            pieces.setdefault(doc, []).append(row["input_ids"][start : start + n])
            start += n
    for i, d in enumerate(docs):
        expected = [d[k : k + 1024].tolist() for k in range(0, len(d), 1024)]
        assert sorted(pieces[i]) == sorted(expected)
    only_short = pack_table(table, cfg, configs=("short",))
    assert only_short[0] is None and only_short[1].equals(short)
    assert only_short[2].long is None
    only_long = pack_table(table, cfg, configs=("long",))
    assert only_long[1] is None and only_long[0].equals(long)


def test_threaded_gather_matches_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 900, 300)
    docs = [rng.integers(0, 70_000, n).astype(np.int32) for n in lengths]
    table = pa.table({"input_ids": pa.array(docs, type=pa.list_(pa.int32()))})
    cfg = PlanConfig(short_len=256, long_len=2048)
    monkeypatch.setattr(write, "_THREADS", 1)
    expected = pack_table(table, cfg)
    monkeypatch.setattr(write, "_THREADS", 3)
    monkeypatch.setattr(write, "_PARALLEL_MIN_TOKENS", 0)
    got = pack_table(table, cfg)
    assert got[0].equals(expected[0]) and got[1].equals(expected[1])


@pytest.mark.parametrize("cp_size", [1, 2])
def test_reused_buffers_give_the_same_rows_and_bytes(tmp_path: Path, cp_size: int) -> None:
    """One thread's ``Scratch`` serves row group after row group, file after file (bigger and
    smaller than the last): every table and file equals one built on fresh arrays, with and
    without labels and context-parallel padding (the ``fill`` path)."""
    rng = np.random.default_rng(4 + cp_size)
    lengths = rng.integers(1, 700, 500)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    n = int(offsets[-1])
    values = rng.integers(0, 70_000, n).astype(np.int32)
    labels = np.where(rng.random(n) < 0.5, -100, values).astype(np.int32)
    cfg = PlanConfig(short_len=128, long_len=1024, cp_size=cp_size)
    plan = plan_two_tier(lengths, cfg)
    wcfg = WriteConfig(row_group_tokens=3 * 1024)
    for with_labels in (False, True):
        source = TokenSource(
            [ShardTokens(values, offsets, 0, labels=labels if with_labels else None)]
        )
        scratch = Scratch()
        for name in ("long", "short"):
            lay = getattr(plan, name)
            cuts = [0, lay.num_rows // 3, lay.num_rows // 3 + 1, lay.num_rows]
            for r0, r1 in itertools.pairwise(cuts):
                fresh = rows_to_table(plan, lay, r0, r1, source).to_pylist()
                assert (
                    rows_to_table(plan, lay, r0, r1, source, scratch=scratch).to_pylist() == fresh
                )
                a, b = tmp_path / f"{name}-a.parquet", tmp_path / f"{name}-b.parquet"
                write_config_file(plan, lay, source, a, wcfg, r0, r1)
                write_config_file(plan, lay, source, b, wcfg, r0, r1, scratch=scratch)
                assert a.read_bytes() == b.read_bytes()
                assert pq.read_table(b).to_pylist() == fresh


def _parquet_bytes(table: pa.Table) -> bytes:
    """``table`` as ``write_config_file`` writes a row group (zstd 3, no dictionary)."""
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(
        sink, table.schema, compression="zstd", compression_level=3, use_dictionary=False
    ) as writer:
        writer.write_table(table, row_group_size=table.num_rows)
    return bytes(sink.getvalue())


@pytest.mark.parametrize("seed", range(3))
def test_chunked_write_same_bytes(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``in_chunks`` hands the writer a row group as slices of whole rows; the file's bytes
    are those of the table in one piece: rows shorter and longer than a chunk, empty lists,
    chunk sizes that fall mid-page (columns of several 1 MB pages, values that do not
    compress away), and a table smaller than a chunk (returned as is)."""
    rng = np.random.default_rng(seed)
    rows = 600
    lengths = rng.integers(0, 2_500, rows)
    lengths[rng.integers(0, rows, 5)] = rng.integers(10_000, 40_000, 5)  # rows over a chunk
    lengths[rng.integers(0, rows, 5)] = 0
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    total = int(offsets[-1])
    tokens = rng.integers(0, 128_000, total).astype(np.int32)
    seg = np.repeat(rng.integers(1, 40, rows).astype(np.int32), lengths)
    table = pa.table(
        {
            "input_ids": pa.ListArray.from_arrays(offsets, tokens),
            "segment_ids": pa.ListArray.from_arrays(offsets, seg),
            "num_tokens": pa.array(lengths.astype(np.int32)),
        }
    )
    one = _parquet_bytes(table)
    assert len(pq.ParquetFile(pa.BufferReader(one)).metadata.to_dict()["row_groups"]) == 1
    for chunk_tokens, capacity in ((1 << 17, 4_096), (5_000, 2_500), (3_333, 997), (1, 1)):
        monkeypatch.setattr(write, "CHUNK_TOKENS", chunk_tokens)
        chunked = write.in_chunks(table, capacity)
        per_chunk = max(1, chunk_tokens // capacity)
        assert chunked.column("input_ids").num_chunks == -(-rows // per_chunk)
        assert _parquet_bytes(chunked) == one
    monkeypatch.setattr(write, "CHUNK_TOKENS", 1 << 30)
    assert write.in_chunks(table, 4_096) is table
