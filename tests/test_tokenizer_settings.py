"""Tokenizer settings that would silently change every document (issue: nothing silently
wrong): a ``tokenizer.json`` that truncates and pads, and special-token strings inside text."""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from clirun import invoke
from corpora import random_text
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from packcli.tokenize import tokenizer as tokenizer_module
from packcli.tokenize.tokenizer import SpecialStringCounter, load_tokenizer

SMALL = ["--short-len", "64", "--long-len", "1024", "--quiet"]


@pytest.fixture(scope="module")
def wordpiece_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A BERT-style WordPiece tokenizer saved the way pipelines save them: with truncation
    to 16 tokens and padding to 16 switched on in ``tokenizer.json``."""
    folder = tmp_path_factory.mktemp("wordpiece")
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(
        vocab_size=300,
        special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
        show_progress=False,
    )
    rng = random.Random(0)
    tok.train_from_iterator([random_text(rng, 40) for _ in range(200)], trainer)
    tok.enable_truncation(max_length=16)
    tok.enable_padding(length=16, pad_id=tok.token_to_id("[PAD]"), pad_token="[PAD]")
    tok.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


def docs_from_output(out: Path) -> dict[int, list[int]]:
    """Each document's tokens, rebuilt from the long config's segments (pieces in order)."""
    pieces: dict[int, list[list[int]]] = {}
    for f in sorted((out / "data" / "long").glob("*.parquet")):
        for row in pq.read_table(f).to_pylist():
            pos = 0
            for doc, n in zip(row["doc_ids"], row["seq_lengths"], strict=True):
                pieces.setdefault(doc, []).append(row["input_ids"][pos : pos + n])
                pos += n
    return {d: [t for p in ps for t in p] for d, ps in pieces.items()}


def test_loading_turns_truncation_and_padding_off(wordpiece_path: Path) -> None:
    raw = Tokenizer.from_file(str(wordpiece_path))
    assert raw.truncation is not None and raw.padding is not None
    loaded = load_tokenizer(str(wordpiece_path))
    assert loaded.tokenizer.truncation is None and loaded.tokenizer.padding is None
    assert loaded.disabled == ("truncation (max_length 16)", "padding (to 16)")
    assert loaded.file_fingerprint != loaded.fingerprint
    note = b"\n# turned off: truncation (max_length 16), padding (to 16)"
    assert loaded.fingerprint == hashlib.sha256(wordpiece_path.read_bytes() + note).hexdigest()
    assert loaded.file_fingerprint == hashlib.sha256(wordpiece_path.read_bytes()).hexdigest()
    text = " ".join(["word"] * 40)
    assert len(loaded.tokenizer.encode(text, add_special_tokens=False).ids) > 16


def test_wordpiece_file_that_truncates_and_pads_conserves_every_token(
    wordpiece_path: Path, tmp_path: Path
) -> None:
    """The run keeps every token a truncation- and padding-free HF encoding gives, says what
    it turned off, and `verify` passes."""
    rng = random.Random(3)
    texts = [random_text(rng, rng.choice([2, 5, 30, 90, 200])) for _ in range(60)]
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = tmp_path / "out"
    code, output = invoke("pack", corpus, "-t", wordpiece_path, "-o", out, *SMALL[:-1])
    assert code == 0, output
    assert "truncation (max_length 16): turned off" in output
    ref = Tokenizer.from_file(str(wordpiece_path))
    ref.no_truncation()
    ref.no_padding()
    sep = ref.token_to_id("[SEP]")  # --eos auto finds [SEP]
    pad = ref.token_to_id("[PAD]")
    got = docs_from_output(out)
    assert len(got) == len(texts)
    for doc, text in enumerate(texts):
        assert got[doc] == [*ref.encode(text, add_special_tokens=False).ids, sep]
    assert max(len(v) for v in got.values()) > 16
    assert all(pad not in v for v in got.values())
    report = json.loads((out / "packcli.json").read_text())["report"]
    assert report["tokenizer"]["disabled_settings"] == [
        "truncation (max_length 16)",
        "padding (to 16)",
    ]
    code, output = invoke("verify", out)
    assert code == 0, output
    assert "60 input documents encoded again match the output" in output


def test_verify_catches_a_run_whose_tokenizer_truncated(
    wordpiece_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old behaviour (truncation and padding kept) made shards that were already wrong,
    so checking against the shards passed; encoding input again catches it."""
    rng = random.Random(4)
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": random_text(rng, 60)}) + "\n" for _ in range(20)))
    out = tmp_path / "out"
    with monkeypatch.context() as m:
        m.setattr(tokenizer_module, "disable_length_settings", lambda tok: ())
        code, output = invoke("pack", corpus, "-t", wordpiece_path, "-o", out, *SMALL)
    assert code == 0, output
    assert all(len(v) == 17 for v in docs_from_output(out).values())  # 16 + [SEP]: cut
    code, output = invoke("verify", out)
    assert code == 1
    assert f"{corpus.resolve()}:1: document 0 encoded again from the input" in output
    assert "differs from the output (17 tokens" in output


SPECIAL_TEXTS = [
    "plain text with nothing special",
    "scraped page <|endoftext|> and the page goes on <|endoftext|>",
    "a template leaked <|bos|>Hi there",
    "almost <|endoftext| but not quite",
]


@pytest.mark.parametrize("mode", ["text", "special"])
@pytest.mark.parametrize("backend", ["hf", "fastokens"])
def test_special_token_strings_inside_documents(
    toy_tokenizer_path: Path, tmp_path: Path, mode: str, backend: str
) -> None:
    """Default: encoded as plain text (no fake document end mid-document); ``special`` keeps
    HF's default. Counted in the report either way; every backend gives HF's ids."""
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in SPECIAL_TEXTS))
    out = tmp_path / "out"
    flags = [] if mode == "text" else ["--special-in-text", "special"]
    code, output = invoke(
        "pack",
        corpus,
        "-t",
        toy_tokenizer_path,
        "-o",
        out,
        "--tokenizer-backend",
        backend,
        *flags,
        *SMALL[:-1],
    )
    assert code == 0, output
    ref = Tokenizer.from_file(str(toy_tokenizer_path))
    ref.encode_special_tokens = mode == "text"
    eos, bos = ref.token_to_id("<|endoftext|>"), ref.token_to_id("<|bos|>")
    got = docs_from_output(out)
    for doc, text in enumerate(SPECIAL_TEXTS):
        assert got[doc] == [*ref.encode(text, add_special_tokens=False).ids, eos]
    inner = [t for v in got.values() for t in v[:-1]]
    assert (eos in inner and bos in inner) == (mode == "special")
    meta = json.loads((out / "packcli.json").read_text())
    found = meta["report"]["tokenizer"]["special_strings"]
    assert found == {"occurrences": 3, "by_token": {"<|endoftext|>": 2, "<|bos|>": 1}}
    assert meta["report"]["tokenizer"]["special_in_text"] == mode
    assert "3 special-token strings inside documents" in output
    assert meta["run"]["tokenizer_backend"]["backend"] == backend
    code, output = invoke("verify", out)
    assert code == 0, output


def test_special_string_counter() -> None:
    """Longest match first (``<|ab|>`` is not also counted as ``<|a``...), none across
    documents."""
    counter = SpecialStringCounter(["<|a|>", "<|ab|>", "[SEP]", ""])
    found: Counter[str] = Counter()
    counter(["x<|ab|>y<|a|>", "[SEP][SEP]", "<|a", "|>nothing"], found)
    assert found == {"[SEP]": 2, "<|ab|>": 1, "<|a|>": 1}
    empty: Counter[str] = Counter()
    SpecialStringCounter([])(["<|a|>"], empty)
    assert not empty


@pytest.mark.parametrize("spec", ["models/llama3", "models/llama3/tokenizer", "./llama3"])
def test_a_mistyped_local_path_is_not_asked_of_the_hub(
    spec: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``models/llama3`` beside a local ``models/`` folder is a typo, not a repo id: say "no
    such file" at once instead of retrying the Hub for half a minute."""
    (tmp_path / "models").mkdir()
    monkeypatch.chdir(tmp_path)

    def no_hub(*args: object, **kwargs: object) -> None:
        raise AssertionError("asked the Hub")

    monkeypatch.setattr(tokenizer_module.Tokenizer, "from_pretrained", no_hub)
    with pytest.raises(tokenizer_module.ConfigError, match=f"no such file or folder {spec}"):
        load_tokenizer(spec)


def test_eos_auto_refuses_a_config_token_missing_from_the_vocabulary(
    toy_tokenizer_path: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes(toy_tokenizer_path.read_bytes())
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    loaded = load_tokenizer(str(folder))
    with pytest.raises(tokenizer_module.ConfigError, match="names eos_token '</s>', which is not"):
        tokenizer_module.resolve_special(loaded, "auto", "eos")
    assert tokenizer_module.resolve_special(loaded, "none", "eos") is None


def test_verify_encodes_again_only_documents_of_bounded_size(
    toy_tokenizer_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A huge first document is not encoded again by ``verify`` (HF needed 19 s and 2.8 GB
    for one of 20 MB); the others still are."""
    rng = random.Random(5)
    texts = [random_text(rng, 400)] + [random_text(rng, 5) for _ in range(9)]
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = tmp_path / "out"
    code, output = invoke("pack", corpus, "-t", toy_tokenizer_path, "-o", out, *SMALL)
    assert code == 0, output
    from packcli.publish import recheck

    monkeypatch.setattr(recheck, "MAX_DOC_CHARS", max(map(len, texts[1:])))
    code, output = invoke("verify", out)
    assert code == 0, output
    assert "9 input documents encoded again match the output" in output


def test_an_uncached_hub_tokenizer_offline_says_offline_mode_is_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HF_HUB_OFFLINE=1 (the tests' environment) and an empty Hub cache: the message names
    offline mode, the repo and the cache instead of the Hub's "check your connection"."""
    from huggingface_hub import constants

    cache = tmp_path / "hf" / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    assert constants.HF_HUB_OFFLINE
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"text": "hello"}) + "\n")
    code, output = invoke("pack", corpus, "-t", "packcli-tests/no-such-tok", "-o", tmp_path / "o")
    assert code == 1
    assert output.count("\n") == 1, output  # one line
    assert "HF_HUB_OFFLINE is set" in output and "packcli-tests/no-such-tok" in output
    assert str(cache) in output and "check your connection" not in output
    assert not (tmp_path / "o").exists()
