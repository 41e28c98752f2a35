"""Rendered dialogues in, token ids and loss masks out.

Token rule: a token is trained when any of its characters lies in a trained span (the rule
of transformers' ``assistant_masks``, so the masks agree token for token). Every trained
character is therefore in a trained token; a byte-level token that straddles a boundary,
such as ``"\\n "`` = the header's newline + the content's leading space, is trained.
Control-token text inside a message (a literal ``<|im_end|>``) is tokenized as that token,
as transformers does by default; the mask follows characters, so it is trained only inside
an assistant turn. The whole dialogue stays one sequence (one packed segment), so every
assistant turn is trained in one forward pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import numpy.typing as npt
from tokenizers import Encoding, Tokenizer

from packcli.chat.budget import DEFAULT_LIMITS, RenderLimits
from packcli.chat.offsets import pieces, token_turns
from packcli.chat.renderer import Rendered, render_dialogues
from packcli.chat.templates import ChatTemplate
from packcli.errors import require_one_of
from packcli.names import IGNORE_INDEX, TRAIN_ON, TrainOn


@dataclass(frozen=True, eq=False)
class EncodedDialogue:
    ids: npt.NDArray[np.int32]  # token ids of the rendered dialogue (no special tokens added)
    mask: npt.NDArray[np.bool_]  # per token: True = trained (label kept), False = label -100
    turns: npt.NDArray[np.int64]  # (n, 2): token range [start, end) of each assistant turn
    train_on: str

    @property
    def n_assistant_turns(self) -> int:
        """Assistant turns that are trained (0: nothing to learn, the pipeline drops it)."""
        if self.train_on == "last":
            return min(1, len(self.turns))
        return len(self.turns)

    @property
    def n_trained(self) -> int:
        return int(self.mask.sum())

    def labels(self) -> np.ndarray:
        """Token ids where trained, -100 elsewhere (the causal shift is the trainer's)."""
        return np.where(self.mask, self.ids, IGNORE_INDEX).astype(np.int32)


def _mask(n_tokens: int, turns: np.ndarray, train_on: str) -> np.ndarray:
    if train_on == "all":
        return np.ones(n_tokens, dtype=bool)
    mask = np.zeros(n_tokens, dtype=bool)
    chosen = turns[-1:] if train_on == "last" else turns
    for start, end in chosen:
        mask[start:end] = True
    return mask


def _masks(lengths: list[int], turns: list[np.ndarray], train_on: str) -> list[np.ndarray]:
    """``_mask`` of each dialogue of a batch, as views of one array (a few numpy calls per
    batch instead of per dialogue)."""
    if not lengths:
        return []
    bounds = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=bounds[1:])
    if train_on == "all":
        flat = np.ones(int(bounds[-1]), dtype=bool)
    else:
        chosen = [t[-1:] for t in turns] if train_on == "last" else turns
        counts = np.fromiter((len(t) for t in chosen), np.int64, count=len(chosen))
        ranges = np.concatenate(chosen) if counts.sum() else np.zeros((0, 2), np.int64)
        base = np.repeat(bounds[:-1], counts)
        delta = np.zeros(int(bounds[-1]) + 1, dtype=np.int64)
        np.add.at(delta, ranges[:, 0] + base, 1)
        np.add.at(delta, ranges[:, 1] + base, -1)
        flat = np.cumsum(delta[:-1]) > 0
    return pieces(flat, np.asarray(lengths, dtype=np.int64))


def _check_train_on(train_on: str) -> None:
    require_one_of("train_on", train_on, TRAIN_ON)


def _ids_offsets(encoding: Encoding) -> tuple[np.ndarray, np.ndarray]:
    return (
        np.asarray(encoding.ids, dtype=np.int32),
        np.asarray(encoding.offsets, dtype=np.int64).reshape(-1, 2),
    )


def encode_rendered(
    tokenizer: Tokenizer,
    rendered: Sequence[Rendered],
    train_on: TrainOn = "assistant",
    *,
    tokens: Sequence[tuple[np.ndarray, np.ndarray] | None] | None = None,
) -> list[EncodedDialogue]:
    """Tokenize rendered dialogues in one ``encode_batch`` (parallel, with offsets) and mask.

    ``tokens``: ids and HF's character offsets already known for some dialogues (None for
    the others; ``packcli.offsets.FastOffsets``); HF encodes only the rest."""
    _check_train_on(train_on)
    known = list(tokens) if tokens is not None else [None] * len(rendered)
    texts = [r.text for r, t in zip(rendered, known, strict=True) if t is None]
    encodings = iter(tokenizer.encode_batch(texts, add_special_tokens=False) if texts else ())
    pairs = [t if t is not None else _ids_offsets(next(encodings)) for t in known]
    spans = token_turns([t[1] for t in pairs], [r.assistant_spans for r in rendered])
    masks = _masks([len(t[0]) for t in pairs], spans, train_on)
    return [
        EncodedDialogue(ids, mask, turns, train_on)
        for (ids, _), turns, mask in zip(pairs, spans, masks, strict=True)
    ]


def encode_dialogues(
    tokenizer: Tokenizer,
    template: ChatTemplate,
    dialogues: Sequence[Sequence[Mapping[str, Any]]],
    train_on: TrainOn = "assistant",
    special_tokens: Mapping[str, str] | None = None,
    *,
    limits: RenderLimits = DEFAULT_LIMITS,
    now: datetime | None = None,
) -> list[EncodedDialogue]:
    """Render (Python) then tokenize (one Rust batch) validated dialogues.

    A dialogue the template rejects raises ``ChatFormatError`` with ``index`` set to its
    position; to skip such lines instead, ``render`` each one and call ``encode_rendered``.
    """
    _check_train_on(train_on)
    rendered = render_dialogues(
        tokenizer, template, dialogues, special_tokens, limits=limits, now=now
    )
    return encode_rendered(tokenizer, [r for _, r in rendered], train_on)


def encode_dialogue(
    tokenizer: Tokenizer,
    template: ChatTemplate,
    messages: Sequence[Mapping[str, Any]],
    train_on: TrainOn = "assistant",
    special_tokens: Mapping[str, str] | None = None,
    *,
    limits: RenderLimits = DEFAULT_LIMITS,
    now: datetime | None = None,
) -> EncodedDialogue:
    """One dialogue: token ids, loss mask and assistant turns (see the module docstring)."""
    return encode_dialogues(
        tokenizer, template, [messages], train_on, special_tokens, limits=limits, now=now
    )[0]


def truncate_at_turns(encoded: EncodedDialogue, max_len: int) -> EncodedDialogue | None:
    """``--overlong truncate`` for dialogues: keep the tokens up to the end of the last
    assistant turn that fits in ``max_len`` (its end-of-turn marker included), so no turn is
    cut in the middle; ``None`` when not even the first assistant turn fits.

    For the templates in use (prefix-stable ones), the kept tokens are what rendering the
    dialogue up to that turn would give, minus what the template writes after the marker
    (ChatML's newline). With ``train_on="last"`` the kept final turn becomes the trained one.
    """
    if len(encoded.ids) <= max_len:
        return encoded
    fits = int(np.searchsorted(encoded.turns[:, 1], max_len, side="right"))
    if fits == 0:
        return None
    cut = int(encoded.turns[fits - 1, 1])
    turns = encoded.turns[:fits]
    return EncodedDialogue(
        encoded.ids[:cut].copy(), _mask(cut, turns, encoded.train_on), turns, encoded.train_on
    )
