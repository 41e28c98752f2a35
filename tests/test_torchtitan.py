"""``packcli.torchtitan`` on real packs (``packcli pack`` in the test), checked with torchtitan
0.3's own code where it is installed (``make test-frameworks``; those tests are marked
``frameworks`` and skipped elsewhere): its ``StatefulDataLoader``-based
``ParallelAwareDataloader`` across ranks and workers, its varlen metadata and flex document
mask derived from the positions we yield, its ignore index, and its llama3 model, whose logits
for every packed document must equal that document run alone. The oracles are the tokenizer
(text: every document's tokens, cut into pieces of ``long_len`` as ``--overlong split`` does)
and the stored rows read with pyarrow; the sample layout itself is checked against a
token-by-token loop."""

from __future__ import annotations

import itertools
import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from clirun import invoke_ok
from corpora import mixed_corpus, packed_string_pairs
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from packcli.names import IGNORE_INDEX
from packcli.torchtitan import (
    PackedTitanDataset,
    TitanDataError,
    shard_bounds,
    shifted_sample,
)

LONG = 512  # export_cases' text pack: --long-len 512 --short-len 64; the chat pack 512 / 128


def _need_torchtitan() -> None:
    try:
        import torchtitan.components.dataloader
        import torchtitan.models.common.attention  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"torchtitan not importable ({exc}); `make test-frameworks` installs it")


@pytest.fixture(scope="module")
def cp_pack(tmp_path_factory: pytest.TempPathFactory, toy_tokenizer_path: Path) -> Path:
    """Text packed with --cp-size 2: segments padded to multiples of 4 (seq_pad, labels)."""
    folder = tmp_path_factory.mktemp("cp")
    corpus = mixed_corpus(folder / "corpus.jsonl", 80, 9)
    out = folder / "out"
    invoke_ok(
        "pack", corpus, "-t", toy_tokenizer_path, "-o", out, "--short-len", "64",
        "--long-len", "512", "--cp-size", "2", "-q",
    )  # fmt: skip
    return out


def stored_rows(out: Path, config: str) -> list[dict[str, Any]]:
    rows = []
    for path in sorted((out / "data" / config).glob("*.parquet")):
        rows += pq.read_table(path).to_pylist()
    return rows


def expected_sample(row: dict[str, Any], seq_len: int, pad_id: int) -> tuple[int, ...]:
    """The ``input`` a row must become: its tokens, then ``pad_id`` up to ``seq_len``."""
    return (*row["input_ids"], *[pad_id] * (seq_len - len(row["input_ids"])))


# --- the sample layout, against a token-by-token loop -----------------------------------------


def loop_sample(
    ids: list[int], lengths: list[int], seq_len: int, labels: list[int] | None, pad: list[int]
) -> tuple[list[int], list[int], list[int]]:
    tokens, positions, targets = [], [], []
    source = labels if labels is not None else ids
    t = 0
    for length, n_pad in zip(lengths, pad, strict=True):
        for j in range(length):
            tokens.append(ids[t])
            positions.append(j)
            last = j == length - 1
            nxt_is_pad = j + 1 >= length - n_pad
            targets.append(IGNORE_INDEX if last or nxt_is_pad else source[t + 1])
            t += 1
    for j in range(seq_len - t):
        tokens.append(0)
        positions.append(j)
        targets.append(IGNORE_INDEX)
    return tokens, positions, targets


@st.composite
def rows(draw: st.DrawFn) -> tuple[list[int], list[int], list[int] | None, list[int], int]:
    lengths = draw(st.lists(st.integers(1, 9), min_size=1, max_size=6))
    n = sum(lengths)
    ids = draw(st.lists(st.integers(1, 99), min_size=n, max_size=n))
    has_labels = draw(st.booleans())
    labels = [i if draw(st.booleans()) else IGNORE_INDEX for i in ids] if has_labels else None
    pad = [draw(st.integers(0, length - 1)) for length in lengths] if has_labels else []
    seq_len = n + draw(st.integers(0, 5))
    return ids, lengths, labels, pad, seq_len


@settings(max_examples=200, deadline=None)
@given(rows())
def test_shifted_sample_matches_a_token_loop(row) -> None:
    ids, lengths, labels, pad, seq_len = row
    got = shifted_sample(ids, lengths, seq_len, labels=labels, seq_pad=pad or None)
    want = loop_sample(ids, lengths, seq_len, labels, pad or [0] * len(lengths))
    assert [a.tolist() for a in got] == list(want)
    assert all(a.dtype == np.int64 and a.shape == (seq_len,) for a in got)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 300), st.integers(1, 12), st.integers(1, 5))
def test_shards_partition_the_rows(n_rows: int, ranks: int, workers: int) -> None:
    """Ranks, then each rank's workers: contiguous, in order, every row once, sizes within 1."""
    parts = []
    for r in range(ranks):
        a, b = shard_bounds(n_rows, r, ranks)
        parts += [
            (a + x, a + y) for x, y in (shard_bounds(b - a, w, workers) for w in range(workers))
        ]
    assert [i for a, b in parts for i in range(a, b)] == list(range(n_rows))
    rank_sizes = [b - a for a, b in (shard_bounds(n_rows, r, ranks) for r in range(ranks))]
    assert max(rank_sizes) - min(rank_sizes) <= 1


def test_row_longer_than_seq_len_is_refused() -> None:
    with pytest.raises(TitanDataError, match=r"set training\.seq_len"):
        shifted_sample([1, 2, 3], [3], 2)
    with pytest.raises(TitanDataError, match="sum to the row's 3 tokens"):
        shifted_sample([1, 2, 3], [2], 4)


# --- the dataset on real packs, with torch's own DataLoader -------------------------------------


def test_every_row_once_across_ranks_and_workers_with_torch_workers(chat) -> None:
    out, _ = chat
    rows = stored_rows(out, "short")
    ds0 = PackedTitanDataset(out, config="short")
    seen: Counter[tuple[int, ...]] = Counter()
    for rank in range(3):
        ds = PackedTitanDataset(out, config="short", dp_rank=rank, dp_world_size=3)
        loader = DataLoader(ds, batch_size=2, num_workers=2)
        for inputs, _labels in loader:
            seen.update(tuple(x) for x in inputs["input"].tolist())
    assert seen == Counter(expected_sample(r, 128, ds0.pad_id) for r in rows)
    assert ds0.seq_len == 128 and ds0.num_rows == len(rows)


def test_state_resumes_where_it_stopped_and_infinite_wraps(text) -> None:
    out, _ = text
    ds = PackedTitanDataset(out, dp_rank=1, dp_world_size=2)
    whole = [s[0]["input"].tolist() for s in ds]
    start, stop = ds.rank_bounds()
    assert len(whole) == stop - start > 3
    assert [s[0]["input"].tolist() for s in ds] == whole  # a new pass: the next epoch
    assert ds.state_dict()["epoch"] == 1
    first = PackedTitanDataset(out, dp_rank=1, dp_world_size=2)
    head = [s[0]["input"].tolist() for s in itertools.islice(iter(first), 3)]
    again = PackedTitanDataset(out, dp_rank=1, dp_world_size=2)
    again.load_state_dict(first.state_dict())
    assert head + [s[0]["input"].tolist() for s in again] == whole
    other = PackedTitanDataset(out, dp_rank=0, dp_world_size=2)
    with pytest.raises(TitanDataError, match="same data-parallel size and num_workers"):
        other.load_state_dict(first.state_dict())
    looping = PackedTitanDataset(out, dp_rank=1, dp_world_size=2, infinite=True)
    twice = [s[0]["input"].tolist() for s in itertools.islice(iter(looping), 2 * len(whole))]
    assert twice == whole + whole and looping.state_dict()["epoch"] == 1


def test_settings_that_cannot_train_are_refused(
    text, tmp_path: Path, toy_tokenizer_path: Path
) -> None:
    out, _ = text
    with pytest.raises(TitanDataError, match=r"set training\.seq_len = 512"):
        PackedTitanDataset(out, seq_len=256)
    with pytest.raises(TitanDataError, match="config must be one of"):
        PackedTitanDataset(out, config="medium")
    rows = PackedTitanDataset(out).num_rows
    with pytest.raises(TitanDataError, match=f"has {rows} rows, fewer than the {rows + 1} data"):
        PackedTitanDataset(out, dp_world_size=rows + 1)
    pairs = packed_string_pairs(tmp_path, toy_tokenizer_path, 10, seed=1)
    with pytest.raises(TitanDataError, match="preference pairs"):
        PackedTitanDataset(pairs)


# --- torchtitan's own code ------------------------------------------------------------------


def titan_loader(out: Path, rank: int, world: int, **config: Any) -> Any:
    from packcli.torchtitan import PackedDataLoader

    batch = config.pop("batch", 3)
    cfg = PackedDataLoader.Config(dataset_path=str(out), infinite=False, **config)
    return cfg.build(
        dp_world_size=world, dp_rank=rank, tokenizer=None, seq_len=LONG, local_batch_size=batch
    )


def titan_documents(positions: torch.Tensor) -> list[list[tuple[int, int]]]:
    """Per sample, the ``[start, end)`` of each document, as torchtitan's varlen attention
    gets them (``create_varlen_metadata_for_document``), after checking that its flex
    "block_causal" mask (``get_document_mask_mod`` and causal) is the same block structure."""
    from torchtitan.models.common.attention import (
        create_varlen_metadata_for_document,
        get_causal_mask_mod,
        get_document_mask_mod,
    )

    batch, length = positions.shape
    meta = create_varlen_metadata_for_document(positions)
    docs: list[list[tuple[int, int]]] = [[] for _ in range(batch)]
    for s, e in itertools.pairwise(meta.cu_seq_q.tolist()):
        b = s // length
        assert (e - 1) // length == b  # a document never spans two samples
        docs[b].append((s - b * length, e - b * length))
    b = torch.arange(batch)[:, None, None]
    q, kv = torch.arange(length)[None, :, None], torch.arange(length)[None, None, :]
    zero = torch.zeros((), dtype=torch.int64)
    flex = get_document_mask_mod(positions)(b, zero, q, kv) & get_causal_mask_mod()(b, zero, q, kv)
    want = torch.zeros(batch, length, length, dtype=torch.bool)
    for r, spans in enumerate(docs):
        for s, e in spans:
            want[r, s:e, s:e] = True
    assert torch.equal(flex, want.tril())
    return docs


def rows_by_input(out: Path) -> dict[tuple[int, ...], dict[str, Any]]:
    """The long config's stored rows, by the ``input`` each must become (all distinct)."""
    rows = stored_rows(out, "long")
    pad_id = PackedTitanDataset(out).pad_id
    by_input = {expected_sample(r, LONG, pad_id): r for r in rows}
    assert len(by_input) == len(rows)
    return by_input


def check_samples(out: Path, world: int, workers: int) -> list[tuple[list[int], list[int]]]:
    """Every row of the long config once over ``world`` ranks x ``workers`` workers; per
    sample, torchtitan's documents are the row's ``seq_lengths`` (then the padding block) and
    every label is the next token's stored target within the document, ignored at its end and
    on padding. Returns every real document's (tokens, shifted labels)."""
    from torchtitan.components.loss import IGNORE_INDEX as TITAN_IGNORE

    assert TITAN_IGNORE == IGNORE_INDEX
    by_input = rows_by_input(out)
    seen: Counter[tuple[int, ...]] = Counter()
    documents = []
    for rank in range(world):
        for inputs, labels in titan_loader(out, rank, world, num_workers=workers):
            assert set(inputs) == {"input", "positions"}  # every other key is a model kwarg
            assert inputs["input"].dtype == labels.dtype == torch.int64
            for tokens, spans, target in zip(
                inputs["input"].tolist(),
                titan_documents(inputs["positions"]),
                labels.tolist(),
                strict=True,
            ):
                key = tuple(tokens)
                seen[key] += 1
                row = by_input[key]
                n = len(row["input_ids"])
                assert [e - s for s, e in spans] == row["seq_lengths"] + (
                    [LONG - n] if n < LONG else []
                )
                source = row.get("labels") or row["input_ids"]
                for s, e in spans[: len(row["seq_lengths"])]:
                    assert target[s : e - 1] == source[s + 1 : e]
                    assert target[e - 1] == IGNORE_INDEX
                    documents.append((tokens[s:e], target[s:e]))
                assert set(target[n:]) <= {IGNORE_INDEX}
    assert seen == Counter(list(by_input))  # every row exactly once, none left out
    return documents


@pytest.mark.frameworks
def test_text_documents_through_torchtitan_across_ranks_and_workers(text) -> None:
    _need_torchtitan()
    out, docs = text
    documents = check_samples(out, world=2, workers=2)
    pieces = [d[i : i + LONG] for d in docs for i in range(0, len(d), LONG)]
    assert sorted(t for t, _ in documents) == sorted(pieces)  # the tokenizer's own documents
    for tokens, target in documents:
        assert target == [*tokens[1:], IGNORE_INDEX]


@pytest.mark.frameworks
def test_chat_loss_masks_through_torchtitan(chat) -> None:
    _need_torchtitan()
    out, docs = chat
    documents = check_samples(out, world=3, workers=1)
    want = [(ids, [*labels[1:], IGNORE_INDEX]) for ids, labels in docs.values()]
    assert sorted(documents) == sorted(want)
    trained = sum(t != IGNORE_INDEX for _, target in documents for t in target)
    assert trained == sum(x != IGNORE_INDEX for _, labels in docs.values() for x in labels) > 0


@pytest.mark.frameworks
def test_cp_padding_is_inside_its_segment_and_never_a_target(cp_pack: Path) -> None:
    _need_torchtitan()
    documents = check_samples(cp_pack, world=2, workers=1)
    assert all(len(tokens) % 4 == 0 for tokens, _ in documents)
    rows = stored_rows(cp_pack, "long")
    padded = sum(sum(r["seq_pad"]) for r in rows)
    assert padded > 0
    # each padded segment: its last real token (EOS) and its padding have no target
    ignored = sum(t == IGNORE_INDEX for _, target in documents for t in target)
    assert ignored == sum(len(r["seq_lengths"]) for r in rows) + padded


@pytest.mark.frameworks
def test_torchtitan_dataloader_resumes_from_its_checkpoint_state(text) -> None:
    """torchtitan's ``state_dict``/``load_state_dict`` (pickled ``StatefulDataLoader`` state
    per dp rank) with 2 workers: the resumed loader yields exactly the batches not yet seen;
    with another worker count the state is refused, not read from the wrong rows."""
    _need_torchtitan()
    out, _ = text

    def batches(loader: Any, n: int | None = None) -> list[list[list[int]]]:
        return [b[0]["input"].tolist() for b in itertools.islice(loader, n)]

    whole = batches(titan_loader(out, 1, 2, num_workers=2, batch=2))
    first = titan_loader(out, 1, 2, num_workers=2, batch=2)
    it = iter(first)
    head = [next(it)[0]["input"].tolist() for _ in range(3)]
    state = first.state_dict()
    assert set(state) == {"dp_rank_1", "world_size"}
    resumed = titan_loader(out, 1, 2, num_workers=2, batch=2)
    resumed.load_state_dict(state)
    assert head + batches(resumed) == whole
    assert len(whole) > 4
    fewer_workers = titan_loader(out, 1, 2, num_workers=1, batch=2)
    fewer_workers.load_state_dict(state)
    with pytest.raises(TitanDataError, match="same data-parallel size and num_workers"):
        batches(fewer_workers)


def docs_config_function() -> Any:
    """The config function of docs/training.md's torchtitan section, defined by running its
    snippet."""
    text = (Path(__file__).parents[1] / "docs" / "training.md").read_text(encoding="utf-8")
    section = text.split("## torchtitan", 1)[1].split("\n## ", 1)[0]
    (snippet,) = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    namespace: dict[str, Any] = {}
    exec(compile(snippet, "training.md:torchtitan", "exec"), namespace)
    return namespace["llama3_8b_packed"]


@pytest.mark.frameworks
def test_the_docs_trainer_config_builds_the_loader(text, toy_tokenizer_path: Path) -> None:
    """The docs' ``Trainer.Config``, its tokenizer and dataloader built as ``Trainer.__init__``
    builds them (the pack's own tokenizer); a tokenizer with fewer ids is refused."""
    _need_torchtitan()
    import types

    from packcli.torchtitan import PackedDataLoader

    out, _ = text
    config = docs_config_function()(pack=str(out), seq_len=LONG)
    assert isinstance(config.dataloader, PackedDataLoader.Config)
    assert config.dataloader.infinite  # torchtitan trains on an endless stream by default
    kwargs = {"dp_world_size": 1, "dp_rank": 0, "seq_len": config.training.seq_len}
    small = types.SimpleNamespace(get_vocab_size=lambda: 100)
    with pytest.raises(TitanDataError, match="packed with a vocabulary of"):
        config.dataloader.build(tokenizer=small, local_batch_size=2, **kwargs)
    tokenizer = config.tokenizer.build(tokenizer_path=str(toy_tokenizer_path.parent))
    loader = config.dataloader.build(tokenizer=tokenizer, local_batch_size=2, **kwargs)
    inputs, labels = next(iter(loader))
    assert inputs["input"].shape == labels.shape == (2, LONG)


@pytest.mark.frameworks
def test_torchtitan_llama_computes_every_packed_document_as_if_alone(
    text, one_torch_thread
) -> None:
    """torchtitan's llama3 debug model (flex attention, block_causal from our positions, the
    masks built by its own ``get_attention_masks``): each document's logits in a packed batch
    equal its logits run alone, torchtitan's loss on the packed batch is the sum of the
    documents' own losses, and the same batch with plain positions differs (the negative
    control)."""
    _need_torchtitan()
    import torch.nn.functional as F
    from torchtitan.components.loss import cross_entropy_loss
    from torchtitan.models.llama3 import model_registry

    out, _ = text
    torch.manual_seed(0)
    model = model_registry("debugmodel", attn_backend="flex").model.build()
    model.init_states()
    model.eval()

    def logits(tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            masks = model.get_attention_masks(positions=positions)
            return model(tokens, positions=positions, attention_masks=masks)

    by_input = rows_by_input(out)

    def documents_in(sample: Any) -> int:
        return int((sample[0]["positions"] == 0).sum())

    samples = sorted(PackedTitanDataset(out), key=documents_in)[-2:]  # the most documents
    inputs = {k: torch.stack([x[0][k] for x in samples]) for k in ("input", "positions")}
    labels = torch.stack([x[1] for x in samples])
    packed = logits(inputs["input"], inputs["positions"])
    plain = logits(inputs["input"], torch.arange(LONG).expand(2, LONG).contiguous())
    worst, control, alone_loss, n_docs = 0.0, 0.0, 0.0, 0
    for r, spans in enumerate(titan_documents(inputs["positions"])):
        real = len(by_input[tuple(inputs["input"][r].tolist())]["seq_lengths"])
        for s, e in spans[:real]:
            doc = inputs["input"][r : r + 1, s:e]
            alone = logits(doc, torch.arange(e - s)[None])[0]
            worst = max(worst, float((packed[r, s:e] - alone).abs().max()))
            if s > 0:  # a row's first document is alone under any mask
                control = max(control, float((plain[r, s:e] - alone).abs().max()))
            # the document's own next-token loss, shifted here from its tokens alone
            alone_loss += float(F.cross_entropy(alone[:-1], doc[0, 1:], reduction="sum"))
            n_docs += 1
    assert n_docs >= 4
    assert worst < 1e-4
    assert control > 1e-2
    # torchtitan's loss (a sum over labels != IGNORE_INDEX) on the packed batch
    assert float(cross_entropy_loss(packed, labels)) == pytest.approx(alone_loss, rel=1e-5)
