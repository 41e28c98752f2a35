"""HF's character offsets of tokens, computed from the token ids of a byte-level BPE.

Chat loss masks come from character spans (the assistant turns in the rendered text), so
the chat path needs each token's character range. HF computes it while encoding; the fast
backends give ids only. For a byte-level BPE the ids are enough: every token stands for
fixed bytes, so the tokens' bytes laid end to end must spell the text's UTF-8 bytes, and
each token's range follows from the running sum of their lengths.

Nothing here is assumed. Per text, the tokens' bytes are compared with the text's bytes
(a text they do not spell, e.g. after a normalizer or a prefix space, gets ``None`` and the
caller asks HF for it); HF's own offset rules are reproduced (a token holding part of a
multi-byte character covers that character; the ByteLevel post-processor's
``trim_offsets`` drops leading and trailing spaces), and the pipeline compares the result
with HF's offsets on a sample and on ``ADVERSARIAL`` texts before it trusts them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import numpy.typing as npt
from tokenizers import Tokenizer

from packcli import jit
from packcli.records import Fields

# Unicode White_Space (Rust's char::is_whitespace, what HF's trimming tests), which differs
# from Python's str.isspace on U+001C..U+001F.
_WHITE_SPACE = frozenset(
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
    "\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
_SPACE_CHAR = "\u0120"  # the byte-level character for b" "

# Texts on which the offsets are compared with HF's before a run trusts them: spaces at
# token edges (trimming), multi-byte characters split across tokens, emoji, combining marks,
# control characters, runs of spaces and newlines.
ADVERSARIAL = (
    " ",
    "  leading spaces",
    "trailing spaces   ",
    "a  b   c    d",
    " \n \n\n  \t x",
    "ünïcödé wörds ünd mëhr",
    "日本語のテキスト、そして中文。",
    "emoji 👩‍👩‍👧‍👦 and 🇺🇳 flags 🏳️‍🌈",
    "e\u0301 combining a\u0308 marks",
    "\x00\x01 control \x1c\x1f chars \x7f",
    "\u00a0nbsp\u00a0 and \u3000ideographic\u3000space",
    "tabs\tand\r\nwindows\r\nlines",
    "def f(x):\n    return x  # code\n\n\n",
    "1234567890 3.14159 -42",
)


@cache
def _byte_chars() -> dict[int, str]:
    """The ByteLevel alphabet (GPT-2's ``bytes_to_unicode``) as a ``str.translate`` table
    back to bytes: each alphabet character becomes the latin-1 character of its byte, and
    every other character below 256 becomes one latin-1 cannot encode, so a token with a
    character outside the alphabet fails to convert instead of converting wrongly."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table: dict[int, str] = {b: "\uffff" for b in range(256)}
    extra = 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[256 + extra] = chr(b)
            extra += 1
    return table


def _edge_count(token: str, chars: frozenset[str] | str, reverse: bool = False) -> int:
    n = 0
    for c in reversed(token) if reverse else token:
        if c not in chars:
            break
        n += 1
    return n


def _has_byte_level(state: Any) -> bool:
    if isinstance(state, dict):
        return state.get("type") == "ByteLevel" or any(map(_has_byte_level, state.values()))
    if isinstance(state, list):
        return any(map(_has_byte_level, state))
    return False


def _byte_level(tokenizer: Tokenizer) -> bool:
    """Whether the pre-tokenizer or the decoder is (or holds) ByteLevel: then vocabulary
    tokens are bytes in GPT-2's alphabet (each text still has to prove it)."""
    parts = (tokenizer.pre_tokenizer, tokenizer.decoder)
    return any(p is not None and _has_byte_level(json.loads(p.__getstate__())) for p in parts)


def _trim_rule(tokenizer: Tokenizer) -> tuple[bool, bool] | None:
    """``(trim_offsets, add_prefix_space)`` of the post-processor's offset trimming, or
    None for a post-processor whose effect on offsets is not reproduced here."""
    processor = tokenizer.post_processor
    if processor is None:
        return False, False
    state = json.loads(processor.__getstate__())
    parts = state["processors"] if state.get("type") == "Sequence" else [state]
    trim, prefix = False, False
    for part in parts:
        kind = part.get("type")
        if kind in ("ByteLevel", "RobertaProcessing"):
            if part.get("trim_offsets"):
                trim, prefix = True, bool(part.get("add_prefix_space"))
        elif kind not in ("TemplateProcessing", "BertProcessing"):
            return None  # nothing is added without special tokens; others: unknown
    return trim, prefix


# ``ByteOffsets.spelling``: data, meta, head, trim, add_prefix_space.
Spelling = tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64], npt.NDArray[np.uint8], bool, bool]
# Columns of ``ByteOffsets.meta``, one row per token id.
START, LEN, LEAD, TRAIL, CHARS, CONT = range(6)
HEAD = 16  # bytes of each token kept in ``ByteOffsets.head``


@dataclass(frozen=True, eq=False)
class ByteOffsets:
    """Per token id (row ``i`` of ``meta``): its bytes (``data[meta[i, START]:][:meta[i,
    LEN]]``, ``LEN`` -1 when the token is not bytes of the text), the characters HF trims at
    its edges (``LEAD``, ``TRAIL``), how many characters start in it (``CHARS``: its UTF-8
    lead bytes) and whether it starts inside one (``CONT``: its first byte continues a
    character); ``head[i]``: its first ``HEAD`` bytes, zero-padded.

    Why these columns: the compiled spelling check copies each token's ``HEAD`` bytes to its
    place (a fixed-size move, whatever the token's length) and compares whole texts, and
    counts characters from ``CHARS``/``CONT`` instead of byte by byte: with unsigned
    positions, 1.7x faster than comparing token by token in variable-length loops
    (7.5M tokens of chat: 0.19 -> 0.11 s).
    """

    data: npt.NDArray[np.uint8]  # every token's bytes end to end
    meta: npt.NDArray[np.int64]  # (ids, 6)
    head: npt.NDArray[np.uint8]  # (ids, HEAD)
    trim: bool
    add_prefix_space: bool

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> ByteOffsets | None:
        """The table for a byte-level tokenizer, else None (its tokens are not bytes of the
        text, and the chat path keeps HF's offsets)."""
        if not _byte_level(tokenizer):
            return None
        rule = _trim_rule(tokenizer)
        if rule is None:
            return None
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        added = {i: t.content for i, t in tokenizer.get_added_tokens_decoder().items()}
        size = max([*vocab.values(), *added]) + 1
        pieces: list[bytes] = [b""] * size
        meta = np.zeros((size, 6), dtype=np.int64)
        meta[:, LEN] = -1
        table = _byte_chars()
        edge = _WHITE_SPACE | {_SPACE_CHAR}
        for token, i in vocab.items():
            if i in added:
                continue
            try:
                raw = token.translate(table).encode("latin-1")
            except UnicodeEncodeError:
                continue  # not bytes of the text: a text holding it goes to HF
            pieces[i] = raw
            meta[i, LEN] = len(raw)
            if rule[0]:
                meta[i, LEAD] = _edge_count(token, _SPACE_CHAR)
                meta[i, TRAIL] = _edge_count(token, _SPACE_CHAR, reverse=True)
        for i, content in added.items():
            raw = content.encode("utf-8")
            pieces[i] = raw
            meta[i, LEN] = len(raw) if raw else -1
            if rule[0]:
                meta[i, LEAD] = _edge_count(content, edge)
                meta[i, TRAIL] = _edge_count(content, edge, reverse=True)
        data = np.frombuffer(b"".join(pieces), dtype=np.uint8)
        lens = np.maximum(meta[:, LEN], 0)
        starts = np.zeros(size, dtype=np.int64)
        np.cumsum(lens[:-1], out=starts[1:])
        meta[:, START] = starts
        lead_bytes = np.zeros(len(data) + 1, dtype=np.int64)
        np.cumsum((data & 0xC0) != 0x80, out=lead_bytes[1:])
        meta[:, CHARS] = lead_bytes[starts + lens] - lead_bytes[starts]
        some = lens > 0
        meta[some, CONT] = (data[starts[some]] & 0xC0) == 0x80
        head = np.zeros((size, HEAD), dtype=np.uint8)
        kept = np.arange(HEAD) < lens[:, None]
        head[kept] = data[(starts[:, None] + np.arange(HEAD))[kept]]
        return cls(data, meta, head, rule[0], rule[1])

    @property
    def spelling(self) -> Spelling:
        """What the compiled kernels take of the table (``text_chars``), as one argument."""
        return self.data, self.meta, self.head, self.trim, self.add_prefix_space

    def __call__(
        self, texts: Sequence[str], ids: np.ndarray, bounds: np.ndarray
    ) -> list[np.ndarray | None]:
        """HF's ``(n_tokens, 2)`` character offsets of each text's tokens
        (``ids[bounds[i]:bounds[i + 1]]``), or None where those tokens do not spell it."""
        offsets, spelled = self.flat(texts, ids, bounds)
        return [
            offsets[bounds[i] : bounds[i + 1]] if spelled[i] else None for i in range(len(texts))
        ]

    def flat(
        self, texts: Sequence[str], ids: np.ndarray, bounds: np.ndarray
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
        """``__call__`` as two arrays: every token's offsets, one text after another (rows
        of texts not spelled are meaningless), and per text whether its tokens spell it."""
        text, text_start = text_bytes(texts)
        ids = np.asarray(ids, dtype=np.int64)
        bounds = np.asarray(bounds, dtype=np.int64)
        offsets = np.empty((len(ids), 2), dtype=np.int64)
        spelled = np.zeros(len(texts), dtype=np.bool_)
        # Work in best-fit items (jit.SMALL_WORK): a byte costs ~1/20 of one as Python.
        run = jit.pick(_token_chars, len(text) // 20 + len(ids))
        run(ids, bounds, text, text_start, spelling_room(text), self.spelling, offsets, spelled)
        return offsets, spelled


def text_bytes(texts: Sequence[str]) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    """The texts' UTF-8 bytes end to end, and where each starts (``len(texts) + 1``)."""
    raw = [t.encode("utf-8") for t in texts]
    text_start = np.zeros(len(raw) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, raw), np.int64, count=len(raw)), out=text_start[1:])
    return np.frombuffer(b"".join(raw), dtype=np.uint8), text_start


def spelling_room(text: np.ndarray) -> npt.NDArray[np.uint8]:
    """Where ``text_chars`` lays tokens' bytes out to compare with ``text``: its size, plus
    room for the last token's ``HEAD``-byte copy."""
    return np.empty(len(text) + HEAD, dtype=np.uint8)


@jit.kernel(nogil=True)
def _token_chars(
    ids: np.ndarray,
    bounds: np.ndarray,
    text: np.ndarray,
    text_start: np.ndarray,
    room: np.ndarray,
    table: Spelling,
    offsets: np.ndarray,
    spelled: np.ndarray,
) -> None:
    """Per text: whether its tokens' bytes are its bytes (``spelled``) and, if so, each
    token's character range as HF gives it (``offsets``): ``text_chars`` of each text,
    in order (a text's copies may spill into the next one's room, which it overwrites)."""
    for d in range(len(bounds) - 1):
        spelled[d] = text_chars(
            ids,
            bounds[d],
            bounds[d + 1],
            text,
            text_start[d],
            text_start[d + 1],
            room,
            table,
            offsets,
            0,
        )


@jit.kernel(nogil=True)
def text_chars(
    ids: np.ndarray,
    k0: int,
    k1: int,
    text: np.ndarray,
    p: int,
    end: int,
    room: np.ndarray,
    table: Spelling,
    offsets: np.ndarray,
    base: int,
) -> bool:
    """Whether tokens ``ids[k0:k1]`` spell the UTF-8 bytes ``text[p:end]``, and if so each
    token's character range as HF gives it, token ``k`` in row ``k - base`` of ``offsets``
    (rows of a text not spelled are left meaningless).

    The tokens' bytes are copied to their places in ``room`` (``spelling_room``; up to
    ``HEAD - 1`` bytes past ``end`` are overwritten) and compared with the text at the end.
    Characters are counted by their lead bytes; a token starting inside a character starts
    at that character. With ``trim`` (HF's ByteLevel ``process_offsets``), ``LEAD``/``TRAIL``
    characters come off the range, never past its other end; a text's first token (or one
    starting at character 0) keeps a single leading space when ``add_prefix_space``.
    """
    data, meta, head, trim, add_prefix_space = table
    # Unsigned positions: compiled, each byte access then skips the check for a negative
    # index (~30% of this loop's time).
    at = np.uint64(p)
    stop = np.uint64(end)
    chars = 0  # characters starting in the text before ``at``
    for k in range(k0, k1):
        if ids[k] < 0 or ids[k] >= len(meta):
            return False
        t = np.uint64(ids[k])
        if meta[t, LEN] < 0:
            return False
        n = np.uint64(meta[t, LEN])
        if at + n > stop:
            return False
        if n <= HEAD:
            for j in range(np.uint64(HEAD)):
                room[at + j] = head[t, j]
        else:
            s = np.uint64(meta[t, START])
            for j in range(n):
                room[at + j] = data[s + j]
        c0 = chars - meta[t, CONT]
        chars += meta[t, CHARS]
        at += n
        c1 = chars
        if trim:
            n_lead = meta[t, LEAD]
            if add_prefix_space and n_lead == 1 and (k == k0 or c0 == 0):
                n_lead = 0
            if n_lead > 0:
                c0 = min(c0 + n_lead, c1)
            n_trail = meta[t, TRAIL]
            if n_trail > 0 and c1 >= n_trail:
                c1 = max(c1 - n_trail, c0)
        offsets[k - base, 0] = c0
        offsets[k - base, 1] = c1
    if at != stop:
        return False
    differ = 0
    for j in range(np.uint64(p), stop):
        differ |= room[j] ^ text[j]
    return differ == 0


Tokens = tuple[np.ndarray, np.ndarray]  # int32 ids, int64 (n, 2) character offsets


class FastOffsets:
    """Ids from a fast backend (checked against HF like any other run) with offsets from
    ``ByteOffsets``: what the chat path needs from HF's ``encode_batch``, at the fast
    backend's speed. A text its tokens do not spell gets None (the caller asks HF)."""

    def __init__(self, encoder: Any, table: ByteOffsets) -> None:
        self.encoder = encoder
        self.table = table

    @property
    def name(self) -> str:
        return str(self.encoder.name)

    def __call__(self, texts: list[str]) -> list[Tokens | None]:
        return self.flat(texts).per_text()

    def flat(self, texts: list[str]) -> FlatTokens:
        """The same tokens as whole-batch arrays (the chat path's columnar finish)."""
        ids, bounds = self.encoder(texts)
        return self.with_offsets(texts, ids, bounds)

    def with_offsets(self, texts: list[str], ids: np.ndarray, bounds: np.ndarray) -> FlatTokens:
        """``flat`` of texts the encoder gave ``ids`` (``bounds``) for."""
        offsets, spelled = self.table.flat(texts, ids, bounds)
        return FlatTokens(ids.astype(np.int32, copy=False), np.asarray(bounds), offsets, spelled)


@dataclass(frozen=True, eq=False)
class FlatTokens:
    """A batch's tokens from a fast backend: text ``i``'s ids are ``ids[bounds[i]:bounds[i +
    1]]``, their HF offsets the same rows of ``offsets``, valid where ``spelled[i]``."""

    ids: npt.NDArray[np.int32]
    bounds: np.ndarray  # int, len(texts) + 1
    offsets: npt.NDArray[np.int64]  # (n_tokens, 2)
    spelled: npt.NDArray[np.bool_]

    def per_text(self) -> list[Tokens | None]:
        """``(ids, offsets)`` of each text, None where its tokens do not spell it."""
        cuts = self.bounds.tolist()
        ids, offsets = self.ids, self.offsets
        return [
            (ids[a:b], offsets[a:b]) if ok else None
            for a, b, ok in zip(cuts[:-1], cuts[1:], self.spelled.tolist(), strict=True)
        ]


@dataclass(frozen=True)
class OffsetsCheck(Fields):
    """``run.tokenizer_backend.chat_offsets`` in ``packcli.json``: the texts compared, those
    whose offsets were derived (and their tokens), and the first mismatch, None when there
    was none (the fast backend's offsets are then used)."""

    texts: int
    derived: int
    tokens: int
    mismatch: str | None


def check_offsets(fast: FastOffsets, tokenizer: Tokenizer, texts: Sequence[str]) -> OffsetsCheck:
    """Compare ``fast``'s ids and offsets with HF's ``encode_batch`` on ``texts``: the
    record for the report, with ``mismatch`` set on the first text where they differ (a
    text the tokens do not spell is not a mismatch: HF encodes it at run time too)."""
    texts = list(texts)
    got = fast(texts)
    want = tokenizer.encode_batch(texts, add_special_tokens=False)
    derived = tokens = 0

    def record(mismatch: str | None) -> OffsetsCheck:
        return OffsetsCheck(len(texts), derived, tokens, mismatch)

    for text, g, w in zip(texts, got, want, strict=True):
        if g is None:
            continue
        w_ids = np.asarray(w.ids, dtype=np.int32)
        w_off = np.asarray(w.offsets, dtype=np.int64).reshape(-1, 2)
        if not (np.array_equal(g[0], w_ids) and np.array_equal(g[1], w_off)):
            return record(f"offsets differ from HF's on {text[:80]!r}")
        derived += 1
        tokens += len(w_ids)
    return record(None)


def token_turns(
    offsets: Sequence[np.ndarray], spans: Sequence[Sequence[tuple[int, int]]]
) -> list[np.ndarray]:
    """Per text, the token range ``[first, last)`` of each character span: the tokens that
    share at least one character with it (spans no token touches are left out), as an
    int64 ``(k, 2)`` array. One compiled call for a whole batch of dialogues, instead of a
    dozen numpy calls per dialogue."""
    n = len(offsets)
    counts = np.fromiter((len(o) for o in offsets), np.int64, count=n)
    n_spans = np.fromiter((len(s) for s in spans), np.int64, count=n)
    tok_bounds = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=tok_bounds[1:])
    span_bounds = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(n_spans, out=span_bounds[1:])
    flat = (
        np.concatenate([np.asarray(o, np.int64).reshape(-1, 2) for o in offsets])
        if tok_bounds[-1]
        else np.zeros((0, 2), np.int64)
    )
    bounds = np.array([b for s in spans for b in s], dtype=np.int64).reshape(-1, 2)
    first, last = span_tokens(flat, tok_bounds, bounds, span_bounds)
    if n == 0:
        return []
    touched = last > first
    turns = np.stack([first[touched], last[touched]], axis=1)
    per_text = np.bincount(np.repeat(np.arange(n), n_spans)[touched], minlength=n)
    return pieces(turns, per_text)


def span_tokens(
    offsets: np.ndarray, tok_bounds: np.ndarray, spans: np.ndarray, span_bounds: np.ndarray
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """``token_turns`` over whole-batch arrays: text ``d``'s token offsets are rows
    ``tok_bounds[d]:tok_bounds[d + 1]`` of ``offsets`` and its character spans rows
    ``span_bounds[d]:span_bounds[d + 1]`` of ``spans`` (both ``(n, 2)``); per span, its first
    and end token within its text (equal when no token touches it)."""
    offsets = np.asarray(offsets, np.int64).reshape(-1, 2)
    spans = np.asarray(spans, np.int64).reshape(-1, 2)
    first = np.zeros(len(spans), dtype=np.int64)
    last = np.zeros(len(spans), dtype=np.int64)
    run = jit.pick(_span_tokens, int(tok_bounds[-1]) // 20 + len(spans))
    run(
        np.ascontiguousarray(offsets), np.asarray(tok_bounds, np.int64),
        np.ascontiguousarray(spans), np.asarray(span_bounds, np.int64), first, last,
    )  # fmt: skip
    return first, last


def pieces(flat: np.ndarray, counts: np.ndarray) -> list[np.ndarray]:
    """``flat`` cut into consecutive views of ``counts`` items: ``np.split`` without its
    per-piece ``swapaxes`` (it cost ~3 us a dialogue, more than the masks themselves)."""
    ends = np.cumsum(counts).tolist()
    return [flat[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]


@jit.kernel(nogil=True)
def _span_tokens(
    offsets: np.ndarray,
    tok_bounds: np.ndarray,
    spans: np.ndarray,
    span_bounds: np.ndarray,
    first: np.ndarray,
    last: np.ndarray,
) -> None:
    """``span_range`` of each text's spans over its tokens' offsets."""
    for d in range(len(tok_bounds) - 1):
        t0 = tok_bounds[d]
        t1 = tok_bounds[d + 1]
        if t1 == t0:
            continue
        monotone = goes_forward(offsets, t0, t1)
        for k in range(span_bounds[d], span_bounds[d + 1]):
            f, e = span_range(offsets, t0, t1, monotone, spans[k, 0], spans[k, 1])
            first[k] = f
            last[k] = e


@jit.kernel(nogil=True)
def goes_forward(offsets: np.ndarray, t0: int, t1: int) -> bool:
    """Whether rows ``t0:t1`` of ``(n, 2)`` token offsets never go back (then spans are
    found by binary search)."""
    for i in range(t0 + 1, t1):
        if offsets[i, 0] < offsets[i - 1, 0] or offsets[i, 1] < offsets[i - 1, 1]:
            return False
    return True


@jit.kernel(nogil=True)
def span_range(
    offsets: np.ndarray, t0: int, t1: int, monotone: bool, a: int, b: int
) -> tuple[int, int]:
    """The tokens (rows ``t0:t1`` of ``offsets``) sharing a character with ``[a, b)``: the
    first ending after ``a`` and the end of those starting before ``b``, relative to ``t0``
    (binary searches when ``monotone``, else every token is tested); ``(0, 0)`` when no
    token touches it."""
    if monotone:
        lo, hi = t0, t1
        while lo < hi:
            mid = (lo + hi) // 2
            if offsets[mid, 1] <= a:
                lo = mid + 1
            else:
                hi = mid
        f = lo
        lo, hi = t0, t1
        while lo < hi:
            mid = (lo + hi) // 2
            if offsets[mid, 0] < b:
                lo = mid + 1
            else:
                hi = mid
        return f - t0, lo - t0
    f = -1
    e = -1
    for i in range(t0, t1):
        if offsets[i, 0] < b and offsets[i, 1] > a:
            if f < 0:
                f = i
            e = i + 1
    if f < 0:
        return 0, 0
    return f - t0, e - t0
