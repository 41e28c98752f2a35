"""Real packs to export, and what each must hold, worked out without the export code: text
documents from the tokenizer itself (``encode`` + EOS, the pack's overlong policy applied),
dialogues from the pack's own rows (``packcli verify`` vouches for them), and readers of the
export's bytes written from the formats' specs (shared by tests/test_export*.py)."""

from __future__ import annotations

import gzip
import itertools
import json
import random
import struct
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from clirun import invoke_ok
from corpora import chatml_tokenizer, mixed_lengths, write_corpus
from tokenizers import Tokenizer

TEXT_ARGS = ["--short-len", "64", "--long-len", "512", "-q"]


def text_pack(folder: Path, tokenizer: Path, policy: str = "split") -> tuple[Path, list[list[int]]]:
    """A text pack of 200 mixed-length documents (a few over ``long_len``) and every
    document's tokens as the pack holds it, in input order."""
    corpus = folder / "corpus.jsonl"
    counts = mixed_lengths(200, seed=3)
    counts[17] = 0  # an empty text: not in the pack, so not in an export
    write_corpus(corpus, counts, seed=3)
    out = folder / "out"
    invoke_ok("pack", corpus, "-t", tokenizer, "-o", out, *TEXT_ARGS, "--overlong", policy)
    tok = Tokenizer.from_file(str(tokenizer))
    eos = tok.token_to_id("<|endoftext|>")
    docs = []
    for line in corpus.read_text(encoding="utf-8").splitlines():
        text = json.loads(line)["text"]
        ids = [*tok.encode(text, add_special_tokens=False).ids, eos] if text else []
        if policy == "truncate":
            ids = ids[:512]
        if ids and not (policy == "drop" and len(ids) > 512):
            docs.append(ids)
    assert any(len(d) > 512 for d in docs) or policy != "split"
    return out, docs


def chat_pack(folder: Path, n: int = 60) -> tuple[Path, dict[int, tuple[list[int], list[int]]]]:
    """A chat pack (ChatML, no EOS added: the default) and, per document id, its tokens and
    labels as the pack's long rows hold them (a dialogue is never split: one segment)."""
    tok = chatml_tokenizer(folder / "tok")
    rng = random.Random(5)
    words = ["the", "answer", "question", "tool", "packing", "token", "sunny", "東京"]
    corpus = folder / "chat.jsonl"
    with open(corpus, "w", encoding="utf-8") as fh:
        for i in range(n):
            msgs = []
            for _ in range(rng.randint(1, 3)):
                for role in ("user", "assistant"):
                    text = " ".join(rng.choice(words) for _ in range(rng.randint(1, 12)))
                    msgs.append({"role": role, "content": text})
            fh.write(json.dumps({"messages": msgs, "id": i}, ensure_ascii=False) + "\n")
    out = folder / "out"
    invoke_ok(
        "pack", corpus, "-t", tok, "-o", out, "--format", "chat", "--chat-template", "chatml",
        "--short-len", "128", "--long-len", "512", "-q",
    )  # fmt: skip
    docs: dict[int, tuple[list[int], list[int]]] = {}
    for path in sorted((out / "data" / "long").glob("*.parquet")):
        for row in pq.read_table(path).to_pylist():
            start = 0
            for doc, n_tok in zip(row["doc_ids"], row["seq_lengths"], strict=True):
                seg = slice(start, start + n_tok)
                assert doc not in docs
                docs[doc] = (row["input_ids"][seg], row["labels"][seg])
                start += n_tok
    return out, dict(sorted(docs.items()))


def read_megatron(prefix: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(tokens, lengths, document_indices)`` from the .idx/.bin bytes, by megatron-core's
    layout (header, version, dtype code, counts, int32 lengths, int64 pointers, int64 doc
    indices), written out here apart from the exporter's reader."""
    raw = prefix.with_suffix(".idx").read_bytes()
    assert raw[:9] == b"MMIDIDX\x00\x00" and struct.unpack_from("<Q", raw, 9) == (1,)
    code = raw[17]
    seqs, docs = struct.unpack_from("<QQ", raw, 18)
    lengths = np.frombuffer(raw, np.int32, seqs, 34)
    pointers = np.frombuffer(raw, np.int64, seqs, 34 + 4 * seqs)
    doc_index = np.frombuffer(raw, np.int64, docs, 34 + 12 * seqs)
    assert 34 + 12 * seqs + 8 * docs == len(raw)
    dtype = {8: np.uint16, 4: np.int32}[code]
    tokens = np.fromfile(prefix.with_suffix(".bin"), dtype=dtype)
    size = np.dtype(dtype).itemsize
    assert np.array_equal(pointers, (np.cumsum(lengths, dtype=np.int64) - lengths) * size)
    return tokens, lengths, doc_index


def read_olmo_bounds(path: Path) -> list[tuple[int, int]]:
    with gzip.open(path, "rt") as fh:
        return [(int(a), int(b)) for a, b in (line.strip().split(",")[:2] for line in fh)]


def bridge_collate(row: dict) -> tuple[list[int], list[int], list[int]]:
    """What Megatron-Bridge's ``GPTSFTPackedDataset.collate_fn`` makes of one row read by
    ``GPTSFTPackedParquetDataset.__getitem__`` (``seq_boundaries = seq_start_id +
    [len(input_ids)]``; per segment, inputs ``ids[s:e-1]``, labels ``ids[s+1:e]``, mask
    ``loss_mask[s:e-1]`` with ``answer_only_loss=True``): inputs, labels, mask."""
    ids, mask = row["input_ids"], row["loss_mask"]
    bounds = [*row["seq_start_id"], len(ids)]
    inputs, labels, loss = [], [], []
    for s, e in itertools.pairwise(bounds):
        inputs += ids[s : e - 1]
        labels += ids[s + 1 : e]
        loss += mask[s : e - 1]
    return inputs, labels, loss
