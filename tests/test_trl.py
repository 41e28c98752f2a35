"""TRL as a tested consumer of ``packcli pack`` output (TRL >= 1.16, the ``dev`` extra).

The real CLI packs a generated corpus with the bundled demo tokenizer into 2048-token rows;
TRL's ``SFTTrainer`` then trains a tiny random Llama on them (CPU, no network). Checked:

* TRL's own padding-free path ``SFTConfig(packing=False, padding_free=True, max_length=None)``
  trains (exact; on sdpa/eager slower than the recipe docs/training.md leads with, which
  ``test_trl_configs.py`` checks), and every batch TRL collates equals
  ``PackedCollator(mode="flash", return_seq_idx=True)`` on the same rows, key by key (so the
  exactness proven for ``PackedCollator`` in ``test_training_equivalence.py`` holds for
  TRL's batches);
* the traps, each also caught by ``packcli.collate.check_sft_config``: ``padding_free=True``
  without ``max_length=None`` raises; the default ``SFTConfig()`` cuts every row to 1024
  tokens, leaves ``seq_lengths`` as they were and collates without boundaries;
  ``packing=True`` packs every packcli row again as one document.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import datasets
import pytest
import torch
from clirun import invoke_ok
from corpora import write_corpus
from tiny_models import tiny_llama
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from packcli.collate import PackedCollator, check_sft_config

trl = pytest.importorskip("trl", minversion="1.16", reason="TRL is in the dev extra")
pytest.importorskip("accelerate", reason="TRL's trainers need accelerate")

DEMO = Path(__file__).resolve().parent.parent / "packcli" / "assets" / "demo_tokenizer.json"
ROW = 2048


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("trl")
    write_corpus(folder / "corpus.jsonl", [20 + (37 * i) % 400 for i in range(48)], seed=5)
    out = folder / "out"
    invoke_ok(
        "pack", folder / "corpus.jsonl", "-t", DEMO, "-o", out,
        "--short-len", 256, "--long-len", ROW, "-q",
    )  # fmt: skip
    return out


@pytest.fixture(scope="module")
def rows(packed: Path) -> datasets.Dataset:
    ds = datasets.load_dataset(str(packed), "long", split="train")
    assert len(ds) >= 3 and max(ds["num_tokens"]) > 1024  # rows TRL's default would cut
    assert max(len(s) for s in ds["seq_lengths"]) > 1
    return ds


@pytest.fixture(scope="module")
def short_rows(packed: Path) -> datasets.Dataset:
    """256-token rows: what the training test runs on, to stay fast on a CPU."""
    ds = datasets.load_dataset(str(packed), "short", split="train")
    assert max(len(s) for s in ds["seq_lengths"]) > 1
    return ds


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_file=str(DEMO),
        bos_token="<|bos|>",
        eos_token="<|endoftext|>",
        pad_token="<|pad|>",
    )


def trl_llama(vocab_size: int) -> LlamaForCausalLM:
    """What TRL trains: the default 0.02 initialisation, in training mode."""
    return tiny_llama(vocab_size, max_positions=ROW, initializer_range=0.02, train=True)


def sft_config(tmp_path: Path, **kwargs: Any) -> Any:
    return trl.SFTConfig(
        output_dir=str(tmp_path / "ckpt"),
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        # TRL's defaults are bf16=True and gradient (activation) checkpointing on: slow on a CPU,
        # and irrelevant to what is checked here.
        bf16=False,
        activation_checkpointing=False,
        **kwargs,
    )


def test_recommended_config_trains_on_packcli_rows_with_packed_collator_batches(
    short_rows: datasets.Dataset, tokenizer: PreTrainedTokenizerFast, tmp_path: Path
) -> None:
    args = sft_config(
        tmp_path,
        packing=False,
        padding_free=True,
        max_length=None,
        per_device_train_batch_size=2,
        max_steps=2,
        logging_steps=1,
    )
    check_sft_config(args)  # exact, so packcli's check passes it (it warns on sdpa: slow)
    model = trl_llama(len(tokenizer))
    before = model.model.embed_tokens.weight.detach().clone()
    trainer = trl.SFTTrainer(
        model=model, args=args, train_dataset=short_rows, processing_class=tokenizer
    )
    # Rows reach the collator whole: no truncation, seq_lengths kept.
    prepared = trainer.train_dataset
    assert sorted(prepared["input_ids"]) == sorted(short_rows["input_ids"])
    assert sorted(map(tuple, prepared["seq_lengths"])) == sorted(
        map(tuple, short_rows["seq_lengths"])
    )

    seen: list[tuple[list[dict[str, Any]], dict[str, Any]]] = []
    trl_collate = trainer.data_collator

    def recording(examples: list[dict[str, Any]]) -> dict[str, Any]:
        batch = trl_collate(examples)
        seen.append((examples, batch))
        return batch

    trainer.data_collator = recording
    trainer.train()
    assert trainer.state.global_step == 2
    assert not torch.equal(before, model.model.embed_tokens.weight)  # it trained
    assert len(seen) >= 2  # the dataloader may collate one batch ahead

    ours = PackedCollator(mode="flash", return_seq_idx=True)
    for examples, theirs in seen:
        assert {"input_ids", "seq_lengths"} <= set(examples[0])
        mine = ours(examples)
        assert set(mine) == set(theirs)
        for key, value in theirs.items():
            if torch.is_tensor(value):
                assert value.dtype == mine[key].dtype, key
                assert torch.equal(value, mine[key]), key
            else:
                assert value == mine[key], key
        assert len(mine["cu_seq_lens_q"]) - 1 == sum(len(e["seq_lengths"]) for e in examples)


def test_padding_free_without_max_length_none_raises(
    rows: datasets.Dataset, tokenizer: PreTrainedTokenizerFast, tmp_path: Path
) -> None:
    args = sft_config(tmp_path, packing=False, padding_free=True)
    assert args.max_length == 1024  # TRL's default
    with pytest.raises(ValueError, match="max_length"):
        trl.SFTTrainer(
            model=trl_llama(len(tokenizer)), args=args, train_dataset=rows,
            processing_class=tokenizer,
        )  # fmt: skip
    with pytest.raises(ValueError, match="max_length=1024 cuts"):
        check_sft_config(args)


def test_default_config_cuts_rows_and_ignores_boundaries(
    rows: datasets.Dataset, tokenizer: PreTrainedTokenizerFast, tmp_path: Path
) -> None:
    args = sft_config(tmp_path, per_device_train_batch_size=2)
    assert (args.packing, args.padding_free, args.max_length) == (False, False, 1024)
    trainer = trl.SFTTrainer(
        model=trl_llama(len(tokenizer)), args=args, train_dataset=rows, processing_class=tokenizer
    )
    prepared = trainer.train_dataset
    kept = sum(len(ids) for ids in prepared["input_ids"])
    total = sum(rows["num_tokens"])
    assert max(len(ids) for ids in prepared["input_ids"]) == 1024
    assert kept < total  # tokens silently lost
    # seq_lengths still describe the uncut rows: they no longer add up.
    pairs = zip(prepared["seq_lengths"], prepared["input_ids"], strict=True)
    assert any(sum(s) != len(ids) for s, ids in pairs)
    # And the collator ignores them: a plain padded batch, every document attending to the
    # ones before it.
    batch = trainer.data_collator([prepared[0], prepared[1]])
    assert "attention_mask" in batch and "position_ids" not in batch
    assert "cu_seq_lens_q" not in batch
    # packcli's collator, handed such a cut row, refuses it and says why.
    with pytest.raises(ValueError, match=r"SFTConfig\(max_length=None\)"):
        PackedCollator(mode="flash")([prepared[0]])
    with pytest.raises(ValueError, match=r"max_length=1024 cuts.*padding_free=False"):
        check_sft_config(args)


def test_packing_true_packs_each_row_again_as_one_document(
    rows: datasets.Dataset, tokenizer: PreTrainedTokenizerFast, tmp_path: Path
) -> None:
    args = sft_config(tmp_path, packing=True, max_length=ROW)
    trainer = trl.SFTTrainer(
        model=trl_llama(len(tokenizer)), args=args, train_dataset=rows, processing_class=tokenizer
    )
    repacked = [n for lengths in trainer.train_dataset["seq_lengths"] for n in lengths]
    # TRL's documents are packcli's whole rows: their boundaries are gone.
    assert sorted(repacked) == sorted(rows["num_tokens"])
    assert len(repacked) < sum(len(s) for s in rows["seq_lengths"])
    with pytest.raises(ValueError, match="packing=True packs each packcli row again"):
        check_sft_config(args)
