"""The tiktoken fast path gives HF's ids exactly, or refuses / falls back and says why."""

from __future__ import annotations

import importlib.util
import json
import logging
import random
from collections.abc import Callable

import numpy as np
import pytest
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

from packcli import fastpath
from packcli.errors import ConfigError
from packcli.fastpath import (
    CheckResult,
    FastPath,
    FastPathUnsupported,
    TiktokenSpec,
    adversarial_texts,
    build_tiktoken_encoder,
    bytes_to_unicode,
    choose_encoder,
    derive_spec,
    self_check,
)
from packcli.tokenizer import hf_batch_encoder, set_special_in_text

needs_tiktoken = pytest.mark.skipif(
    importlib.util.find_spec("tiktoken") is None, reason="tiktoken is not installed"
)

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
    want = hf_batch_encoder(tok)(texts)
    got = fast(texts)
    for text, g, w in zip(texts, got, want, strict=True):
        assert isinstance(g, np.ndarray) and g.dtype == np.uint32  # no Python int per token
        assert g.tolist() == list(w), f"ids differ for {text[:80]!r}"


@needs_tiktoken
@pytest.mark.parametrize("specials", ["special", "text"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_fast_path_gives_hf_ids(
    variant: str,
    specials: str,
    gpt2_tok: Tokenizer,
    llama3_tok: Tokenizer,
    nfc_tok: Tokenizer,
    texts: list[str],
) -> None:
    """Identical ids under both ``--special-in-text`` settings (special-token strings inside
    text: matched as the tokens, or encoded as plain text)."""
    tok = VARIANTS[variant]({"gpt2": gpt2_tok, "llama3": llama3_tok, "nfc": nfc_tok})
    tok = Tokenizer.from_str(tok.to_str())
    set_special_in_text(tok, specials)
    fast = build_tiktoken_encoder(tok, num_threads=2)
    extra = [
        "x<x|e\u0301y <|\u212aey|> hello world<|reserved_3|>hello worldx",
        "<|endoftext|><|begin_of_text|>Hi<|eot_id|>\r\n",
    ]
    assert_identical(fast, tok, texts + adversarial_texts(tok) + extra)
    assert self_check(fast, hf_batch_encoder(tok), texts[:50], tok).ok
    info = fast.describe()
    assert info["ranks"] == ("remapped" if variant == "permuted-ids" else "ids")
    if variant == "converter-style-merges":
        assert info["exact_because"] == "merges hold every split of every token"
    else:
        assert info["exact_because"] == "unique merges, all tokens reachable"


@needs_tiktoken
def test_added_tokens_in_text_are_matched_like_hf(llama3_tok: Tokenizer) -> None:
    tok = Tokenizer.from_str(llama3_tok.to_str())
    eot = tok.token_to_id("<|eot_id|>")
    text = "before<|eot_id|>after"
    # HF matches added tokens in raw text even without add_special_tokens ...
    assert eot in tok.encode(text, add_special_tokens=False).ids
    assert eot in build_tiktoken_encoder(tok, 1)([text])[0]
    assert_identical(build_tiktoken_encoder(tok, 1), tok, [text])
    # ... unless told to encode special tokens as text.
    tok.encode_special_tokens = True
    assert eot not in tok.encode(text, add_special_tokens=False).ids
    fast = build_tiktoken_encoder(tok, 1)
    assert eot not in fast([text])[0]
    assert_identical(fast, tok, [text, *adversarial_texts(tok)])


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


@pytest.mark.parametrize("case", list(UNSUPPORTED))
def test_unsupported_tokenizers_are_refused(
    case: str, gpt2_tok: Tokenizer, caplog: pytest.LogCaptureFixture
) -> None:
    make, reason = UNSUPPORTED[case]
    tok = make(gpt2_tok)
    with pytest.raises(FastPathUnsupported, match=reason):
        derive_spec(tok)
    sample = ["hello world", "abc abc"]
    with caplog.at_level(logging.WARNING, logger="packcli.fastpath"):
        encoder, record = choose_encoder(tok, "auto", sample, num_threads=2)
    assert record["backend"] == "hf" and reason in record["fallback_reason"]
    assert not isinstance(encoder, FastPath)
    if case != "dropout":  # dropout makes HF itself random
        assert encoder(sample) == hf_batch_encoder(tok)(sample)
    assert len(caplog.records) == 1 and "not the tiktoken fast path" in caplog.text
    with pytest.raises(ConfigError, match=reason):
        choose_encoder(tok, "tiktoken", sample, num_threads=2)


def test_handmade_bpe_with_reachable_tokens_is_accepted() -> None:
    tok = byte_level_bpe(["ab", "abc"], [("a", "b"), ("ab", "c")])
    spec = derive_spec(tok)
    assert spec.proof == "unique merges, all tokens reachable" and spec.rank_to_id is None


def swapped_ranks(spec: TiktokenSpec, tokens: list[bytes]) -> TiktokenSpec:
    ranks = dict(spec.mergeable_ranks)
    a, b = tokens
    ranks[a], ranks[b] = ranks[b], ranks[a]
    return TiktokenSpec(
        pattern=spec.pattern,
        mergeable_ranks=ranks,
        special_tokens=spec.special_tokens,
        rank_to_id=spec.rank_to_id,
        normalizer=spec.normalizer,
        split_added=spec.split_added,
        proof=spec.proof,
    )


@needs_tiktoken
def test_altered_encoding_fails_the_check_and_auto_falls_back(
    llama3_tok: Tokenizer,
    texts: list[str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    spec = derive_spec(llama3_tok)
    by_rank = sorted((r, t) for t, r in spec.mergeable_ranks.items() if len(t) > 1)
    altered = swapped_ranks(spec, [by_rank[0][1], by_rank[1][1]])
    check = self_check(FastPath(altered, 2), hf_batch_encoder(llama3_tok), texts[:20], llama3_tok)
    assert not check.ok and check.mismatch and "ids differ on" in check.line()

    monkeypatch.setattr(fastpath, "derive_spec", lambda tok: altered)
    with caplog.at_level(logging.WARNING, logger="packcli.fastpath"):
        encoder, record = choose_encoder(llama3_tok, "auto", texts[:20], num_threads=2)
    assert record["backend"] == "hf" and record["fallback_reason"].startswith("self-check failed")
    assert record["check"]["ok"] is False
    assert "self-check failed" in caplog.text
    assert encoder(texts[:5]) == hf_batch_encoder(llama3_tok)(texts[:5])
    with pytest.raises(ConfigError, match="different ids"):
        choose_encoder(llama3_tok, "tiktoken", texts[:20], num_threads=2)


@needs_tiktoken
def test_choose_encoder_backends(llama3_tok: Tokenizer, texts: list[str]) -> None:
    fast, record = choose_encoder(llama3_tok, "auto", texts[:30], num_threads=2)
    assert record["backend"] == "tiktoken" and record["check"]["ok"]
    assert record["check"]["texts"] == 30 + len(adversarial_texts(llama3_tok))
    assert isinstance(fast, FastPath)
    forced, record = choose_encoder(llama3_tok, "tiktoken", texts[:30], num_threads=2)
    assert isinstance(forced, FastPath) and record["requested"] == "tiktoken"
    hf, record = choose_encoder(llama3_tok, "hf", texts[:30], num_threads=2)
    assert record == {"requested": "hf", "backend": "hf", "fallback_reason": None}
    assert hf(texts[:3]) == [ids.tolist() for ids in fast(texts[:3])]
    with pytest.raises(ConfigError, match="must be one of"):
        choose_encoder(llama3_tok, "fast", texts, num_threads=2)


def test_self_check_names_the_first_difference() -> None:
    def hf(texts: list[str]) -> list[list[int]]:
        return [[len(t), 1, 2] for t in texts]

    def off_by_one(texts: list[str]) -> list[list[int]]:
        return [[len(t), 1, 2 if "y" not in t else 3] for t in texts]

    ok = self_check(hf, hf, ["a", "b"])
    assert ok == CheckResult(ok=True, texts=ok.texts, tokens=3 * ok.texts)
    bad = self_check(off_by_one, hf, ["x" * 500 + "y"])
    assert not bad.ok
    assert bad.mismatch is not None and "(501 chars) at token 2" in bad.mismatch


@pytest.mark.parametrize("variant", ["plain", "permuted"])
def test_spec_cache_round_trip(
    llama3_tok: Tokenizer,
    texts: list[str],
    tmp_path,
    monkeypatch: pytest.MonkeyPatch,
    variant: str,
) -> None:
    """The derived spec is cached per tokenizer fingerprint and reused without deriving."""
    tok = permuted_ids(llama3_tok) if variant == "permuted" else llama3_tok
    monkeypatch.setenv("PACKCLI_CACHE_DIR", str(tmp_path))
    fingerprint = "ab" * 32
    first = fastpath.build_tiktoken_encoder(tok, 2, fingerprint)
    assert [p.name for p in tmp_path.iterdir()] == [fastpath._spec_path(fingerprint).name]
    derived = fastpath.derive_spec(tok)
    assert (derived.rank_to_id is None) == (variant == "plain")

    def refuse(_: Tokenizer) -> None:
        raise AssertionError("derived again despite the cache")

    monkeypatch.setattr(fastpath, "derive_spec", refuse)
    cached = fastpath.build_tiktoken_encoder(tok, 2, fingerprint)
    for name in ("pattern", "mergeable_ranks", "special_tokens", "normalizer", "proof"):
        assert getattr(cached.spec, name) == getattr(derived, name)
    if derived.rank_to_id is not None:
        assert np.array_equal(cached.spec.rank_to_id, derived.rank_to_id)
    assert_identical(cached, tok, texts)
    assert [a.tolist() for a in cached(texts)] == [a.tolist() for a in first(texts)]


def test_spec_cache_keeps_the_special_tokens_setting_apart(
    llama3_tok: Tokenizer, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``encode_special_tokens`` is not in the tokenizer's serialization (so not in its
    fingerprint) but changes the spec: a spec cached under one setting must not serve the
    other."""
    monkeypatch.setenv("PACKCLI_CACHE_DIR", str(tmp_path))
    text = "a<|eot_id|>b"
    eot = llama3_tok.token_to_id("<|eot_id|>")
    for mode in ("special", "text", "special", "text"):
        tok = Tokenizer.from_str(llama3_tok.to_str())
        set_special_in_text(tok, mode)
        ids = fastpath.build_tiktoken_encoder(tok, 1, "ab" * 32)([text])[0].tolist()
        assert (eot in ids) == (mode == "special")
        assert ids == tok.encode(text, add_special_tokens=False).ids
    assert len(list(tmp_path.iterdir())) == 2


def test_spec_cache_ignores_bad_or_foreign_entries(
    gpt2_tok: Tokenizer, tmp_path, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    monkeypatch.setenv("PACKCLI_CACHE_DIR", str(tmp_path))
    fingerprint = "cd" * 32
    fastpath.build_tiktoken_encoder(gpt2_tok, 1, fingerprint)
    path = fastpath._spec_path(fingerprint)
    data = json.loads(path.read_text())
    calls = []
    real = fastpath.derive_spec
    monkeypatch.setattr(fastpath, "derive_spec", lambda t: calls.append(1) or real(t))
    # Another packcli version's entry, a cut-off file: derived again, then rewritten.
    path.write_text(json.dumps({**data, "packcli": "0.0.0"}))
    fastpath.build_tiktoken_encoder(gpt2_tok, 1, fingerprint)
    path.write_text(path.read_text()[:1000])
    with caplog.at_level(logging.WARNING):
        fastpath.build_tiktoken_encoder(gpt2_tok, 1, fingerprint)
    assert "ignoring the cached fast-path spec" in caplog.text
    assert len(calls) == 2
    assert json.loads(path.read_text()) == data
    # An empty PACKCLI_CACHE_DIR turns the cache off.
    monkeypatch.setenv("PACKCLI_CACHE_DIR", "")
    fastpath.build_tiktoken_encoder(gpt2_tok, 1, "ef" * 32)
    assert len(calls) == 3 and len(list(tmp_path.iterdir())) == 1


def test_lone_surrogates_take_tiktokens_own_replacement(llama3_tok: Tokenizer) -> None:
    """The numpy path raises on text that is not valid UTF-8; the fast path then falls back
    to tiktoken's list path, which replaces the surrogate (the reader never passes such
    text on, but a library caller may)."""
    fast = build_tiktoken_encoder(llama3_tok, 1)
    text = "ab\ud800cd <|endoftext|> x\udfff"
    (got,) = fast([text])
    assert got.dtype == np.uint32
    want = fast.encoding.encode(text, allowed_special="all", disallowed_special=())
    assert got.tolist() == want
