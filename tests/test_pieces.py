"""Per-segment piece columns (issue 25 item 4): ``seq_pieces`` says which piece of its
document a segment is, ``seq_last`` whether the document ends with it, so a reader can
reassemble split documents and place EOD only at a document's real end.

Oracles are independent of the writer: documents are cut into consecutive ``long_len``
slices here by hand (or read whole from the tokenized shards), and reassembly sorts a
document's segments by the written piece index only.
"""

from __future__ import annotations

import json
import shutil
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from clirun import invoke, invoke_ok
from corpora import mixed_corpus
from hypothesis import given, settings
from hypothesis import strategies as st

from packcli.config import PlanConfig
from packcli.tokenize.shards import TokenShards, sha256_file
from packcli.write import pack_table

LONG = 64


def _pieces(table: pa.Table) -> dict[int, list[tuple[int, int, list[int]]]]:
    """Per doc id, its segments as (seq_pieces, seq_last, tokens), in the order written."""
    out: dict[int, list[tuple[int, int, list[int]]]] = defaultdict(list)
    for row in table.to_pylist():
        at = 0
        for doc, n, piece, last in zip(
            row["doc_ids"], row["seq_lengths"], row["seq_pieces"], row["seq_last"], strict=True
        ):
            out[doc].append((piece, last, row["input_ids"][at : at + n]))
            at += n
    return out


def _reassembled(pieces: list[tuple[int, int, list[int]]]) -> list[int]:
    """A document from its segments by piece index, after checking they are numbered
    0..k-1 exactly once with only the k-th marked last."""
    pieces = sorted(pieces, key=lambda p: p[0])
    assert [p[0] for p in pieces] == list(range(len(pieces)))
    assert [p[1] for p in pieces] == [0] * (len(pieces) - 1) + [1]
    return [t for p in pieces for t in p[2]]


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 5 * LONG), min_size=1, max_size=40),
    overlong=st.sampled_from(["split", "truncate"]),
    seed=st.integers(0, 2**16),
)
def test_documents_reassemble_from_doc_id_and_piece(
    lengths: list[int], overlong: str, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    docs = [rng.integers(0, 1000, n).astype(np.int32) for n in lengths]
    table = pa.table({"input_ids": pa.array(docs, type=pa.list_(pa.int32()))})
    long, short, _ = pack_table(table, PlanConfig(short_len=16, long_len=LONG, overlong=overlong))
    got = _pieces(long)
    assert sorted(got) == list(range(len(docs)))
    for i, d in enumerate(docs):
        want = d.tolist() if overlong == "split" else d[:LONG].tolist()
        assert _reassembled(got[i]) == want
    # The short config's segments (whole short documents, split documents' last pieces)
    # carry the same numbers as in the long config.
    long_tags = {(d, tuple(t)): (p, e) for d, ps in got.items() for p, e, t in ps}
    for d, ps in _pieces(short).items():
        for p, e, t in ps:
            assert long_tags[(d, tuple(t))] == (p, e)


@pytest.fixture(scope="module")
def split_out(toy_tokenizer_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Planned in groups of shards with a tail, so pieces are written both from the groups'
    shards and from the tail shards."""
    folder = tmp_path_factory.mktemp("pieces")
    mixed_corpus(folder / "c.jsonl", 400, 5)
    config = folder / "grouped.yaml"
    config.write_text(
        "read:\n  batch_size: 16\ntokenize:\n  shard_tokens: 1024\n"
        "plan:\n  short_len: 128\n  long_len: 1024\n  group_tokens: 4096\n"
    )
    out = folder / "out"
    invoke_ok("pack", folder / "c.jsonl", "-t", toy_tokenizer_path, "-o", out, "-c", config, "-q")
    return out


def test_split_documents_reassemble_to_the_tokenized_documents(split_out: Path) -> None:
    meta = json.loads((split_out / "packcli.json").read_text())
    assert meta["report"]["policy"]["split_docs"] > 0
    assert meta["parts"][-1]["name"] == "tail"
    got = _pieces(pq.read_table(split_out / "data" / "long"))
    shards = TokenShards(split_out / ".packcli" / "tokens")
    documents = {}
    for s in range(len(shards)):
        shard = shards.shard(s)
        for k in range(shard.offsets.size - 1):
            a, b = int(shard.offsets[k]), int(shard.offsets[k + 1])
            documents[shard.first_doc_id + k] = shard.values[a:b].tolist()
    assert set(got) == {d for d, toks in documents.items() if toks}
    split = 0
    for doc, pieces in got.items():
        assert _reassembled(pieces) == documents[doc]
        split += len(pieces) > 1
    assert split == meta["report"]["policy"]["split_docs"]


def _copy_with(split_out: Path, tmp_path: Path, edit: object) -> Path:
    """A copy of the output whose first long file had ``edit(data)`` applied, with
    packcli.json's hash of it made to agree (so only the piece checks can object)."""
    out = tmp_path / "out"
    shutil.copytree(split_out, out, symlinks=True)
    meta = json.loads((out / "packcli.json").read_text())
    for entry in meta["files"]["long"]:
        path = out / "data" / "long" / entry["file"]
        table = pq.read_table(path)
        data = table.to_pydict()
        if edit(data):  # type: ignore[operator]
            pq.write_table(pa.Table.from_pydict(data, schema=table.schema), path)
            entry["sha256"], entry["bytes"] = sha256_file(path), path.stat().st_size
            (out / "packcli.json").write_text(json.dumps(meta, indent=2))
            return out
    raise AssertionError("no file had a segment to edit")


def _renumber_a_split_piece(data: dict[str, list]) -> bool:
    """The first piece after a document's first gets index 0 (now two pieces 0)."""
    for r, pieces in enumerate(data["seq_pieces"]):
        for k, p in enumerate(pieces):
            if p > 0:
                data["seq_pieces"][r][k] = 0
                return True
    return False


def _end_a_split_document_early(data: dict[str, list]) -> bool:
    """A piece a document continues after is marked as its last."""
    for r, last in enumerate(data["seq_last"]):
        for k, e in enumerate(last):
            if e == 0:
                data["seq_last"][r][k] = 1
                return True
    return False


@pytest.mark.parametrize(
    "edit", [_renumber_a_split_piece, _end_a_split_document_early], ids=["index", "last"]
)
def test_verify_names_a_document_whose_pieces_are_misnumbered(
    split_out: Path, tmp_path: Path, edit: object
) -> None:
    out = _copy_with(split_out, tmp_path, edit)
    code, output = invoke("verify", out)
    assert code == 1, output
    assert "seq_pieces / seq_last say pieces" in output and "numbered 0..k-1" in output, output


def test_verify_without_shards_checks_the_piece_columns_shape(
    split_out: Path, tmp_path: Path
) -> None:
    def negative(data: dict[str, list]) -> bool:
        data["seq_pieces"][0][0] = -1
        return True

    out = _copy_with(split_out, tmp_path, negative)
    code, output = invoke("verify", out, "--no-shards")
    assert code == 1 and "seq_pieces holds -1" in output, output


def test_inspect_shows_each_segments_piece(split_out: Path) -> None:
    from packcli.publish.rowview import inspect_row

    table = pq.read_table(split_out / "data" / "long", columns=["seq_last"])
    row = next(i for i, last in enumerate(table.column("seq_last").to_pylist()) if 0 in last)
    view = inspect_row(split_out, "long", row, decode=False)
    assert view["has_pieces"]
    assert any(not s["last"] for s in view["segments"])
    shown = json.loads(invoke_ok("inspect", split_out, "--row", str(row), "--json"))
    assert [(s["piece"], s["last"]) for s in shown["segments"]] == [
        (s["piece"], s["last"]) for s in view["segments"]
    ]
    from rich.console import Console

    from packcli.publish.rowview import render_row

    console = Console(width=200, record=True)
    for part in render_row(view):
        console.print(part)
    text = console.export_text()
    assert "piece (seq_pieces)" in text and "continues" in text


def test_the_card_lists_the_piece_columns(split_out: Path) -> None:
    card = (split_out / "README.md").read_text()
    assert "`seq_pieces` | list<int32>" in card and "`seq_last` | list<int8>" in card
    assert "name: seq_pieces" in card and "name: seq_last" in card
