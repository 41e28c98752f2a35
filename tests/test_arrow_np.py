"""numpy <-> Arrow helpers: the same arrays as pyarrow's conversions, and pandas stays unloaded."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

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


def test_small_pack_does_not_import_pandas_numba_or_datasets(
    tmp_path: Path, toy_tokenizer_path: Path
) -> None:
    """A 100-document pack pays for none of these imports (~3 s of CPU together on the dev
    machine). The tokenize loop of the pipeline is replaced by the same steps here, so that
    this test covers the modules below it (read, encode, shards, plan, write, card); the
    whole command is checked by the next test."""
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(
        "".join(json.dumps({"text": f"word {i} " * (i + 1)}) + "\n" for i in range(100))
    )
    code = f"""
        import sys
        import numpy as np
        from pathlib import Path
        from packcli.config import PlanConfig, WriteConfig
        from packcli.tokenize.encode import batch_to_record_batch
        from packcli.read import ReadOptions, iter_batches
        from packcli.atomic import atomic_write_json
        from packcli.tokenize.records import SUCCESS, IndexedShard, ShardIndex
        from packcli.tokenize.shards import ShardWriter, TokenShards
        from packcli.pack.plan import plan_two_tier
        from packcli.write import TokenSource, write_config_file
        from packcli.publish.card import render_card
        from packcli.publish.marker import MarkerFiles
        from packcli.stages.write_records import Listing
        folder = Path({str(tmp_path / "tokens")!r})
        with ShardWriter(folder, 1 << 20) as w:
            for b in iter_batches([Path({str(corpus)!r})], "text", ReadOptions(64)):
                lengths = np.array([len(t) for t in b.texts], dtype=np.int64)
                ids = np.concatenate([np.frombuffer(t.encode(), np.uint8) for t in b.texts])
                w.add(batch_to_record_batch(b, ids.astype(np.int32), lengths))
        m = w.manifests[0]
        entry = IndexedShard(
            **m.to_json(), first_doc_id=0, first_line=0, file_index=0, tokenized_file_index=0
        )
        index = ShardIndex(
            fingerprint="", files=[], shards=[entry], read_stats={{}},
            chat=None, special_strings={{}}, units=[], times={{}}, tokens=m.num_tokens,
            tokenizer={{}}, backend={{}},
        )
        atomic_write_json(folder / SUCCESS, index.to_json())
        shards = TokenShards(folder)
        plan = plan_two_tier(shards.column("length").astype(np.int64), PlanConfig(64, 1024))
        source = TokenSource(list(shards.iter_shards()))
        for name in ("short", "long"):
            lay = getattr(plan, name)
            out = folder.parent / "out" / f"{{name}}.parquet"
            write_config_file(plan, lay, source, out, WriteConfig(), 0, lay.num_rows)
        tier = {{"capacity": 1, "rows": 1, "tokens": 1, "segments": 1, "efficiency": 1.0,
                 "rows_over_bound": 1.0}}
        pol = dict.fromkeys(["split_docs", "split_pieces", "split_tokens", "truncated_docs",
                             "truncated_tokens", "dropped_docs", "dropped_tokens",
                             "empty_docs"], 0)
        report = {{"tiers": {{"short": tier, "long": tier}}, "policy": pol,
                   "input": {{"documents": 1, "tokens": 1}}}}
        run = {{"tokenizer": {{"source": "t", "vocab_size": 1, "eos_id": 0}},
                "packcli_version": "0", "command": "c"}}
        files = MarkerFiles([Listing("a", 1, 1, 1, "")], [Listing("b", 1, 1, 1, "")])
        render_card(report, run, files)
        print(sorted(m for m in ("pandas", "numba", "datasets") if m in sys.modules))
    """
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def _pack_imports(tmp_path: Path, tokenizer: Path) -> list[str]:
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(
        "".join(json.dumps({"text": f"a few words {i} " * (i + 1)}) + "\n" for i in range(100))
    )
    code = f"""
        import json, sys
        from packcli.cli import main
        sys.argv = ["packcli", "pack", {str(corpus)!r}, "-t", {str(tokenizer)!r},
                    "-o", {str(tmp_path / "out")!r}, "-q"]
        try:
            main()
        except SystemExit as exc:
            assert not exc.code, exc.code
        print(json.dumps([m for m in ("pandas", "numba", "datasets") if m in sys.modules]))
    """
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_small_pack_command_imports_neither_numba_nor_datasets(
    tmp_path: Path, toy_tokenizer_path: Path
) -> None:
    loaded = _pack_imports(tmp_path, toy_tokenizer_path)
    assert "numba" not in loaded and "datasets" not in loaded


def test_small_pack_command_does_not_import_pandas(
    tmp_path: Path, toy_tokenizer_path: Path
) -> None:
    assert "pandas" not in _pack_imports(tmp_path, toy_tokenizer_path)
