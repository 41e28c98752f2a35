"""Proof that packed rows train exactly like separate documents.

Rows come from the real ``packcli pack`` on a generated corpus; the model is a tiny randomly
initialised ``LlamaForCausalLM`` built from a config (no download), float32 on CPU, with
sdpa and eager attention. For every collator mode, against every document run alone:

* the logits of every segment agree to 1e-4 (max abs);
* the mean loss of the packed batch equals the token-weighted mean of the separate losses;
* the gradients of one step (sum of per-document losses) agree to 1e-4 relative;
* negative controls: the same rows as plain sequences (no boundaries), a boolean 4D mask on
  eager, and position_ids with the model's cache on all differ by a clear margin, so the
  comparisons above can fail.

flash-attn is not installed on CPU; its varlen kwargs are proven by a reference varlen
attention registered in transformers' ``AttentionInterface`` that reads only
``cu_seq_lens_q/k`` (the flash batch's ``position_ids`` also make sdpa/eager exact).
The end also runs HF ``Trainer`` with the collator and executes every python snippet of
``docs/training.md``.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import datasets
import pytest
import torch
import torch.nn.functional as F
from corpora import packed_string_pairs, write_corpus
from tiny_models import IMPLS, LOSS_TOL, MARGIN, MODES, TOL, tiny_llama
from tokenizers import Tokenizer
from transformers import AttentionInterface, LlamaForCausalLM
from typer.testing import CliRunner

from packcli.cli import app
from packcli.collate import (
    PackedCollator,
    cu_seqlens_from_lengths,
    position_ids_from_lengths,
    segment_ids_from_lengths,
)

DOCS = Path(__file__).resolve().parent.parent / "docs" / "training.md"

Segment = tuple[int, int, int]  # (row, start, end) within the row


# --- fixtures ------------------------------------------------------------------------------


# The tiny models' matrices run on one torch thread (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def packed_dir(toy_tokenizer_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """46 documents (42 short, 4 long at --short-len 64 --long-len 256) packed by the CLI."""
    folder = tmp_path_factory.mktemp("equivalence")
    counts = [2 + (7 * i) % 29 for i in range(40)] + [40 + 13 * i for i in range(6)]
    write_corpus(folder / "corpus.jsonl", counts, seed=3)
    out = folder / "out"
    args = ["pack", str(folder / "corpus.jsonl"), "-t", str(toy_tokenizer_path), "-o", str(out)]
    result = CliRunner().invoke(app, [*args, "--short-len", "64", "--long-len", "256", "-q"])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def rows(packed_dir: Path) -> dict[str, list[dict[str, Any]]]:
    loaded = {
        c: list(datasets.load_dataset(str(packed_dir), c, split="train")) for c in ("long", "short")
    }
    assert max(len(r["seq_lengths"]) for r in loaded["long"]) > 1  # really packed
    assert len({r["num_tokens"] for r in loaded["long"]}) > 1  # rows of unequal length: padding
    return loaded


@pytest.fixture(scope="module")
def vocab_size(toy_tokenizer_path: Path) -> int:
    return Tokenizer.from_file(str(toy_tokenizer_path)).get_vocab_size()


def build_model(vocab_size: int, impl: str) -> LlamaForCausalLM:
    return tiny_llama(vocab_size, impl)


@pytest.fixture(scope="module")
def models(vocab_size: int) -> dict[str, LlamaForCausalLM]:
    return {impl: build_model(vocab_size, impl) for impl in IMPLS}


def segments(batch_rows: list[dict[str, Any]], mode: str) -> Iterator[tuple[Segment, Segment]]:
    """Each document's real tokens as (row, start, end) in the rows and in the collated
    batch's layout (CP padding, ``seq_pad``, left out)."""
    offset = 0
    for r, row in enumerate(batch_rows):
        cu = cu_seqlens_from_lengths(row["seq_lengths"]).tolist()
        pads = row.get("seq_pad") or [0] * (len(cu) - 1)
        for (a, b), pad in zip(itertools.pairwise(cu), pads, strict=True):
            end = b - pad
            where = (0, offset + a, offset + end) if mode == "flash" else (r, a, end)
            yield (r, a, end), where
        offset += cu[-1]


def run_alone(
    models: dict[str, LlamaForCausalLM], rows: dict[str, list[dict[str, Any]]]
) -> dict[tuple[str, str], dict[Segment, tuple[torch.Tensor, torch.Tensor]]]:
    """Every document's real tokens run alone: (logits, loss) by (impl, config) and (row,
    start, end)."""
    out: dict[tuple[str, str], dict[Segment, tuple[torch.Tensor, torch.Tensor]]] = {}
    with torch.no_grad():
        for impl, model in models.items():
            for config, batch_rows in rows.items():
                found = {}
                for (r, a, b), _ in segments(batch_rows, "position_ids"):
                    ids = torch.tensor(batch_rows[r]["input_ids"][a:b])[None]
                    result = model(input_ids=ids, labels=ids, use_cache=False)
                    found[(r, a, b)] = (result.logits[0], result.loss)
                out[(impl, config)] = found
    return out


@pytest.fixture(scope="module")
def separate(
    models: dict[str, LlamaForCausalLM], rows: dict[str, list[dict[str, Any]]]
) -> dict[tuple[str, str], dict[Segment, tuple[torch.Tensor, torch.Tensor]]]:
    return run_alone(models, rows)


def max_segment_diff(
    logits: torch.Tensor,
    batch_rows: list[dict[str, Any]],
    mode: str,
    reference: dict[Segment, tuple[torch.Tensor, torch.Tensor]],
) -> float:
    return max(
        (logits[w[0], w[1] : w[2]] - reference[s][0]).abs().max().item()
        for s, w in segments(batch_rows, mode)
    )


def token_weighted_loss(reference: dict[Segment, tuple[torch.Tensor, torch.Tensor]]) -> float:
    # A document of n tokens has n - 1 targets (its first token is never predicted).
    weights = {s: s[2] - s[1] - 1 for s in reference}
    total = sum(reference[s][1].item() * w for s, w in weights.items() if w > 0)
    return total / sum(weights.values())


def assert_as_separate(
    model: LlamaForCausalLM,
    batch: dict[str, torch.Tensor],
    batch_rows: list[dict[str, Any]],
    mode: str,
    reference: dict[Segment, tuple[torch.Tensor, torch.Tensor]],
) -> None:
    """The packed ``batch`` through ``model``: each document's logits within ``TOL`` of its
    own run alone (``reference``), the batch's loss the documents' token-weighted mean."""
    with torch.no_grad():
        result = model(**batch, use_cache=False)
    assert max_segment_diff(result.logits, batch_rows, mode, reference) <= TOL
    assert abs(result.loss.item() - token_weighted_loss(reference)) <= LOSS_TOL


# --- logits and loss -----------------------------------------------------------------------


@pytest.mark.parametrize("config", ["long", "short"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("impl", IMPLS)
def test_packed_logits_and_loss_equal_separate(
    impl: str, mode: str, config: str, models: dict, rows: dict, separate: dict
) -> None:
    batch_rows = rows[config]
    batch = PackedCollator(mode=mode, pad_token_id=0)(batch_rows)
    assert_as_separate(models[impl], batch, batch_rows, mode, separate[(impl, config)])


@pytest.mark.parametrize("impl", IMPLS)
def test_negative_control_plain_concatenation_differs(
    impl: str, models: dict, rows: dict, separate: dict
) -> None:
    """The same rows with no boundaries (plain positions, one causal mask per row, labels
    crossing documents) fail both checks above by a clear margin."""
    batch_rows = rows["long"]
    reference = separate[(impl, "long")]
    logits = []
    losses, targets = 0.0, 0
    with torch.no_grad():
        for row in batch_rows:
            ids = torch.tensor(row["input_ids"])[None]
            result = models[impl](input_ids=ids, labels=ids, use_cache=False)
            logits.append(F.pad(result.logits, (0, 0, 0, 256 - ids.shape[1])))
            losses += result.loss.item() * (ids.shape[1] - 1)
            targets += ids.shape[1] - 1
    diff = max_segment_diff(torch.cat(logits), batch_rows, "position_ids", reference)
    assert diff > MARGIN, diff
    assert abs(losses / targets - token_weighted_loss(reference)) > 100 * LOSS_TOL


# --- gradients -----------------------------------------------------------------------------


def gradients(model: LlamaForCausalLM, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return grads


@pytest.fixture(scope="module")
def separate_grads(models: dict, rows: dict) -> dict[str, dict[str, torch.Tensor]]:
    """Gradient of the sum of per-document losses (each a sum over its targets)."""
    out = {}
    for impl, model in models.items():
        total = torch.zeros(())
        for (r, a, b), _ in segments(rows["long"], "position_ids"):
            ids = torch.tensor(rows["long"][r]["input_ids"][a:b])[None]
            if b - a > 1:
                total = total + model(input_ids=ids, labels=ids, use_cache=False).loss * (b - a - 1)
        out[impl] = gradients(model, total)
    return out


def relative_diff(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    num = math.sqrt(sum((got[k] - want[k]).pow(2).sum().item() for k in want))
    return num / math.sqrt(sum(w.pow(2).sum().item() for w in want.values()))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("impl", IMPLS)
def test_packed_gradients_equal_separate(
    impl: str, mode: str, models: dict, rows: dict, separate_grads: dict
) -> None:
    model = models[impl]
    batch = PackedCollator(mode=mode)(rows["long"])
    n_targets = int((batch["labels"][..., 1:] != -100).sum())
    packed = gradients(model, model(**batch, use_cache=False).loss * n_targets)
    want = separate_grads[impl]
    assert relative_diff(packed, want) <= TOL
    for name in want:  # and tensor by tensor, so no small tensor hides in the global norm
        assert relative_diff({name: packed[name]}, {name: want[name]}) <= TOL, name

    # Negative control: the same rows without boundaries give clearly different gradients.
    plain = torch.zeros(())
    for row in rows["long"]:
        ids = torch.tensor(row["input_ids"])[None]
        plain = plain + model(input_ids=ids, labels=ids, use_cache=False).loss * (ids.shape[1] - 1)
    assert relative_diff(gradients(model, plain), want) > MARGIN


# --- flash-attention varlen kwargs, through a reference varlen attention ----------------------


def varlen_reference_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    cu_seq_lens_q: torch.Tensor | None = None,
    cu_seq_lens_k: torch.Tensor | None = None,
    max_length_q: int | None = None,
    max_length_k: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """What flash_attn_varlen_func computes, in plain torch: causal attention within each
    [cu[i], cu[i+1]) block. It reads only cu_seq_lens, never position_ids."""
    assert attention_mask is None and query.shape[0] == 1
    assert cu_seq_lens_q is not None and torch.equal(cu_seq_lens_q, cu_seq_lens_k)
    assert max_length_q == max_length_k == int(cu_seq_lens_q.diff().max())
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    cu = cu_seq_lens_q.tolist()
    blocks = [
        F.scaled_dot_product_attention(
            query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], is_causal=True, scale=scaling
        )
        for a, b in itertools.pairwise(cu)
    ]
    return torch.cat(blocks, dim=2).transpose(1, 2).contiguous(), None


def test_flash_kwargs_drive_varlen_attention(vocab_size: int, rows: dict, separate: dict) -> None:
    AttentionInterface.register("packcli_varlen_reference", varlen_reference_attention)
    model = build_model(vocab_size, "packcli_varlen_reference")
    batch_rows = rows["long"]
    batch = PackedCollator(mode="flash", pad_to_multiple_of=64)(batch_rows)
    reference = separate[("sdpa", "long")]
    with torch.no_grad():
        logits = model(**batch, use_cache=False).logits
        assert max_segment_diff(logits, batch_rows, "flash", reference) <= TOL
        # Negative control: one block spanning everything (no boundaries) differs.
        whole = torch.tensor([0, batch["input_ids"].shape[1]], dtype=torch.int32)
        n = int(whole[1])
        wrong = {**batch, "cu_seq_lens_q": whole, "cu_seq_lens_k": whole}
        wrong |= {"max_length_q": n, "max_length_k": n}
        logits = model(**wrong, use_cache=False).logits
        assert max_segment_diff(logits, batch_rows, "flash", reference) > MARGIN


# --- the transformers traps the collator and the docs steer around ---------------------------


def test_boolean_4d_mask_is_misread_by_eager(models: dict, rows: dict, separate: dict) -> None:
    """Why the collator emits a float mask: eager *adds* the 4D mask to the scores, so a
    boolean mask becomes biases 1/0 and masks nothing; sdpa reads the same boolean right."""
    batch_rows = rows["long"]
    batch = PackedCollator(mode="mask4d")(batch_rows)
    as_bool = {**batch, "attention_mask": batch["attention_mask"] == 0}
    with torch.no_grad():
        for impl, expect_exact in (("sdpa", True), ("eager", False)):
            logits = models[impl](**as_bool, use_cache=False).logits
            diff = max_segment_diff(logits, batch_rows, "mask4d", separate[(impl, "long")])
            assert (diff <= TOL) if expect_exact else (diff > MARGIN), (impl, diff)


@pytest.mark.parametrize("impl", IMPLS)
def test_position_ids_need_the_cache_off(
    impl: str, models: dict, rows: dict, separate: dict
) -> None:
    """config.use_cache is True by default; with a cache transformers skips the packed
    sequence detection and position_ids alone no longer separate documents. The 4D mask does
    not depend on it. (HF Trainer sets config.use_cache = args.use_cache, False by default.)"""
    model, batch_rows = models[impl], rows["long"]
    assert model.config.use_cache is True
    reference = separate[(impl, "long")]
    with torch.no_grad():
        by_position = model(**PackedCollator(mode="position_ids")(batch_rows)).logits
        by_mask = model(**PackedCollator(mode="mask4d")(batch_rows)).logits
    assert max_segment_diff(by_position, batch_rows, "position_ids", reference) > MARGIN
    assert max_segment_diff(by_mask, batch_rows, "mask4d", reference) <= TOL


def test_helpers_match_stored_columns(rows: dict) -> None:
    for row in rows["long"] + rows["short"]:
        assert segment_ids_from_lengths(row["seq_lengths"]).tolist() == row["segment_ids"]
        positions = position_ids_from_lengths(row["seq_lengths"])
        assert len(positions) == row["num_tokens"] and (positions == 0).sum() == len(
            row["seq_lengths"]
        )


# --- HF Trainer and the docs -----------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_hf_trainer_runs_with_the_collator(
    mode: str, packed_dir: Path, vocab_size: int, tmp_path: Path
) -> None:
    pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate")
    from transformers import Trainer, TrainingArguments

    train = datasets.load_dataset(str(packed_dir), "long", split="train")
    args = TrainingArguments(
        output_dir=str(tmp_path / "ckpt"),
        per_device_train_batch_size=2,
        max_steps=2,
        remove_unused_columns=False,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_steps=1,
    )
    model = build_model(vocab_size, "sdpa")
    before = model.model.embed_tokens.weight.detach().clone()
    trainer = Trainer(
        model=model, args=args, train_dataset=train, data_collator=PackedCollator(mode=mode)
    )
    result = trainer.train()
    assert trainer.state.global_step == 2
    assert math.isfinite(result.training_loss)
    assert not torch.equal(before, model.model.embed_tokens.weight)  # it trained
    assert model.config.use_cache is False  # what keeps position_ids packing effective


def python_snippets(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


def test_docs_snippets_run(
    packed_dir: Path,
    vocab_size: int,
    toy_tokenizer_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every ```python block of docs/training.md runs, in order, in one namespace holding
    `out` (a packcli output folder), `pairs_out` (preference rows laid out like a packcli
    output), `model` (a causal LM on sdpa) and `tokenizer`, as the guide says.
    A block whose first line is `# requires: NAME` is skipped when NAME is not installed."""
    from transformers import PreTrainedTokenizerFast

    snippets = python_snippets(DOCS.read_text(encoding="utf-8"))
    assert len(snippets) >= 9
    monkeypatch.chdir(tmp_path)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(toy_tokenizer_path), eos_token="<|endoftext|>"
    )
    namespace: dict[str, Any] = {
        "out": str(packed_dir),
        "pairs_out": str(packed_string_pairs(tmp_path, toy_tokenizer_path, 40, seed=3)),
        "model": build_model(vocab_size, "sdpa"),
        "tokenizer": tokenizer,
    }
    ran = 0
    for snippet in snippets:
        first = snippet.splitlines()[0]
        if first.startswith("# requires:"):
            names = first.removeprefix("# requires:").split()
            if any(_missing(name) for name in names):
                continue
        exec(compile(snippet, f"{DOCS.name}:snippet", "exec"), namespace)
        ran += 1
    assert ran >= 7


def _missing(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return True
    return False


# --- context-parallel padding (--cp-size) ---------------------------------------------------

CP_SIZE = 4  # segments padded to multiples of 8


@pytest.fixture(scope="module")
def cp_rows(
    toy_tokenizer_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, list[dict[str, Any]]]:
    """The corpus of ``packed_dir`` packed by the CLI with ``--cp-size 4``."""
    folder = tmp_path_factory.mktemp("equivalence-cp")
    counts = [2 + (7 * i) % 29 for i in range(40)] + [40 + 13 * i for i in range(6)]
    write_corpus(folder / "corpus.jsonl", counts, seed=3)
    out = folder / "out"
    args = ["pack", str(folder / "corpus.jsonl"), "-t", str(toy_tokenizer_path), "-o", str(out)]
    args += ["--short-len", "64", "--long-len", "256", "--cp-size", str(CP_SIZE), "-q"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    loaded = {c: list(datasets.load_dataset(str(out), c, split="train")) for c in ("long", "short")}
    pads = [p for rows in loaded.values() for r in rows for p in r["seq_pad"]]
    assert sum(pads) > 0 and max(pads) < 2 * CP_SIZE  # really padded, minimally
    return loaded


@pytest.fixture(scope="module")
def cp_separate(
    models: dict[str, LlamaForCausalLM], cp_rows: dict[str, list[dict[str, Any]]]
) -> dict[tuple[str, str], dict[Segment, tuple[torch.Tensor, torch.Tensor]]]:
    """Every document's real tokens run alone, with no padding anywhere."""
    return run_alone(models, cp_rows)


@pytest.mark.parametrize("config", ["long", "short"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("impl", IMPLS)
def test_cp_padded_logits_and_loss_equal_separate(
    impl: str, mode: str, config: str, models: dict, cp_rows: dict, cp_separate: dict
) -> None:
    """Rows padded for context parallelism: each document's logits are those of it alone,
    and the loss over the batch (padding at label -100) is the separate documents' mean."""
    batch_rows = cp_rows[config]
    batch = PackedCollator(mode=mode, pad_token_id=0, pad_to_multiple_of=2 * CP_SIZE)(batch_rows)
    assert_as_separate(models[impl], batch, batch_rows, mode, cp_separate[(impl, config)])


def test_cp_padding_trained_would_change_the_loss(models: dict, cp_rows: dict) -> None:
    """Negative control: the same batch with the padding's labels restored to its tokens
    (what a reader that ignores ``seq_pad`` and ``labels`` would train) has another loss."""
    batch_rows = cp_rows["long"]
    batch = PackedCollator(mode="position_ids")(batch_rows)
    trained_pad = {**batch, "labels": batch["input_ids"].clone()}
    starts = batch["position_ids"] == 0
    trained_pad["labels"][starts] = -100
    with torch.no_grad():
        right = models["sdpa"](**batch, use_cache=False).loss.item()
        wrong = models["sdpa"](**trained_pad, use_cache=False).loss.item()
    assert abs(right - wrong) > 100 * LOSS_TOL


def thd_reference_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    thd: dict[str, Any] | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """What Transformer Engine's THD attention with padding computes, in plain torch, from
    ``te_thd_kwargs`` only: sequence i is the tokens ``[padded[i], padded[i] + real_i)``,
    causal within itself; every other position (the padding) gets a zero output."""
    assert attention_mask is None and query.shape[0] == 1 and thd is not None
    assert thd["qkv_format"] == "thd" and thd["attn_mask_type"] == "padding_causal"
    real = thd["cu_seqlens_q"].diff().tolist()
    starts = thd["cu_seqlens_q_padded"][:-1].tolist()
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    out = torch.zeros_like(query)
    for a, n in zip(starts, real, strict=True):
        out[:, :, a : a + n] = F.scaled_dot_product_attention(
            query[:, :, a : a + n],
            key[:, :, a : a + n],
            value[:, :, a : a + n],
            is_causal=True,
            scale=scaling,
        )
    return out.transpose(1, 2).contiguous(), None


def test_te_thd_boundaries_drive_padded_attention(
    vocab_size: int, cp_rows: dict, cp_separate: dict
) -> None:
    """The collator's ``cu_seqlens`` / ``cu_seqlens_padded`` (as ``te_thd_kwargs`` hands them
    to TE) give every document its own logits through an attention that reads nothing else;
    swapping the two (real lengths taken as offsets) does not."""
    from packcli.collate import te_thd_kwargs

    AttentionInterface.register("packcli_thd_reference", thd_reference_attention)
    model = build_model(vocab_size, "packcli_thd_reference")
    batch_rows = cp_rows["long"]
    batch = PackedCollator(mode="flash", pad_to_multiple_of=2 * CP_SIZE)(batch_rows)
    thd = te_thd_kwargs(batch)
    assert thd["max_seqlen_q"] == int(thd["cu_seqlens_q_padded"].diff().max())
    assert not (thd["cu_seqlens_q_padded"].diff() % (2 * CP_SIZE)).any()  # TE's CP split
    forward = {k: batch[k] for k in ("input_ids", "position_ids")}
    reference = cp_separate[("sdpa", "long")]
    with torch.no_grad():
        logits = model(**forward, thd=thd, use_cache=False).logits
        assert max_segment_diff(logits, batch_rows, "flash", reference) <= TOL
        swapped = {**thd, "cu_seqlens_q_padded": thd["cu_seqlens_q"]}
        logits = model(**forward, thd=swapped, use_cache=False).logits
        assert max_segment_diff(logits, batch_rows, "flash", reference) > MARGIN
