"""ShardWriter: shards hold exactly the batches added, in order, split where the token budget
says, and each manifest's sha256 and size are those of the file on disk (hashed here with
hashlib, independently of the writer)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packcli.arrow_np import list_array, to_arrow
from packcli.tokenize.shards import (
    CHAT_SHARD_SCHEMA,
    SHARD_SCHEMA,
    ShardWriter,
    distinct_shards,
    shard_intact,
)


def _batch(rng: np.random.Generator, lengths: list[int], first: int, chat: bool) -> pa.RecordBatch:
    n = len(lengths)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    ids = rng.integers(0, 1 << 17, int(offsets[-1]), dtype=np.int32)
    columns = [
        list_array(offsets, ids, pa.int32()),
        to_arrow(np.array(lengths, dtype=np.int32)),
        to_arrow(np.arange(first, first + n, dtype=np.int64)),
        to_arrow(np.zeros(n, dtype=np.int32)),
        to_arrow(np.arange(first, first + n, dtype=np.int64) * 2),
    ]
    if chat:
        columns.append(list_array(offsets, np.where(ids % 3 == 0, -100, ids), pa.int32()))
    batch = pa.RecordBatch.from_arrays(columns, schema=CHAT_SHARD_SCHEMA if chat else SHARD_SCHEMA)
    # Some batches arrive as slices of a larger one (offsets not starting at 0).
    return batch.slice(1) if n > 1 and first % 2 else batch


def _read(path: Path) -> pa.Table:
    with pa.memory_map(str(path), "r") as source:
        reader = pa.ipc.open_file(source)
        assert reader.num_record_batches == 1  # readers rely on one contiguous batch
        return reader.read_all()


@settings(max_examples=40, deadline=None)
@given(
    batches=st.lists(st.lists(st.integers(1, 700), min_size=1, max_size=30), max_size=12),
    budget=st.integers(1, 3000),
    chat=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
    behind=st.booleans(),
)
def test_shards_hold_the_batches_in_order(
    tmp_path_factory,
    batches: list[list[int]],
    budget: int,
    chat: bool,
    seed: int,
    behind: bool,
) -> None:
    """Written in line or behind (on a thread while the next shard fills): the same shards,
    in order, every one listed once it is on disk."""
    folder = tmp_path_factory.mktemp("shards")
    rng = np.random.default_rng(seed)
    added = []
    first = 0
    schema = CHAT_SHARD_SCHEMA if chat else SHARD_SCHEMA
    with ShardWriter(folder, budget, schema=schema, behind=behind) as w:
        for lengths in batches:
            batch = _batch(rng, lengths, first, chat)
            first += len(lengths)
            w.add(batch)
            added.append(batch)
    want = pa.Table.from_batches(added, schema=w.schema) if added else None
    tables = []
    for m in w.manifests:
        path = folder / m.file
        data = path.read_bytes()
        assert m.sha256 == hashlib.sha256(data).hexdigest()
        assert m.bytes == len(data)
        assert shard_intact(folder, m)
        table = _read(path)
        assert m.num_docs == table.num_rows
        assert m.num_tokens == sum(table.column("length").to_pylist())
        tables.append(table)
    if want is None:
        assert w.manifests == []
        return
    got = pa.concat_tables(tables)
    assert got.to_pydict() == want.to_pydict()
    # Every shard but the last holds at least the budget, and went over it by one batch at most.
    for m in w.manifests[:-1]:
        assert m.num_tokens >= budget


def test_a_batch_larger_than_the_reserved_column_grows_it(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    with ShardWriter(tmp_path, 1024) as w:
        small = _batch(rng, [10, 20], 0, chat=False)
        huge = _batch(rng, [5000, 7000], 2, chat=False)  # > the 1024 tokens reserved
        w.add(small)
        w.add(huge)
    assert len(w.manifests) == 1
    table = _read(tmp_path / w.manifests[0].file)
    want = pa.Table.from_batches([small, huge])
    assert table.column("input_ids").to_pylist() == want.column("input_ids").to_pylist()
    assert w.manifests[0].num_tokens == 10 + 20 + 5000 + 7000


def test_a_shard_with_the_old_writers_bytes(tmp_path: Path) -> None:
    """Same bytes as writing the batches' combined table with pyarrow's own IPC file writer
    (what the writer did before it collected columns itself): reused work folders stay valid."""
    rng = np.random.default_rng(1)
    batches = [_batch(rng, [3, 9, 1], 0, chat=True), _batch(rng, [40, 2], 3, chat=True)]
    with ShardWriter(tmp_path / "new", 1 << 20, schema=CHAT_SHARD_SCHEMA) as w:
        for b in batches:
            w.add(b)
    table = pa.Table.from_batches(batches, schema=CHAT_SHARD_SCHEMA).combine_chunks()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, CHAT_SHARD_SCHEMA) as writer:
        writer.write_table(table)
    assert (tmp_path / "new" / w.manifests[0].file).read_bytes() == sink.getvalue().to_pybytes()


def test_a_shard_written_behind_that_fails_fails_the_writer(tmp_path: Path) -> None:
    """An error while a shard is written on the thread (here: its folder gone) is raised by
    the writer's next flush or close, not lost with the thread."""
    import shutil

    rng = np.random.default_rng(2)
    folder = tmp_path / "shards"
    w = ShardWriter(folder, 10, behind=True)
    shutil.rmtree(folder)
    w.add(_batch(rng, [20], 0, chat=False))  # full: handed to the thread, which fails
    with pytest.raises(FileNotFoundError):
        w.close()
    assert w.manifests == []


@given(st.lists(st.integers(0, 40), max_size=60))
def test_distinct_shards_are_np_unique(values: list[int]) -> None:
    shard_of = np.asarray(values, dtype=np.int64)
    got = distinct_shards(shard_of)
    assert got.tolist() == sorted(set(values))  # the oracle: Python's own set
    assert got.tolist() == np.unique(shard_of).tolist()


@pytest.mark.parametrize("behind", [False, True])
def test_a_written_shards_arrays_fill_a_later_shard(tmp_path: Path, behind: bool) -> None:
    """One set of column arrays serves every shard written in line, two every shard written
    behind (fresh pages are touched once; no more sets resident than before), none is held
    after ``close``, and a set is reused only once nothing else holds its arrays: a view
    kept outside the writer keeps its set out of reuse. The shards' contents are the
    property test's concern."""
    rng = np.random.default_rng(2)
    with ShardWriter(tmp_path / "reused", 100, behind=behind) as w:
        sets = {id(w._columns[0].values.data)}  # an id holds no reference
        for k in range(6):
            w.add(_batch(rng, [60, 40], 2 * k, chat=False))  # a shard each, no growth
            sets.add(id(w._columns[0].values.data))
            w._wait()  # the shard behind is on disk: its arrays spare
        assert len(sets) == (2 if behind else 1)
    assert len(w.manifests) == 6 and w._spare is None and w._columns == []
    with ShardWriter(tmp_path / "held", 100, behind=behind) as w:
        held = []
        for k in range(4):
            held.append(w._columns[0].values.data)  # a reference from outside
            w.add(_batch(rng, [60, 40], 2 * k, chat=False))
            w._wait()
        assert len({id(a) for a in held}) == 4
