"""``check_sft_config`` against TRL itself, combination by combination (TRL >= 1.16).

For every combination of ``packing``, ``padding_free``, ``max_length`` (none, shorter than
the rows, longer), ``remove_unused_columns``, ``data_collator`` (TRL's own or
``PackedCollator`` in each mode) and ``per_device_train_batch_size``, the test builds the
real ``SFTTrainer`` on two ``packcli pack`` rows and observes:

* refused: ``SFTTrainer(...)`` raises;
* exact, per attention kernel (sdpa, eager, and transformers' flash-attention dispatch on
  reference kernels, ``tests/flash_reference.py``): the first batch of TRL's own dataloader
  holds whole packcli rows, every document's logits equal that document run alone, and the
  trained targets are exactly each document's own (none crosses a boundary);
* wrong also when ``PackedCollator`` stops at the first batch (a row TRL cut);
* slow: exact, but on sdpa/eager the batch TRL feeds is one flattened row of two rows' tokens
  (attention then builds a ``total x total`` mask).

``sft_config_verdict`` must name the same outcome, so the oracle is TRL and transformers, not
a table of ours.
"""

from __future__ import annotations

import itertools
import logging
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pytest
import torch
from clirun import invoke_ok
from corpora import write_corpus
from flash_reference import reference_flash
from tiny_models import tiny_llama
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from packcli.collate import (
    IGNORE_INDEX,
    PackedCollator,
    check_sft_config,
    collator_mode_for,
    cu_seqlens_from_lengths,
    sft_config_verdict,
)

trl = pytest.importorskip("trl", minversion="1.16", reason="TRL is in the dev extra")
pytest.importorskip("accelerate", reason="TRL's trainers need accelerate")

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DEMO = Path(__file__).resolve().parent.parent / "packcli" / "assets" / "demo_tokenizer.json"
ROW = 256
TOL = 1e-4
IMPLS = ("sdpa", "eager", "flash")
COLLATORS = (None, "position_ids", "flash", "mask4d")


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> datasets.Dataset:
    """Two packcli rows of up to 256 tokens, several documents each."""
    folder = tmp_path_factory.mktemp("trl_configs")
    write_corpus(folder / "corpus.jsonl", [8 + (13 * i) % 50 for i in range(24)], seed=11)
    invoke_ok(
        "pack", folder / "corpus.jsonl", "-t", DEMO, "-o", folder / "out",
        "--short-len", 64, "--long-len", ROW, "-q",
    )  # fmt: skip
    ds = datasets.load_dataset(str(folder / "out"), "long", split="train")
    ds = ds.sort("num_tokens", reverse=True).select(range(2))
    assert min(ds["num_tokens"]) > 128 and min(len(s) for s in ds["seq_lengths"]) > 1
    return ds


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_file=str(DEMO), eos_token="<|endoftext|>", pad_token="<|pad|>"
    )


@pytest.fixture(scope="module")
def models(tokenizer: PreTrainedTokenizerFast) -> dict[str, LlamaForCausalLM]:
    """The same seeded weights on each kernel (the flash one through transformers' dispatch)."""
    with reference_flash() as flash:
        built = {
            impl: tiny_llama(len(tokenizer), impl, max_positions=2 * ROW) for impl in IMPLS[:2]
        }
        built["flash"] = tiny_llama(len(tokenizer), flash, max_positions=2 * ROW)
        yield built


@pytest.fixture(scope="module")
def alone(
    rows: datasets.Dataset, models: dict[str, LlamaForCausalLM]
) -> list[tuple[np.ndarray, list[tuple[int, int, torch.Tensor]]]]:
    """Per packcli row: its input_ids and each document's (start, end, logits run alone)."""
    found = []
    with torch.no_grad():
        for row in rows:
            ids = np.asarray(row["input_ids"])
            cu = cu_seqlens_from_lengths(row["seq_lengths"]).tolist()
            docs = []
            for a, b in itertools.pairwise(cu):
                x = torch.tensor(ids[a:b])[None]
                docs.append((a, b, models["sdpa"](input_ids=x, use_cache=False).logits[0]))
            found.append((ids, docs))
    return found


def locate(batch_ids: np.ndarray, ids: np.ndarray) -> tuple[int, int] | None:
    """(batch row, offset) where a packcli row's tokens stand whole in the batch, if anywhere."""
    for r, hay in enumerate(batch_ids):
        if hay.size < ids.size:
            continue
        windows = np.lib.stride_tricks.sliding_window_view(hay, ids.size)
        hits = np.flatnonzero((windows == ids).all(axis=1))
        if hits.size:
            return r, int(hits[0])
    return None


def exact(batch: dict[str, Any], model: LlamaForCausalLM, alone: list) -> bool:
    """Whether the batch trains what each document alone would: whole rows, the logits of
    every document as if alone, and exactly each document's own targets."""
    batch_ids = batch["input_ids"].numpy()
    labels = batch["labels"].numpy()
    inputs = {k: v for k, v in batch.items() if k not in ("seq_roles", "seq_spans")}
    try:
        with torch.no_grad():
            logits = model(**inputs, use_cache=False).logits
    except (RuntimeError, ValueError, IndexError):  # a layout this kernel cannot take
        return False
    want_trained = 0
    for ids, docs in alone:
        where = locate(batch_ids, ids)
        if where is None:
            continue  # not in this batch, or cut: the target count below tells
        r, off = where
        for a, b, reference in docs:
            if (logits[r, off + a : off + b] - reference).abs().max().item() > TOL:
                return False
            want = ids[a:b].copy()
            want[0] = IGNORE_INDEX  # a document's first token is no one's target
            got = labels[r, off + a : off + b]
            if off + a == 0:  # the first column is never a target after the shift
                got, want = got[1:], want[1:]
            if not np.array_equal(got, want):
                return False
            want_trained += int((want != IGNORE_INDEX).sum())
    return want_trained > 0 and want_trained == int((labels[:, 1:] != IGNORE_INDEX).sum())


GRID = list(
    itertools.product([False, True], [False, True], [None, 128, 512], [True, False], COLLATORS)
)


@pytest.mark.parametrize("batch_size", [2, 1])
@pytest.mark.parametrize(("packing", "padding_free", "max_length", "remove", "collator"), GRID)
def test_check_sft_config_matches_trl(
    packing: bool,
    padding_free: bool,
    max_length: int | None,
    remove: bool,
    collator: str | None,
    batch_size: int,
    rows: datasets.Dataset,
    tokenizer: PreTrainedTokenizerFast,
    models: dict[str, LlamaForCausalLM],
    alone: list,
    tmp_path: Path,
) -> None:
    args = trl.SFTConfig(
        output_dir=str(tmp_path / "ckpt"), report_to=[], use_cpu=True, save_strategy="no",
        bf16=False, activation_checkpointing=False, packing=packing, padding_free=padding_free,
        max_length=max_length, remove_unused_columns=remove,
        per_device_train_batch_size=batch_size,
    )  # fmt: skip
    data_collator = None if collator is None else PackedCollator(mode=collator)
    verdicts = {
        impl: sft_config_verdict(
            args, data_collator, attn_implementation=impl, train_dataset=rows
        ).verdict
        for impl in ("sdpa", "eager", "flash_attention_2")
    }
    try:
        trainer = trl.SFTTrainer(
            model=tiny_llama(len(tokenizer), max_positions=2 * ROW), args=args,
            train_dataset=rows, processing_class=tokenizer, data_collator=data_collator,
        )  # fmt: skip
    except ValueError:
        assert set(verdicts.values()) == {"refused"}
        return
    try:
        batch = next(iter(trainer.get_train_dataloader()))
    except ValueError as refused:  # PackedCollator stops at a row TRL cut
        assert "max_length=None" in str(refused)
        assert set(verdicts.values()) == {"wrong"}
        return
    flattened = batch["input_ids"].shape[0] == 1 and batch_size > 1
    for impl, verdict in zip(IMPLS, verdicts.values(), strict=True):
        observed = "wrong" if not exact(batch, models[impl], alone) else "ok"
        if observed == "ok" and flattened and impl != "flash":
            observed = "slow"
        assert verdict == observed, impl


def test_check_sft_config_raises_warns_and_passes(
    rows: datasets.Dataset, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def config(**kwargs: Any) -> Any:
        return trl.SFTConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[], **kwargs)

    recipe = config(padding_free=False, max_length=None, remove_unused_columns=False)
    for impl in ("sdpa", "eager", "flash_attention_2", "flash_attention_3"):
        mode = collator_mode_for(impl)
        assert mode == ("flash" if "flash" in impl else "position_ids")
        check_sft_config(recipe, PackedCollator(mode=mode), attn_implementation=impl)
    with pytest.raises(ValueError, match="custom data_collator with padding_free=True"):
        check_sft_config(config(padding_free=True, max_length=None), PackedCollator(mode="flash"))
    with pytest.raises(ValueError, match="only for one row"):
        check_sft_config(
            recipe, PackedCollator(mode="position_ids"), attn_implementation="flash_attention_2"
        )
    with pytest.raises(ValueError, match="max_length=1024 cuts"):
        check_sft_config(config(max_length=1024), PackedCollator(mode="position_ids"))
    # A max_length no row exceeds cuts nothing, which only the rows can tell.
    check_sft_config(
        config(max_length=ROW), PackedCollator(mode="position_ids"), train_dataset=rows
    )
    with caplog.at_level(logging.WARNING, logger="packcli.collate"):
        check_sft_config(config(padding_free=True, max_length=None), attn_implementation="sdpa")
    assert "total x total" in caplog.text
