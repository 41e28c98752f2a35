"""Loss normalisation: packed batches reproduce unpacked training under both conventions.

* ``"token"``: the summed loss over every trained token of the optimizer step divided by the
  number of those tokens (HF ``Trainer`` and TRL's default, through ``num_items_in_batch``);
* ``"sequence"``: the mean over the step's documents of each document's token-mean.

Exact weights on hand-made batches, then on a tiny random Llama (float32, sdpa and eager,
every collator mode): the loss and the gradients of a step of two packed micro-batches
(gradient accumulation) equal those computed from every document run alone, and the
negative controls (a naive accumulation loop, the other convention) differ. Last, HF
``Trainer`` itself: one SGD step with gradient accumulation moves the weights by exactly the
unpacked gradient, token-normalised with the plain ``Trainer``, sequence-normalised with
``PackedLossMixin``.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from tiny_models import GRAD_RTOL, IMPLS, MARGIN, MODES, VOCAB, tiny_llama
from transformers import LlamaForCausalLM

from packcli.collate import (
    PackedCollator,
    PackedLossMixin,
    count_loss_items,
    loss_weights,
    model_inputs,
    packed_loss,
)

LOSS_RTOL = 1e-5


# The tiny models' matrices run on one torch thread (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("one_torch_thread")


# --- exact weights ---------------------------------------------------------------------------

ROWS: list[dict[str, Any]] = [
    {"input_ids": [1, 2, 3, 4, 5], "seq_lengths": [3, 2], "labels": [1, 2, 3, 4, 5]},
    {"input_ids": [6, 7, 8, 9], "seq_lengths": [4], "labels": [-100, -100, 8, 9]},
]


def test_weights_exact_flash() -> None:
    token = PackedCollator(mode="flash", loss_normalization="token")(ROWS)
    assert token["labels"].tolist() == [[-100, 2, 3, -100, 5, -100, -100, 8, 9]]
    assert token["loss_weights"].tolist() == [[0, 1, 1, 0, 1, 0, 0, 1, 1]]
    assert token["loss_weights"].dtype == torch.float32
    seq = PackedCollator(mode="flash", loss_normalization="sequence")(ROWS)
    assert seq["loss_weights"].tolist() == [[0, 0.5, 0.5, 0, 1, 0, 0, 0.5, 0.5]]
    assert count_loss_items([token]) == 5 and count_loss_items([seq]) == 3
    assert count_loss_items([token, token]) == 10  # the accumulated step


@pytest.mark.parametrize("mode", ["position_ids", "mask4d"])
def test_weights_exact_padded(mode: str) -> None:
    seq = PackedCollator(mode=mode, loss_normalization="sequence")(ROWS)
    assert seq["loss_weights"].tolist() == [[0, 0.5, 0.5, 0, 1], [0, 0, 0.5, 0.5, 0]]
    token = PackedCollator(mode=mode, loss_normalization="token")(ROWS)
    assert token["loss_weights"].tolist() == [[0, 1, 1, 0, 1], [0, 0, 1, 1, 0]]


def test_weights_of_a_trl_padding_free_batch() -> None:
    """TRL pads position_ids with 0: every pad token is a one-token segment without loss."""
    batch = {
        "labels": torch.tensor([[-100, 2, 3, -100, 5, -100, -100]]),
        "position_ids": torch.tensor([[0, 1, 2, 0, 1, 0, 0]]),
    }
    assert loss_weights(batch, "sequence").tolist() == [[0, 0.5, 0.5, 0, 1, 0, 0]]


def test_without_the_option_nothing_changes_and_errors_say_what_to_do() -> None:
    assert "loss_weights" not in PackedCollator(mode="flash")(ROWS)
    with pytest.raises(ValueError, match="loss_normalization must be one of token, sequence"):
        PackedCollator(mode="flash", loss_normalization="mean")  # type: ignore[arg-type]
    batch = PackedCollator(mode="flash")(ROWS)
    with pytest.raises(ValueError, match="no loss_weights"):
        packed_loss(torch.zeros(1, 9, 4), batch)
    with pytest.raises(ValueError, match="do not match labels"):
        packed_loss(torch.zeros(1, 8, 4), {**batch, "loss_weights": torch.ones(1, 9)})
    assert "loss_normalization='sequence'" in repr(
        PackedCollator(mode="flash", loss_normalization="sequence")
    )


# --- the proof on a tiny model ---------------------------------------------------------------

Document = tuple[list[int], list[int]]  # input_ids, labels (unshifted, -100 = no loss)


@pytest.fixture(scope="module")
def documents() -> list[Document]:
    """Documents of very different lengths (so the two conventions differ), some with a
    masked prompt (chat-like) and one with no trained token at all."""
    rng = random.Random(3)
    docs = []
    for i in range(14):
        n = rng.choice([2, 3, 5, 9, 17, 30])
        ids = [rng.randrange(3, VOCAB) for _ in range(n)]
        masked = rng.randrange(n) if i % 3 == 0 else 0
        docs.append((ids, [-100] * masked + ids[masked:]))
    docs.append(([4, 5, 6], [-100, -100, -100]))  # prompt only: no loss under either convention
    return docs


@pytest.fixture(scope="module")
def micro_batches(documents: list[Document]) -> list[list[dict[str, Any]]]:
    """Two micro-batches of two rows each, with unequal token counts."""
    rows: list[dict[str, Any]] = []
    groups = [documents[0:3], documents[3:8], documents[8:10], documents[10:]]
    for group in groups:
        rows.append(
            {
                "input_ids": [t for ids, _ in group for t in ids],
                "labels": [t for _, labels in group for t in labels],
                "seq_lengths": [len(ids) for ids, _ in group],
            }
        )
    return [rows[:2], rows[2:]]


def build_model(impl: str = "sdpa") -> LlamaForCausalLM:
    return tiny_llama(VOCAB, impl, max_positions=128)


@pytest.fixture(scope="module")
def models() -> dict[str, LlamaForCausalLM]:
    return {impl: build_model(impl) for impl in IMPLS}


def flat_grads(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm())


def unpacked_step(
    model: LlamaForCausalLM, documents: list[Document], normalization: str
) -> tuple[float, torch.Tensor]:
    """Loss and gradient of one step over all documents, each run alone."""
    sums, counts = [], []
    for ids, labels in documents:
        logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
        targets = torch.tensor(labels[1:])
        sums.append(F.cross_entropy(logits[:-1], targets, ignore_index=-100, reduction="sum"))
        counts.append(int((targets != -100).sum()))
    if normalization == "token":
        loss = torch.stack(sums).sum() / sum(counts)
    else:
        trained = [s / n for s, n in zip(sums, counts, strict=True) if n > 0]
        loss = torch.stack(trained).mean()
    model.zero_grad(set_to_none=True)
    loss.backward()
    grads = flat_grads(model)
    model.zero_grad(set_to_none=True)
    return loss.item(), grads


@pytest.fixture(scope="module")
def unpacked(models: dict, documents: list[Document]) -> dict[tuple[str, str], tuple]:
    return {
        (impl, how): unpacked_step(models[impl], documents, how)
        for impl in IMPLS
        for how in ("token", "sequence")
    }


def packed_step(
    model: LlamaForCausalLM, micro_batches: list, mode: str, normalization: str
) -> tuple[float, torch.Tensor]:
    """Gradient accumulation over packed micro-batches, each loss divided by the step's
    count of items."""
    collate = PackedCollator(mode=mode, loss_normalization=normalization)  # type: ignore[arg-type]
    batches = [collate(rows) for rows in micro_batches]
    n_items = count_loss_items(batches)
    model.zero_grad(set_to_none=True)
    total = 0.0
    for batch in batches:
        logits = model(**model_inputs(batch, labels=False), use_cache=False).logits
        loss = packed_loss(logits, batch, n_items)
        loss.backward()
        total += loss.item()
    grads = flat_grads(model)
    model.zero_grad(set_to_none=True)
    return total, grads


@pytest.mark.parametrize("normalization", ["token", "sequence"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("impl", IMPLS)
def test_packed_accumulated_step_equals_unpacked(
    impl: str, mode: str, normalization: str, models: dict, micro_batches: list, unpacked: dict
) -> None:
    want_loss, want_grads = unpacked[(impl, normalization)]
    loss, grads = packed_step(models[impl], micro_batches, mode, normalization)
    assert abs(loss - want_loss) <= LOSS_RTOL * abs(want_loss)
    assert relative(grads, want_grads) <= GRAD_RTOL
    # Negative control: the other convention is a different step on these documents.
    other = unpacked[(impl, "sequence" if normalization == "token" else "token")]
    assert relative(grads, other[1]) > MARGIN


@pytest.mark.parametrize("impl", IMPLS)
def test_negative_control_naive_accumulation_differs(
    impl: str, models: dict, micro_batches: list, unpacked: dict
) -> None:
    """Averaging each micro-batch's own mean loss (a loop without num_items_in_batch) weighs
    the tokens of the smaller micro-batch more: neither convention."""
    model = models[impl]
    collate = PackedCollator(mode="position_ids")
    model.zero_grad(set_to_none=True)
    for rows in micro_batches:
        (model(**collate(rows), use_cache=False).loss / len(micro_batches)).backward()
    grads = flat_grads(model)
    model.zero_grad(set_to_none=True)
    for how in ("token", "sequence"):
        assert relative(grads, unpacked[(impl, how)][1]) > MARGIN, how


def test_model_loss_with_num_items_is_the_token_convention(
    models: dict, micro_batches: list, unpacked: dict
) -> None:
    """What Trainer does for a model that accepts loss kwargs: the model's own loss with
    num_items_in_batch = trained tokens of the step (labels[..., 1:] != -100) is exact for
    packed rows, because the collator's -100 at every segment start keeps shift and count
    within documents."""
    model = models["sdpa"]
    batches = [PackedCollator(mode="flash")(rows) for rows in micro_batches]
    n_items = sum(int((b["labels"][..., 1:] != -100).sum()) for b in batches)
    model.zero_grad(set_to_none=True)
    for batch in batches:
        model(**batch, num_items_in_batch=n_items, use_cache=False).loss.backward()
    grads = flat_grads(model)
    model.zero_grad(set_to_none=True)
    assert relative(grads, unpacked[("sdpa", "token")][1]) <= GRAD_RTOL


# --- HF Trainer --------------------------------------------------------------------------------


def trainer_update(
    micro_batches: list, tmp_path: Path, collator: PackedCollator, mixin: bool
) -> torch.Tensor:
    """-(weights after - before) of one Trainer step of plain SGD with lr 1, no clipping, two
    accumulated micro-batches of two rows: exactly the step's gradient."""
    pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate")
    import datasets
    from transformers import Trainer, TrainingArguments

    base: type = type("PackedTrainer", (PackedLossMixin, Trainer), {}) if mixin else Trainer
    rows = [row for batch in micro_batches for row in batch]
    args = TrainingArguments(
        output_dir=str(tmp_path / "ckpt"),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        max_steps=1,
        optim="sgd",
        learning_rate=1.0,
        lr_scheduler_type="constant",
        max_grad_norm=0.0,
        remove_unused_columns=False,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
    )
    model = build_model("sdpa")
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    trainer = base(
        model=model,
        args=args,
        train_dataset=datasets.Dataset.from_list(rows),
        data_collator=collator,
    )
    trainer.train()
    assert trainer.state.global_step == 1
    after = torch.cat([p.detach().flatten() for p in model.parameters()])
    return before - after


def test_trainer_default_is_the_token_convention(
    micro_batches: list, unpacked: dict, tmp_path: Path
) -> None:
    update = trainer_update(micro_batches, tmp_path, PackedCollator(mode="position_ids"), False)
    assert relative(update, unpacked[("sdpa", "token")][1]) <= GRAD_RTOL


def test_trainer_with_mixin_gives_the_sequence_convention(
    micro_batches: list, unpacked: dict, tmp_path: Path
) -> None:
    collate = PackedCollator(mode="position_ids", loss_normalization="sequence")
    update = trainer_update(micro_batches, tmp_path, collate, True)
    assert relative(update, unpacked[("sdpa", "sequence")][1]) <= GRAD_RTOL
    # Negative control, and why the mixin is needed: the plain Trainer calls model(**batch),
    # which silently drops loss_weights, and so trains the token convention.
    plain = trainer_update(micro_batches, tmp_path / "plain", collate, False)
    assert relative(plain, unpacked[("sdpa", "sequence")][1]) > MARGIN
    assert relative(plain, unpacked[("sdpa", "token")][1]) <= GRAD_RTOL


def test_trainer_with_mixin_token_convention(
    micro_batches: list, unpacked: dict, tmp_path: Path
) -> None:
    collate = PackedCollator(mode="flash", loss_normalization="token")
    update = trainer_update(micro_batches, tmp_path, collate, True)
    assert relative(update, unpacked[("sdpa", "token")][1]) <= GRAD_RTOL
