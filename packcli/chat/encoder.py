"""The chat stage's encoders: rendered dialogues (or preference pairs) in, token ids,
labels and lengths out, with the length policy and ``--bos``/``--eos`` applied.

Why a stage apart from the text tokenizer (``packcli.tokenize.encode``): a dialogue is rendered
(Python, sandboxed) before it is tokenized, tokenizing needs character offsets for the loss
mask, and a dialogue is cut at turn boundaries, not at a token count. How the steps of a
batch overlap is ``packcli.chat.batches``. The template modules are imported on first use:
the pipeline imports this module on every run, text runs included.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field, fields
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Self

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from tokenizers import Tokenizer

from packcli.arrow_np import list_array, to_arrow
from packcli.names import IGNORE_INDEX, TrainOn
from packcli.read import DocBatch
from packcli.tokenize.encode import batch_to_record_batch
from packcli.tokenize.shards import CHAT_SHARD_SCHEMA, PREFERENCE_SHARD_SCHEMA

if TYPE_CHECKING:
    from packcli.chat.columns import LabelledTokens, RenderedColumns
    from packcli.chat.mask import EncodedDialogue
    from packcli.chat.offsets import FastOffsets, FlatTokens
    from packcli.chat.render_pool import RenderPool
    from packcli.chat.renderer import Rendered
    from packcli.chat.templates import ChatTemplate


@dataclass
class Counts:
    """A dataclass of counters (the report's chat and preference sections): ``add`` sums a
    batch's into the run's."""

    def add(self, other: Self) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


@dataclass
class ChatStats(Counts):
    """What the chat path removed before planning, for the report."""

    dialogues: int = 0
    no_trainable: int = 0  # dropped: no assistant token to train on
    no_trainable_tokens: int = 0
    truncated: int = 0  # cut after the last whole assistant turn that fits the long tier
    truncated_tokens: int = 0
    truncate_dropped: int = 0  # not even the first assistant turn fits
    truncate_dropped_tokens: int = 0
    # --bos/--eos on kept dialogues: added by packcli, or already rendered by the template.
    bos_added: int = 0
    bos_in_template: int = 0
    eos_added: int = 0
    eos_trained: int = 0  # of eos_added: the dialogue ends with an assistant turn
    eos_in_template: int = 0
    # Dialogues HF encoded with offsets although a fast backend was in use (its tokens did
    # not spell the rendered text byte for byte; packcli/chat/offsets.py).
    hf_offsets: int = 0


@dataclass
class EncodedRecords:
    """A batch of chat records (dialogues or preference pairs) encoded, in input order."""

    ids: npt.NDArray[np.int32]  # every record's tokens, one record after another
    labels: npt.NDArray[np.int32]  # beside ids: the token to predict, or -100 (no loss)
    lengths: np.ndarray  # tokens per record; 0 = not trainable (an empty document)
    stats: Counts  # what the length policy and the separators did, for the report
    failures: list[tuple[int, str]]  # (index, reason): records the template refused
    chosen_lengths: np.ndarray | None = None  # preference: the length of each first sequence

    def record_batch(self, batch: DocBatch) -> pa.RecordBatch:
        """The shard rows of ``batch``: the text path's columns, the labels, and for pairs
        the chosen lengths."""
        base = batch_to_record_batch(batch, self.ids, self.lengths)
        offsets = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int32)
        columns = [*base.columns, list_array(offsets, self.labels, pa.int32())]
        if self.chosen_lengths is None:
            return pa.RecordBatch.from_arrays(columns, schema=CHAT_SHARD_SCHEMA)
        columns.append(to_arrow(self.chosen_lengths, pa.int32()))
        return pa.RecordBatch.from_arrays(columns, schema=PREFERENCE_SHARD_SCHEMA)


@dataclass(eq=False)
class TemplateEncoder:
    """What the chat and preference encoders share: the tokenizer and the template they
    render with, the tokenizer config's special tokens (template variables), the length
    policy (``long_len``, ``overlong``), the token ids ``--bos``/``--eos`` add (None: add
    nothing), and ``fast``, the fast backend's ids with HF's character offsets derived from
    them (None: HF encodes with offsets).

    A batch goes through three steps, so ``packcli.chat.batches`` can overlap them: ``render``
    (Python: the template), ``tokens`` (the fast backend; may run on another thread while the
    next batch renders) and ``finish`` (HF where needed, masks, length policy, separators);
    ``__call__`` runs the three in this thread."""

    tokenizer: Tokenizer
    template: ChatTemplate | None
    _: KW_ONLY
    special_tokens: dict[str, str]
    long_len: int
    overlong: str
    bos: int | None = None
    eos: int | None = None
    fast: FastOffsets | None = field(default=None, init=False, repr=False)

    def using(self, fast: FastOffsets | None) -> Self:
        """This encoder with ids and offsets from a fast backend (None: HF's)."""
        other = copy.copy(self)
        other.fast = fast
        return other

    def fast_tokens(self, texts: list[str]) -> list[Any] | None:
        """Ids and offsets of ``texts`` from the fast backend (None per text it did not
        spell), or None without one: ``encode_rendered``'s ``tokens``."""
        return None if self.fast is None else self.fast(texts)

    @property
    def tokens_ahead(self) -> bool:
        """Whether ``tokens`` is worth a thread of its own (it does the fast backend's work)."""
        return False

    def tokens(self, rendering: Any) -> list[Any] | None:
        """The fast backend's tokens of a rendering, or None (``finish`` makes them)."""
        return None


@dataclass(eq=False)
class ChatEncoder(TemplateEncoder):
    """Dialogues in, token ids + labels out, with the length policy applied.

    Rendering is Python (sandboxed jinja, one dialogue at a time so a dialogue the template
    rejects can be reported by line), tokenizing one Rust ``encode_batch`` with offsets (the
    loss mask comes from character spans), or a fast backend with the offsets derived from
    its ids (``using``; packcli/chat/offsets.py). A dialogue that cannot be trained on is kept as
    an empty document (length 0) so document ids stay positions in the input; the plan drops
    empty documents and ``ChatStats`` counts them by reason.

    ``bos``/``eos`` (``--bos``/``--eos``, None = add nothing): BOS goes before the rendered
    dialogue, with label -100 (nothing predicts it); EOS goes after it, trained when the
    dialogue ends with an assistant message (the model learns to stop after its answer, as
    it will have to at inference) or with ``--train-on all``, and label -100 after a
    dialogue that ends with another role. Neither is added twice: a dialogue the template
    already starts with BOS (or ends with EOS) keeps its own. Both count in the lengths, so
    ``--overlong truncate`` keeps the last whole turn that fits with them, and the EOS then
    follows that turn (trained: the cut dialogue ends with an assistant turn).
    """

    template: ChatTemplate
    _: KW_ONLY
    train_on: TrainOn

    def rendered_texts(self, dialogues: list[Any]) -> list[str]:
        """The texts this encoder tokenizes for ``dialogues`` (those the template renders):
        the sample a fast backend is checked on."""
        return [r.text for _, r in self.render(dialogues)[0]]

    def render(self, dialogues: list[Any]) -> tuple[Rendering, list[tuple[int, str]]]:
        """``(index, Rendered)`` of the dialogues the template renders, and ``(index,
        reason)`` of those it refused (the caller applies the policy)."""
        from packcli.chat.renderer import render_dialogues

        failures: list[tuple[int, str]] = []
        rendered = render_dialogues(
            self.tokenizer,
            self.template,
            dialogues,
            self.special_tokens,
            now=RENDER_DATE,
            on_error=lambda index, exc: failures.append((index, str(exc))),
        )
        return rendered, failures

    def render_pool(self, workers: int) -> RenderPool:
        """Worker processes that render as ``render`` does (packcli/chat/render_pool.py)."""
        from packcli.chat.render_pool import RenderPool
        from packcli.chat.renderer import control_tokens_of

        controls = control_tokens_of(self.tokenizer)
        return RenderPool(self.template, self.special_tokens, controls, RENDER_DATE, workers)

    @property
    def tokens_ahead(self) -> bool:
        return self.fast is not None

    def __call__(self, dialogues: list[Any]) -> EncodedRecords:
        rendered, failures = self.render(dialogues)
        return self.finish(dialogues, rendered, self.tokens(rendered), failures)

    def tokens(self, rendering: Rendering) -> list[Any] | None:
        """``fast_tokens`` of a rendering: Rust and a compiled kernel, both without the
        GIL, so it can run while the next batch renders."""
        return self.fast_tokens([r.text for _, r in rendering])

    def finish(
        self,
        dialogues: list[Any],
        rendered: Rendering,
        tokens: list[Any] | None,
        failures: list[tuple[int, str]],
    ) -> EncodedRecords:
        """After rendering and the fast backend's tokens: HF encodes what has no tokens yet,
        then masks, length policy and separators."""
        return self._finish(
            len(dialogues), lambda i: _ends_with_answer(dialogues[i]), rendered, tokens, failures
        )

    def finish_columns(
        self,
        n: int,
        columns: RenderedColumns,
        tokens: LabelledTokens | FlatTokens | None,
        ends_with_answer: npt.NDArray[np.bool_],
    ) -> EncodedRecords:
        """``finish`` of a batch of ``n`` dialogues rendered on a worker (columns), with the
        fast backend's tokens (``tokens_columns``): labelled already when every text is
        spelled and there are no separators or truncation (then cut here by
        ``kept_columns``), else the same steps as ``finish``. ``ends_with_answer``: per
        dialogue, whether its last message is the assistant's (for ``--eos``)."""
        from packcli.chat.columns import LabelledTokens, kept_columns

        failures = list(columns.failures)
        if isinstance(tokens, LabelledTokens):  # made only when this encoder is plain
            ids, labels, lengths, dropped, dropped_tokens = kept_columns(n, columns, tokens)
            stats = ChatStats(dialogues=n, no_trainable=dropped, no_trainable_tokens=dropped_tokens)
            return EncodedRecords(ids, labels, lengths, stats, failures)
        per_text = tokens.per_text() if tokens is not None else None
        ends = ends_with_answer.tolist()
        return self._finish(n, ends.__getitem__, columns.rendered(), per_text, failures)

    @property
    def _plain(self) -> bool:
        """No separators and no truncation: a batch's labels are its records' own."""
        return self.bos is None and self.eos is None and self.overlong != "truncate"

    def tokens_columns(self, columns: RenderedColumns) -> LabelledTokens | FlatTokens | None:
        """The fast backend's tokens of a worker's rendering (None without one), labelled
        when ``finish_columns`` can use them so (``label_tokens``), else with their
        offsets; Rust and compiled kernels without the GIL, like ``tokens``."""
        if self.fast is None:
            return None
        if not self._plain:
            return self.fast.flat(columns.texts)
        from packcli.chat.columns import label_tokens

        ids, bounds = self.fast.encoder(columns.texts)
        labelled = label_tokens(self.fast.table, columns, ids, bounds, self.train_on)
        if labelled is not None:
            return labelled
        return self.fast.with_offsets(columns.texts, ids, bounds)  # HF encodes what is not spelled

    def _finish(
        self,
        n: int,
        ends_with_answer: Callable[[int], bool],
        rendered: Rendering,
        tokens: list[Any] | None,
        failures: list[tuple[int, str]],
    ) -> EncodedRecords:
        from packcli.chat.mask import encode_rendered

        encoded: list[EncodedDialogue | None] = [None] * n
        results = encode_rendered(
            self.tokenizer,
            [r for _, r in rendered],
            self.train_on,
            tokens=tokens,
        )
        for (index, _), result in zip(rendered, results, strict=True):
            encoded[index] = result
        stats = ChatStats(dialogues=n)
        if tokens is not None:
            stats.hf_offsets = sum(t is None for t in tokens)
        if self._plain:
            flat = _kept_flat(n, [i for i, _ in rendered], results, stats)
            if flat is not None:
                return EncodedRecords(*flat, stats, failures)
        ids, labels = [], []
        for index, e in enumerate(encoded):
            answer = ends_with_answer(index)
            if e is not None and e.n_trained == 0:
                stats.no_trainable += 1
                stats.no_trainable_tokens += len(e.ids)
                e = None
            elif (
                e is not None
                and self._length(e.ids) > self.long_len
                and self.overlong == "truncate"
            ):
                cut = self._truncate(e)
                # Tokens removed, counted as the plan counts them: with the separators.
                removed = self._length(e.ids) - (self._length(cut.ids) if cut else 0)
                if cut is None:
                    stats.truncate_dropped += 1
                    stats.truncate_dropped_tokens += removed
                else:
                    stats.truncated += 1
                    stats.truncated_tokens += removed
                    answer = True  # cut after an assistant turn
                e = cut
            if e is None:
                ids.append(_EMPTY)
                labels.append(_EMPTY)
                continue
            e_ids, e_labels = self._separate(e, answer, stats)
            ids.append(e_ids)
            labels.append(e_labels)
        return EncodedRecords(*flat_documents(ids, labels), stats, failures)

    def _adds(self, ids: np.ndarray) -> tuple[bool, bool]:
        """Whether BOS and EOS are to be added (not when the template wrote them)."""
        bos = self.bos is not None and not (len(ids) and ids[0] == self.bos)
        eos = self.eos is not None and not (len(ids) and ids[-1] == self.eos)
        return bos, eos

    def _length(self, ids: np.ndarray) -> int:
        return len(ids) + sum(self._adds(ids))

    def _truncate(self, e: EncodedDialogue) -> EncodedDialogue | None:
        """The last whole turn that fits ``long_len`` with the separators it will get."""
        from packcli.chat.mask import truncate_at_turns

        add_bos, _ = self._adds(e.ids)
        room = self.long_len - add_bos
        cut = truncate_at_turns(e, room)
        if cut is not None and len(cut.ids) + self._adds(cut.ids)[1] > room:
            cut = truncate_at_turns(e, room - 1)  # an earlier turn, and room for the EOS
        return cut

    def _separate(
        self, e: EncodedDialogue, ends_with_answer: bool, stats: ChatStats
    ) -> tuple[np.ndarray, np.ndarray]:
        """Token ids and labels with BOS/EOS added as the class docstring says."""
        add_bos, add_eos = self._adds(e.ids)
        ids, labels = e.ids, e.labels()
        if self.bos is not None:
            stats.bos_added += add_bos
            stats.bos_in_template += not add_bos
        if self.eos is not None:
            stats.eos_added += add_eos
            stats.eos_in_template += not add_eos
        if not (add_bos or add_eos):
            return ids, labels
        head = np.array([self.bos] if add_bos else [], dtype=np.int32)
        tail = np.array([self.eos] if add_eos else [], dtype=np.int32)
        trained = add_eos and (ends_with_answer or self.train_on == "all")
        stats.eos_trained += trained
        tail_labels = tail if trained else np.full(len(tail), IGNORE_INDEX, dtype=np.int32)
        return (
            np.concatenate([head, ids, tail]),
            np.concatenate([np.full(len(head), IGNORE_INDEX, dtype=np.int32), labels, tail_labels]),
        )


def _ends_with_answer(messages: list[Any]) -> bool:
    return bool(messages) and messages[-1].get("role") == "assistant"


# Templates that print today's date see this fixed date, so reruns are byte-identical.
RENDER_DATE = datetime(2025, 1, 1, tzinfo=UTC)
_EMPTY = np.zeros(0, dtype=np.int32)
Rendering = list[tuple[int, "Rendered"]]  # (index in the batch, rendered dialogue)


def _kept_flat(
    n: int, order: list[int], results: list[EncodedDialogue], stats: ChatStats
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``finish`` without separators or truncation, as whole-batch array operations: each
    dialogue's ids and labels, or nothing when it has no trained token (counted), in input
    order. Same arrays as the per-dialogue loop; None when the rendered dialogues are not in
    input order (the loop handles that)."""
    if any(b <= a for a, b in itertools.pairwise(order)):
        return None
    rendered = np.fromiter((len(e.ids) for e in results), np.int64, count=len(results))
    ids = np.concatenate([e.ids for e in results]) if results else _EMPTY
    mask = np.concatenate([e.mask for e in results]) if results else np.zeros(0, np.bool_)
    running = np.zeros(len(mask) + 1, dtype=np.int64)
    np.cumsum(mask, out=running[1:])
    ends = np.cumsum(rendered)
    kept = running[ends] - running[ends - rendered] > 0
    stats.no_trainable += int(len(kept) - kept.sum())
    stats.no_trainable_tokens += int(rendered[~kept].sum())
    tokens = np.repeat(kept, rendered)
    labels = np.where(mask, ids, IGNORE_INDEX).astype(np.int32)[tokens]
    lengths = np.zeros(n, dtype=np.int64)
    lengths[order] = np.where(kept, rendered, 0)
    return ids[tokens].astype(np.int32), labels, lengths


def flat_documents(
    ids: list[np.ndarray], labels: list[np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(ids, labels, lengths)``: per-document token ids and labels as the flat int32 arrays
    and the lengths a record batch is built from."""
    lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
    flat_ids = np.concatenate(ids).astype(np.int32) if ids else _EMPTY
    flat_labels = np.concatenate(labels).astype(np.int32) if labels else _EMPTY
    return flat_ids, flat_labels, lengths
