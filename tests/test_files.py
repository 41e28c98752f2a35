"""How a config's rows are cut into output files: by ``write.shard_tokens``, and into at least
``write.min_files`` (auto: up to 8, one per row group of tokens) so streaming readers can give
each dataloader worker its own files and the writer compresses a config on every core."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from clirun import invoke_ok as invoke
from corpora import mixed_corpus
from hypothesis import given, settings
from hypothesis import strategies as st

from packcli.config import AUTO_FILES, WriteConfig
from packcli.pack.plan import RowLayout
from packcli.write import file_ranges, files_wanted


def _layout(row_tokens: list[int]) -> RowLayout:
    n = len(row_tokens)
    return RowLayout(
        capacity=max(row_tokens, default=1),
        row_offsets=np.arange(n + 1, dtype=np.int64),
        row_pieces=np.arange(n, dtype=np.int64),
        row_tokens=np.array(row_tokens, dtype=np.int64),
    )


def _by_size(row_tokens: list[int], shard_tokens: int) -> list[tuple[int, int]]:
    """The size rule, written out row by row: a new file where a row starts in the next
    multiple of ``shard_tokens``."""
    edges, start = [0], 0
    for r, t in enumerate(row_tokens):
        if r and start // shard_tokens != (start - row_tokens[r - 1]) // shard_tokens:
            edges.append(r)
        start += t
    edges.append(len(row_tokens))
    return list(itertools.pairwise(edges))


@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(st.integers(1, 5000), min_size=1, max_size=80),
    shard_tokens=st.integers(1, 20000),
    min_files=st.integers(1, 100),
)
def test_files_cover_every_row_once_and_as_many_as_asked(
    rows: list[int], shard_tokens: int, min_files: int
) -> None:
    got = file_ranges(_layout(rows), shard_tokens, min_files)
    by_size = _by_size(rows, shard_tokens)
    # Contiguous, in order, every row once, no empty file.
    assert got[0][0] == 0 and got[-1][1] == len(rows)
    assert all(a < b for a, b in got)
    assert all(b == c for (_, b), (c, _) in itertools.pairwise(got))
    if len(by_size) >= min(min_files, len(rows)):
        assert got == by_size  # the size rule alone, as before the setting
    else:
        assert len(got) == min(min_files, len(rows))
        # About equal tokens: no file holds more than its share plus one row.
        share = sum(rows) / len(got)
        assert all(sum(rows[a:b]) <= share + max(rows) for a, b in got)


def test_files_wanted() -> None:
    auto = WriteConfig(row_group_tokens=100)
    assert files_wanted(auto, 50) == 1  # under one row group: one file
    assert files_wanted(auto, 250) == 3  # one per row group, rounded up
    assert files_wanted(auto, 10**9) == AUTO_FILES
    assert files_wanted(auto, 10**9, parts=3) == 3  # 8 spread over 3 groups, rounded up
    assert files_wanted(auto, 10**9, parts=100) == 1
    asked = WriteConfig(row_group_tokens=100, min_files=12)
    assert files_wanted(asked, 50) == 12  # asked for: not capped by row groups
    assert files_wanted(asked, 50, parts=5) == 3


def test_pack_min_files_cuts_each_config_and_keeps_every_row(
    tmp_path: Path, toy_tokenizer_path: Path
) -> None:
    corpus = mixed_corpus(tmp_path / "c.jsonl", 300, 3)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("plan:\n  short_len: 64\n  long_len: 1024\n")
    one, five = tmp_path / "one", tmp_path / "five"
    common = ("pack", corpus, "-t", toy_tokenizer_path, "-c", cfg, "-q")
    invoke(*common, "-o", one)
    invoke(*common, "-o", five, "--min-files", 5)
    for config in ("long", "short"):
        files = sorted((five / "data" / config).glob("*.parquet"))
        rows = pq.read_table(one / "data" / config).num_rows
        assert [f.name for f in files] == [
            f"train-{i:05d}-of-{min(5, rows):05d}.parquet" for i in range(min(5, rows))
        ]
        whole = pq.read_table(sorted((one / "data" / config).glob("*.parquet")))
        assert pq.ParquetDataset(files).read().equals(whole)  # same rows, same order
    assert "all invariants hold" in invoke("verify", five)
    marker = json.loads((five / "packcli.json").read_text())
    assert marker["config"]["write"]["min_files"] == 5
