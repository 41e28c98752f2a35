"""Preference rows as ``packcli pack --format preference`` writes them, for tests of the
training side that must not depend on the packing side (``seq_roles`` per segment, a pair as
two adjacent segments prompt+chosen then prompt+rejected, labels -100 on the prompt and on
every segment's first token)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA = pa.schema(
    [
        pa.field("input_ids", pa.list_(pa.int32())),
        pa.field("segment_ids", pa.list_(pa.int32())),
        pa.field("seq_lengths", pa.list_(pa.int32())),
        pa.field("doc_ids", pa.list_(pa.int64())),
        pa.field("num_tokens", pa.int32()),
        pa.field("labels", pa.list_(pa.int32())),
        pa.field("seq_roles", pa.list_(pa.int8())),
    ]
)


def preference_rows(vocab_size: int, n_rows: int = 3, seed: int = 0) -> list[dict[str, Any]]:
    """Rows of two or three pairs and sometimes an ordinary document each."""
    rng = random.Random(seed)
    rows, doc = [], 0
    for _ in range(n_rows):
        segments: list[tuple[list[int], list[int], int, int]] = []
        for _ in range(rng.randint(2, 3)):
            prompt = [rng.randrange(2, vocab_size) for _ in range(rng.randint(2, 8))]
            for role in (1, 2):
                response = [rng.randrange(2, vocab_size) for _ in range(rng.randint(1, 10))]
                segments.append((prompt + response, [-100] * len(prompt) + response, role, doc))
            doc += 1
        if rng.random() < 0.5:
            ids = [rng.randrange(2, vocab_size) for _ in range(rng.randint(2, 10))]
            segments.append((ids, [-100, *ids[1:]], 0, doc))
            doc += 1
        rows.append(
            {
                "input_ids": [t for s in segments for t in s[0]],
                "segment_ids": [i + 1 for i, s in enumerate(segments) for _ in s[0]],
                "seq_lengths": [len(s[0]) for s in segments],
                "doc_ids": [s[3] for s in segments],
                "num_tokens": sum(len(s[0]) for s in segments),
                "labels": [t for s in segments for t in s[1]],
                "seq_roles": [s[2] for s in segments],
            }
        )
    return rows


def write_preference_output(folder: Path, vocab_size: int, seed: int = 0) -> Path:
    """A folder ``datasets.load_dataset(folder, "long")`` reads like a packcli output."""
    for config in ("long", "short"):
        data = folder / "data" / config
        data.mkdir(parents=True, exist_ok=True)
        rows = preference_rows(vocab_size, seed=seed + (config == "short"))
        pq.write_table(pa.Table.from_pylist(rows, SCHEMA), data / "train-00000-of-00001.parquet")
    configs = "".join(
        f"- config_name: {c}\n  data_files:\n  - split: train\n    path: data/{c}/train-*.parquet\n"
        for c in ("long", "short")
    )
    (folder / "README.md").write_text(f"---\nconfigs:\n{configs}---\n", encoding="utf-8")
    return folder
