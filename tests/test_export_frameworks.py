"""Exports read by the frameworks' own readers: megatron-core 0.16's ``IndexedDataset`` and
``GPTDataset`` (EOD-based ``reset_position_ids``/``reset_attention_mask``/``eod_mask_loss``),
and ai2-olmo-core 3.0's ``NumpyPackedFSLDataset`` (boundaries from the ``.csv.gz``, label
masks, its own ``get_labels`` shift). Each test is skipped, saying why, when its package is
not importable; ``make test-frameworks`` builds a venv with both and runs only these
(marker ``frameworks``). Megatron-Bridge's reader needs Python 3.12 and GPU packages: its
columns are checked in tests/test_export.py by mirroring its reader (``bridge_collate``)."""

from __future__ import annotations

import json
import types
import warnings
from pathlib import Path

import numpy as np
import pytest
from clirun import invoke_ok

pytestmark = pytest.mark.frameworks


def _need(module: str, extra: str) -> None:
    try:
        __import__(module)
    except ImportError as exc:
        pytest.skip(f"{module} not importable ({exc}); `make test-frameworks` installs {extra}")


def _megatron(out: Path) -> list[Path]:
    invoke_ok("export", out, "--to", "megatron", "-q")
    dest = out / "export" / "megatron"
    marker = json.loads((dest / "packcli-export.json").read_text())
    return [dest / p["name"] for p in marker["parts"]]


def test_megatron_indexed_dataset_reads_every_document(text) -> None:
    _need("megatron.core", "megatron-core")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDataset

    out, docs = text
    got = []
    for prefix in _megatron(out):
        ds = IndexedDataset(str(prefix))
        assert np.array_equal(ds.document_indices, np.arange(len(ds) + 1))
        got += [ds[i].tolist() for i in range(len(ds))]
    assert got == docs


def test_megatron_gpt_dataset_resets_at_every_document(text) -> None:
    """GPTDataset's windows, as Megatron trains them: positions restart after each EOD, no
    loss is taken where the input is the EOD, and every window's inner pieces are whole
    documents of the pack (so no document merged with a neighbour)."""
    _need("megatron.core", "megatron-core")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
        from megatron.core.datasets.indexed_dataset import IndexedDataset
        from megatron.core.datasets.utils import Split

    out, docs = text
    eos = docs[0][-1]
    whole = {tuple(d) for d in docs}
    (prefix,) = _megatron(out)
    tok = types.SimpleNamespace(eod=eos, pad=eos, vocab_size=400, unique_identifiers={})
    config = GPTDatasetConfig(
        random_seed=1,
        sequence_length=256,
        tokenizer=tok,
        split="1,0,0",
        reset_position_ids=True,
        reset_attention_mask=True,
        eod_mask_loss=True,
        create_attention_mask=False,
    )
    indexed = IndexedDataset(str(prefix))
    ds = GPTDataset(indexed, str(prefix), np.arange(len(indexed)), None, Split.train, config)
    seen = 0
    for i in range(len(ds)):
        item = ds[i]
        tokens = item["tokens"].numpy()
        labels = item["labels"].numpy()
        positions = item["position_ids"].numpy()
        assert np.array_equal(labels[:-1], tokens[1:])
        assert np.array_equal(item["loss_mask"].numpy() == 0, tokens == eos)
        cuts = np.flatnonzero(tokens == eos) + 1
        pieces = np.split(np.arange(tokens.size), cuts)
        for k, piece in enumerate(pieces):
            if piece.size == 0:
                continue
            assert np.array_equal(positions[piece] - positions[piece[0]], np.arange(piece.size))
            if k > 0:
                assert positions[piece[0]] == 0
            if 0 < k < len(pieces) - 1:
                assert tuple(tokens[piece].tolist()) in whole
                seen += 1
    assert seen > len(docs) // 2


def test_olmo_packed_dataset_keeps_dialogues_and_trains_assistant_tokens(
    chat, tmp_path: Path
) -> None:
    """NumpyPackedFSLDataset with boundaries from the metadata (``use_array_if_local=False``):
    every dialogue exactly once, ``doc_lens`` from the table, and after OLMo's own
    ``get_labels`` shift the trained targets are the pack's labels."""
    _need("olmo_core", "ai2-olmo-core")
    import torch
    from olmo_core.data.numpy_dataset import NumpyPackedFSLDataset
    from olmo_core.data.utils import get_labels

    out, docs = chat
    invoke_ok("export", out, "--to", "olmo", "-q")
    paths = json.loads((out / "export" / "olmo" / "paths.json").read_text())
    ds = NumpyPackedFSLDataset(
        *paths["paths"],
        sequence_length=512,
        pad_token_id=0,
        eos_token_id=2,
        vocab_size=500,
        dtype=np.uint16,
        label_mask_paths=paths["label_mask_paths"],
        generate_doc_lengths=True,
        use_array_if_local=False,
    )
    ds.work_dir = tmp_path / "olmo-work"
    ds.prepare()
    found: list[tuple[list[int], list[int]]] = []
    for i in range(len(ds)):
        item = ds[i]
        labels = get_labels({k: v[None] for k, v in item.items() if torch.is_tensor(v)})[0]
        ids = item["input_ids"].tolist()
        start = 0
        for n in item["doc_lens"].tolist():
            piece = ids[start : start + n]
            # Padding (pad id 0, <|endoftext|>: no dialogue holds it) is its own segment.
            if set(piece) != {0}:
                # OLMo's label at t is the target predicted at t (token t+1): shifted back,
                # a document's labels read as the pack stores them (first token -100).
                found.append((piece, [-100, *labels[start : start + n - 1].tolist()]))
            start += n
        assert start == len(ids)
    assert sorted(found) == sorted(docs.values())
