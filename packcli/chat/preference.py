"""Preference pairs (``--format preference``): TRL's record forms in, one document per pair out.

Why one document per pair: DPO-style losses compare a pair's two sequences (prompt+chosen,
prompt+rejected), so both must reach the model in the same row, next to each other, and
neither may be cut by the long tier. The planner already keeps a document whole and never
splits one of at most ``long_len`` tokens, so a pair is stored in the tokenized shards as ONE
document (the tokens of prompt+chosen followed by those of prompt+rejected, labels alongside)
plus ``chosen_len``, the length of its first sequence. The planner, which reads only lengths,
stays untouched and packs the pair as one item of the summed length; the writer emits it as
two segments (``packcli.write``), and ``packcli verify`` checks the pair invariants.

Input forms (TRL's DPOTrainer's; ``packcli.chat.validate.validate_pair`` makes every
prompt explicit):

* strings: no chat template; each sequence is the tokens of ``prompt + chosen`` (TRL's
  non-conversational path); every response token is trained (TRL's completion mask).
* messages: rendered with the chat template as ``--format chat`` does: the prompt with the
  generation prompt, and prompt + chosen, prompt + rejected as whole dialogues; the prompt's
  rendering must be the start of both (TRL refuses such a template too).

Tokens and labels: the rendered prompt+response text is tokenized in one piece (with
offsets, as ``--format chat``), which is what TRL's ``prompt_ids + (prompt+chosen ids)[len
(prompt_ids):]`` gives whenever the prompt's own tokens are the start of that tokenization.
The rare pair where a token crosses the prompt's end is tokenized as the prompt's tokens and
then the response's text alone (TRL keeps the joint tokens after ``len(prompt_ids)``, which
can drop or repeat characters there); the report counts them (``prompt_retokenized``). Either
way both sequences start with the same prompt tokens. Labels: -100 on the prompt and on
template tokens outside the response's assistant turns (the chat mask machinery, only the
turns after the prompt), the token id on the response's trained tokens.

Length policy (the pair's length is the sum of both sequences): a pair longer than
``long_len`` is dropped by the planner (``--overlong drop``, the default) or, with
``--overlong truncate``, both responses are cut to the same budget (the largest cap that
fits; a response shorter than the cap keeps all of its tokens), never the prompt. ``split``
is refused: a pair is never split.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from packcli.chat.encoder import (
    RENDER_DATE,
    Counts,
    EncodedRecords,
    TemplateEncoder,
    flat_documents,
)
from packcli.chat.mask import encode_rendered
from packcli.chat.renderer import Rendered, render_dialogues
from packcli.chat.templates import ChatTemplate
from packcli.chat.validate import SIDES
from packcli.names import IGNORE_INDEX


@dataclass
class PreferenceStats(Counts):
    """What the preference path did to the pairs before planning, for the report."""

    pairs: int = 0
    conversational: int = 0  # message lists (rendered with the chat template); else strings
    implicit_prompt: int = 0  # the prompt was extracted from chosen/rejected
    identical: int = 0  # kept pairs whose two sequences are the same tokens
    # The prompt's tokens were not the start of prompt+response tokenized together: the
    # response was tokenized on its own after them.
    prompt_retokenized: int = 0
    no_trainable: int = 0  # dropped: a side has no token to train on
    no_trainable_tokens: int = 0
    truncated: int = 0  # responses cut to fit long_len (--overlong truncate)
    truncated_tokens: int = 0
    truncate_dropped: int = 0  # not even one response token per side fits after the prompts
    truncate_dropped_tokens: int = 0
    bos_added: int = 0  # sequences given a BOS by --bos (a prompt that starts with it is kept)
    eos_added: int = 0  # sequences given a trained EOS by --eos (not when they end with it)
    # Texts HF encoded with offsets although a fast backend was in use (its tokens did not
    # spell the text byte for byte; packcli/chat/offsets.py).
    hf_offsets: int = 0


_EMPTY = np.zeros(0, dtype=np.int32)


def response_cap(budget: int, rc: int, rr: int) -> int:
    """The largest cap ``b`` with ``min(rc, b) + min(rr, b) <= budget`` (``budget >= 2``):
    both responses are cut to the same budget, and a shorter one keeps all of its tokens."""
    if rc + rr <= budget:
        return max(rc, rr)
    short = min(rc, rr)
    return budget // 2 if 2 * short >= budget else budget - short


@dataclass
class _Side:
    ids: npt.NDArray[np.int32]  # prompt tokens first
    mask: npt.NDArray[np.bool_]  # True = trained
    retokenized: bool = False  # the response was tokenized apart from the prompt


def _joint(prompt_ids: np.ndarray, ids: np.ndarray, mask: np.ndarray) -> _Side | None:
    """Prompt+response tokenized together, when the prompt's own tokens start it; else None."""
    n = len(prompt_ids)
    if len(ids) < n or not np.array_equal(ids[:n], prompt_ids):
        return None
    mask = mask.copy()
    mask[:n] = False  # the prompt is never trained, whatever a span touched
    return _Side(ids, mask)


@dataclass(eq=False)
class PreferenceEncoder(TemplateEncoder):
    """Pairs (``validate_pair``'s dicts) in; per pair one document (prompt+chosen tokens, then
    prompt+rejected tokens), its labels and ``chosen_len`` out, the length policy applied.

    A pair that cannot be used (template failure, no trained token, nothing fits) becomes an
    empty document, so document ids stay positions in the input; the plan drops empty
    documents and ``PreferenceStats`` counts them by reason.

    ``bos``/``eos`` (``--bos``/``--eos``, None = add nothing) as in ``--format chat``, for each
    sequence: BOS before it (part of the prompt, label -100) unless the prompt starts with it;
    EOS after it, trained, unless the sequence already ends with it.
    """

    # None: no template was found and none was asked for; then pairs of strings still work
    # and a conversational pair fails with ``template_missing``.
    template: ChatTemplate | None
    _: KW_ONLY
    template_missing: str = ""

    def rendered_texts(self, pairs: list[dict[str, Any]]) -> list[str]:
        """The texts this encoder tokenizes for ``pairs`` (prompts, prompt+chosen,
        prompt+rejected): the sample a fast backend is checked on."""
        texts, _ = self.render(pairs)
        return [r.text for group in texts for r in group]

    def render(self, pairs: list[dict[str, Any]]) -> tuple[list[list[Rendered]], list[Any]]:
        """Per pair: the prompt's text, then prompt+chosen and prompt+rejected with the
        character spans to train (empty for a pair that failed); and ``(index, reason)`` of
        the pairs that failed."""
        failed: dict[int, str] = {}
        texts = self._texts(pairs, failed)
        return texts, sorted(failed.items())

    # ``tokens`` stays the base's (None): ``finish`` asks the fast backend itself, in this
    # thread, since a response tokenized apart from its prompt needs it again, and the
    # backend is called from one thread at a time.

    def __call__(self, pairs: list[dict[str, Any]]) -> EncodedRecords:
        """The steps ``packcli.chat.batches`` takes, in this thread (verify's recheck)."""
        texts, failures = self.render(pairs)
        return self.finish(pairs, texts, self.tokens(texts), failures)

    def _encode(self, rendered: list[Rendered], stats: PreferenceStats) -> list[Any]:
        """``encode_rendered`` on the fast backend's ids and offsets when there is one."""
        tokens = self.fast_tokens([r.text for r in rendered])
        if tokens is not None:
            stats.hf_offsets += sum(t is None for t in tokens)
        return encode_rendered(self.tokenizer, rendered, "assistant", tokens=tokens)

    def finish(
        self,
        pairs: list[dict[str, Any]],
        texts: list[list[Rendered]],
        tokens: list[Any] | None,
        failures: list[tuple[int, str]],
    ) -> EncodedRecords:
        """Per pair one document (prompt+chosen tokens, then prompt+rejected tokens), its
        labels and ``chosen_lengths``, the length policy applied."""
        stats = PreferenceStats(pairs=len(pairs))
        stats.conversational = sum(isinstance(p["chosen"], list) for p in pairs)
        stats.implicit_prompt = sum(bool(p.get("implicit")) for p in pairs)
        failed = dict(failures)
        ok = [i for i in range(len(pairs)) if i not in failed]
        rendered = [r for i in ok for r in texts[i]]
        encoded = self._encode(rendered, stats)
        ids: list[np.ndarray] = [_EMPTY] * len(pairs)
        labels: list[np.ndarray] = [_EMPTY] * len(pairs)
        firsts = np.zeros(len(pairs), dtype=np.int64)
        for k, i in enumerate(ok):
            prompt, *sides = encoded[3 * k : 3 * k + 3]
            built = []
            for j, e in enumerate(sides):
                side = _joint(prompt.ids, e.ids, e.mask)
                if side is None:
                    side = self._retokenized(prompt.ids, texts[i][0], texts[i][1 + j], stats)
                built.append(side)
            stats.prompt_retokenized += any(side.retokenized for side in built)
            pair = self._finish(len(prompt.ids), built, stats)
            if pair is None:
                continue
            (c_ids, c_labels), (r_ids, r_labels) = pair
            stats.identical += bool(np.array_equal(c_ids, r_ids))
            ids[i] = np.concatenate([c_ids, r_ids])
            labels[i] = np.concatenate([c_labels, r_labels])
            firsts[i] = len(c_ids)
        return EncodedRecords(*flat_documents(ids, labels), stats, failures, firsts)

    def _texts(self, pairs: list[dict[str, Any]], failed: dict[int, str]) -> list[list[Rendered]]:
        """``render``'s texts: the spans to train are the responses' assistant turns (all of
        a string response)."""
        out: list[list[Rendered]] = [[] for _ in pairs]
        conv = [i for i, p in enumerate(pairs) if isinstance(p["chosen"], list)]
        for i, p in enumerate(pairs):
            if isinstance(p["chosen"], str):
                prompt = p["prompt"]
                out[i] = [Rendered(prompt, [], None)]
                for side in SIDES:
                    text = prompt + p[side]
                    out[i].append(Rendered(text, [(len(prompt), len(text))], None))
        if not conv:
            return out
        if self.template is None:
            for i in conv:
                failed[i] = f"a conversational pair needs a chat template: {self.template_missing}"
            return out

        def fail(index: int, exc: Exception) -> None:
            failed.setdefault(index, str(exc))

        prompts = dict(
            render_dialogues(
                self.tokenizer,
                self.template,
                [pairs[i]["prompt"] for i in conv],
                self.special_tokens,
                now=RENDER_DATE,
                on_error=lambda k, exc: fail(conv[k], exc),
                add_generation_prompt=True,
            )
        )
        fulls = dict(
            render_dialogues(
                self.tokenizer,
                self.template,
                [pairs[i]["prompt"] + pairs[i][side] for i in conv for side in SIDES],
                self.special_tokens,
                now=RENDER_DATE,
                on_error=lambda k, exc: fail(conv[k // 2], exc),
            )
        )
        for k, i in enumerate(conv):
            if i in failed:
                continue
            prompt = prompts[k].text
            out[i] = [Rendered(prompt, [], None)]
            for j, side in enumerate(SIDES):
                full = fulls[2 * k + j]
                if not full.text.startswith(prompt):
                    failed[i] = (
                        f"the chat template's rendering of prompt + {side} does not start with "
                        "its rendering of the prompt (with the generation prompt), so prompt "
                        "and response cannot be told apart (TRL refuses this template too)"
                    )
                    break
                # Only the response's assistant turns: a multi-turn prompt's earlier answers
                # are context here, not something to prefer or reject.
                spans = [
                    (max(a, len(prompt)), b) for a, b in full.assistant_spans if b > len(prompt)
                ]
                out[i].append(Rendered(full.text, spans, None))
        return out

    def _retokenized(
        self, prompt_ids: np.ndarray, prompt: Rendered, full: Rendered, stats: PreferenceStats
    ) -> _Side:
        """The prompt's tokens, then the response's text tokenized alone (its spans moved)."""
        cut = len(prompt.text)
        spans = [(a - cut, b - cut) for a, b in full.assistant_spans]
        (response,) = self._encode([Rendered(full.text[cut:], spans, None)], stats)
        return _Side(
            np.concatenate([prompt_ids, response.ids]).astype(np.int32),
            np.concatenate([np.zeros(len(prompt_ids), dtype=bool), response.mask]),
            retokenized=True,
        )

    def _finish(
        self, n_prompt: int, sides: list[_Side], stats: PreferenceStats
    ) -> list[tuple[np.ndarray, np.ndarray]] | None:
        """Both sequences with BOS/EOS and labels, the length policy applied; None = dropped."""
        add_bos = self.bos is not None and not (n_prompt and sides[0].ids[0] == self.bos)
        seqs = []
        for side in sides:
            add_eos = self.eos is not None and not (len(side.ids) and side.ids[-1] == self.eos)
            head = np.array([self.bos] if add_bos else [], dtype=np.int32)
            tail = np.array([self.eos] if add_eos else [], dtype=np.int32)
            ids = np.concatenate([head, side.ids, tail]).astype(np.int32)
            labels = np.concatenate(
                [
                    np.full(len(head), IGNORE_INDEX, dtype=np.int32),
                    np.where(side.mask, side.ids, IGNORE_INDEX).astype(np.int32),
                    tail,
                ]
            )
            seqs.append((ids, labels, add_eos))
        total = sum(len(s[0]) for s in seqs)
        if any(not (labels != IGNORE_INDEX).any() for _, labels, _ in seqs):
            stats.no_trainable += 1
            stats.no_trainable_tokens += total
            return None
        prompt_len = n_prompt + add_bos
        if total > self.long_len and self.overlong == "truncate":
            budget = self.long_len - 2 * prompt_len
            responses = [len(ids) - prompt_len for ids, _, _ in seqs]
            cap = response_cap(budget, *responses) if budget >= 2 else 0
            cut = [
                (ids[: prompt_len + cap], labels[: prompt_len + cap], e) for ids, labels, e in seqs
            ]
            if cap == 0 or any(
                not (labels[prompt_len:] != IGNORE_INDEX).any() for _, labels, _ in cut
            ):
                stats.truncate_dropped += 1
                stats.truncate_dropped_tokens += total
                return None
            stats.truncated += 1
            stats.truncated_tokens += total - sum(len(s[0]) for s in cut)
            seqs = cut
        stats.bos_added += 2 * add_bos
        stats.eos_added += sum(e for _, _, e in seqs)
        return [(ids, labels) for ids, labels, _ in seqs]
