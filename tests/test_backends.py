"""Every fast backend gives HF's ids exactly, or is passed over / refused, and says why."""

from __future__ import annotations

import importlib.util
import itertools
import json
import logging
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

from packcli.errors import ConfigError
from packcli.tokenize import backends, tokenizer_cache
from packcli.tokenize.backends import (
    FAST_ORDER,
    CheckResult,
    HFEncoder,
    adversarial_texts,
    choose_encoder,
    self_check,
)
from packcli.tokenize.tokenizer import load_tokenizer, set_special_in_text

# Every fast backend installed here (identity is tested for all), and those ``auto`` tries.
INSTALLED = [name for name in backends._MAKERS if importlib.util.find_spec(name) is not None]
AUTO = [name for name in FAST_ORDER if name in INSTALLED]


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table, which byte-level BPE vocabularies are in."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("\u00a1"), ord("\u00ac") + 1))
        + list(range(ord("\u00ae"), ord("\u00ff") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIALS = ["<|endoftext|>", "<|begin_of_text|>", "<|eot_id|>"]

_ALPHABETS = [
    "abcdefghijklmnopqrstuvwxyz",
    "abcdeéèêàâçñöüßøå",
    "абвгдежзийклмнопрстуфхцчшщыэюя",
    "αβγδεζηθικλμνξοπρστυφχψω",
    "的一是不了人我在有他这中大来上个国和到说们为子",
    "ابتثجحخدذرزسشصضطظعغفقكلمنهوي",
    "कखगघचछजझटठडढणतथदधनपफबभमयरलवशसह",
    "가나다라마바사아자차카타파하",
]
_SEPARATORS = [" "] * 12 + [", ", ". ", "\n", "\r\n", "\t", "  ", " - ", "\n\n", "! ", "? "]
_EXTRAS = ["'s", "'LL", "'re", "'T", "e\u0301", "\U0001f600", "\U0001f44d\U0001f3fd", "...", "%"]


def multilingual_texts(n: int, seed: int) -> list[str]:
    """Deterministic documents mixing scripts, digits, emoji, contractions and whitespace."""
    rng = random.Random(seed)
    words = []
    for _ in range(600):
        alphabet = rng.choice(_ALPHABETS[:2] * 3 + _ALPHABETS)
        word = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 9)))
        words.append(word.capitalize() if rng.random() < 0.2 else word)
    texts = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(5, 120)):
            roll = rng.random()
            if roll < 0.08:
                parts.append(str(rng.randint(0, 10 ** rng.randint(1, 8))))
            elif roll < 0.14:
                parts.append(rng.choice(_EXTRAS))
            else:
                parts.append(words[min(int(rng.paretovariate(1.0)) - 1, len(words) - 1)])
            parts.append(rng.choice(_SEPARATORS))
        texts.append("".join(parts))
    return texts


def train(
    pre_tokenizer: pre_tokenizers.PreTokenizer,
    normalizer: normalizers.Normalizer | None = None,
    vocab_size: int = 1200,
) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    if normalizer is not None:
        tok.normalizer = normalizer
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(multilingual_texts(500, seed=1), trainer)
    return tok


def edited(tok: Tokenizer, edit: Callable[[dict], None]) -> Tokenizer:
    data = json.loads(tok.to_str())
    edit(data)
    return Tokenizer.from_str(json.dumps(data))


def llama3_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


@pytest.fixture(scope="module")
def gpt2_tok() -> Tokenizer:
    return train(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))


@pytest.fixture(scope="module")
def llama3_tok() -> Tokenizer:
    return train(llama3_pre_tokenizer())


@pytest.fixture(scope="module")
def nfc_tok() -> Tokenizer:
    return train(llama3_pre_tokenizer(), normalizers.NFC())


@pytest.fixture(scope="module")
def texts() -> list[str]:
    """Held-out documents (another seed than training) plus the adversarial set."""
    return multilingual_texts(300, seed=2)


def with_more_added_tokens(tok: Tokenizer) -> Tokenizer:
    """Reserved specials beyond the vocabulary and a normalized non-special added token."""
    out = Tokenizer.from_str(tok.to_str())
    out.add_special_tokens([f"<|reserved_{i}|>" for i in range(40)])
    out.add_tokens(["hello world"])
    return out


def converter_style(tok: Tokenizer) -> Tokenizer:
    """What the tiktoken -> HF converters write: every split of every token is a merge."""

    def edit(data: dict) -> None:
        vocab = data["model"]["vocab"]
        targets = {a + b for a, b in data["model"]["merges"]}
        merges = []
        for token in sorted(targets, key=vocab.__getitem__):
            splits = [
                (token[:i], token[i:])
                for i in range(1, len(token))
                if token[:i] in vocab and token[i:] in vocab
            ]
            merges += sorted(splits, key=lambda s: (vocab[s[0]], vocab[s[1]]))
        data["model"]["merges"] = [list(m) for m in merges]
        data["model"]["ignore_merges"] = True

    return edited(tok, edit)


def permuted_ids(tok: Tokenizer) -> Tokenizer:
    """The same tokenizer with merged tokens' ids shuffled: id order is no longer merge order."""

    def edit(data: dict) -> None:
        vocab = data["model"]["vocab"]
        targets = sorted({a + b for a, b in data["model"]["merges"]}, key=vocab.__getitem__)
        ids = [vocab[t] for t in targets]
        random.Random(0).shuffle(ids)
        vocab.update(zip(targets, ids, strict=True))

    return edited(tok, edit)


def add_nfc_sensitive_specials(data: dict) -> None:
    """Specials that NFC would change around: HF matches them on the raw text, then normalizes."""
    for i, content in enumerate(["<x|e", "<|Key|>"]):  # "e" + U+0301 -> "é"; U+212A -> "K"
        data["added_tokens"].append(
            {
                "id": 5000 + i,
                "content": content,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        )


VARIANTS: dict[str, Callable[[dict[str, Tokenizer]], Tokenizer]] = {
    "gpt2-bytelevel-regex": lambda t: t["gpt2"],
    "llama3-split": lambda t: t["llama3"],
    "nfc": lambda t: t["nfc"],
    "llama3-ignore-merges": lambda t: edited(
        t["llama3"], lambda d: d["model"].update(ignore_merges=True)
    ),
    "llama3-more-added-tokens": lambda t: with_more_added_tokens(t["llama3"]),
    "nfc-more-special-tokens": lambda t: edited(t["nfc"], add_nfc_sensitive_specials),
    "converter-style-merges": lambda t: converter_style(t["llama3"]),
    "permuted-ids": lambda t: permuted_ids(t["gpt2"]),
}


def assert_identical(fast: Callable, tok: Tokenizer, texts: list[str]) -> None:
    want_ids, want_off = HFEncoder(tok)(texts)
    got_ids, got_off = fast(texts)
    assert got_ids.dtype in (np.uint32, np.int32)  # a flat buffer, no Python int per token
    for i, text in enumerate(texts):
        g = got_ids[got_off[i] : got_off[i + 1]].tolist()
        w = want_ids[want_off[i] : want_off[i + 1]].tolist()
        assert g == w, f"ids differ for {text[:80]!r}"


@pytest.mark.parametrize("backend", INSTALLED)
@pytest.mark.parametrize("specials", ["special", "text"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_backend_gives_hf_ids(
    backend: str,
    variant: str,
    specials: str,
    gpt2_tok: Tokenizer,
    llama3_tok: Tokenizer,
    nfc_tok: Tokenizer,
    texts: list[str],
) -> None:
    """Identical ids on the multilingual corpus, the adversarial set and special-token strings
    inside text, under both ``--special-in-text`` settings."""
    tok = VARIANTS[variant]({"gpt2": gpt2_tok, "llama3": llama3_tok, "nfc": nfc_tok})
    tok = Tokenizer.from_str(tok.to_str())
    set_special_in_text(tok, specials)
    fast = backends._MAKERS[backend](tok)
    extra = [
        "x<x|e\u0301y <|\u212aey|> hello world<|reserved_3|>hello worldx",
        "<|endoftext|><|begin_of_text|>Hi<|eot_id|>\r\n",
    ]
    assert_identical(fast, tok, texts + adversarial_texts(tok) + extra)
    assert self_check(fast, HFEncoder(tok), texts[:50], tok, backend).ok


@pytest.mark.parametrize("backend", INSTALLED)
def test_special_tokens_in_text_follow_the_setting(llama3_tok: Tokenizer, backend: str) -> None:
    tok = Tokenizer.from_str(llama3_tok.to_str())
    eot = tok.token_to_id("<|eot_id|>")
    text = "before<|eot_id|>after"
    ids, _ = backends._MAKERS[backend](tok)([text])
    assert eot in ids.tolist()
    set_special_in_text(tok, "text")
    ids, _ = backends._MAKERS[backend](tok)([text])
    assert eot not in ids.tolist()
    assert ids.tolist() == tok.encode(text, add_special_tokens=False).ids


def byte_level_bpe(
    tokens: list[str], merges: list[tuple[str, str]], ignore_merges: bool = False
) -> Tokenizer:
    """A hand-made byte-level BPE: the 256 byte symbols, then ``tokens``."""
    vocab = {c: i for i, c in enumerate(bytes_to_unicode().values())}
    for token in tokens:
        vocab[token] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return tok


def wordpiece() -> Tokenizer:
    vocab = {"[UNK]": 0, "hello": 1, "world": 2, "##s": 3}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return tok


def _lstrip_token(d: dict) -> None:
    d["added_tokens"][0]["lstrip"] = True


UNSUPPORTED: dict[str, tuple[Callable[[Tokenizer], Tokenizer], str]] = {
    "wordpiece": (lambda t: wordpiece(), "model WordPiece"),
    "byte-fallback": (
        lambda t: edited(t, lambda d: d["model"].update(byte_fallback=True)),
        "byte_fallback",
    ),
    "dropout": (lambda t: edited(t, lambda d: d["model"].update(dropout=0.1)), "dropout"),
    "add-prefix-space": (
        lambda t: edited(t, lambda d: d["pre_tokenizer"].update(add_prefix_space=True)),
        "add_prefix_space",
    ),
    "nfkc": (
        lambda t: edited(t, lambda d: d.update(normalizer={"type": "NFKC"})),
        "normalizer NFKC",
    ),
    "metaspace": (
        lambda t: edited(
            t,
            lambda d: d.update(
                pre_tokenizer={"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always"}
            ),
        ),
        "pre-tokenizer Metaspace",
    ),
    "lstrip-added-token": (lambda t: edited(t, _lstrip_token), "lstrip=true"),
    "split-leaves-gaps": (
        lambda t: edited(
            t,
            lambda d: d.update(
                pre_tokenizer={
                    "type": "Sequence",
                    "pretokenizers": [
                        {
                            "type": "Split",
                            "pattern": {"Regex": r"\p{L}+"},
                            "behavior": "Isolated",
                            "invert": False,
                        },
                        {
                            "type": "ByteLevel",
                            "add_prefix_space": False,
                            "trim_offsets": True,
                            "use_regex": False,
                        },
                    ],
                }
            ),
        ),
        "leaves text unmatched",
    ),
    # "abc" is made by (ab, c) but (b, c) merges first: HF never reaches it, tiktoken's
    # whole-piece lookup would.
    "unreachable-token": (
        lambda t: byte_level_bpe(["bc", "ab", "abc"], [("b", "c"), ("a", "b"), ("ab", "c")]),
        "not reachable",
    ),
    "unreachable-with-ignore-merges": (
        lambda t: byte_level_bpe(
            ["bc", "ab", "abc"], [("b", "c"), ("a", "b"), ("ab", "c")], ignore_merges=True
        ),
        "splits of tokens into two tokens are not merges",
    ),
}


@pytest.mark.parametrize("case", [c for c in UNSUPPORTED if c != "dropout"])
def test_auto_takes_a_fast_backend_only_when_it_is_exact(
    case: str, gpt2_tok: Tokenizer, texts: list[str]
) -> None:
    """Tokenizers the old tiktoken path refused: each either loads in a fast backend and then
    gives HF's ids, or ``auto`` falls back to HF and records why."""
    tok = UNSUPPORTED[case][0](gpt2_tok)
    encoder, record = choose_encoder(tok, "auto", texts[:40])
    assert_identical(encoder, tok, texts[:100] + adversarial_texts(tok))
    if record["backend"] == "hf":
        assert record["fallback_reason"]
    else:
        assert record["check"]["ok"]


@pytest.mark.parametrize("backend", AUTO)
def test_a_tokenizer_the_backend_cannot_load_falls_back_with_the_reason(
    backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    tok = wordpiece()
    sample = ["hello world", "hellos"]
    with caplog.at_level(logging.WARNING, logger="packcli.tokenize.backends"):
        encoder, record = choose_encoder(tok, "auto", sample)
    assert isinstance(encoder, HFEncoder) and record["backend"] == "hf"
    assert f"{backend}: unavailable: " in record["fallback_reason"]
    assert f"not {backend}" in caplog.text
    with pytest.raises(ConfigError, match=f"tokenizer backend {backend}: .*cannot load"):
        choose_encoder(tok, backend, sample)


class _OffByOne:
    """A deliberately wrong backend: one id changed in every document holding an 'e'."""

    name = "fastokens"
    version = "test"

    def __init__(self, tok: Tokenizer, serialized: str | None = None) -> None:
        self.inner = HFEncoder(tok)

    def __call__(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        ids, offsets = self.inner(texts)
        ids = ids.copy()
        for i, text in enumerate(texts):
            if "e" in text and offsets[i + 1] > offsets[i]:
                ids[offsets[i]] += 1
        return ids, offsets


def test_a_wrong_backend_fails_the_check_auto_falls_back_explicit_stops(
    llama3_tok: Tokenizer, texts: list[str], monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    monkeypatch.setattr(backends, "_MAKERS", {name: _OffByOne for name in FAST_ORDER})
    with caplog.at_level(logging.WARNING, logger="packcli.tokenize.backends"):
        encoder, record = choose_encoder(llama3_tok, "auto", texts[:20])
    assert isinstance(encoder, HFEncoder)
    assert record["backend"] == "hf" and "fastokens: self-check failed" in record["fallback_reason"]
    assert "self-check failed" in caplog.text
    with pytest.raises(ConfigError, match="fastokens gives different ids than HF"):
        choose_encoder(llama3_tok, "fastokens", texts[:20])


def test_auto_keeps_small_inputs_on_hf(llama3_tok: Tokenizer, texts: list[str]) -> None:
    """A fast backend first builds tables from the vocabulary (seconds at 128k); an input
    HF finishes sooner stays on HF, by its size alone (so every task chooses alike)."""
    small = llama3_tok.get_vocab_size() * backends.HF_BYTES_PER_VOCAB_ENTRY
    encoder, record = choose_encoder(llama3_tok, "auto", texts[:5], input_bytes=small - 1)
    assert isinstance(encoder, HFEncoder) and "small input" in record["fallback_reason"]
    _, record = choose_encoder(llama3_tok, "auto", texts[:5], input_bytes=small)
    assert record["backend"] == AUTO[0]
    _, record = choose_encoder(llama3_tok, AUTO[0], texts[:5], input_bytes=10)
    assert record["backend"] == AUTO[0]  # named: used whatever the size


@pytest.mark.skipif("fastokens" not in INSTALLED, reason="fastokens is not installed")
def test_choose_encoder_records(llama3_tok: Tokenizer, texts: list[str]) -> None:
    fast, record = choose_encoder(llama3_tok, "auto", texts[:30])
    assert record["backend"] == "fastokens" and record["check"]["ok"]
    assert record["check"]["texts"] == 30 + len(adversarial_texts(llama3_tok))
    _, alias = choose_encoder(llama3_tok, "tiktoken", texts[:30])  # the old fast path's name
    assert alias["backend"] == "fastokens" and alias["requested"] == "fastokens"
    hf, record = choose_encoder(llama3_tok, "hf", texts[:30])
    assert record == {"requested": "hf", "backend": "hf", "fallback_reason": None}
    a, b = hf(texts[:3]), fast(texts[:3])
    assert np.array_equal(a[1], b[1]) and a[0].tolist() == b[0].tolist()
    with pytest.raises(ConfigError, match="must be one of"):
        choose_encoder(llama3_tok, "fast", texts)


def test_self_check_names_the_first_difference() -> None:
    def flat(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
        return backends.flat_from_lists(rows)

    def hf(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        return flat([[len(t), 1, 2] for t in texts])

    def off_by_one(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        return flat([[len(t), 1, 2 if "y" not in t else 3] for t in texts])

    ok = self_check(hf, hf, ["a", "b"])
    assert ok == CheckResult(ok=True, texts=ok.texts, tokens=3 * ok.texts)
    bad = self_check(off_by_one, hf, ["x" * 500 + "y"], name="gigatoken")
    assert not bad.ok
    assert bad.mismatch is not None and "(501 chars) at token 2: gigatoken [3]" in bad.mismatch


@pytest.mark.skipif("fastokens" not in INSTALLED, reason="fastokens is not installed")
def test_preloaded_fastokens_follows_the_runs_settings(llama3_tok: Tokenizer, tmp_path) -> None:
    """Built from the file while HF loads it, then bound to HF's special-token setting (the
    file carries truncation, which both turn off); small inputs and ``hf`` preload nothing."""
    path = tmp_path / "tokenizer.json"
    with_truncation = Tokenizer.from_str(llama3_tok.to_str())
    with_truncation.enable_truncation(max_length=4)
    with_truncation.save(str(path))
    early = backends.preload("auto", path, input_bytes=10**9)
    assert early is not None
    tok = Tokenizer.from_file(str(path))
    tok.no_truncation()
    set_special_in_text(tok, "text")
    encoder, record = choose_encoder(tok, "auto", ["x"], loading=early)
    assert record["backend"] == "fastokens" and record["check"]["ok"]
    text = "a long enough text<|eot_id|>b c d e f"
    ids, _ = encoder([text])
    assert ids.tolist() == tok.encode(text, add_special_tokens=False).ids
    assert tok.token_to_id("<|eot_id|>") not in ids.tolist()
    assert backends.preload("auto", path, input_bytes=10) is None
    assert backends.preload("hf", path, input_bytes=10**9) is None
    assert backends.preload("auto", None, input_bytes=10**9) is None


@pytest.mark.skipif("fastokens" not in INSTALLED, reason="fastokens is not installed")
def test_preloaded_fastokens_builds_from_the_cached_copy(
    llama3_tok: Tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, texts: list[str]
) -> None:
    """Once HF's load has cached a copy of the file, the early build reads the copy (faster
    to build from), and what it builds passes the self-check and encodes as HF does."""
    monkeypatch.setenv("PACKCLI_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(tokenizer_cache, "MIN_BYTES", 0)
    path = tmp_path / "tokenizer.json"
    llama3_tok.save(str(path))  # merges as pairs: a copy is made
    built: list[str | None] = []
    real = backends._Loading

    def spy(name: str, tokenizer: Tokenizer | None, serialized: str | None) -> Any:
        built.append(serialized)
        return real(name, tokenizer, serialized)

    monkeypatch.setattr(backends, "_Loading", spy)
    backends.preload("auto", path, input_bytes=10**9).result()  # type: ignore[union-attr]
    tok = load_tokenizer(str(path)).tokenizer  # HF's load makes the copy
    early = backends.preload("auto", path, input_bytes=10**9)
    (copy,) = (tmp_path / "cache" / "tokenizers").glob("*.json")
    assert built == [path.read_text(encoding="utf-8"), copy.read_text(encoding="utf-8")]
    assert built[0] != built[1]
    encoder, record = choose_encoder(tok, "auto", texts, loading=early)
    assert record["backend"] == "fastokens" and record["check"]["ok"]
    ids, bounds = encoder(texts)
    want = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    assert [ids[a:b].tolist() for a, b in itertools.pairwise(bounds.tolist())] == want


def test_the_self_check_sample_is_bounded(
    llama3_tok: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A corpus opening with a huge document: the self-check encodes a cut of it (HF took
    19 s and 2.8 GB for a 20 MB document), and both encoders see the same cut."""
    seen: list[int] = []
    real = HFEncoder.__call__

    def recording(self: HFEncoder, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        seen.append(max(map(len, texts)))
        return real(self, texts)

    monkeypatch.setattr(HFEncoder, "__call__", recording)
    huge = "word " * 200_000
    _, record = choose_encoder(llama3_tok, AUTO[0], [huge, huge, "short"])
    assert record["check"]["ok"]
    assert max(seen) <= backends.SAMPLE_CHARS
    cut = backends.bounded_sample(["x" * 10**6] * 200)
    assert all(len(t) == backends.SAMPLE_CHARS for t in cut)
    assert sum(map(len, cut)) <= backends.SAMPLE_TOTAL_CHARS + backends.SAMPLE_CHARS


@pytest.mark.skipif(importlib.util.find_spec("fastokens") is None, reason="needs fastokens")
def test_a_run_that_fails_while_the_fast_backend_loads_exits_1(
    toy_tokenizer_path: Path, tmp_path: Path
) -> None:
    """A bad line found while fastokens' tables are still being built in the background:
    the process printed the error, then aborted at exit ("FATAL: exception not rethrown",
    exit 134) because the builder thread was unwound inside Rust code. The build is made
    slow here (real builds, repeated for 3 s) so it is surely still running."""
    import subprocess
    import sys

    corpus = tmp_path / "bad.jsonl"
    corpus.write_text('{"text": "fine"}\nnot json\n{"text": "fine"}\n')
    script = (
        "import sys, time\n"
        "import packcli.tokenize.backends as b\n"
        "real = b._make\n"
        "def slow(*args):\n"
        "    end = time.monotonic() + 3\n"
        "    value = real(*args)\n"
        "    while time.monotonic() < end:\n"
        "        value = real(*args)\n"
        "    return value\n"
        "b._make = slow\n"
        "from packcli.cli import main\n"
        "main()\n"
    )
    args = ["pack", str(corpus), "-t", str(toy_tokenizer_path), "-o", str(tmp_path / "out")]
    args += ["-q", "--tokenizer-backend", "fastokens"]
    done = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: {corpus}:2: invalid JSON: invalid literal, expected 'null' (at column 1)"
    ]
