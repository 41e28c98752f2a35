"""verify as tasks, part by part: the same verdict for any task count, each file and shard
read once, only reduced results leave a task, and the corruptions that matter are caught in
a group's files and in the tail's (a flipped token, a missing document, a duplicated one, a
broken short pack) with the document or row named."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from clirun import invoke, invoke_ok
from corpora import pack_inputs
from hypothesis import given, settings
from hypothesis import strategies as st
from test_grouped_stages import GROUPED  # several groups and a tail

from packcli.tokenize.shards import sha256_file

SHORT_LEN = 64


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory, toy_tokenizer_path: Path) -> Path:
    root = tmp_path_factory.mktemp("verify-tasks")
    corpus, cfg = pack_inputs(root, 400, 5, GROUPED)
    out = root / "out"
    invoke_ok("pack", corpus, "-t", toy_tokenizer_path, "-o", out, "-c", cfg, "-q")
    return out


@pytest.fixture
def out(packed: Path, tmp_path: Path) -> Path:
    """A copy to damage (its work folder too, so the shards are found)."""
    copy = tmp_path / "out"
    shutil.copytree(packed, copy, symlinks=True)
    return copy


def _meta(out: Path) -> dict[str, Any]:
    return json.loads((out / "packcli.json").read_text())


def _part_files(out: Path, name: str, config: str) -> list[int]:
    part = next(p for p in _meta(out)["parts"] if p["name"] == name)
    return list(range(*part["files"][config]))


Segment = tuple[int, list[int], int, int]  # doc id, tokens, seq_pieces, seq_last


def _rows(out: Path, config: str, index: int) -> list[list[Segment]]:
    """A file's rows, each as its segments (doc id, tokens)."""
    meta = _meta(out)
    table = pq.read_table(out / "data" / config / meta["files"][config][index]["file"])
    rows = []
    for ids, lens, docs, pieces, last in zip(
        table["input_ids"].to_pylist(),
        table["seq_lengths"].to_pylist(),
        table["doc_ids"].to_pylist(),
        table["seq_pieces"].to_pylist(),
        table["seq_last"].to_pylist(),
        strict=True,
    ):
        ends = np.cumsum(lens)
        rows.append(
            [
                (d, ids[e - n : e], p, t)
                for d, n, e, p, t in zip(docs, lens, ends, pieces, last, strict=True)
            ]
        )
    return rows


def _rewrite(out: Path, config: str, index: int, rows: list[list[Segment]]) -> None:
    """Write a file's rows back (valid rows, new bytes) and make packcli.json's file entry
    agree with them, so only the checks across rows, files and shards can catch a change."""
    meta = _meta(out)
    entry = meta["files"][config][index]
    path = out / "data" / config / entry["file"]
    schema = pq.read_schema(path)
    ids = [[t for s in r for t in s[1]] for r in rows]
    lens = [[len(s[1]) for s in r] for r in rows]
    table = pa.table(
        {
            "input_ids": ids,
            "segment_ids": [[k + 1 for k, n in enumerate(ls) for _ in range(n)] for ls in lens],
            "seq_lengths": lens,
            "doc_ids": [[s[0] for s in r] for r in rows],
            "seq_pieces": [[s[2] for s in r] for r in rows],
            "seq_last": [[s[3] for s in r] for r in rows],
            "num_tokens": [len(x) for x in ids],
        },
        schema=schema,
    )
    pq.write_table(table, path, use_dictionary=False)
    entry.update(rows=len(rows), bytes=path.stat().st_size, sha256=sha256_file(path))
    (out / "packcli.json").write_text(json.dumps(meta, indent=2))


def _fails(out: Path, *needles: str) -> str:
    for tasks in ("1", "3"):  # the same verdict however the parts are spread over tasks
        code, output = invoke("verify", out, "--num-tasks", tasks)
        assert code == 1, output
        for needle in needles:
            assert needle in output, output
    return output


def test_the_same_summary_for_any_task_count(packed: Path) -> None:
    one = json.loads(invoke_ok("verify", packed, "--json"))
    parts = _meta(packed)["parts"]
    assert one["parts"] == len(parts) >= 4 and parts[-1]["name"] == "tail"
    for tasks in (2, 3, len(parts), 50):
        many = json.loads(invoke_ok("verify", packed, "--json", "--num-tasks", tasks))
        assert many["tasks"] == min(tasks, len(parts))
        assert {**many, "tasks": 1} == one
    assert one["checked_against_shards"] and one["checked_against_input"]["checked"] > 0


def test_each_file_and_shard_is_read_once_and_only_summaries_leave_a_task(
    packed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from packcli.publish import verify_part
    from packcli.tokenize.shards import TokenShards

    opened: Counter[str] = Counter()
    read: Counter[int] = Counter()
    results: list[Any] = []
    path, shard, check = verify_part.OutputFiles.path, TokenShards.shard, verify_part.check_part

    def counted_path(self: Any, rel: str) -> Path:
        opened[rel] += 1
        return path(self, rel)

    def counted_shard(self: TokenShards, index: int) -> Any:
        read[index] += 1
        return shard(self, index)

    def kept(*args: Any) -> Any:
        results.append(check(*args))
        return results[-1]

    monkeypatch.setattr(verify_part.OutputFiles, "path", counted_path)
    monkeypatch.setattr(TokenShards, "shard", counted_shard)
    monkeypatch.setattr(verify_part, "check_part", kept)
    invoke_ok("verify", packed, "--num-tasks", 2)
    meta = _meta(packed)
    files = [f"data/{c}/{f['file']}" for c in ("long", "short") for f in meta["files"][c]]
    assert opened == Counter(files)  # every file once
    n_shards = sum(len(p["shards"]) for p in meta["parts"])
    assert read == Counter(range(n_shards))  # every shard once
    # What travels back: figures, the pieces groups leave to the tail and the tail's units
    # (each tail unit once as left over and once as held: the tail's share, 0.04-0.2% of the
    # tokens at real group sizes, docs/scale.md), and the re-check's documents only.
    travelled = sum(
        r.left[c][0].size for r in results for c in ("long", "short") if r.left is not None
    )
    tail_units = sum(r.scans[c].totals.units for r in results if r.tail for c in ("long", "short"))
    assert travelled == 2 * tail_units
    largest = meta["report"]["largest_document"]["doc_id"]
    wanted = {int(d) for r in results for d in r.wanted[0]}
    assert wanted <= {*range(256), largest} and largest in wanted


def _flip_a_token(out: Path, part: str, at: int) -> int:
    """Flip token ``at`` (0 or -1) of the first long-sized segment in ``part``'s first long
    file (so no short pack changes); returns its document."""
    index = _part_files(out, part, "long")[0]
    rows = _rows(out, "long", index)
    r, k = next(
        (r, k) for r, row in enumerate(rows) for k, s in enumerate(row) if len(s[1]) > SHORT_LEN
    )
    doc, toks, piece, last = rows[r][k]
    toks = list(toks)
    toks[at] ^= 1
    rows[r][k] = (doc, toks, piece, last)
    _rewrite(out, "long", index, rows)
    return int(doc)


def test_a_flipped_token_in_a_group_is_named(out: Path) -> None:
    doc = _flip_a_token(out, "group-00000", 0)
    _fails(out, f"tokens of document {doc} differ from the tokenized shards", "group-00000")


def test_a_flipped_token_in_the_tail_is_named(out: Path) -> None:
    doc = _flip_a_token(out, "tail", -1)
    _fails(out, f"tokens of document {doc} differ from the tokenized shards")


def test_a_missing_document_is_named(out: Path) -> None:
    index = _part_files(out, "group-00001", "long")[0]
    rows = _rows(out, "long", index)
    r, k = next(
        (r, k)
        for r, row in enumerate(rows)
        for k, s in enumerate(row)
        if len(s[1]) > SHORT_LEN and len(row) > 1
    )
    doc = rows[r].pop(k)[0]
    _rewrite(out, "long", index, rows)
    _fails(out, f"tokens of document {doc} differ from the tokenized shards")


def test_a_duplicated_document_is_named(out: Path) -> None:
    """A long document of one group copied as a new row into another group's file."""
    source = _rows(out, "long", _part_files(out, "group-00000", "long")[0])
    seg = next(s for row in source for s in row if len(s[1]) > SHORT_LEN)
    doc = seg[0]
    index = _part_files(out, "group-00002", "long")[0]
    rows = _rows(out, "long", index)
    _rewrite(out, "long", index, [*rows, [seg]])
    _fails(out, f"tokens of document {doc} differ from the tokenized shards", "group-00002")


def _break_a_pack(out: Path, *, with_shards: bool = True) -> str:
    """Swap the first two documents of a short pack in its long row (every token still there
    once, the pack no longer intact); returns the name of its part."""
    meta = _meta(out)
    part = next(
        p
        for p in meta["parts"]
        if (p["name"] != "tail" or not with_shards)
        and p["files"]["short"][1] > p["files"]["short"][0]
    )
    pack = next(row for row in _rows(out, "short", part["files"]["short"][0]) if len(row) >= 2)
    for index in range(*part["files"]["long"]):
        rows = _rows(out, "long", index)
        for row in rows:
            docs = [s[0] for s in row]
            if pack[0][0] in docs:
                k = docs.index(pack[0][0])
                row[k], row[k + 1] = row[k + 1], row[k]
                _rewrite(out, "long", index, rows)
                return str(part["name"])
    raise AssertionError("the pack's first document is in no long row of its part")


def test_a_broken_short_pack_is_named(out: Path) -> None:
    _fails(out, "is not intact and contiguous in one long row", _break_a_pack(out))


def test_parts_that_do_not_describe_the_output_fail(out: Path) -> None:
    meta = _meta(out)
    meta["parts"][0]["files"]["long"][1] += 1
    (out / "packcli.json").write_text(json.dumps(meta))
    _fails(out, "packcli.json: parts")
    meta["parts"][0]["files"]["long"][1] -= 1
    meta["parts"][0]["shards"], meta["parts"][1]["shards"] = (
        meta["parts"][1]["shards"],
        meta["parts"][0]["shards"],
    )
    (out / "packcli.json").write_text(json.dumps(meta))
    _fails(out, "differ from the tokenized shards")  # a group checked against other shards


def test_no_shards_still_checks_each_part(out: Path) -> None:
    said = invoke_ok("verify", out, "--no-shards", "--num-tasks", 2)
    assert "all invariants hold" in said and "part(s) in 2 task(s)" in said
    _break_a_pack(out, with_shards=False)
    code, output = invoke("verify", out, "--no-shards")
    assert code == 1 and "not intact and contiguous" in output, output


@settings(max_examples=200, deadline=None)
@given(
    expected=st.lists(st.tuples(st.integers(0, 4), st.integers(1, 3), st.integers(0, 2))),
    found=st.lists(st.tuples(st.integers(0, 4), st.integers(1, 3), st.integers(0, 2))),
)
def test_difference_is_the_multiset_difference(
    expected: list[tuple[int, int, int]], found: list[tuple[int, int, int]]
) -> None:
    """The comparison the parts and the driver rely on, against ``Counter`` arithmetic."""
    DTYPES = (np.int64, np.int64, np.uint64)
    from packcli.publish.verify_part import difference

    def pieces(items: list[tuple[int, int, int]]) -> tuple[np.ndarray, ...]:
        cols = list(zip(*items, strict=True)) or [(), (), ()]
        return tuple(np.array(c, dtype=t) for c, t in zip(cols, DTYPES, strict=True))

    extra, left = difference(pieces(found), pieces(expected))
    want, got = Counter(expected), Counter(found)
    over = [key[0] for key in got if got[key] > want[key]]
    assert extra == (min(over) if over else None)
    assert Counter(zip(*(c.tolist() for c in left), strict=True)) == want - got
