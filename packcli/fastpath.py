"""Tokenizer fast path: the same token ids as HF ``tokenizers``, computed by ``tiktoken``.

Why: tokenization is the physical limit of ``packcli pack`` (everything else hides behind
it), and for byte-level BPE tokenizers (GPT-2, Llama 3, Qwen2 and the many trained the same
way) ``tiktoken``'s encoder is several times faster than HF's ``encode_batch_fast`` on the
same threads. Measured with ``scripts/bench_tokenizer.py`` (its docstring has the command): a
100,000-token byte-level BPE with the Llama-3 split regex trained in-process, 66.5 MB of
generated text (70% the demo corpus's synthetic language, 30% multilingual), batches of 1024
documents, 2 threads, identical ids on all 15,940 documents: HF 0.33 MB/s, tiktoken 1.63 MB/s,
**5.0x** (medians of 3; 6.2x in CPU seconds on a 16 MB rerun). That machine was a 2-core VM
shared with other jobs, so the absolute rates are low and only the ratio carries over.
Building the encoding for a 100k vocabulary takes ~3 s, mostly the reachability proof below;
the result is cached per tokenizer (``cache_dir()``) so later runs and tasks skip it.

What "the same" takes. A ``tiktoken.Encoding`` is a split regex, a map ``bytes -> rank`` and
special tokens; it merges, inside each regex piece, the adjacent pair whose *concatenation*
has the lowest rank, and first returns a piece whole when it is itself a token. HF's BPE
merges the adjacent *pair* with the lowest merge index and (unless ``ignore_merges``) never
looks pieces up whole. We derive the ranks from the merge list (a token's rank is the index of
the first merge that makes it; single bytes come first) and use the token ids as ranks when
their order agrees, else remap ranks to ids afterwards. The two algorithms then agree when no
"phantom pair" can occur: two adjacent tokens whose concatenation is a token that HF does not
make from that pair. We accept a tokenizer when either

* every token comes from exactly one merge, every merge comes after the merges making its
  parts, and HF's own BPE turns every token's string into that token (all tokens reachable;
  true of every tokenizer we trained with HF's ``BpeTrainer``). Then the two priorities are
  the same numbers, HF never holds a phantom pair (a phantom pair inside a word would also
  appear when encoding the token's own string, which reaches the token by its one merge), and
  whole-piece lookup returns what the merges would; or
* the merges hold *every* split of every token into two tokens, contiguous per token (what
  the tiktoken-to-HF converters write for Llama 3 and friends, with ``ignore_merges``): no
  phantom pair exists. One corner is left to the self-check: two candidate pairs making the
  same token at once, which HF orders by merge index and tiktoken left to right.

The split regex comes from a ``ByteLevel(use_regex=True)`` pre-tokenizer (the GPT-2 pattern)
or a ``Split(Regex, isolated)`` followed by ``ByteLevel(use_regex=False)``, and must cover the
text (HF keeps unmatched text as pieces, tiktoken drops it); the normalizer may be absent or
NFC (applied with ``unicodedata`` before encoding). Added tokens: HF matches their strings
inside raw text even with ``add_special_tokens=False`` (that flag only controls the
post-processor), so they become tiktoken special tokens and we encode with every special
allowed; with NFC, non-normalized ones are split out before normalising, as HF does.
Anything else (WordPiece/Unigram, ``byte_fallback``, dropout, subword prefixes,
``add_prefix_space``, other normalizers or pre-tokenizers, ``lstrip``/``rstrip``/
``single_word`` added tokens, truncation or padding) raises ``FastPathUnsupported``.

Never trust, always check: ``self_check`` encodes the first documents of the corpus plus a
built-in adversarial set (whitespace runs, CRLF, digits, CJK, emoji ZWJ sequences, combining
marks and NFC/NFD pairs, very long words, contractions in all cases, the tokenizer's own added
tokens inside text...) with both backends and requires identical ids; ``choose_encoder`` uses
the fast path only when the check passes (``auto``) or refuses loudly (``tiktoken``).
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import logging
import os
import random
import re
import unicodedata
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from tokenizers import Tokenizer, models

from packcli import __version__
from packcli.errors import ConfigError
from packcli.shards import atomic_write_bytes
from packcli.tokenizer import BatchEncoder, hf_batch_encoder

log = logging.getLogger(__name__)

Backend = Literal["auto", "hf", "tiktoken"]
BACKENDS: tuple[str, ...] = ("auto", "hf", "tiktoken")

# What HF's ByteLevel(use_regex=True) splits with (tokenizers' byte_level.rs).
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# ByteLevel(use_regex=False) alone: each added-token-free segment is one piece.
WHOLE_TEXT_PATTERN = r"[\s\S]+"

# Characters of a truncated text shown in a mismatch message.
_SHOW_CHARS = 80


class FastPathUnsupported(Exception):
    """The tokenizer is outside what the tiktoken fast path reproduces exactly."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table, which byte-level BPE vocabularies are in."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


@dataclass(frozen=True)
class TiktokenSpec:
    """Everything a ``tiktoken.Encoding`` needs, derived from a ``tokenizer.json``.

    ``rank_to_id`` is ``None`` when the ranks are the HF ids; otherwise tiktoken's output ranks
    are mapped through it. ``split_added`` means added tokens are split out in Python before
    NFC (HF matches non-normalized added tokens on the raw text); otherwise tiktoken matches
    them itself.
    """

    pattern: str
    mergeable_ranks: dict[bytes, int]
    special_tokens: dict[str, int]
    rank_to_id: np.ndarray | None = None
    normalizer: Literal["NFC"] | None = None
    split_added: bool = False
    proof: str = ""  # which sufficient condition for exactness holds
    excluded: int = 0  # vocabulary entries HF can never produce from text, left out


def _unsupported(condition: bool, reason: str) -> None:
    if condition:
        raise FastPathUnsupported(reason)


def _parse_normalizer(spec: dict | None) -> Literal["NFC"] | None:
    if spec is None:
        return None
    kind = spec.get("type")
    if kind == "NFC":
        return "NFC"
    if kind == "Sequence":
        parts = [_parse_normalizer(p) for p in spec.get("normalizers", [])]
        kept = [p for p in parts if p is not None]
        _unsupported(len(kept) > 1, "normalizer sequence with more than one NFC")
        return kept[0] if kept else None
    raise FastPathUnsupported(f"normalizer {kind} (only none or NFC are reproduced)")


def _check_byte_level(spec: dict, use_regex: bool) -> None:
    _unsupported(spec.get("add_prefix_space", True), "ByteLevel add_prefix_space=true")
    _unsupported(
        spec.get("use_regex", True) != use_regex,
        f"ByteLevel use_regex={not use_regex} in this position",
    )


def _parse_pre_tokenizer(spec: dict | None) -> str:
    """The tiktoken split pattern equivalent to the HF pre-tokenizer."""
    _unsupported(spec is None, "no pre-tokenizer (not byte-level)")
    assert spec is not None
    kind = spec.get("type")
    if kind == "ByteLevel":
        if spec.get("use_regex", True):
            _check_byte_level(spec, use_regex=True)
            return GPT2_PATTERN
        _check_byte_level(spec, use_regex=False)
        return WHOLE_TEXT_PATTERN
    if kind == "Sequence":
        parts = spec.get("pretokenizers", [])
        if len(parts) == 1:
            return _parse_pre_tokenizer(parts[0])
        _unsupported(
            len(parts) != 2 or [p.get("type") for p in parts] != ["Split", "ByteLevel"],
            "pre-tokenizer sequence other than [Split, ByteLevel]: "
            + ", ".join(str(p.get("type")) for p in parts),
        )
        split, byte_level = parts
        pattern = split.get("pattern", {})
        _unsupported("Regex" not in pattern, "Split on a plain string (not a regex)")
        _unsupported(split.get("behavior") != "Isolated", f"Split behavior {split.get('behavior')}")
        _unsupported(bool(split.get("invert", False)), "Split with invert=true")
        _check_byte_level(byte_level, use_regex=False)
        return pattern["Regex"]
    raise FastPathUnsupported(f"pre-tokenizer {kind} (not byte-level BPE)")


def _check_coverage(pattern: str) -> None:
    """HF's isolated Split keeps the text between matches as pieces; tiktoken drops it."""
    import regex  # tiktoken's own dependency; close to Oniguruma's syntax

    try:
        compiled = regex.compile(pattern)
    except regex.error as exc:
        raise FastPathUnsupported(f"split regex does not compile: {exc}") from exc
    for text in adversarial_texts():
        pieces = [m.group() for m in compiled.finditer(text)]
        _unsupported("" in pieces, "split regex matches the empty string")
        _unsupported(
            "".join(pieces) != text,
            f"split regex leaves text unmatched in {_show(text)} (tiktoken would drop it)",
        )


def _parse_merges(raw: list) -> list[tuple[str, str]]:
    merges = []
    for item in raw:
        if isinstance(item, str):
            left, sep, right = item.partition(" ")
            _unsupported(not sep, f"unreadable merge {item!r}")
            merges.append((left, right))
        else:
            merges.append((item[0], item[1]))
    return merges


def _unreachable(vocab: dict[str, int], merges: list[tuple[str, str]], tokens: list[str]) -> int:
    """How many of ``tokens`` HF's own BPE (no whole-word lookup) does not encode to themselves."""
    probe = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=False))
    encoded = probe.encode_batch_fast(tokens, add_special_tokens=False)
    return sum(1 for tok, enc in zip(tokens, encoded, strict=True) if enc.ids != [vocab[tok]])


def _missing_splits(
    tokens: list[str], vocab: dict[str, Any], pair_target: dict[tuple[str, str], str]
) -> int:
    """Splits of a token into two vocabulary tokens that are not a merge (phantom pairs)."""
    missing = 0
    for tok in tokens:
        for i in range(1, len(tok)):
            left, right = tok[:i], tok[i:]
            if left in vocab and right in vocab and pair_target.get((left, right)) != tok:
                missing += 1
    return missing


def derive_spec(tokenizer: Tokenizer) -> TiktokenSpec:
    """Derive the tiktoken encoding from ``tokenizer``; ``FastPathUnsupported`` says why not."""
    data = json.loads(tokenizer.to_str())
    model = data.get("model", {})
    _unsupported(model.get("type") != "BPE", f"model {model.get('type')} (not BPE)")
    _unsupported(bool(model.get("byte_fallback")), "BPE with byte_fallback")
    _unsupported(bool(model.get("dropout")), f"BPE dropout={model.get('dropout')}")
    _unsupported(
        bool(model.get("continuing_subword_prefix")) or bool(model.get("end_of_word_suffix")),
        "BPE continuing_subword_prefix/end_of_word_suffix",
    )
    _unsupported(data.get("truncation") is not None, "tokenizer.json enables truncation")
    _unsupported(data.get("padding") is not None, "tokenizer.json enables padding")
    normalizer = _parse_normalizer(data.get("normalizer"))
    pattern = _parse_pre_tokenizer(data.get("pre_tokenizer"))
    _check_coverage(pattern)
    ignore_merges = bool(model.get("ignore_merges", False))

    # Added tokens HF matches inside text (``encode_special_tokens`` turns that off for the
    # special ones). They become tiktoken specials, encoded with every special allowed.
    specials: dict[str, int] = {}
    normalized_flags = set()
    skip_special = bool(getattr(tokenizer, "encode_special_tokens", False))
    added_contents = {added["content"] for added in data.get("added_tokens", [])}
    for added in data.get("added_tokens", []):
        if added.get("special") and skip_special:
            continue  # encoded as the characters it is made of, like any text
        content = added["content"]
        _unsupported(not content, "an empty added token")
        for flag in ("single_word", "lstrip", "rstrip"):
            _unsupported(bool(added.get(flag)), f"added token {content!r} with {flag}=true")
        specials[content] = int(added["id"])
        normalized_flags.add(bool(added.get("normalized")))
    ordered = sorted(specials)
    for a, b in itertools.pairwise(ordered):
        # HF matches leftmost-longest, tiktoken leftmost-first in an arbitrary order.
        _unsupported(b.startswith(a), f"added token {a!r} is a prefix of {b!r}")
    split_added = False
    if normalizer is not None and specials:
        _unsupported(
            len(normalized_flags) > 1, "added tokens mix normalized=true and normalized=false"
        )
        if normalized_flags == {True}:
            # Matched on the normalized text: normalize first, then let tiktoken match.
            for content in specials:
                _unsupported(
                    unicodedata.normalize("NFC", content) != content,
                    f"added token {content!r} changes under NFC",
                )
        else:
            split_added = True

    # The vocabulary as bytes. Entries outside the byte alphabet can never be produced from
    # byte-level input; entries no merge produces only through whole-word lookup.
    u2b = {c: b for b, c in bytes_to_unicode().items()}
    vocab: dict[str, int] = model.get("vocab", {})
    missing_bytes = [b for b, c in bytes_to_unicode().items() if c not in vocab]
    _unsupported(
        bool(missing_bytes), f"{len(missing_bytes)} of the 256 byte tokens missing (not byte-level)"
    )
    merges = _parse_merges(model.get("merges", []))
    first_merge: dict[str, int] = {}
    last_merge: dict[str, int] = {}
    merge_count: dict[str, int] = {}
    pair_target: dict[tuple[str, str], str] = {}
    for index, (left, right) in enumerate(merges):
        target = left + right
        _unsupported(target not in vocab, f"merge {left!r} {right!r} makes no vocabulary token")
        first_merge.setdefault(target, index)
        last_merge[target] = index
        merge_count[target] = merge_count.get(target, 0) + 1
        pair_target[(left, right)] = target
    # Merges of one token must be contiguous, or pair order and token order disagree.
    by_first = sorted(first_merge, key=first_merge.__getitem__)
    for a, b in itertools.pairwise(by_first):
        _unsupported(
            last_merge[a] > first_merge[b],
            f"the merges making {a!r} interleave with those making {b!r}",
        )

    mergeable: dict[str, int] = {}
    excluded = 0
    for tok, tid in vocab.items():
        if len(tok) > 1 and tok in added_contents and tok not in first_merge:
            # An added token's vocabulary entry: matched as a special, or (special tokens
            # under ``encode_special_tokens``) never produced, as in HF.
            excluded += 1
            continue
        if not all(c in u2b for c in tok):
            excluded += 1
            continue
        if len(tok) > 1 and tok not in first_merge:
            # HF produces it only by whole-word lookup (ignore_merges); tiktoken would also
            # merge into it, so we cannot rank it. Without ignore_merges HF never produces it.
            _unsupported(ignore_merges, f"vocabulary token {tok!r} is made by no merge")
            excluded += 1
            continue
        mergeable[tok] = int(tid)
    multi = [tok for tok in by_first if tok in mergeable]

    # Proof A: one merge per token, every merge after those making its parts, and every
    # token reachable. Proof B: the merges hold every split (no phantom pairs can exist).
    unique = all(count == 1 for count in merge_count.values())
    bottom_up = all(
        last_merge.get(part, -1) < index for index, pair in enumerate(merges) for part in pair
    )
    reachable_known = (unique and bottom_up) or not ignore_merges
    unreachable = _unreachable(vocab, merges, multi) if reachable_known else -1
    if not ignore_merges:
        _unsupported(
            unreachable > 0,
            f"{unreachable} tokens are not reachable by their merges and ignore_merges is "
            "false (tiktoken returns a piece whole when it is a token)",
        )
    if unique and bottom_up and unreachable == 0:
        proof = "unique merges, all tokens reachable"
    else:
        missing = _missing_splits(multi, mergeable, pair_target)
        why_not_a = (
            "some token is made by several merges"
            if not unique
            else "some merge comes before one making its parts"
            if not bottom_up
            else f"{unreachable} tokens are not reachable by their merges"
        )
        _unsupported(
            missing > 0,
            f"{missing} splits of tokens into two tokens are not merges and {why_not_a} "
            "(tiktoken's rank order could merge pairs HF never merges)",
        )
        proof = "merges hold every split of every token"

    # Ranks: the ids when their order is the merge order, else positions in the merge order.
    ids_in_merge_order = np.array([mergeable[tok] for tok in multi], dtype=np.int64)
    rank_to_id: np.ndarray | None = None
    if np.all(np.diff(ids_in_merge_order) > 0):
        ranks = {bytes(u2b[c] for c in tok): tid for tok, tid in mergeable.items()}
        special_ranks = dict(specials)
    else:
        ranks = {bytes([b]): b for b in range(256)}
        for i, tok in enumerate(multi):
            ranks[bytes(u2b[c] for c in tok)] = 256 + i
        special_ranks = {tok: 256 + len(multi) + i for i, tok in enumerate(specials)}
        table = [0] * (256 + len(multi) + len(specials))
        for b, c in bytes_to_unicode().items():
            table[b] = vocab[c]
        for i, tok in enumerate(multi):
            table[256 + i] = mergeable[tok]
        for tok, rank in special_ranks.items():
            table[rank] = specials[tok]
        rank_to_id = np.asarray(table, dtype=np.int64)
    return TiktokenSpec(
        pattern=pattern,
        mergeable_ranks=ranks,
        special_tokens=special_ranks,
        rank_to_id=rank_to_id,
        normalizer=normalizer,
        split_added=split_added,
        proof=proof,
        excluded=excluded,
    )


def _balanced_chunks(texts: list[str], parts: int) -> list[list[str]]:
    """Contiguous chunks of about equal total length (documents are heavy-tailed)."""
    total = sum(map(len, texts))
    target = max(1, total // parts)
    chunks: list[list[str]] = []
    start = 0
    acc = 0
    for i, text in enumerate(texts):
        acc += len(text)
        if acc >= target:
            chunks.append(texts[start : i + 1])
            start = i + 1
            acc = 0
    if start < len(texts):
        chunks.append(texts[start:])
    return chunks


class FastPath:
    """A ``BatchEncoder``: texts in, HF-identical ids out, encoded by tiktoken on threads."""

    def __init__(self, spec: TiktokenSpec, num_threads: int, name: str = "packcli") -> None:
        try:
            import tiktoken
        except ImportError as exc:
            raise FastPathUnsupported("tiktoken is not installed (pip install tiktoken)") from exc
        self.spec = spec
        self.num_threads = max(1, int(num_threads))
        try:
            self.encoding = tiktoken.Encoding(
                name,
                pat_str=spec.pattern,
                mergeable_ranks=spec.mergeable_ranks,
                special_tokens=spec.special_tokens,
            )
        except Exception as exc:  # tiktoken raises ValueError (bad regex) or a Rust panic
            raise FastPathUnsupported(f"tiktoken rejects the encoding: {exc}") from exc
        self.tiktoken_version = tiktoken.__version__
        self._encode_one = self._pick_encoder()
        table = spec.rank_to_id
        self._rank_to_id = None if table is None else table.astype(np.uint32)

    def _pick_encoder(self) -> Callable[[str], np.ndarray]:
        """Per-text encoder returning uint32 ids as a numpy array (tiktoken's buffer, no
        Python int per token: ~40 bytes and a conversion saved on every token)."""
        enc = self.encoding
        spec = self.spec
        nfc = spec.normalizer == "NFC"

        def ordinary(text: str) -> np.ndarray:
            try:
                return enc.encode_to_numpy(text, disallowed_special=())
            except UnicodeEncodeError:  # lone surrogates: tiktoken's own replacement rule
                return np.asarray(enc.encode_ordinary(text), dtype=np.uint32)

        if not spec.special_tokens:
            if nfc:
                return lambda t: ordinary(unicodedata.normalize("NFC", t))
            return ordinary
        allowed = frozenset(spec.special_tokens)
        # A C-speed scan first: most documents hold no added token, and the ordinary path
        # skips converting the allowed set for every call.
        added_re = re.compile("|".join(re.escape(s) for s in sorted(allowed, key=len)[::-1]))
        search = added_re.search
        if spec.split_added:
            ids = spec.special_tokens

            def split_then_nfc(text: str) -> np.ndarray:
                if search(text) is None:
                    return ordinary(unicodedata.normalize("NFC", text))
                out: list[np.ndarray] = []
                pos = 0
                for m in added_re.finditer(text):
                    if m.start() > pos:
                        out.append(ordinary(unicodedata.normalize("NFC", text[pos : m.start()])))
                    out.append(np.array([ids[m.group()]], dtype=np.uint32))
                    pos = m.end()
                if pos < len(text):
                    out.append(ordinary(unicodedata.normalize("NFC", text[pos:])))
                return np.concatenate(out)

            return split_then_nfc

        def with_specials(text: str) -> np.ndarray:
            if nfc:
                text = unicodedata.normalize("NFC", text)
            if search(text) is None:
                return ordinary(text)
            try:
                return enc.encode_to_numpy(text, allowed_special=allowed, disallowed_special=())
            except UnicodeEncodeError:  # as in ``ordinary``
                ids = enc.encode(text, allowed_special=allowed, disallowed_special=())
                return np.asarray(ids, dtype=np.uint32)

        return with_specials

    def _encode_chunk(self, texts: list[str]) -> list[np.ndarray]:
        encode = self._encode_one
        out = [encode(t) for t in texts]
        table = self._rank_to_id
        if table is None:
            return out
        return [table[ranks] for ranks in out]

    def __call__(self, texts: list[str]) -> list[np.ndarray]:
        if self.num_threads == 1 or len(texts) < 2:
            return self._encode_chunk(list(texts))
        chunks = _balanced_chunks(list(texts), self.num_threads * 4)
        out: list[np.ndarray] = []
        with ThreadPoolExecutor(self.num_threads, thread_name_prefix="packcli-tiktoken") as pool:
            for part in pool.map(self._encode_chunk, chunks):
                out.extend(part)
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "tiktoken": self.tiktoken_version,
            "ranks": "ids" if self.spec.rank_to_id is None else "remapped",
            "normalizer": self.spec.normalizer,
            "added_tokens": len(self.spec.special_tokens),
            "exact_because": self.spec.proof,
        }


def build_tiktoken_encoder(
    tokenizer: Tokenizer, num_threads: int, fingerprint: str | None = None
) -> FastPath:
    """The tiktoken fast path for ``tokenizer``; raises ``FastPathUnsupported`` with the reason.

    With the tokenizer's ``fingerprint`` (sha256 of its serialization), the derived spec is
    kept in the cache folder and reused by later runs and tasks (deriving it costs ~3 s for a
    100k vocabulary, per task). The self-check still runs every time.
    """
    if fingerprint is None:
        return FastPath(derive_spec(tokenizer), num_threads)
    if tokenizer.encode_special_tokens:  # not in the serialization, but changes the spec
        fingerprint = f"{fingerprint}-plain-specials"
    spec = _load_cached_spec(fingerprint)
    if spec is None:
        spec = derive_spec(tokenizer)
        _store_cached_spec(fingerprint, spec)
    return FastPath(spec, num_threads)


_SPEC_FORMAT = 1


def cache_dir() -> Path | None:
    """``$PACKCLI_CACHE_DIR`` (empty: no cache), else ``$XDG_CACHE_HOME/packcli``, else
    ``~/.cache/packcli``."""
    value = os.environ.get("PACKCLI_CACHE_DIR")
    if value is not None:
        return Path(value) if value else None
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "packcli"


def _spec_path(fingerprint: str) -> Path | None:
    folder = cache_dir()
    if folder is None:
        return None
    return folder / f"fastpath-{hashlib.sha256(fingerprint.encode()).hexdigest()[:32]}.json"


def _load_cached_spec(fingerprint: str) -> TiktokenSpec | None:
    """The cached spec for this exact tokenizer and packcli version, or ``None`` (absent,
    unreadable or from another version: derived again)."""
    path = _spec_path(fingerprint)
    if path is None or not path.is_file():
        return None
    try:
        data = json.loads(path.read_bytes())
        if (data["format"], data["packcli"], data["tokenizer_sha256"]) != (
            _SPEC_FORMAT,
            __version__,
            fingerprint,
        ):
            return None
        raw = data["spec"]
        spec = TiktokenSpec(
            pattern=raw["pattern"],
            mergeable_ranks={
                base64.b64decode(token): rank for token, rank in raw["mergeable_ranks"]
            },
            special_tokens=raw["special_tokens"],
            rank_to_id=None
            if raw["rank_to_id"] is None
            else np.asarray(raw["rank_to_id"], dtype=np.int64),
            normalizer=raw["normalizer"],
            split_added=raw["split_added"],
            proof=raw["proof"],
            excluded=raw["excluded"],
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring the cached fast-path spec %s: %s", path, exc)
        return None
    log.info("fast-path spec from the cache: %s", path)
    return spec


def _store_cached_spec(fingerprint: str, spec: TiktokenSpec) -> None:
    """Best effort: a read-only or full cache folder only costs the next run the derivation."""
    path = _spec_path(fingerprint)
    if path is None:
        return
    raw = {
        "pattern": spec.pattern,
        "mergeable_ranks": [
            [base64.b64encode(token).decode("ascii"), rank]
            for token, rank in spec.mergeable_ranks.items()
        ],
        "special_tokens": spec.special_tokens,
        "rank_to_id": None if spec.rank_to_id is None else spec.rank_to_id.tolist(),
        "normalizer": spec.normalizer,
        "split_added": spec.split_added,
        "proof": spec.proof,
        "excluded": spec.excluded,
    }
    data = {
        "format": _SPEC_FORMAT,
        "packcli": __version__,
        "tokenizer_sha256": fingerprint,
        "spec": raw,
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, json.dumps(data).encode("utf-8"))
    except OSError as exc:
        log.warning("cannot cache the fast-path spec in %s: %s", path.parent, exc)


def _show(text: str) -> str:
    shown = repr(text[:_SHOW_CHARS])
    return shown + (f"... ({len(text)} chars)" if len(text) > _SHOW_CHARS else "")


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    texts: int
    tokens: int
    mismatch: str | None = None  # the first differing text, truncated, with where it differs
    details: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        if self.ok:
            return f"identical ids on {self.texts} texts ({self.tokens} tokens)"
        return f"ids differ on {self.mismatch}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "texts": self.texts,
            "tokens": self.tokens,
            "mismatch": self.mismatch,
        }


def adversarial_texts(tokenizer: Tokenizer | None = None) -> list[str]:
    """Texts where split regexes, normalizers and added-token matching tend to disagree."""
    texts = [
        "",
        " ",
        "  ",
        "\t",
        "\n",
        "\r\n",
        "a\r\nb",
        "line one\r\n\r\nline two\r\n",
        "tabs\tand\t\ttabs \t mixed",
        "trailing spaces   ",
        "   leading spaces",
        "x \n y \n\n z  \n",
        "a" + " " * 40 + "b",
        "\n" * 30 + "end",
        " \u00a0nbsp\u00a0 \u3000ideographic\u2028line\u2029para\x0b\x0c\x85",
        "zero\u200bwidth\u200djoiner\ufeffbom\u2060",
        "control \x00\x01\x1f\x7f chars",
        "1 12 123 1234 12345 123456 1234567 12345678 123456789 1234567890 12345678901234567890",
        "3.14159 2,718 1_000_000 -42 +7e10 0x1F 1/2 50% $9.99 #1",
        "\u0663\u0664\u0665 \uff11\uff12\uff13 \u2460\u2461 \u216b \u00b2\u00b3 \u0e51\u0e52",
        "中文字符测试，标点符号。还有数字123和English混合",  # noqa: RUF001
        "日本語のテキスト、カタカナとひらがな。ｶﾀｶﾅ",
        "한국어 텍스트입니다. 한글 자모 \u1100\u1161\u11a8",
        "Привет, мир! Ёлка. Γειά σου κόσμε. مرحبا بالعالم. שלום עולם. नमस्ते दुनिया. สวัสดี",  # noqa: RUF001
        "family \U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 flag "
        "\U0001f3f3\ufe0f\u200d\U0001f308 skin \U0001f44d\U0001f3fd flags \U0001f1eb\U0001f1f7",
        "\U0001f600\U0001f600\U0001f600 emoji run \u2764\ufe0f \u263a",
        "caf\u00e9 cafe\u0301 na\u00efve nai\u0308ve \u00c5 \u212b A\u030a",
        "\u212a \u2126 \ufb01 \u01c5 \u2460 \u00bd \u1e9b\u0323",
        "e\u0301\u0301\u0301 a\u0323\u0302 \u1e69 s\u0323\u0307 \u0915\u093c \u05d1\u05bc",
        "\U0001e030 \U00011f00 \U00010d40 \U0001e4d0 \u0cf3 newer letters",
        "x" * 3000,
        "ab" * 1500,
        "supercalifragilisticexpialidocious" * 40,
        "1" * 500,
        "\u00e9" * 700,
        "\u4e2d" * 700,
        "!!!??? ... ---- ==== **** ____ //// \\\\\\\\ |||| ;;;; :::: ,,,,",
        "\u2014\u2013- \u00ab\u00bb \u201c\u201d \u2018\u2019 {[()]}<> @#$%^&*~`",
        "#!/usr/bin/env python\ndef f(x):\n    return x**2  # square\n",
        "\tif (a) {\n\t\treturn;\n\t}\n\n\n",
        "http://example.com/path?q=1&x=2#frag user@example.org",
        "don't DON'T Don't I'm I'M you're YOU'RE we've WE'VE she'll SHE'LL he'd HE'D it's IT'S",
        "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'VE 'M 'LL 'D",
        "'\u017f '\u212a ''s '''' ' '' rock'n'roll \u2019s \u2018t O'Neil",
        " 's\n'll\t'D",
    ]
    added: list[str] = []
    if tokenizer is not None:
        added = sorted(t.content for t in tokenizer.get_added_tokens_decoder().values())[:32]
    for tok in added:
        half = len(tok) // 2
        texts += [
            tok,
            f"x{tok}y",
            f" {tok} ",
            tok + tok,
            f"\n{tok}\n\n",
            f"end.{tok}Start",
            tok[:-1],
            tok[1:],
            f"{tok[:half]} {tok[half:]}",
            tok.upper(),
            f"caf\u00e9{tok}cafe\u0301",
        ]
    # A deterministic mix of characters from many blocks, in random runs.
    rng = random.Random(12345)
    pool = (
        "abcxyzABCXYZ0123456789 \t\n\r.,;:!?'\"-_()[]{}<>/\\|@#$%^&*+=~`"
        "éèàùçñøåßÆŒ\u0301\u0308ЖжЯяΩωλ中文日本語한국어ไทยअआ\u093cאבغ"
        "\u00a0\u2009\u3000\u200b\u200d\U0001f600\U0001f44d\U0001f3fd\ufe0f" + "".join(added)
    )
    for _ in range(64):
        texts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 120))))
    return texts


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def self_check(
    fast: BatchEncoder,
    hf_encoder: BatchEncoder,
    sample_texts: Sequence[str],
    tokenizer: Tokenizer | None = None,
) -> CheckResult:
    """Encode the sample plus the adversarial set with both encoders; ids must be identical."""
    texts = list(sample_texts) + adversarial_texts(tokenizer)
    got = fast(texts)
    want = hf_encoder(texts)
    tokens = 0
    for text, g, w in zip(texts, got, want, strict=True):
        g, w = np.asarray(g).tolist(), list(w)
        if g != w:
            at = _first_difference(g, w)
            return CheckResult(
                ok=False,
                texts=len(texts),
                tokens=tokens,
                mismatch=f"{_show(text)} at token {at}: tiktoken {g[at : at + 3]} "
                f"vs hf {w[at : at + 3]}",
                details={"text": text, "tiktoken": g, "hf": w},
            )
        tokens += len(w)
    return CheckResult(ok=True, texts=len(texts), tokens=tokens)


def choose_encoder(
    tokenizer: Tokenizer,
    backend: Backend,
    sample_texts: Sequence[str],
    num_threads: int,
    fingerprint: str | None = None,
) -> tuple[BatchEncoder, dict[str, Any]]:
    """The encoder to tokenize with, and a record of the choice for the report.

    ``hf``: always HF. ``auto``: the tiktoken fast path when it is supported and its self-check
    passes, else HF with one warning saying why. ``tiktoken``: the fast path or a
    ``ConfigError`` naming the reason.
    """
    if backend not in BACKENDS:
        raise ConfigError(
            f"tokenizer backend must be one of {', '.join(BACKENDS)}, got {backend!r}"
        )
    hf = hf_batch_encoder(tokenizer)
    record: dict[str, Any] = {"requested": backend, "backend": "hf", "fallback_reason": None}
    if backend == "hf":
        return hf, record
    try:
        fast = build_tiktoken_encoder(tokenizer, num_threads, fingerprint)
    except FastPathUnsupported as exc:
        reason = f"unsupported: {exc.reason}"
        if backend == "tiktoken":
            raise ConfigError(
                f"tokenizer backend tiktoken: this tokenizer cannot be reproduced exactly "
                f"({exc.reason}); use backend auto or hf"
            ) from exc
        log.warning("tokenizing with HF tokenizers, not the tiktoken fast path: %s", reason)
        record["fallback_reason"] = reason
        return hf, record
    check = self_check(fast, hf, sample_texts, tokenizer)
    record["check"] = check.as_dict()
    if not check.ok:
        reason = f"self-check failed: {check.line()}"
        if backend == "tiktoken":
            raise ConfigError(
                f"tokenizer backend tiktoken: the fast path gives different ids than HF "
                f"tokenizers ({check.line()}); use backend auto or hf"
            )
        log.warning("tokenizing with HF tokenizers, not the tiktoken fast path: %s", reason)
        record["fallback_reason"] = reason
        return hf, record
    log.info("tokenizing with the tiktoken fast path: %s", check.line())
    record.update(backend="tiktoken", **fast.describe())
    return fast, record
