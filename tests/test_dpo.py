"""TRL's ``DPOTrainer`` on ``packcli pack --format preference`` output (TRL >= 1.16).

The oracle for ``unpack_pairs`` is the input file: every pair comes back as the tokens of its
prompt and responses, in order. Then ``DPOTrainer`` (with ``PackedDPOMixin``) trains a tiny
Llama for two steps on them, on exactly those tokens; handed the packed rows directly, plain
``DPOTrainer`` fails with ``KeyError: 'chosen'`` (the trap) and packcli says what to do.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import datasets
import pytest
import torch
from corpora import packed_string_pairs
from tiny_models import tiny_llama
from transformers import PreTrainedTokenizerFast

from packcli.dpo import PAIR_COLUMNS, PackedDPOMixin, check_dpo_dataset, unpack_pairs

trl = pytest.importorskip("trl", minversion="1.16", reason="TRL is in the dev extra")
pytest.importorskip("accelerate", reason="TRL's trainers need accelerate")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def pairs_out(toy_tokenizer_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return packed_string_pairs(tmp_path_factory.mktemp("dpo"), toy_tokenizer_path, 12, seed=4)


@pytest.fixture(scope="module")
def tokenizer(toy_tokenizer_path: Path) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_file=str(toy_tokenizer_path), eos_token="<|endoftext|>"
    )


@pytest.fixture(scope="module")
def rows(pairs_out: Path) -> datasets.Dataset:
    """The long config: every pair once (each config packs all of them, at its own length)."""
    return datasets.load_dataset(str(pairs_out), "long", split="train")


def test_unpack_pairs_gives_every_pair_of_the_input_once(
    rows: datasets.Dataset, pairs_out: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    unpacked = unpack_pairs(rows)
    corpus = [json.loads(line) for line in (pairs_out.parent / "pairs.jsonl").open()]
    assert (
        len(unpacked["prompt_ids"])
        == len(corpus)
        == sum(list(r).count(1) for r in rows["seq_roles"])
    )
    got = sorted(
        (tokenizer.decode(p), tokenizer.decode(c), tokenizer.decode(r))
        for p, c, r in zip(*(unpacked[name] for name in PAIR_COLUMNS), strict=True)
    )
    want = sorted((x["prompt"], x["chosen"], x["rejected"]) for x in corpus)
    assert got == want


def test_unpack_pairs_refuses_rows_that_are_not_pairs(rows: datasets.Dataset) -> None:
    row = dict(rows[0])
    with pytest.raises(ValueError, match="no seq_roles"):
        unpack_pairs([{k: v for k, v in row.items() if k != "seq_roles"}])
    roles = list(row["seq_roles"])
    first = roles.index(1)
    roles[first + 1] = 0
    with pytest.raises(ValueError, match="not followed by its rejected"):
        unpack_pairs([{**row, "seq_roles": roles}])
    labels = list(row["labels"])
    labels[0] = row["input_ids"][0]  # the prompt's first token trained: no prompt left
    with pytest.raises(ValueError, match=r"start with the prompt|untrained tokens inside"):
        unpack_pairs([{**row, "labels": labels}])


def dpo_config(tmp_path: Path, **kwargs: object) -> object:
    return trl.DPOConfig(
        output_dir=str(tmp_path / "ckpt"), report_to=[], use_cpu=True, save_strategy="no",
        bf16=False, per_device_train_batch_size=2, max_steps=2, logging_steps=1, **kwargs,
    )  # fmt: skip


class PackedDPOTrainer(PackedDPOMixin, trl.DPOTrainer):
    pass


def test_dpo_trainer_trains_on_unpacked_pairs_with_packcli_tokens(
    rows: datasets.Dataset, tokenizer: PreTrainedTokenizerFast, tmp_path: Path
) -> None:
    pairs = datasets.Dataset.from_dict(unpack_pairs(rows))
    model = tiny_llama(len(tokenizer), initializer_range=0.02, train=True)
    before = model.model.embed_tokens.weight.detach().clone()
    trainer = PackedDPOTrainer(
        model=model, ref_model=copy.deepcopy(model).eval(), args=dpo_config(tmp_path),
        train_dataset=pairs, processing_class=tokenizer,
    )  # fmt: skip
    assert trainer.train_dataset["chosen_ids"] == pairs["chosen_ids"]  # not re-tokenized
    seen = []
    collate = trainer.data_collator

    def recording(examples: list[dict]) -> dict:
        seen.append(examples)
        return collate(examples)

    trainer.data_collator = recording
    result = trainer.train()
    assert trainer.state.global_step == 2 and torch.isfinite(torch.tensor(result.training_loss))
    assert not torch.equal(before, model.model.embed_tokens.weight)  # it trained
    known = {tuple(p + c) for p, c in zip(pairs["prompt_ids"], pairs["chosen_ids"], strict=True)}
    assert seen and all(tuple(e["prompt_ids"] + e["chosen_ids"]) in known for b in seen for e in b)


def test_packed_rows_given_to_dpo_trainer_say_what_to_do(
    rows: datasets.Dataset, tokenizer: PreTrainedTokenizerFast, tmp_path: Path
) -> None:
    model = tiny_llama(len(tokenizer), train=True)
    reference = copy.deepcopy(model).eval()  # else TRL loads one by the model's name
    with pytest.raises(KeyError, match="chosen"):  # TRL 1.16's own message: the trap
        trl.DPOTrainer(
            model=model, ref_model=reference, args=dpo_config(tmp_path), train_dataset=rows,
            processing_class=tokenizer,
        )  # fmt: skip
    with pytest.raises(ValueError, match=r"unpack_pairs\(rows\)"):
        check_dpo_dataset(rows)
    with pytest.raises(ValueError, match=r"unpack_pairs\(rows\)"):
        PackedDPOTrainer(
            model=model, ref_model=reference, args=dpo_config(tmp_path), train_dataset=rows,
            processing_class=tokenizer,
        )  # fmt: skip
    check_dpo_dataset(datasets.Dataset.from_dict(unpack_pairs(rows)))
