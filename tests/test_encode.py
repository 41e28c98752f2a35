"""Tokenize stage: ids equal the tokenizer's own, separators added by rule, big vocabularies."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from packcli.errors import ConfigError
from packcli.tokenize.backends import FastokensEncoder, HFEncoder
from packcli.tokenize.encode import assemble, prefetch
from packcli.tokenize.tokenizer import load_tokenizer, resolve_special

TEXTS = ["hello world", "", "the packing of tokens", "東京 🙂 naïve", "a " * 300]


@pytest.mark.parametrize("backend", [HFEncoder, FastokensEncoder])
@pytest.mark.parametrize(("bos", "eos"), [(None, None), (None, 0), (1, 0), (1, None)])
def test_encode_matches_per_document_encoding(
    toy_tokenizer_path: Path, bos: int | None, eos: int | None, backend: type
) -> None:
    tok = Tokenizer.from_file(str(toy_tokenizer_path))
    flat, lengths = assemble(backend(tok)(TEXTS), bos=bos, eos=eos)
    assert flat.dtype == np.int32 and lengths.sum() == flat.size
    starts = np.cumsum(lengths) - lengths
    for text, s, n in zip(TEXTS, starts, lengths, strict=True):
        expected = tok.encode(text, add_special_tokens=False).ids
        expected = (
            ([bos] if bos is not None else []) + expected + ([eos] if eos is not None else [])
        )
        assert flat[s : s + n].tolist() == expected


def test_vocabulary_over_65536_keeps_ids(tmp_path: Path) -> None:
    vocab = {f"w{i}": i for i in range(70_000)}
    vocab["[UNK]"] = 70_000
    vocab["<eos>"] = 70_001
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    loaded = load_tokenizer(str(tmp_path))
    eos = resolve_special(loaded, "<eos>", "eos")
    flat, lengths = assemble(
        HFEncoder(loaded.tokenizer)(["w69999 w65536 w1", "w70"]), bos=None, eos=eos
    )
    assert flat.tolist() == [69999, 65536, 1, 70_001, 70, 70_001]
    assert lengths.tolist() == [4, 2]


def test_load_tokenizer_file_folder_and_errors(toy_tokenizer_path: Path, tmp_path: Path) -> None:
    by_file = load_tokenizer(str(toy_tokenizer_path))
    by_folder = load_tokenizer(str(toy_tokenizer_path.parent))
    assert by_file.fingerprint == by_folder.fingerprint
    assert by_file.config["eos_token"] == "<|endoftext|>"
    with pytest.raises(ConfigError, match="not found"):
        load_tokenizer(str(tmp_path / "missing.json"))
    with pytest.raises(ConfigError, match=r"no tokenizer\.json"):
        load_tokenizer(str(tmp_path))
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot load"):
        load_tokenizer(str(tmp_path / "broken.json"))


def test_resolve_special_tokens(toy_tokenizer_path: Path, tmp_path: Path) -> None:
    loaded = load_tokenizer(str(toy_tokenizer_path))
    tok = loaded.tokenizer
    assert resolve_special(loaded, "auto", "eos") == tok.token_to_id("<|endoftext|>")
    assert resolve_special(loaded, "auto", "bos") == tok.token_to_id("<|bos|>")
    assert resolve_special(loaded, "none", "eos") is None
    assert resolve_special(loaded, 5, "eos") == 5
    assert resolve_special(loaded, "<|bos|>", "eos") == tok.token_to_id("<|bos|>")
    with pytest.raises(ConfigError, match="outside the vocabulary"):
        resolve_special(loaded, 10**6, "eos")
    with pytest.raises(ConfigError, match="not a token"):
        resolve_special(loaded, "<nope>", "eos")
    # Without a config file, detection falls back to well-known names; none found -> error.
    bare = tmp_path / "bare"
    bare.mkdir()
    tok.save(str(bare / "tokenizer.json"))
    assert resolve_special(load_tokenizer(str(bare)), "auto", "eos") == tok.token_to_id(
        "<|endoftext|>"
    )
    plain = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    plain.save(str(tmp_path / "plain.json"))
    with pytest.raises(ConfigError, match="could not detect"):
        resolve_special(load_tokenizer(str(tmp_path / "plain.json")), "auto", "eos")
    # The bundled demo tokenizer's config sits beside it under a prefixed name.
    demo = Path(__file__).parent.parent / "packcli" / "assets" / "demo_tokenizer.json"
    demo_loaded = load_tokenizer(str(demo))
    cfg = json.loads((demo.parent / "demo_tokenizer_config.json").read_text())
    assert resolve_special(demo_loaded, "auto", "eos") == demo_loaded.tokenizer.token_to_id(
        cfg["eos_token"]
    )


def test_prefetch_preserves_order_and_reraises() -> None:
    assert list(prefetch(iter(range(100)), depth=2)) == list(range(100))

    def failing():  # type: ignore[no-untyped-def]
        yield 1
        yield 2
        raise ValueError("bad line")

    got = []
    with pytest.raises(ValueError, match="bad line"):
        for x in prefetch(failing()):
            got.append(x)
    assert got == [1, 2]
