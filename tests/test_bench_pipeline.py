"""The benchmark's naive arm (scripts/bench_pipeline.py, issue 24) must produce what it claims
to: the same tokens packcli packs, cut into rows of one size, with segment ids from 0 in each
row; a bench arm that skipped work would make packcli look slow for nothing."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("fastokens") is None, reason="fastokens is not installed"
)


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "bench_pipeline", ROOT / "scripts/bench_pipeline.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_pipeline"] = module
    spec.loader.exec_module(module)
    return module


def test_naive_arm_packs_every_token_with_eos_into_rows_with_segment_ids(
    bench: ModuleType,
    toy_tokenizer_path: Path,
    make_corpus,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    corpus = make_corpus([5, 0, 40, 3, 120, 7] * 5)
    monkeypatch.setattr(bench, "NAIVE_ROW", 64)
    monkeypatch.setattr(bench, "NAIVE_BATCH", 4)  # several batches, and a partial last one
    out = tmp_path / "naive.parquet"
    _, _, nbytes, tokens = bench.naive_script(corpus, toy_tokenizer_path, out)

    tok = Tokenizer.from_file(str(toy_tokenizer_path))
    tok.encode_special_tokens = True
    eos = tok.token_to_id("<|endoftext|>")
    texts = [json.loads(line)["text"] for line in corpus.open()]
    want = [[*e.ids, eos] for e in tok.encode_batch(texts, add_special_tokens=False)]
    flat = np.concatenate([np.array(w, dtype=np.int32) for w in want])
    assert nbytes == sum(len(t.encode("utf-8")) for t in texts)
    assert tokens == flat.size

    table = pq.read_table(out)
    rows = table.column("input_ids").to_pylist()
    segments = table.column("segment_ids").to_pylist()
    assert [len(r) for r in rows[:-1]] == [64] * (len(rows) - 1) and 0 < len(rows[-1]) <= 64
    assert np.array_equal(np.concatenate(rows), flat)
    doc_of_token = np.repeat(np.arange(len(want)), [len(w) for w in want])
    start = 0
    for row, seg in zip(rows, segments, strict=True):
        assert len(seg) == len(row) and seg[0] == 0
        expect = doc_of_token[start : start + len(row)] - doc_of_token[start]
        assert np.array_equal(seg, expect)
        start += len(row)
    column = pq.ParquetFile(out).metadata.row_group(0).column(0)
    assert column.compression == "ZSTD" and "PLAIN_DICTIONARY" not in column.encodings
