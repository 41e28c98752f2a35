"""Preference rows (``seq_roles``) through ``PackedCollator``, ``segment_logps`` and
``preference_pairs``: exact tensors on hand-made rows, then the proof on a tiny random Llama
(float32, sdpa and eager, every collator mode) that

* every segment's summed log-probability from the packed rows equals that sequence run alone
  (<= 1e-5 relative);
* a DPO loss (sigmoid, beta 0.1, a second random model as reference) from the packed rows
  equals the loss from the pairs run alone, and so do the policy's gradients;
* negative control: the same rows without boundaries (one causal sequence per row) differ.

Rows are built here as ``packcli pack --format preference`` writes them (``write.py``
``PREFERENCE_ROW_SCHEMA``): a pair is two adjacent segments of one row, prompt+chosen (role 1)
then prompt+rejected (role 2), labels -100 on the prompt and on every segment's first token.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from tiny_models import GRAD_RTOL, IMPLS, MARGIN, MODES, VOCAB, tiny_llama
from transformers import LlamaForCausalLM

from packcli.collate import (
    PackedCollator,
    model_inputs,
    preference_pairs,
    segment_logps,
)

LOGP_RTOL = 1e-5
BETA = 0.1


# The tiny models' matrices run on one torch thread (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("one_torch_thread")


# --- hand-made rows: exact tensors ----------------------------------------------------------

# Row 0: a pair (3 + 3 tokens) then a document (2); row 1: a document (2).
ROWS: list[dict[str, Any]] = [
    {
        "input_ids": [5, 6, 7, 5, 6, 8, 9, 10],
        "seq_lengths": [3, 3, 2],
        "labels": [-100, -100, 7, -100, -100, 8, -100, 10],
        "seq_roles": [1, 2, 0],
    },
    {"input_ids": [11, 12], "seq_lengths": [2], "labels": [-100, 12], "seq_roles": [0]},
]


def test_flash_passes_roles_and_spans_through() -> None:
    batch = PackedCollator(mode="flash")(ROWS)
    assert batch["seq_roles"].tolist() == [1, 2, 0, 0]
    assert batch["seq_roles"].dtype == torch.int64
    assert batch["seq_spans"].tolist() == [[0, 0, 3], [0, 3, 6], [0, 6, 8], [0, 8, 10]]
    assert preference_pairs(batch)[0].tolist() == [0]
    assert preference_pairs(batch)[1].tolist() == [1]


@pytest.mark.parametrize("mode", ["position_ids", "mask4d"])
def test_padded_modes_give_spans_per_row(mode: str) -> None:
    batch = PackedCollator(mode=mode)(ROWS)
    assert batch["seq_roles"].tolist() == [1, 2, 0, 0]
    # Padding of row 1 (columns 2..7) is not a segment of its own here.
    assert batch["seq_spans"].tolist() == [[0, 0, 3], [0, 3, 6], [0, 6, 8], [1, 0, 2]]


@pytest.mark.parametrize("mode", MODES)
def test_rows_without_roles_give_the_same_batch_as_before(mode: str) -> None:
    plain = [{k: v for k, v in r.items() if k != "seq_roles"} for r in ROWS]
    with_roles = PackedCollator(mode=mode)(ROWS)
    without = PackedCollator(mode=mode)(plain)
    assert set(with_roles) - set(without) == {"seq_roles", "seq_spans"}
    for key, value in without.items():
        same = (
            torch.equal(value, with_roles[key])
            if torch.is_tensor(value)
            else value == with_roles[key]
        )
        assert same, key
    # One row without the column among rows with it: its segments are ordinary documents.
    mixed = PackedCollator(mode=mode)([ROWS[0], plain[1]])
    assert mixed["seq_roles"].tolist() == [1, 2, 0, 0]


def test_model_inputs_strip_the_loss_keys() -> None:
    batch = PackedCollator(mode="flash", loss_normalization="token")(ROWS)
    assert {"seq_roles", "seq_spans", "loss_weights"} <= set(batch)
    kept = model_inputs(batch)
    assert not {"seq_roles", "seq_spans", "loss_weights"} & set(kept) and "labels" in kept
    assert "labels" not in model_inputs(batch, labels=False)


def test_bad_roles_are_refused() -> None:
    collate = PackedCollator(mode="flash")
    with pytest.raises(ValueError, match="seq_roles has 2 entries but the row has 3 segments"):
        collate([{**ROWS[0], "seq_roles": [1, 2]}])
    with pytest.raises(ValueError, match=r"must be 0 \(document\), 1 \(chosen\) or 2"):
        collate([{**ROWS[0], "seq_roles": [1, 3, 0]}])
    # Rejected before chosen, or a chosen with no rejected: not pairs.
    for roles in ([2, 1, 0], [1, 0, 0], [1, 0, 2]):
        batch = collate([{**ROWS[0], "seq_roles": roles}])
        with pytest.raises(ValueError, match="do not form pairs"):
            preference_pairs(batch)
    # A pair whose halves sit in two rows (packcli never writes that).
    split = [
        {"input_ids": [1, 2, 3], "seq_lengths": [3], "seq_roles": [1]},
        {"input_ids": [1, 2, 4], "seq_lengths": [3], "seq_roles": [2]},
    ]
    with pytest.raises(ValueError, match="different rows"):
        preference_pairs(PackedCollator(mode="position_ids")(split))
    with pytest.raises(ValueError, match="no seq_spans"):
        segment_logps(torch.zeros(1, 2, 3), {"labels": torch.zeros(1, 2, dtype=torch.long)})
    with pytest.raises(ValueError, match="no seq_roles"):
        preference_pairs({})


# --- the proof on a tiny model --------------------------------------------------------------

Sequence = tuple[list[int], list[int]]  # (input_ids, labels) of one segment


def make_pair(rng: random.Random) -> tuple[Sequence, Sequence]:
    """prompt+chosen and prompt+rejected; labels -100 on the prompt (and the first token)."""
    prompt = [rng.randrange(3, VOCAB) for _ in range(rng.randint(2, 9))]
    out = []
    for _ in range(2):
        response = [rng.randrange(3, VOCAB) for _ in range(rng.randint(1, 12))]
        out.append((prompt + response, [-100] * len(prompt) + response))
    return out[0], out[1]


def make_document(rng: random.Random) -> Sequence:
    ids = [rng.randrange(3, VOCAB) for _ in range(rng.randint(2, 14))]
    return ids, [-100, *ids[1:]]


@pytest.fixture(scope="module")
def packed() -> tuple[list[dict[str, Any]], list[Sequence], list[int]]:
    """Rows of pairs and ordinary documents, of unequal lengths (so padded modes pad), and
    the segments they hold, in order, with their roles."""
    rng = random.Random(7)
    layout = [["pair", "doc", "pair"], ["pair", "pair"], ["doc", "pair", "doc", "pair"]]
    rows, segments, roles = [], [], []
    for plan in layout:
        row_segments, row_roles = [], []
        for kind in plan:
            if kind == "pair":
                row_segments += make_pair(rng)
                row_roles += [1, 2]
            else:
                row_segments.append(make_document(rng))
                row_roles.append(0)
        rows.append(
            {
                "input_ids": [t for ids, _ in row_segments for t in ids],
                "labels": [t for _, labels in row_segments for t in labels],
                "seq_lengths": [len(ids) for ids, _ in row_segments],
                "seq_roles": row_roles,
            }
        )
        segments += row_segments
        roles += row_roles
    assert len({len(r["input_ids"]) for r in rows}) == len(rows)  # unequal: padding
    return rows, segments, roles


def build_model(impl: str, seed: int) -> LlamaForCausalLM:
    return tiny_llama(VOCAB, impl, seed=seed, max_positions=128)


@pytest.fixture(scope="module")
def models() -> dict[tuple[str, str], LlamaForCausalLM]:
    """Policy (seed 0) and reference (seed 1), per attention implementation."""
    return {
        (impl, name): build_model(impl, seed)
        for impl in IMPLS
        for name, seed in (("policy", 0), ("reference", 1))
    }


def alone_logp(model: LlamaForCausalLM, sequence: Sequence) -> torch.Tensor:
    """Summed log-prob of a sequence's trained tokens, run alone (the unpacked reference)."""
    ids, labels = sequence
    logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
    logps = F.log_softmax(logits[:-1].float(), dim=-1)
    targets = torch.tensor(labels[1:])
    keep = targets != -100
    return logps[keep].gather(-1, targets[keep, None]).sum()


def dpo_loss(
    policy: torch.Tensor, reference: torch.Tensor, chosen: torch.Tensor, rejected: torch.Tensor
) -> torch.Tensor:
    """TRL's sigmoid DPO loss, from per-sequence log-probs."""
    margin = (policy[chosen] - reference[chosen]) - (policy[rejected] - reference[rejected])
    return -F.logsigmoid(BETA * margin).mean()


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm())


def grads(model: LlamaForCausalLM, loss: torch.Tensor) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    loss.backward()
    flat = torch.cat([p.grad.flatten() for p in model.parameters()])
    model.zero_grad(set_to_none=True)
    return flat


@pytest.fixture(scope="module")
def unpacked(models: dict, packed: tuple) -> dict[str, tuple[torch.Tensor, ...]]:
    """Per impl: every segment's log-prob under the policy, alone, and the policy gradient
    of the DPO loss computed from the pairs run alone."""
    _, segments, roles = packed
    chosen = torch.tensor([i for i, r in enumerate(roles) if r == 1])
    out = {}
    for impl in IMPLS:
        policy, reference = models[(impl, "policy")], models[(impl, "reference")]
        with torch.no_grad():
            ref = torch.stack([alone_logp(reference, s) for s in segments])
        logps = torch.stack([alone_logp(policy, s) for s in segments])
        loss = dpo_loss(logps, ref, chosen, chosen + 1)
        out[impl] = (logps.detach(), ref, loss.detach(), grads(policy, loss))
    return out


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("impl", IMPLS)
def test_packed_dpo_equals_unpacked(
    impl: str, mode: str, models: dict, packed: tuple, unpacked: dict
) -> None:
    rows, _, roles = packed
    policy, reference = models[(impl, "policy")], models[(impl, "reference")]
    want_logps, _, want_loss, want_grads = unpacked[impl]

    batch = PackedCollator(mode=mode)(rows)
    assert batch["seq_roles"].tolist() == roles
    chosen, rejected = preference_pairs(batch)
    assert torch.equal(batch["seq_roles"][chosen], torch.ones_like(chosen))
    with torch.no_grad():
        ref = segment_logps(reference(**model_inputs(batch), use_cache=False).logits, batch)
    logps = segment_logps(policy(**model_inputs(batch), use_cache=False).logits, batch)

    # Every segment, chosen, rejected and ordinary, as if run alone.
    assert torch.allclose(logps.detach(), want_logps, rtol=LOGP_RTOL, atol=0)
    loss = dpo_loss(logps, ref, chosen, rejected)
    assert abs(loss.item() - want_loss.item()) <= LOGP_RTOL * abs(want_loss.item())
    assert relative(grads(policy, loss), want_grads) <= GRAD_RTOL


@pytest.mark.parametrize("impl", IMPLS)
def test_average_is_the_mean_over_trained_tokens(impl: str, models: dict, packed: tuple) -> None:
    rows, segments, _ = packed
    batch = PackedCollator(mode="flash")(rows)
    with torch.no_grad():
        logits = models[(impl, "policy")](**model_inputs(batch), use_cache=False).logits
    sums = segment_logps(logits, batch)
    means = segment_logps(logits, batch, average=True)
    counts = torch.tensor([sum(t != -100 for t in labels[1:]) for _, labels in segments])
    assert torch.allclose(means, sums / counts, rtol=1e-6, atol=0)


@pytest.mark.parametrize("impl", IMPLS)
def test_negative_control_without_boundaries_differs(
    impl: str, models: dict, packed: tuple, unpacked: dict
) -> None:
    """The same rows as plain causal sequences (positions 0..n-1, one segment per row): the
    chosen and rejected of a pair attend to each other, and both checks above fail."""
    rows, _, _ = packed
    policy, reference = models[(impl, "policy")], models[(impl, "reference")]
    want_logps, _, want_loss, want_grads = unpacked[impl]
    batch = PackedCollator(mode="position_ids")(rows)
    plain = model_inputs(batch)
    plain["position_ids"] = torch.arange(batch["input_ids"].shape[1]).expand_as(batch["input_ids"])
    # Padding sits at the end of a row, after every real token, so causal attention never
    # lets a real token see it: the only change is that documents see each other.
    with torch.no_grad():
        ref = segment_logps(reference(**plain, use_cache=False).logits, batch)
    logps = segment_logps(policy(**plain, use_cache=False).logits, batch)
    assert relative(logps.detach(), want_logps) > MARGIN
    chosen, rejected = preference_pairs(batch)
    loss = dpo_loss(logps, ref, chosen, rejected)
    assert abs(loss.item() - want_loss.item()) > 100 * LOGP_RTOL * abs(want_loss.item())
    assert relative(grads(policy, loss), want_grads) > MARGIN
    assert math.isfinite(loss.item())


@pytest.mark.parametrize("mode", MODES)
def test_real_preference_output_trains_like_its_pairs_alone(
    mode: str, toy_tokenizer_path: Any, tmp_path: Any
) -> None:
    """The proof on a real ``packcli pack --format preference`` output (not hand-made rows):
    every segment's log-prob from the packed rows equals that sequence alone, pairs are
    found, and the DPO loss equals the unpacked one."""

    import datasets
    from corpora import packed_string_pairs
    from tokenizers import Tokenizer

    out = packed_string_pairs(tmp_path, toy_tokenizer_path, 30, seed=4)
    rows = list(datasets.load_dataset(str(out), "long", split="train"))
    vocab = Tokenizer.from_file(str(toy_tokenizer_path)).get_vocab_size()
    policy = tiny_llama(vocab, "sdpa", seed=1, max_positions=256)
    reference = tiny_llama(vocab, "sdpa", seed=2, max_positions=256)
    sequences, roles = [], []
    for row in rows:
        start = 0
        for n, role in zip(row["seq_lengths"], row["seq_roles"], strict=True):
            sequences.append(
                (row["input_ids"][start : start + n], row["labels"][start : start + n])
            )
            roles.append(role)
            start += n
    assert roles.count(1) == roles.count(2) == 30
    batch = PackedCollator(mode=mode)(rows)
    chosen, rejected = preference_pairs(batch)
    with torch.no_grad():
        want = torch.stack([alone_logp(policy, s) for s in sequences])
        want_ref = torch.stack([alone_logp(reference, s) for s in sequences])
        got = segment_logps(policy(**model_inputs(batch), use_cache=False).logits, batch)
        ref = segment_logps(reference(**model_inputs(batch), use_cache=False).logits, batch)
    assert torch.allclose(got, want, rtol=LOGP_RTOL, atol=0)
    want_chosen = torch.tensor([i for i, r in enumerate(roles) if r == 1])
    assert torch.equal(chosen, want_chosen) and torch.equal(rejected, want_chosen + 1)
    loss = dpo_loss(got, ref, chosen, rejected)
    want_loss = dpo_loss(want, want_ref, want_chosen, want_chosen + 1)
    assert abs(loss.item() - want_loss.item()) <= LOGP_RTOL * abs(want_loss.item())
