"""Tokenizer backends: HF ``tokenizers`` (the reference) and byte-identical fast encoders.

Why: tokenization is the cost of ``packcli pack``. ``fastokens`` (Apache-2.0, Rust, abi3
wheels) loads the same ``tokenizer.json`` and encodes byte-level BPE tokenizers (GPT-2,
Llama 3, Qwen, with or without NFC, ``ignore_merges``, ``byte_fallback``) an order of
magnitude faster than HF's ``encode_batch_fast`` on the same cores, and returns a batch as two
flat buffers (uint32 ids, uint64 offsets), so no Python object is made per token; it refuses
what it cannot reproduce (WordPiece, Unigram, Metaspace, NFKC...), which then stays on HF.
``gigatoken`` (``pip install 'packcli[gigatoken]'``) is a backend to name, not one ``auto``
takes: it also loads Metaspace BPE, but 0.10 keeps its encode caches unbounded (8 GB after
1 GB of varied text, measured) and loads some pre-tokenizer settings it then ignores
(Digits/Punctuation in a Sequence, ``single_word`` added tokens), which only the self-check
would catch; on the 150 MB real-text benchmark it differed from HF on 2 of 103,751 documents
(``scripts/bench_pipeline.py --check-ids``), beyond what a sample check can promise.

Never trust, always check: ``self_check`` encodes the first documents of the corpus plus a
built-in adversarial set (whitespace runs, CRLF, digits, CJK, emoji ZWJ sequences, combining
marks and NFC/NFD pairs, very long words, contractions, the tokenizer's own added tokens inside
text...) with the candidate and with HF, under the run's special-token setting, and requires
identical ids. ``auto`` takes the first backend in ``FAST_ORDER`` that loads and passes;
naming a backend refuses loudly when it cannot load or differs. The choice and the check are
recorded in ``packcli.json``.

Every encoder is ``texts -> (ids, offsets)``: ``ids`` a flat integer array, ``offsets``
int64 of length ``len(texts) + 1`` (document ``i`` is ``ids[offsets[i]:offsets[i + 1]]``).
"""

from __future__ import annotations

import json
import logging
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from tokenizers import Tokenizer

from packcli.errors import ConfigError, require_one_of
from packcli.names import BACKEND_ALIASES, BACKENDS
from packcli.records import Fields
from packcli.tokenize import tokenizer_cache

log = logging.getLogger(__name__)

# What ``auto`` tries, fastest first (scripts/bench_pipeline.py measures every installed
# backend against HF on the same texts). gigatoken is left out until its caches are bounded.
FAST_ORDER: tuple[str, ...] = ("fastokens",)

# Characters of a truncated text shown in a mismatch message.
_SHOW_CHARS = 80

Flat = tuple[np.ndarray, np.ndarray]


class Encoder(Protocol):
    name: str

    def __call__(self, texts: list[str]) -> Flat: ...


class FastEncoder(Encoder, Protocol):
    """A fast backend: its package's version goes into the run's record."""

    version: str


class BackendUnavailable(Exception):
    """The backend is not installed or cannot load this tokenizer; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def flat_from_lists(id_lists: Sequence[Sequence[int]]) -> Flat:
    """Per-document id lists (HF's encodings) as one flat int32 array and offsets."""
    lengths = np.fromiter((len(ids) for ids in id_lists), dtype=np.int64, count=len(id_lists))
    offsets = np.zeros(len(id_lists) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    ids = np.fromiter(chain.from_iterable(id_lists), dtype=np.int32, count=int(offsets[-1]))
    return ids, offsets


class HFEncoder:
    """HF ``encode_batch_fast`` (parallel in Rust, skips character offsets: ~2x faster than
    ``encode_batch``); the reference every other backend is checked against."""

    name = "hf"

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    def __call__(self, texts: list[str]) -> Flat:
        encs = self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        return flat_from_lists([e.ids for e in encs])


class FastokensEncoder:
    """``fastokens`` from the same serialization HF holds (truncation and padding already
    off), with HF's special-token setting (``split_special_tokens`` is HF's
    ``encode_special_tokens``)."""

    name = "fastokens"

    def __init__(self, tokenizer: Tokenizer | None, serialized: str | None = None) -> None:
        """``tokenizer``: the HF tokenizer whose special-token setting to follow; ``None``
        when loading early from the file's text (``preload``), bound later."""
        try:
            import fastokens
        except ImportError as exc:
            raise BackendUnavailable("fastokens is not installed") from exc
        try:
            # Releases the GIL while it builds its tables (~2 s for a 128k vocabulary).
            if serialized is not None:
                text = serialized
            elif tokenizer is not None:
                text = tokenizer.to_str()
            else:
                raise ValueError("neither a tokenizer nor its serialization was given")
            self.tok = fastokens.Tokenizer.from_json_str(text)
        except Exception as exc:  # ValueError for unsupported components; be broad: Rust
            raise BackendUnavailable(f"fastokens cannot load this tokenizer: {exc}") from exc
        self.tok.no_truncation()
        self.tok.no_padding()
        self.hf = tokenizer
        self.version = _version("fastokens")

    def bind(self, tokenizer: Tokenizer) -> None:
        self.hf = tokenizer

    def __call__(self, texts: list[str]) -> Flat:
        split = bool(self.hf is not None and self.hf.encode_special_tokens)
        ids, offsets = self.tok.encode_batch_flat(
            texts, add_special_tokens=False, split_special_tokens=split
        )
        return np.frombuffer(ids, dtype=np.uint32), np.frombuffer(offsets, np.uint64).astype(
            np.int64
        )


class GigatokenEncoder:
    """``gigatoken`` (optional). It has no switch for special tokens inside text, so under
    ``--special-in-text text`` it is built from the serialization without the special added
    tokens: they are then plain text, which is what HF's ``encode_special_tokens`` does (the
    self-check proves it per tokenizer)."""

    name = "gigatoken"

    def __init__(self, tokenizer: Tokenizer, serialized: str | None = None) -> None:
        try:
            import gigatoken
        except ImportError as exc:
            raise BackendUnavailable(
                "gigatoken is not installed (pip install 'packcli[gigatoken]')"
            ) from exc
        data = json.loads(serialized or tokenizer.to_str())
        if tokenizer.encode_special_tokens:
            data["added_tokens"] = [t for t in data["added_tokens"] if not t.get("special")]
        try:
            self.tok = gigatoken.Tokenizer.from_json(json.dumps(data))
        except Exception as exc:
            raise BackendUnavailable(f"gigatoken cannot load this tokenizer: {exc}") from exc
        self.version = _version("gigatoken")

    def __call__(self, texts: list[str]) -> Flat:
        layout = self.tok.encode_batch(texts).layout  # awkward ListOffsetArray, zero-copy
        offsets = np.asarray(layout.offsets.data).astype(np.int64)
        ids = np.asarray(layout.content.data)
        if offsets[0] != 0:
            ids = ids[offsets[0] : offsets[-1]]
            offsets = offsets - offsets[0]
        return ids, offsets


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "unknown"


_MAKERS: dict[str, Callable[..., FastEncoder]] = {
    "fastokens": FastokensEncoder,
    "gigatoken": GigatokenEncoder,
}


def _show(text: str) -> str:
    shown = repr(text[:_SHOW_CHARS])
    return shown + (f"... ({len(text)} chars)" if len(text) > _SHOW_CHARS else "")


@dataclass(frozen=True)
class CheckResult(Fields):
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
        """As the tokenize stage's record holds it: every field but ``details`` (the
        report's, kept in memory)."""
        return {k: v for k, v in self.to_json().items() if k != "details"}


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
    fast: Callable[[list[str]], Flat],
    reference: Callable[[list[str]], Flat],
    sample_texts: Sequence[str],
    tokenizer: Tokenizer | None = None,
    name: str = "fast",
) -> CheckResult:
    """Encode the sample plus the adversarial set with both encoders; ids must be identical."""
    texts = list(sample_texts) + adversarial_texts(tokenizer)
    got_ids, got_off = fast(texts)
    want_ids, want_off = reference(texts)
    if np.array_equal(got_off, want_off) and np.array_equal(
        got_ids.astype(np.int64, copy=False), want_ids.astype(np.int64, copy=False)
    ):
        return CheckResult(ok=True, texts=len(texts), tokens=int(want_off[-1]))
    for i, text in enumerate(texts):
        g = got_ids[got_off[i] : got_off[i + 1]].tolist()
        w = want_ids[want_off[i] : want_off[i + 1]].tolist()
        if g != w:
            at = _first_difference(g, w)
            return CheckResult(
                ok=False,
                texts=len(texts),
                tokens=int(want_off[i]),
                mismatch=f"{_show(text)} at token {at}: {name} {g[at : at + 3]} "
                f"vs hf {w[at : at + 3]}",
                details={"text": text, name: g, "hf": w},
            )
    raise AssertionError("unreachable: flat outputs differ but no document does")


# Below this many input bytes per vocabulary entry, ``auto`` tokenizes with HF: a fast
# backend builds its tables from the vocabulary first (measured: fastokens ~18 us per entry,
# 2.3 s for 128k), and HF (~4 MB/s on 2 cores) finishes small inputs before that.
HF_BYTES_PER_VOCAB_ENTRY = 72
# tokenizer.json bytes per vocabulary entry, at most: ~72 for Llama-3-shaped 128k BPEs (vocab
# plus merges), ~23 for small ones; the larger figure guesses fewer entries, so preload never
# starts a load that choose_encoder would not want.
FILE_BYTES_PER_VOCAB_ENTRY = 72


def _hf_first(input_bytes: int, vocab_entries: int) -> bool:
    """Whether HF finishes an input of this size before a fast backend has built its tables."""
    return input_bytes < vocab_entries * HF_BYTES_PER_VOCAB_ENTRY


# The self-check's sample of the corpus: the first documents, each cut to SAMPLE_CHARS and
# SAMPLE_TOTAL_CHARS in all. A corpus opening with a 20 MB document made HF's reference
# encoding of it take 19 s and 2.8 GB; cut texts test the backends just as well (both encode
# the same cut text).
SAMPLE_CHARS = 1 << 14
SAMPLE_TOTAL_CHARS = 1 << 20


def bounded_sample(texts: Sequence[str]) -> list[str]:
    out: list[str] = []
    total = 0
    for text in texts:
        if total >= SAMPLE_TOTAL_CHARS:
            break
        out.append(text[:SAMPLE_CHARS])
        total += len(out[-1])
    return out


def _make(name: str, tokenizer: Tokenizer | None, serialized: str | None) -> FastEncoder:
    return _MAKERS[name](tokenizer, serialized)


def preload(backend: str, tokenizer_file: Path | None, input_bytes: int) -> _Loading | None:
    """Start building fastokens' tables from the tokenizer file now, in parallel with HF's
    own load of it (which holds the GIL for ~0.8 s at 128k): when ``choose_encoder`` will
    want fastokens (the same size rule), it then waits ~0.8 s less. It builds from the
    file's cached copy where there is one (``tokenizer_cache.cached_copy``: the tokenizer
    HF builds from the file, in the form it reads fastest), else the file's text;
    truncation/padding are turned off in both, and the self-check still decides."""
    if BACKEND_ALIASES.get(backend, backend) not in ("auto", "fastokens") or tokenizer_file is None:
        return None
    try:
        size = tokenizer_file.stat().st_size
        # The vocabulary's size estimated from the file's (parsing 9 MB of JSON to count it
        # cost 0.3 s, a fifth of a small run): a guess only decides whether to start early;
        # ``choose_encoder`` decides with the real count.
        if backend == "auto" and _hf_first(input_bytes, size // FILE_BYTES_PER_VOCAB_ENTRY):
            return None
        raw = tokenizer_file.read_bytes()
        text = tokenizer_cache.cached_copy(raw) or raw.decode("utf-8")
    except (OSError, ValueError):
        return None  # HF's load reports what is wrong with the file
    return _Loading("fastokens", None, text)


def choose_encoder(
    tokenizer: Tokenizer,
    backend: str,
    sample_texts: Sequence[str] | Callable[[], Sequence[str]],
    *,
    serialized: str | Callable[[], str] | None = None,
    input_bytes: int | None = None,
    loading: _Loading | None = None,
) -> tuple[Encoder, dict[str, Any]]:
    """The encoder to tokenize with, and a record of the choice for the report.

    ``hf``: always HF. ``auto``: the first of ``FAST_ORDER`` that loads the tokenizer and
    passes the self-check, else HF, with a warning per backend passed over saying why; HF
    also when ``input_bytes`` is so small that HF is done before a fast backend has loaded
    (the choice depends only on the input's size, so every task makes the same one). A
    named fast backend: that one, or a ``ConfigError`` naming the reason. ``serialized``:
    the tokenizer's ``to_str()``, when the caller has it; ``loading``: a load ``preload``
    started. The fast backend loads in a background thread while HF encodes the
    self-check's reference.
    """
    backend = BACKEND_ALIASES.get(backend, backend)
    require_one_of("tokenizer backend", backend, BACKENDS)
    hf = HFEncoder(tokenizer)
    record: dict[str, Any] = {"requested": backend, "backend": "hf", "fallback_reason": None}
    if backend == "hf":
        return hf, record
    entries = tokenizer.get_vocab_size()
    if backend == "auto" and input_bytes is not None and _hf_first(input_bytes, entries):
        small = entries * HF_BYTES_PER_VOCAB_ENTRY
        record["fallback_reason"] = (
            f"small input ({input_bytes:,} bytes < {small:,}): HF tokenizes it before a fast "
            "backend would have loaded its tables"
        )
        return hf, record
    names = FAST_ORDER if backend == "auto" else (backend,)

    def text() -> str | None:  # made only when a backend loads from it (0.2-0.5 s at 128k)
        return serialized() if callable(serialized) else serialized

    if callable(sample_texts):
        sample_texts = sample_texts()
    if loading is None or loading.name != names[0]:
        loading = _Loading(names[0], tokenizer, text())
    sample_texts = bounded_sample(sample_texts)
    texts = list(sample_texts) + adversarial_texts(tokenizer)
    reference = hf(texts)
    reasons: dict[str, str] = {}
    for name in names:
        try:
            fast = _loaded(name, tokenizer, loading, text)
        except BackendUnavailable as exc:
            if backend != "auto":
                raise ConfigError(
                    f"tokenizer backend {name}: {exc.reason}; use backend auto or hf"
                ) from exc
            reasons[name] = f"unavailable: {exc.reason}"
            continue
        check = self_check(fast, lambda _: reference, texts[: len(sample_texts)], tokenizer, name)
        if not check.ok:
            if backend != "auto":
                raise ConfigError(
                    f"tokenizer backend {name} gives different ids than HF tokenizers "
                    f"({check.line()}); use backend auto or hf"
                )
            reasons[name] = f"self-check failed: {check.line()}"
            continue
        log.info("tokenizing with %s: %s", name, check.line())
        record.update(backend=name, version=fast.version, check=check.as_dict())
        if reasons:
            record["passed_over"] = reasons
        return fast, record
    return hf, _fell_back(record, reasons)


def _loaded(
    name: str, tokenizer: Tokenizer, loading: _Loading, text: Callable[[], str | None]
) -> FastEncoder:
    """Fast backend ``name``: the one ``loading`` built (bound to this run's tokenizer
    settings), or built now."""
    if loading.name != name:
        return _make(name, tokenizer, text())
    fast = loading.result()
    bind = getattr(fast, "bind", None)
    if bind is not None:
        bind(tokenizer)
    return fast


def _fell_back(record: dict[str, Any], reasons: dict[str, str]) -> dict[str, Any]:
    """HF after all: each fast backend passed over is logged with why, and recorded."""
    for name, reason in reasons.items():
        # A backend that is simply not installed is not news; one that failed is.
        level = logging.INFO if "is not installed" in reason else logging.WARNING
        log.log(level, "tokenizing with HF tokenizers, not %s: %s", name, reason)
    record["fallback_reason"] = "; ".join(f"{n}: {r}" for n, r in reasons.items())
    return record


class _Loading:
    """A backend being built in a background thread (its Rust side releases the GIL), so its
    seconds of table building overlap HF's reference encoding of the self-check.

    Not a daemon thread: a run that ends before the backend is wanted (an input error in the
    first batches, or HF chosen after all) must still exit cleanly. A daemon thread still in
    the Rust build when the interpreter shut down was unwound there by force, and the
    process aborted ("FATAL: exception not rethrown", exit 134 instead of 1); a non-daemon
    one is waited for at exit (seconds at most)."""

    def __init__(self, name: str, tokenizer: Tokenizer | None, serialized: str | None) -> None:
        self.name = name
        self._value: FastEncoder | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, args=(tokenizer, serialized), name=f"packcli-load-{name}"
        )
        self._thread.start()

    def _run(self, tokenizer: Tokenizer | None, serialized: str | None) -> None:
        try:
            self._value = _make(self.name, tokenizer, serialized)
        except BaseException as exc:  # re-raised in the caller's thread
            self._error = exc

    def result(self) -> FastEncoder:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._value is not None
        return self._value
