"""``packcli export`` end to end on real packs: every document's tokens once, in order, with
its boundaries and trained targets, checked against oracles that do not use the exporter
(``export_cases.py``) and read from the bytes by each format's layout; resume, damage and
refusals. The frameworks' own readers: tests/test_export_frameworks.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from clirun import invoke, invoke_ok
from export_cases import (
    bridge_collate,
    read_megatron,
    read_olmo_bounds,
    text_pack,
)


def test_megatron_holds_every_document_once_whole_with_eos(text, tmp_path: Path) -> None:
    out, docs = text
    dest = tmp_path / "mg"
    output = invoke_ok("export", out, "--to", "megatron", "--dest", dest, "-q")
    assert f"{len(docs):,} documents" in output
    marker = json.loads((dest / "packcli-export.json").read_text())
    prefixes = [dest / p["name"] for p in marker["parts"]]
    tokens, lengths = [], []
    for prefix in prefixes:
        t, n, doc_index = read_megatron(prefix)
        assert t.dtype == np.uint16  # vocab 400: Megatron's own pick
        assert np.array_equal(doc_index, np.arange(n.size + 1))  # end_document per sequence
        tokens.append(t)
        lengths.append(n)
    assert np.array_equal(np.concatenate(lengths), [len(d) for d in docs])
    assert np.concatenate(tokens).tolist() == [t for d in docs for t in d]
    # A document the pack split across rows is one sequence here, ending with its EOS.
    assert max(map(len, docs)) > 512 and all(d[-1] == docs[0][-1] for d in docs)
    args = (dest / "data-args.txt").read_text().split()
    assert [Path(p).name for p in args[1::2]] == [p.name for p in prefixes]
    assert sum(map(int, args[0::2])) == sum(map(len, docs))
    for f in marker["parts"][0]["files"]:
        assert f["sha256"] and (dest / f["path"]).stat().st_size == f["bytes"]


@pytest.mark.parametrize("policy", ["truncate", "drop"])
def test_document_exports_follow_the_overlong_policy(
    policy: str, toy_tokenizer_path: Path, tmp_path: Path
) -> None:
    out, docs = text_pack(tmp_path, toy_tokenizer_path, policy)
    invoke_ok("export", out, "--to", "olmo", "-q")
    dest = out / "export" / "olmo"
    ids = np.fromfile(dest / "tokens" / "part-00000.npy", dtype=np.uint16)
    bounds = read_olmo_bounds(dest / "tokens" / "part-00000.csv.gz")
    assert [ids[s:e].tolist() for s, e in bounds] == docs


def test_olmo_chat_boundaries_come_from_the_document_table(chat, tmp_path: Path) -> None:
    out, docs = chat
    dest = tmp_path / "olmo"
    invoke_ok("export", out, "--to", "olmo", "--dest", dest, "-q")
    paths = json.loads((dest / "paths.json").read_text())
    assert len(paths["paths"]) == len(paths["label_mask_paths"]) == 1
    ids = np.fromfile(paths["paths"][0], dtype=np.uint16)
    mask = np.fromfile(paths["label_mask_paths"][0], dtype=np.bool_)
    bounds = read_olmo_bounds(Path(paths["paths"][0].replace(".npy", ".csv.gz")))
    assert ids.size == mask.size == sum(len(t) for t, _ in docs.values())
    assert len(bounds) == len(docs)
    for (s, e), (tokens, labels) in zip(bounds, docs.values(), strict=True):
        assert ids[s:e].tolist() == tokens
        # OLMo's get_labels masks the unshifted ids: True = trained target.
        assert mask[s:e].tolist() == [lab != -100 for lab in labels]
    # OLMo-core's EOS scan (its default for a local file) cuts where the tokenizer's EOS
    # is: ChatML's <|im_end|> closes every turn, so the scan would make each turn a
    # document; the table keeps each dialogue one.
    assert json.loads((out / "packcli.json").read_text())["run"]["tokenizer"]["eos_id"] is None
    im_end = 2  # corpora.chatml_tokenizer's third special token
    scanned = np.flatnonzero(ids == im_end) + 1
    assert scanned.size > len(bounds) and set(scanned) != {e for _, e in bounds}


@pytest.mark.parametrize("which", ["text", "chat"])
def test_bridge_rows_train_what_the_pack_trains(which: str, text, chat, tmp_path: Path) -> None:
    out = (text if which == "text" else chat)[0]
    dest = tmp_path / "bridge"
    invoke_ok("export", out, "--to", "megatron-bridge", "--dest", dest, "-q")
    for config in ("long", "short"):
        ours = sorted((out / "data" / config).glob("*.parquet"))
        theirs = sorted((dest / config).glob("*.idx.parquet"))
        assert [p.name for p in theirs] == [
            p.name.replace(".parquet", ".idx.parquet") for p in ours
        ]
        meta = json.loads((dest / config / "metadata.jsonl").read_text())
        most = longest = 0
        fewest = None
        for src, exp in zip(ours, theirs, strict=True):
            schema = pq.read_schema(exp)
            assert {"input_ids", "seq_start_id", "loss_mask"} <= set(schema.names)
            assert str(schema.field("loss_mask").type) == "list<element: int8>"
            for row, b in zip(
                pq.read_table(src).to_pylist(), pq.read_table(exp).to_pylist(), strict=True
            ):
                assert b["input_ids"] == row["input_ids"]
                starts = np.cumsum(row["seq_lengths"]) - np.array(row["seq_lengths"])
                assert b["seq_start_id"] == starts.tolist()
                inputs, labels, loss = bridge_collate(b)
                # The pack's own targets: each token after a segment's first, where its
                # label is set (text: every one), predicted from the token before it.
                want_labels, want_inputs, want_loss = [], [], []
                lab = row.get("labels") or row["input_ids"]
                for s, n in zip(starts, row["seq_lengths"], strict=True):
                    want_inputs += row["input_ids"][s : s + n - 1]
                    want_labels += row["input_ids"][s + 1 : s + n]
                    want_loss += [int(x != -100) for x in lab[s + 1 : s + n]]
                assert (inputs, labels, loss) == (want_inputs, want_labels, want_loss)
                most = max(most, len(row["seq_lengths"]))
                longest = max(longest, max(row["seq_lengths"]))
                kept = row["num_tokens"] - len(row["seq_lengths"])
                fewest = kept if fewest is None else min(fewest, kept)
        assert meta[0]["max_samples_per_bin"] == most
        assert meta[0]["dataset_max_seqlen"] == longest
        assert meta[0]["min_packed_seqlen"] == fewest
        # The keys Bridge's reader reads, in the order every export wrote them.
        assert list(meta[0]) == [
            "max_samples_per_bin",
            "dataset_max_seqlen",
            "min_packed_seqlen",
            "pack_size",
            "packing_factor",
            "packing_efficiency",
        ]


def test_rerun_skips_complete_parts_and_rewrites_damaged_ones(text, tmp_path: Path) -> None:
    out, _ = text
    dest = tmp_path / "mg"
    invoke_ok("export", out, "--to", "megatron", "--dest", dest, "-q")
    before = (dest / "packcli-export.json").read_bytes()
    assert "0 part(s) written, 1 already complete" in invoke_ok(
        "export", out, "--to", "megatron", "--dest", dest, "-q"
    )
    assert (dest / "packcli-export.json").read_bytes() == before
    data = bytearray((dest / "part-00000.bin").read_bytes())
    data[10] ^= 1
    (dest / "part-00000.bin").write_bytes(bytes(data))
    assert "1 part(s) written, 0 already complete" in invoke_ok(
        "export", out, "--to", "megatron", "--dest", dest, "-q"
    )
    assert (dest / "packcli-export.json").read_bytes() == before


def test_the_claim_carries_what_earlier_runs_claimed_unless_it_is_damaged(
    text, tmp_path: Path
) -> None:
    from packcli.export.record import CLAIM

    out, _ = text
    dest = tmp_path / "mg"
    invoke_ok("export", out, "--to", "megatron", "--dest", dest, "-q")
    claim = dest / CLAIM
    planned = json.loads(claim.read_text())["files"]
    claim.write_text(json.dumps({"files": [*planned, "earlier.bin"]}))  # an earlier run's
    invoke_ok("export", out, "--to", "megatron", "--dest", dest, "-q")
    assert json.loads(claim.read_text())["files"] == sorted([*planned, "earlier.bin"])
    claim.write_text(json.dumps({"files": ["earlier.bin", 3]}))  # damaged: names nothing
    invoke_ok("export", out, "--to", "megatron", "--dest", dest, "-q")
    assert json.loads(claim.read_text())["files"] == planned


def test_a_damaged_or_incomplete_pack_is_named(toy_tokenizer_path: Path, tmp_path: Path) -> None:
    out, _ = text_pack(tmp_path, toy_tokenizer_path)
    shard = next((out / ".packcli" / "tokens" / "files").rglob("shard-00000.arrow"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 1
    shard.write_bytes(bytes(data))
    code, output = invoke("export", out, "--to", "olmo", "-q")
    assert code == 1 and str(shard) in output and "changed since it was written" in output
    first = sorted((out / "data" / "long").glob("*.parquet"))[0]
    first.write_bytes(first.read_bytes()[:-8])
    code, output = invoke("export", out, "--to", "megatron-bridge", "-q")
    assert code == 1 and str(first) in output
    (out / "packcli.json").unlink()
    code, output = invoke("export", out, "--to", "megatron", "-q")
    assert code == 1 and "no packcli.json" in output
    assert not (out / "export" / "olmo" / "packcli-export.json").exists()


def test_refusals_say_what_to_do(chat, tmp_path: Path) -> None:
    out, _ = chat
    code, output = invoke("export", out, "--to", "megatron", "-q")
    assert code == 1 and "--to megatron-bridge" in output
    code, output = invoke("export", out, "--to", "olmo", "--work-dir", tmp_path, "-q")
    assert code == 1 and "--work-dir is for a URL OUT only" in output
    code, output = invoke("export", out, "--to", "nemo", "-q")
    assert code == 1 and "--to must be one of" in output


def test_a_documents_first_token_is_never_a_target() -> None:
    from packcli.export.source import trained

    got = trained(np.array([5, -100, 7, 8, 9]), np.array([0, 3]))
    assert got.tolist() == [False, False, True, False, True]


def test_megatron_ids_of_a_large_vocabulary_are_int32(tmp_path: Path) -> None:
    from packcli.export.megatron import megatron_dtype, write_indexed

    assert megatron_dtype(65499) == np.uint16 and megatron_dtype(151_936) == np.int32
    tokens = np.array([70_000, 5, 151_935, 0, 9], dtype=np.int32)
    write_indexed(tmp_path / "p", tokens, np.array([2, 3]), megatron_dtype(151_936))
    got, lengths, doc_index = read_megatron(tmp_path / "p")
    assert got.dtype == np.int32 and got.tolist() == tokens.tolist()
    assert lengths.tolist() == [2, 3] and doc_index.tolist() == [0, 1, 2]
